"""The contract as the outside sees it: its functions (from the x402 package's ABI), the events it
emits, its revert reasons, and the decoding of its arguments (a ``ChannelConfig``, a channel id, a
claim row)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eth_utils import keccak, to_checksum_address
from x402.mechanisms.evm.batch_settlement.abi import BATCH_SETTLEMENT_ABI

from ..ledger import LedgerRevert

#: A ``ChannelConfig`` as the contract holds it: payer, payer authorizer, receiver, receiver
#: authorizer, token (checksummed), withdraw delay, salt (32 bytes).
Config = tuple[str, str, str, str, str, int, bytes]

ZERO_ADDRESS = "0x" + "00" * 20
CONFIG_TYPE = "(address,address,address,address,address,uint40,bytes32)"
UINT128_MAX = 2**128 - 1

#: The events this simulation emits, ``name -> canonical signature``.
EVENT_SIGNATURES = {
    "ChannelCreated": f"ChannelCreated(bytes32,{CONFIG_TYPE})",
    "Deposited": "Deposited(bytes32,address,uint128,uint128)",
    "Claimed": "Claimed(bytes32,address,uint128,uint128)",
    "Settled": "Settled(address,address,address,uint128)",
    "Refunded": "Refunded(bytes32,address,uint128)",
    "WithdrawInitiated": "WithdrawInitiated(bytes32,uint128,uint40)",
    "WithdrawFinalized": "WithdrawFinalized(bytes32,address,uint128)",
    "ChannelClosed": f"ChannelClosed(bytes32,{CONFIG_TYPE})",
}
EVENT_TOPICS = {name: "0x" + keccak(text=sig).hex() for name, sig in EVENT_SIGNATURES.items()}

PREFIX = "x402BatchSettlement: "
REVERT_ZERO_AMOUNT = PREFIX + "zero amount"
REVERT_CONFIG = PREFIX + "invalid channel config"
REVERT_WITHDRAW_DELAY = PREFIX + "withdraw delay out of range"
REVERT_UNKNOWN_COLLECTOR = PREFIX + "unknown deposit collector"
REVERT_PERMIT2_UNAVAILABLE = "Permit2DepositCollector: Permit2 is not deployed on the dev chain"
REVERT_CHANNEL_NOT_FOUND = PREFIX + "channel not found"
REVERT_EMPTY_CLAIMS = PREFIX + "no claims"
REVERT_AUTHORIZER_MISMATCH = PREFIX + "claims name different receiver authorizers"
REVERT_AUTHORIZER_SIGNATURE = PREFIX + "invalid receiver authorizer signature"
REVERT_VOUCHER_SIGNATURE = PREFIX + "invalid voucher signature"
REVERT_CLAIM_EXCEEDS_VOUCHER = PREFIX + "claim exceeds voucher maxClaimableAmount"
REVERT_CLAIM_EXCEEDS_BALANCE = PREFIX + "claim exceeds channel balance"
REVERT_UNAUTHORIZED = PREFIX + "caller is not authorized"
REVERT_REFUND_NONCE = PREFIX + "invalid refund nonce"
REVERT_WITHDRAW_EXCEEDS = PREFIX + "withdrawal exceeds unclaimed balance"
REVERT_WITHDRAW_PENDING = PREFIX + "withdrawal already pending"
REVERT_NO_WITHDRAWAL = PREFIX + "no pending withdrawal"
REVERT_WITHDRAW_EARLY = PREFIX + "withdraw delay has not elapsed"
REVERT_UNKNOWN_FUNCTION = PREFIX + "unknown function"


def _canonical(item: dict[str, Any]) -> str:
    kind = item["type"]
    if not kind.startswith("tuple"):
        return kind
    return "(" + ",".join(_canonical(c) for c in item["components"]) + ")" + kind[len("tuple") :]


@dataclass(frozen=True)
class Function:
    name: str
    inputs: list[str]
    outputs: list[str]
    view: bool


def _function_table() -> tuple[dict[bytes, Function], dict[str, Function]]:
    by_selector: dict[bytes, Function] = {}
    by_name: dict[str, Function] = {}
    for entry in BATCH_SETTLEMENT_ABI:
        if entry["type"] != "function":
            continue
        fn = Function(
            name=entry["name"],
            inputs=[_canonical(i) for i in entry["inputs"]],
            outputs=[_canonical(o) for o in entry["outputs"]],
            view=entry["stateMutability"] == "view",
        )
        by_selector[keccak(text=f"{fn.name}({','.join(fn.inputs)})")[:4]] = fn
        by_name[fn.name] = fn
    return by_selector, by_name


BY_SELECTOR, BY_NAME = _function_table()


@dataclass(frozen=True)
class Claim:
    """One row of ``claim`` / ``claimWithSignature``: a voucher and the total it claims."""

    config: Config
    channel_id: str
    max_claimable: int
    signature: bytes
    total_claimed: int


def bytes32_topic(value: bytes) -> str:
    return "0x" + value.hex()


def channel_topic(channel_id: str) -> str:
    """A channel id (``0x`` hex) as an event's topic."""
    return bytes32_topic(bytes.fromhex(channel_id[2:]))


def config_tuple(raw: Any) -> Config:
    """The contract's view of a ``ChannelConfig`` argument: checksummed, typed, validated."""
    try:
        payer, payer_auth, receiver, receiver_auth, token, delay, salt = raw
        config = (
            to_checksum_address(payer),
            to_checksum_address(payer_auth),
            to_checksum_address(receiver),
            to_checksum_address(receiver_auth),
            to_checksum_address(token),
            int(delay),
            bytes(salt) if not isinstance(salt, str) else bytes.fromhex(salt.removeprefix("0x")),
        )
    except (TypeError, ValueError):
        raise LedgerRevert(REVERT_CONFIG) from None
    if len(config[6]) != 32 or not 0 <= config[5] < 2**40:
        raise LedgerRevert(REVERT_CONFIG)
    return config


def channel_key(channel_id: str | bytes) -> str:
    raw = channel_id if isinstance(channel_id, bytes) else bytes.fromhex(channel_id.removeprefix("0x"))
    if len(raw) != 32:
        raise LedgerRevert(PREFIX + "channel id must be 32 bytes")
    return "0x" + raw.hex()
