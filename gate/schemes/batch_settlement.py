"""x402 `batch-settlement` on EVM (payment channels): a deposit once, then a cumulative voucher per request.

A payload is `{type: "deposit", channelConfig, voucher, deposit}` (the first request of a
channel, or a top-up) or `{type: "voucher", channelConfig, voucher}`. The voucher is an EIP-712
signature by the channel's payer authorizer over `(channelId, maxClaimableAmount)` in the
`x402 Batch Settlement` domain of the `x402BatchSettlement` contract; `channelId` is the
EIP-712 hash of the channel's configuration, so one check binds the payload's configuration
to the channel it names. Each voucher raises the channel's claimable total by one price:
its claim key is (network, channel, maxClaimableAmount), so one increment buys one delivery
however the voucher is wrapped.

The gate reads every key here, computes the channel id and recovers voucher signers itself
(keccak from safe-pysha3, ecrecover from coincurve: well under a millisecond), because the
production install carries neither the x402 package nor eth-account. The rules are the
binding's (`x402.mechanisms.evm.batch_settlement`: `validate_channel_config`,
`compute_channel_id`, the voucher typed data); the tests check this module against the
package's own client and helpers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from coincurve import PublicKey
from sha3 import keccak_256

from gate.price import Price
from gate.schemes.base import (
    ADDRESS,
    GENERIC_DEFINITIVE_REASONS,
    NONCE_USED_REASONS,
    SIGNATURE,
    UINT,
    Rejection,
    address_at,
)

SCHEME_NAME = "batch-settlement"
# The binding's deterministic deployments (CREATE2: the same address on every chain).
SETTLEMENT_CONTRACT = "0x4020074e9df2ce1dee5a9c1b5c3f541d02a10003"
ERC3009_DEPOSIT_COLLECTOR = "0x4020806089470a89826cb9fb1f4059150b550004"
PERMIT2_DEPOSIT_COLLECTOR = "0x4020425faf3b746c082c2f942b4e5159887b0005"
DOMAIN_NAME, DOMAIN_VERSION = "x402 Batch Settlement", "1"
MIN_WITHDRAW_DELAY, MAX_WITHDRAW_DELAY = 900, 2_592_000
MIN_DEPOSIT_MULTIPLIER = 10  # the binding's default `extra.minDeposit`: ten requests' worth
ZERO_ADDRESS = "0x" + "00" * 20

# The binding's refusal codes (wire strings, the same in every x402 SDK).
CUMULATIVE_MISMATCH = "invalid_batch_settlement_evm_cumulative_amount_mismatch"
BELOW_CLAIMED = "invalid_batch_settlement_evm_cumulative_below_claimed"
EXCEEDS_BALANCE = "invalid_batch_settlement_evm_cumulative_exceeds_balance"
INVALID_VOUCHER_SIGNATURE = "invalid_batch_settlement_evm_voucher_signature"
CHANNEL_ID_MISMATCH = "invalid_batch_settlement_evm_channel_id_mismatch"
RECEIVER_MISMATCH = "invalid_batch_settlement_evm_receiver_mismatch"
RECEIVER_AUTHORIZER_MISMATCH = "invalid_batch_settlement_evm_receiver_authorizer_mismatch"
TOKEN_MISMATCH = "invalid_batch_settlement_evm_token_mismatch"
WITHDRAW_DELAY_MISMATCH = "invalid_batch_settlement_evm_withdraw_delay_mismatch"
DEPOSIT_BELOW_MIN = "invalid_batch_settlement_evm_deposit_below_min_deposit"
PAYLOAD_TYPE = "invalid_batch_settlement_evm_payload_type"
CHANNEL_BUSY = "invalid_batch_settlement_evm_channel_busy"
# the gate's own (x402 names none): the payer asked to withdraw; a charge now might never be claimed in time
WITHDRAWAL_PENDING = "invalid_batch_settlement_evm_withdrawal_pending"

DEFINITIVE_REASONS = GENERIC_DEFINITIVE_REASONS | {
    INVALID_VOUCHER_SIGNATURE,
    CHANNEL_ID_MISMATCH,
    RECEIVER_MISMATCH,
    RECEIVER_AUTHORIZER_MISMATCH,
    TOKEN_MISMATCH,
    WITHDRAW_DELAY_MISMATCH,
    EXCEEDS_BALANCE,
    "invalid_batch_settlement_evm_insufficient_balance",
    "invalid_batch_settlement_evm_receive_authorization_signature",
    "invalid_batch_settlement_evm_payload_authorization_valid_before",
    "invalid_batch_settlement_evm_deposit_payload",
}

CONFIG_KEYS = frozenset(
    {"payer", "payerAuthorizer", "receiver", "receiverAuthorizer", "token", "withdrawDelay", "salt"}
)
VOUCHER_KEYS = frozenset({"channelId", "maxClaimableAmount", "signature"})
DEPOSIT_KEYS = frozenset({"amount", "authorization"})
ERC3009_KEYS = frozenset({"validAfter", "validBefore", "salt", "signature"})
PERMIT2_KEYS = frozenset({"from", "permitted", "spender", "nonce", "deadline", "witness", "signature"})
AUTHORIZATION_KEYS = {"eip3009": "erc3009Authorization", "permit2": "permit2Authorization"}
PAYLOAD_KEYS = {
    "voucher": frozenset({"type", "channelConfig", "voucher"}),
    "deposit": frozenset({"type", "channelConfig", "voucher", "deposit"}),
}
WORD = re.compile(r"0x[0-9a-fA-F]{64}")
UINT128 = 2**128


def keccak(data: bytes) -> bytes:
    return keccak_256(data).digest()


def _address(value: str) -> bytes:
    return bytes(12) + bytes.fromhex(value.removeprefix("0x"))


def _uint(value: int) -> bytes:
    return value.to_bytes(32, "big")


DOMAIN_TYPEHASH = keccak(b"EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)")
CHANNEL_CONFIG_TYPEHASH = keccak(
    b"ChannelConfig(address payer,address payerAuthorizer,address receiver,address receiverAuthorizer,"
    b"address token,uint40 withdrawDelay,bytes32 salt)"
)
VOUCHER_TYPEHASH = keccak(b"Voucher(bytes32 channelId,uint128 maxClaimableAmount)")
_SEPARATORS: dict[int, bytes] = {}


def chain_id(network: str) -> int:
    """The EVM chain id of a CAIP-2 `eip155:<id>` network; `Rejection` for any other."""
    namespace, _, reference = network.partition(":")
    if namespace != "eip155" or not reference.isdigit():
        raise Rejection("unsupported_network")
    return int(reference)


def domain_separator(chain: int) -> bytes:
    separator = _SEPARATORS.get(chain)
    if separator is None:
        separator = _SEPARATORS[chain] = keccak(
            DOMAIN_TYPEHASH
            + keccak(DOMAIN_NAME.encode())
            + keccak(DOMAIN_VERSION.encode())
            + _uint(chain)
            + _address(SETTLEMENT_CONTRACT)
        )
    return separator


CONFIG_ADDRESSES = ("payer", "payerAuthorizer", "receiver", "receiverAuthorizer", "token")


def channel_id(config: dict[str, Any], network: str) -> str:
    """The channel id of a (checked) channel configuration: its EIP-712 hash, bound to the chain.
    Every voucher of a channel carries the same configuration: its id is hashed once (`_channel_id`)."""
    return _channel_id(
        tuple(config[k] for k in CONFIG_ADDRESSES), int(config["withdrawDelay"]), config["salt"], network
    )


@lru_cache(maxsize=4096)
def _channel_id(addresses: tuple[str, ...], withdraw_delay: int, salt: str, network: str) -> str:
    struct = keccak(
        CHANNEL_CONFIG_TYPEHASH
        + b"".join(_address(a) for a in addresses)
        + _uint(withdraw_delay)
        + bytes.fromhex(salt.removeprefix("0x"))
    )
    return "0x" + keccak(b"\x19\x01" + domain_separator(chain_id(network)) + struct).hex()


CONFIG_FIELDS = (*CONFIG_ADDRESSES, "withdrawDelay", "salt")


@lru_cache(maxsize=4096)
def config_valid(fields: tuple[tuple[type, Any], ...]) -> bool:
    """A channel configuration's fields (`CONFIG_FIELDS`, each with its type) have their shapes: five
    addresses, an integer delay (never a bool: the type is in the key, since True == 1 would share
    1's entry), a 32-byte salt. Every voucher of a channel carries the same ones: checked once."""
    *addresses, (delay_type, _), (salt_type, salt) = fields
    return (
        all(t is str and ADDRESS.fullmatch(a) for t, a in addresses)
        and delay_type is int
        and salt_type is str
        and WORD.fullmatch(salt) is not None
    )


def voucher_digest(channel: str, max_claimable: int, network: str) -> bytes:
    struct = keccak(VOUCHER_TYPEHASH + bytes.fromhex(channel.removeprefix("0x")) + _uint(max_claimable))
    return keccak(b"\x19\x01" + domain_separator(chain_id(network)) + struct)


# secp256k1's group order, and the largest `s` OpenZeppelin's ECDSA (and Circle's ECRecover) accept: n / 2.
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
HALF_N = SECP256K1_N // 2


def recover(digest: bytes, signature: str) -> str | None:
    """The address that signed `digest`, in the one encoding the settlement contract accepts; else None.

    `x402BatchSettlement` checks an EOA payer authorizer's voucher with OpenZeppelin's
    `ECDSA.recoverCalldata` (v5.5), and a claim carrying any other form reverts the whole batch:
    exactly 65 bytes `r || s || v`, `s <= n/2` (`ECDSAInvalidSignatureS` above it), `v` 27 or 28
    (ecrecover recovers nobody for any other `v`: `ECDSAInvalidSignature`), `r` and `s` non-zero and
    below n. Refused here although ecrecover maps them to the same signer: the high-s twin
    (`s' = n - s`, `v` flipped), `v` as 0/1, and EIP-2098's 64-byte compact form (`recoverCalldata`
    takes 65 bytes only). A payer authorizer is always an EOA (ERC-1271 is not consulted for it); a
    zero payer authorizer's voucher is the payer's own, checked by `SignatureChecker` (ERC-1271 for a
    contract payer), which only the facilitator can do: `local_verifiable` is False for those.
    """
    raw = bytes.fromhex(signature.removeprefix("0x"))
    if len(raw) != 65 or raw[64] not in (27, 28):
        return None
    r, s = int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:64], "big")
    if not (0 < r < SECP256K1_N and 0 < s <= HALF_N):
        return None
    try:
        key = PublicKey.from_signature_and_message(raw[:64] + bytes([raw[64] - 27]), digest, hasher=None)
    except ValueError:  # no point has this r: no signer
        return None
    return _address_of(key.format(compressed=False)[1:])


