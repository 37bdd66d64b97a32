"""``claim`` and ``claimWithSignature``: the receiver's claims, each a payer's voucher and the total
claimed against it, moving the channel's ``totalClaimed`` up and the receiver's claimed total with it
(``settle`` pays that out)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eth_abi import encode as abi_encode

from ..chain import _address_topic, recover_ecdsa
from ..ledger import LedgerRevert
from . import signatures, state
from .abi import (
    EVENT_TOPICS,
    PREFIX,
    REVERT_AUTHORIZER_MISMATCH,
    REVERT_AUTHORIZER_SIGNATURE,
    REVERT_CLAIM_EXCEEDS_BALANCE,
    REVERT_CLAIM_EXCEEDS_VOUCHER,
    REVERT_EMPTY_CLAIMS,
    REVERT_UNAUTHORIZED,
    REVERT_VOUCHER_SIGNATURE,
    ZERO_ADDRESS,
    Claim,
    channel_topic,
    config_tuple,
)
from .state import ChannelRecord, Execution

if TYPE_CHECKING:
    from .contract import BatchSettlementContract


def claim_with_signature(c: BatchSettlementContract, ex: Execution, raw_claims: Any, signature: bytes) -> None:
    """Anyone may send claims signed by their one receiver authorizer (``ClaimBatch``)."""
    claims = parse_claims(c, raw_claims)
    authorizer = claims[0].config[3]
    if any(row.config[3] != authorizer for row in claims):
        raise LedgerRevert(REVERT_AUTHORIZER_MISMATCH)
    if not c.signed_by(signatures.claim_batch_digest(c.chain_id, claims), signature, authorizer):
        raise LedgerRevert(REVERT_AUTHORIZER_SIGNATURE)
    apply_claims(c, ex, claims)


def claim(c: BatchSettlementContract, ex: Execution, raw_claims: Any) -> None:
    """The receiver (or its authorizer) sends its claims itself."""
    claims = parse_claims(c, raw_claims)
    if any(ex.sender not in (row.config[2], row.config[3]) for row in claims):
        raise LedgerRevert(REVERT_UNAUTHORIZED)
    apply_claims(c, ex, claims)


def parse_claims(c: BatchSettlementContract, raw_claims: Any) -> list[Claim]:
    claims = []
    try:
        for (raw_config, max_claimable), signature, total_claimed in raw_claims:
            config = config_tuple(raw_config)
            claims.append(Claim(config, c.channel_id(config), int(max_claimable), bytes(signature), int(total_claimed)))
    except (TypeError, ValueError):
        raise LedgerRevert(PREFIX + "malformed claims") from None
    if not claims:
        raise LedgerRevert(REVERT_EMPTY_CLAIMS)
    return claims


def apply_claims(c: BatchSettlementContract, ex: Execution, claims: list[Claim]) -> None:
    """Each row in the contract's order (``_processVoucherClaim``): a row at or below the channel's
    ``totalClaimed`` is a no-op, checked no further (a replayed claim changes nothing); otherwise the
    payer's voucher must cover it, the channel's balance must back it, and the voucher's signature
    must be the payer authorizer's (``voucher_signed``); ``totalClaimed`` moves up to the row's value."""
    for row in claims:
        record = state.load_channel(ex.db, row.channel_id) or ChannelRecord(row.channel_id, row.config)
        if row.total_claimed <= record.total_claimed:
            continue
        if row.total_claimed > row.max_claimable:
            raise LedgerRevert(REVERT_CLAIM_EXCEEDS_VOUCHER)
        if row.total_claimed > record.balance:
            raise LedgerRevert(REVERT_CLAIM_EXCEEDS_BALANCE)
        voucher_signed(c, row)
        delta = row.total_claimed - record.total_claimed
        record.total_claimed = row.total_claimed
        state.store_channel(ex.db, record)
        claimed, settled = state.load_receiver(ex.db, record.receiver, record.token)
        state.store_receiver(ex.db, record.receiver, record.token, claimed + delta, settled)
        ex.emit(
            c.address,
            [EVENT_TOPICS["Claimed"], channel_topic(row.channel_id), _address_topic(ex.sender)],
            abi_encode(["uint128", "uint128"], [delta, record.total_claimed]),
        )


def voucher_signed(c: BatchSettlementContract, row: Claim) -> None:
    """The voucher's signature, as the contract checks it: a non-zero payer authorizer's with
    OpenZeppelin's ``ECDSA.recoverCalldata`` (65 bytes, low s, v 27/28: its own error otherwise; no
    ERC-1271), a zero one's by the payer through ``SignatureChecker`` (``signatures.signed_by``)."""
    if c.trust_signatures:
        return
    digest = signatures.voucher_digest(c.chain_id, row.channel_id, row.max_claimable)
    payer, payer_authorizer = row.config[0], row.config[1]
    if payer_authorizer == ZERO_ADDRESS:
        if not c.signed_by(digest, row.signature, payer):
            raise LedgerRevert(REVERT_VOUCHER_SIGNATURE)
        return
    signer, error = recover_ecdsa(digest, row.signature)
    if error:
        raise LedgerRevert(error)
    if signer != payer_authorizer:
        raise LedgerRevert(REVERT_VOUCHER_SIGNATURE)
