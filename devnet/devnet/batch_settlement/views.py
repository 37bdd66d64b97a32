"""The contract's view functions: a channel's state, its pending withdrawal and refund nonce, a
receiver's totals, and the ids and digests the contract computes for its callers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eth_utils import to_checksum_address

from . import signatures, state
from .abi import channel_key, config_tuple
from .claim import parse_claims
from .state import Execution

if TYPE_CHECKING:
    from .contract import BatchSettlementContract


def channels(c: BatchSettlementContract, ex: Execution, channel_id: bytes) -> tuple[int, int]:
    record = state.load_channel(ex.db, channel_key(channel_id))
    return (0, 0) if record is None else (record.balance, record.total_claimed)


def pending_withdrawals(c: BatchSettlementContract, ex: Execution, channel_id: bytes) -> tuple[int, int]:
    record = state.load_channel(ex.db, channel_key(channel_id))
    return (0, 0) if record is None else (record.withdraw_amount, record.withdraw_initiated_at)


def refund_nonce(c: BatchSettlementContract, ex: Execution, channel_id: bytes) -> int:
    record = state.load_channel(ex.db, channel_key(channel_id))
    return 0 if record is None else record.refund_nonce


def receivers(c: BatchSettlementContract, ex: Execution, receiver: str, token: str) -> tuple[int, int]:
    return state.load_receiver(ex.db, to_checksum_address(receiver), to_checksum_address(token))


def get_channel_id(c: BatchSettlementContract, ex: Execution, raw_config: Any) -> bytes:
    return bytes.fromhex(c.channel_id(config_tuple(raw_config))[2:])


def get_voucher_digest(c: BatchSettlementContract, ex: Execution, channel_id: bytes, max_claimable: int) -> bytes:
    return signatures.voucher_digest(c.chain_id, channel_key(channel_id), int(max_claimable))


def get_refund_digest(c: BatchSettlementContract, ex: Execution, channel_id: bytes, nonce: int, amount: int) -> bytes:
    return signatures.refund_digest(c.chain_id, channel_key(channel_id), int(nonce), int(amount))


def get_claim_batch_digest(c: BatchSettlementContract, ex: Execution, raw_claims: Any) -> bytes:
    return signatures.claim_batch_digest(c.chain_id, parse_claims(c, raw_claims))
