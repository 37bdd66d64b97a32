"""``refund`` and ``refundWithSignature``: the receiver's side gives back what the payer deposited
and nobody claimed, cooperatively (the receiver authorizer's signature over the channel's refund
nonce) or sent by the receiver itself."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eth_abi import encode as abi_encode

from ..chain import _address_topic
from ..ledger import LedgerRevert
from . import signatures, state
from .abi import (
    EVENT_TOPICS,
    REVERT_AUTHORIZER_SIGNATURE,
    REVERT_REFUND_NONCE,
    REVERT_UNAUTHORIZED,
    REVERT_ZERO_AMOUNT,
    channel_topic,
    config_tuple,
)
from .state import ChannelRecord, Execution

if TYPE_CHECKING:
    from .contract import BatchSettlementContract


def refund_with_signature(
    c: BatchSettlementContract, ex: Execution, raw_config: Any, amount: int, nonce: int, signature: bytes
) -> None:
    record = c.existing(ex, config_tuple(raw_config))
    if int(nonce) != record.refund_nonce:
        raise LedgerRevert(REVERT_REFUND_NONCE)
    digest = signatures.refund_digest(c.chain_id, record.channel_id, int(nonce), int(amount))
    if not c.signed_by(digest, signature, record.receiver_authorizer):
        raise LedgerRevert(REVERT_AUTHORIZER_SIGNATURE)
    refund_unclaimed(c, ex, record, int(amount))


def refund(c: BatchSettlementContract, ex: Execution, raw_config: Any, amount: int) -> None:
    record = c.existing(ex, config_tuple(raw_config))
    if ex.sender not in (record.receiver, record.receiver_authorizer):
        raise LedgerRevert(REVERT_UNAUTHORIZED)
    refund_unclaimed(c, ex, record, int(amount))


def refund_unclaimed(c: BatchSettlementContract, ex: Execution, record: ChannelRecord, amount: int) -> None:
    """The nonce advances first; then up to ``balance - totalClaimed`` goes back to the payer,
    and a pending withdrawal shrinks by what was refunded (gone once the refund covers it)."""
    if amount == 0:
        raise LedgerRevert(REVERT_ZERO_AMOUNT)
    record.refund_nonce += 1
    actual = min(amount, record.unclaimed)
    if actual > 0:
        record.balance -= actual
        if record.withdraw_initiated_at:
            if actual >= record.withdraw_amount:
                record.withdraw_amount, record.withdraw_initiated_at = 0, 0
            else:
                record.withdraw_amount -= actual
    state.store_channel(ex.db, record)
    if actual == 0:
        return
    ex.emit(
        c.address,
        [EVENT_TOPICS["Refunded"], channel_topic(record.channel_id), _address_topic(ex.sender)],
        abi_encode(["uint128"], [actual]),
    )
    c.maybe_closed(ex, record)
    c.transfer(ex, record.token, c.address, record.payer, actual)  # the contract's last step