@lru_cache(maxsize=4096)
def _address_of(public_key: bytes) -> str:
    """An account's address: its public key's hash, once per payer (each of its vouchers recovers the same key)."""
    return "0x" + keccak(public_key)[-20:].hex()


def voucher_signer_matches(config: dict[str, Any], voucher: dict[str, Any], network: str) -> bool:
    """An EOA voucher, checked locally: its signer is the channel's payer authorizer."""
    digest = voucher_digest(voucher["channelId"], int(voucher["maxClaimableAmount"]), network)
    signer = recover(digest, voucher["signature"])
    return signer is not None and signer == config["payerAuthorizer"].lower()


def local_verifiable(config: dict[str, Any]) -> bool:
    """A voucher the gate can verify itself: signed by an EOA payer authorizer (a zero one means
    the payer is a contract wallet, whose signatures only the facilitator checks, ERC-1271)."""
    return config["payerAuthorizer"].lower() != ZERO_ADDRESS


@dataclass(frozen=True)
class Voucher:
    """A checked payload, as the channel store reads it."""

    kind: str  # "deposit" | "voucher"
    channel_id: str  # lowercase
    config: dict[str, Any]  # the channel configuration, as the payload spells it
    max_claimable: int
    signature: str
    deposit: int  # the deposit amount (0 for a voucher)

    @property
    def payer(self) -> str:
        return str(self.config["payer"]).lower()


