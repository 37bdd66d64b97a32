"""``settle``: the receiver's claimed-but-unsettled total for a token, paid out of the contract."""

from __future__ import annotations

from typing import TYPE_CHECKING

from eth_abi import encode as abi_encode
from eth_utils import to_checksum_address

from ..chain import _address_topic
from . import state
from .abi import EVENT_TOPICS
from .state import Execution

if TYPE_CHECKING:
    from .contract import BatchSettlementContract


def settle(c: BatchSettlementContract, ex: Execution, receiver: str, token: str) -> None:
    """Anyone may send it; nothing to sweep is a no-op without an event."""
    receiver, token = to_checksum_address(receiver), to_checksum_address(token)
    claimed, settled = state.load_receiver(ex.db, receiver, token)
    amount = claimed - settled
    if amount == 0:
        return
    state.store_receiver(ex.db, receiver, token, claimed, claimed)
    c.transfer(ex, token, c.address, receiver, amount)
    ex.emit(
        c.address,
        [EVENT_TOPICS["Settled"], _address_topic(receiver), _address_topic(token), _address_topic(ex.sender)],
        abi_encode(["uint128"], [amount]),
    )
