"""EIP-712 as the contract computes it (a channel's id, the voucher, refund and claim-batch digests
in its domain) and its signature check for an EOA (``SignatureChecker``)."""

from __future__ import annotations

from typing import Any

from eth_account.messages import encode_typed_data
from eth_utils import keccak, to_checksum_address
from x402.mechanisms.evm.batch_settlement.constants import CLAIM_BATCH_TYPES, REFUND_TYPES, VOUCHER_TYPES
from x402.mechanisms.evm.batch_settlement.types import ChannelConfig
from x402.mechanisms.evm.batch_settlement.utils import compute_channel_id, get_batch_settlement_eip712_domain

from ..chain import recover_ecdsa
from .abi import Claim, Config


def channel_id(config: Config, chain_id: int) -> str:
    """``getChannelId``: the EIP-712 hash of the ``ChannelConfig``, ``0x`` lower-case hex."""
    return compute_channel_id(
        ChannelConfig(
            payer=config[0],
            payer_authorizer=config[1],
            receiver=config[2],
            receiver_authorizer=config[3],
            token=config[4],
            withdraw_delay=config[5],
            salt="0x" + config[6].hex(),
        ),
        chain_id,
    ).lower()


def digest(domain: dict[str, Any], types: dict[str, Any], message: dict[str, Any]) -> bytes:
    signable = encode_typed_data(domain_data=domain, message_types=types, message_data=message)
    return keccak(b"\x19" + signable.version + signable.header + signable.body)


def contract_digest(chain_id: int, types: dict[str, Any], message: dict[str, Any]) -> bytes:
    return digest(get_batch_settlement_eip712_domain(chain_id), types, message)


def voucher_digest(chain_id: int, channel_id: str, max_claimable: int) -> bytes:
    return contract_digest(
        chain_id, VOUCHER_TYPES, {"channelId": bytes.fromhex(channel_id[2:]), "maxClaimableAmount": max_claimable}
    )


def refund_digest(chain_id: int, channel_id: str, nonce: int, amount: int) -> bytes:
    return contract_digest(
        chain_id, REFUND_TYPES, {"channelId": bytes.fromhex(channel_id[2:]), "nonce": nonce, "amount": amount}
    )


def claim_batch_digest(chain_id: int, claims: list[Claim]) -> bytes:
    entries = [
        {
            "channelId": bytes.fromhex(c.channel_id[2:]),
            "maxClaimableAmount": c.max_claimable,
            "totalClaimed": c.total_claimed,
        }
        for c in claims
    ]
    return contract_digest(chain_id, CLAIM_BATCH_TYPES, {"claims": entries})


def signed_by(digest: bytes, signature: bytes, address: str, *, trust_signatures: bool) -> bool:
    """OpenZeppelin's ``SignatureChecker.isValidSignatureNow``: ``ECDSA.tryRecover`` for an EOA (no
    dev-chain address has code: 65 bytes, low s, v 27/28, else false), or the trusting mode's
    accept-everything wallet."""
    if trust_signatures:
        return True
    signer, _ = recover_ecdsa(digest, bytes(signature))
    return signer is not None and signer == to_checksum_address(address)