def read(inner: dict[str, Any]) -> Voucher:
    """The voucher of a payload already passed by `check`."""
    voucher, config = inner["voucher"], inner["channelConfig"]
    deposit = int(inner["deposit"]["amount"]) if inner["type"] == "deposit" else 0
    return Voucher(
        kind=inner["type"],
        channel_id=voucher["channelId"].lower(),
        config=config,
        max_claimable=int(voucher["maxClaimableAmount"]),
        signature=voucher["signature"],
        deposit=deposit,
    )


class BatchSettlement:
    """The scheme, its deposits through one of the binding's two collectors: ERC-3009's (the token's
    own `receiveWithAuthorization`, x402's default) or Permit2's (any ERC-20 the payer approved to
    Permit2: `asset_transfer_method = "permit2"`, offered as `extra.assetTransferMethod`). Vouchers
    are the same either way."""

    scheme = SCHEME_NAME
    versions: tuple[int, ...] = (2,)  # payment channels are x402 v2 only
    v1_signable = False
    advertised: tuple[str, ...] = ("receiverAuthorizer",)  # the facilitator countersigns claims and refunds
    definitive_reasons = DEFINITIVE_REASONS
    nonce_used_reasons = NONCE_USED_REASONS

    def __init__(self, transfer_method: str) -> None:
        assert transfer_method in AUTHORIZATION_KEYS, transfer_method
        self.transfer_method = transfer_method
        self.authorization_key = AUTHORIZATION_KEYS[transfer_method]

    def extra(self) -> dict[str, Any]:
        # the channel parameters are the price's own (`receiverAuthorizer`, ... in its `extra`)
        return {"assetTransferMethod": "permit2"} if self.transfer_method == "permit2" else {}

    def check(self, inner: dict[str, Any], price: Price) -> None:
        kind = inner.get("type")
        if kind == "refund":
            raise Rejection("unsupported_payload")  # refunds are the gate's to start (`a2a-gate channels refund`)
        if not isinstance(kind, str) or kind not in PAYLOAD_KEYS:
            raise Rejection(PAYLOAD_TYPE)
        if set(inner) != PAYLOAD_KEYS[kind]:
            raise Rejection("invalid_payload")
        config, voucher = inner["channelConfig"], inner["voucher"]
        if not isinstance(config, dict) or set(config) != CONFIG_KEYS:
            raise Rejection("invalid_payload")
        if not isinstance(voucher, dict) or set(voucher) != VOUCHER_KEYS:
            raise Rejection("invalid_payload")
        fields = tuple((type(config[k]), config[k]) for k in CONFIG_FIELDS)
        if not all(t is str or t is int for t, _ in fields) or not config_valid(fields):  # (hashable first)
            raise Rejection("invalid_payload")
        delay = config["withdrawDelay"]
        cid, amount, signature = voucher["channelId"], voucher["maxClaimableAmount"], voucher["signature"]
        if not all(isinstance(v, str) for v in (cid, amount, signature)):
            raise Rejection("invalid_payload")
        if not WORD.fullmatch(cid) or not UINT.fullmatch(amount) or not SIGNATURE.fullmatch(signature):
            raise Rejection("invalid_payload")
        if int(amount) >= UINT128 or int(amount) == 0:
            raise Rejection("invalid_payload")
        if kind == "deposit":
            self._check_deposit(inner["deposit"], price)
            if self.transfer_method == "permit2":  # the witness binds the transfer to this channel
                witness = inner["deposit"]["authorization"]["permit2Authorization"]["witness"]
                if witness["channelId"].lower() != cid.lower():
                    raise Rejection(CHANNEL_ID_MISMATCH)
        # the configuration is the one this price offers, and the channel id is its hash
        extra = price.extra
        if config["receiver"].lower() != price.pay_to.lower():
            raise Rejection(RECEIVER_MISMATCH)
        if config["receiverAuthorizer"].lower() != str(extra.get("receiverAuthorizer", "")).lower():
            raise Rejection(RECEIVER_AUTHORIZER_MISMATCH)
        if config["token"].lower() != price.asset.lower():
            raise Rejection(TOKEN_MISMATCH)
        if delay != extra.get("withdrawDelay"):
            raise Rejection(WITHDRAW_DELAY_MISMATCH)
        if channel_id(config, price.network) != cid.lower():
            raise Rejection(CHANNEL_ID_MISMATCH)

    def _check_deposit(self, deposit: Any, price: Price) -> None:
        if not isinstance(deposit, dict) or set(deposit) != DEPOSIT_KEYS:
            raise Rejection("invalid_payload")
        authorization = deposit["authorization"]
        if not isinstance(authorization, dict) or set(authorization) != {self.authorization_key}:
            raise Rejection("unsupported_payload")  # a deposit through the collector this offer does not name
        if self.transfer_method == "permit2":
            self._check_permit2(deposit, authorization["permit2Authorization"], price)
            return
        erc3009 = authorization["erc3009Authorization"]
        if not isinstance(erc3009, dict) or set(erc3009) != ERC3009_KEYS:
            raise Rejection("invalid_payload")
        if not all(isinstance(erc3009[k], str) for k in ERC3009_KEYS) or not isinstance(deposit["amount"], str):
            raise Rejection("invalid_payload")
        numbers = (deposit["amount"], erc3009["validAfter"], erc3009["validBefore"])
        if not all(UINT.fullmatch(n) for n in numbers) or not SIGNATURE.fullmatch(erc3009["signature"]):
            raise Rejection("invalid_payload")
        if not (WORD.fullmatch(erc3009["salt"]) or UINT.fullmatch(erc3009["salt"])):
            raise Rejection("invalid_payload")
        if int(deposit["amount"]) >= UINT128:
            raise Rejection("invalid_payload")
        if int(deposit["amount"]) < int(price.extra.get("minDeposit", "0")):
            raise Rejection(DEPOSIT_BELOW_MIN)

    def _check_permit2(self, deposit: dict[str, Any], permit: Any, price: Price) -> None:
        """A Permit2 witness transfer of the deposit, to the Permit2 collector, bound to the voucher's
        channel (`witness.channelId`). Its signature is Permit2's to check: the facilitator verifies it."""
        if not isinstance(permit, dict) or set(permit) != PERMIT2_KEYS:
            raise Rejection("invalid_payload")
        permitted, witness = permit["permitted"], permit["witness"]
        if not isinstance(permitted, dict) or set(permitted) != {"token", "amount"}:
            raise Rejection("invalid_payload")
        if not isinstance(witness, dict) or set(witness) != {"channelId"}:
            raise Rejection("invalid_payload")
        words = (permit["from"], permit["spender"], permitted["token"], witness["channelId"], permit["signature"])
        numbers = (deposit["amount"], permitted["amount"], permit["nonce"], permit["deadline"])
        if not all(isinstance(v, str) for v in (*words, *numbers)):
            raise Rejection("invalid_payload")
        if not all(ADDRESS.fullmatch(a) for a in words[:3]) or not WORD.fullmatch(witness["channelId"]):
            raise Rejection("invalid_payload")
        if not SIGNATURE.fullmatch(permit["signature"]) or not all(UINT.fullmatch(n) for n in numbers):
            raise Rejection("invalid_payload")
        if int(deposit["amount"]) >= UINT128 or permitted["amount"] != deposit["amount"]:
            raise Rejection("invalid_payload")
        if permit["spender"].lower() != PERMIT2_DEPOSIT_COLLECTOR or permitted["token"].lower() != price.asset.lower():
            raise Rejection("invalid_payload")
        if int(deposit["amount"]) < int(price.extra.get("minDeposit", "0")):
            raise Rejection(DEPOSIT_BELOW_MIN)

    def window(self, inner: dict[str, Any]) -> tuple[int, int]:
        """A deposit's window (ERC-3009's validity, or the Permit2 deadline); a voucher has none (it is
        claimable until the channel closes)."""
        if inner.get("type") != "deposit":
            return 0, 2**62
        try:
            authorization = inner["deposit"]["authorization"][self.authorization_key]
            if self.transfer_method == "permit2":
                return 0, int(authorization["deadline"])
            return int(authorization["validAfter"]), int(authorization["validBefore"])
        except (KeyError, TypeError, ValueError):
            raise Rejection("invalid_payload") from None

    def named_payer(self, inner: dict[str, Any]) -> str:
        return address_at(inner, "channelConfig", "payer")

    def nonce_key(self, inner: dict[str, Any], network: str, asset: str) -> str:
        """Network, channel and cumulative amount: one voucher increment buys one delivery."""
        voucher = inner.get("voucher")
        voucher = voucher if isinstance(voucher, dict) else {}
        cid, amount = str(voucher.get("channelId", "")).lower(), str(voucher.get("maxClaimableAmount", ""))
        return "|".join((network, SCHEME_NAME, cid, amount))

    def authorization(self, payload: dict[str, Any], requirements: dict[str, Any], network: str) -> None:
        return None  # the deposit's nonce is the collector's; the chain is asked about channels instead


SCHEME = BatchSettlement("eip3009")
PERMIT2_SCHEME = BatchSettlement("permit2")
