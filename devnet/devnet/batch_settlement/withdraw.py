"""``initiateWithdraw`` and ``finalizeWithdraw``: the payer's own way out, in two steps the channel's
withdraw delay apart (the time the receiver has to claim what it is owed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eth_abi import encode as abi_encode

from ..chain import _address_topic
from ..ledger import LedgerRevert
from . import state
from .abi import (
    EVENT_TOPICS,
    REVERT_NO_WITHDRAWAL,
    REVERT_UNAUTHORIZED,
    REVERT_WITHDRAW_EARLY,
    REVERT_WITHDRAW_EXCEEDS,
    REVERT_WITHDRAW_PENDING,
    REVERT_ZERO_AMOUNT,
    ZERO_ADDRESS,
    channel_topic,
    config_tuple,
)
from .state import ChannelRecord, Execution

if TYPE_CHECKING:
    from .contract import BatchSettlementContract


def payer_side(ex: Execution, record: ChannelRecord) -> None:
    """The sender is the payer, or its payer authorizer when it has one."""
    allowed = {record.payer} | ({record.payer_authorizer} - {ZERO_ADDRESS})
    if ex.sender not in allowed:
        raise LedgerRevert(REVERT_UNAUTHORIZED)


def initiate_withdraw(c: BatchSettlementContract, ex: Execution, raw_config: Any, amount: int) -> None:
    record = c.existing(ex, config_tuple(raw_config))
    payer_side(ex, record)
    amount = int(amount)
    if amount == 0:
        raise LedgerRevert(REVERT_ZERO_AMOUNT)
    if record.withdraw_initiated_at:
        raise LedgerRevert(REVERT_WITHDRAW_PENDING)
    if amount > record.unclaimed:
        raise LedgerRevert(REVERT_WITHDRAW_EXCEEDS)
    record.withdraw_amount, record.withdraw_initiated_at = amount, ex.now
    state.store_channel(ex.db, record)
    ex.emit(
        c.address,
        [EVENT_TOPICS["WithdrawInitiated"], channel_topic(record.channel_id)],
        abi_encode(["uint128", "uint40"], [amount, ex.now + record.withdraw_delay]),
    )


def finalize_withdraw(c: BatchSettlementContract, ex: Execution, raw_config: Any) -> None:
    """Once the delay has passed: what is still unclaimed of the amount asked for goes to the payer."""
    record = c.existing(ex, config_tuple(raw_config))
    payer_side(ex, record)
    if not record.withdraw_initiated_at:
        raise LedgerRevert(REVERT_NO_WITHDRAWAL)
    if ex.now < record.withdraw_initiated_at + record.withdraw_delay:
        raise LedgerRevert(REVERT_WITHDRAW_EARLY)
    actual = min(record.withdraw_amount, record.unclaimed)
    record.balance -= actual
    record.withdraw_amount, record.withdraw_initiated_at = 0, 0
    state.store_channel(ex.db, record)
    ex.emit(
        c.address,
        [EVENT_TOPICS["WithdrawFinalized"], channel_topic(record.channel_id), _address_topic(ex.sender)],
        abi_encode(["uint128"], [actual]),
    )
    c.maybe_closed(ex, record)
    if actual > 0:  # the contract's last step
        c.transfer(ex, record.token, c.address, record.payer, actual)
