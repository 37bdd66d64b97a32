"""The shape of a ``batch-settlement`` payload, checked before the x402 package sees it.

The package's facilitator reads its payloads with ``from_dict`` and ``int()`` / ``bytes.fromhex``
and trusts what it finds; a field of the wrong type would surface as an exception from deep
inside it. The development facilitator answers such a body with a 400 instead (``ValueError``
here becomes its ``invalid_request``), naming the field and never echoing its value.
"""

from __future__ import annotations

import re
from typing import Any

from x402.mechanisms.evm.batch_settlement.constants import (
    PAYLOAD_TYPE_CLAIM,
    PAYLOAD_TYPE_DEPOSIT,
    PAYLOAD_TYPE_REFUND,
    PAYLOAD_TYPE_SETTLE,
    PAYLOAD_TYPE_VOUCHER,
)

__all__ = ["channel_payer", "check_channel_payload"]

_UINT = re.compile(r"[0-9]{1,78}")
_HEX_BYTES = re.compile(r"0x(?:[0-9a-fA-F]{2})*")
_UINT128 = 2**128
_MAX_CLAIMS = 1000
_CONFIG_ADDRESSES = ("payer", "payerAuthorizer", "receiver", "receiverAuthorizer", "token")


def check_channel_payload(inner: Any) -> None:
    """Raise ``ValueError`` unless ``inner`` is a well-formed deposit, voucher, refund, claim or settle."""
    if not isinstance(inner, dict):
        raise ValueError("paymentPayload.payload must be an object")
    kind = inner.get("type")
    if kind in (PAYLOAD_TYPE_DEPOSIT, PAYLOAD_TYPE_VOUCHER, PAYLOAD_TYPE_REFUND):
        _config(inner.get("channelConfig"), "channelConfig")
        voucher = _object(inner.get("voucher"), "voucher")
        _hex(voucher.get("channelId"), "voucher.channelId", 32)
        _uint(voucher.get("maxClaimableAmount"), "voucher.maxClaimableAmount", _UINT128)
        _hex(voucher.get("signature"), "voucher.signature")
    if kind == PAYLOAD_TYPE_DEPOSIT:
        _deposit(_object(inner.get("deposit"), "deposit"))
    elif kind == PAYLOAD_TYPE_REFUND:
        _refund(inner)
    elif kind == PAYLOAD_TYPE_CLAIM:
        _claims(inner.get("claims"), "claims")
        _optional_hex(inner, "claimAuthorizerSignature")
    elif kind == PAYLOAD_TYPE_SETTLE:
        _hex(inner.get("receiver"), "receiver", 20)
        _hex(inner.get("token"), "token", 20)
    elif kind != PAYLOAD_TYPE_VOUCHER:
        raise ValueError("payload.type must be deposit, voucher, refund, claim or settle")


def channel_payer(inner: Any) -> str | None:
    """The payer a channel payload names, for answers given without reading it further."""
    config = inner.get("channelConfig") if isinstance(inner, dict) else None
    payer = config.get("payer") if isinstance(config, dict) else None
    return payer if isinstance(payer, str) else None


def _deposit(deposit: dict[str, Any]) -> None:
    _uint(deposit.get("amount"), "deposit.amount", _UINT128)
    authorization = _object(deposit.get("authorization"), "deposit.authorization")
    erc3009 = authorization.get("erc3009Authorization")
    permit2 = authorization.get("permit2Authorization")
    if (erc3009 is None) == (permit2 is None):
        raise ValueError("deposit.authorization needs exactly one of erc3009Authorization, permit2Authorization")
    if erc3009 is not None:
        fields = _object(erc3009, "erc3009Authorization")
        _uint(fields.get("validAfter"), "erc3009Authorization.validAfter")
        _uint(fields.get("validBefore"), "erc3009Authorization.validBefore")
        _hex(fields.get("salt"), "erc3009Authorization.salt", 32)
        _hex(fields.get("signature"), "erc3009Authorization.signature")
    else:
        fields = _object(permit2, "permit2Authorization")
        _hex(fields.get("from"), "permit2Authorization.from", 20)
        _hex(fields.get("spender"), "permit2Authorization.spender", 20)
        _uint(fields.get("nonce"), "permit2Authorization.nonce")
        _uint(fields.get("deadline"), "permit2Authorization.deadline")
        _hex(fields.get("signature"), "permit2Authorization.signature")
        permitted = _object(fields.get("permitted"), "permit2Authorization.permitted")
        _hex(permitted.get("token"), "permit2Authorization.permitted.token", 20)
        _uint(permitted.get("amount"), "permit2Authorization.permitted.amount")
        witness = _object(fields.get("witness"), "permit2Authorization.witness")
        _hex(witness.get("channelId"), "permit2Authorization.witness.channelId", 32)


def _refund(inner: dict[str, Any]) -> None:
    if "amount" in inner:
        _uint(inner["amount"], "amount", _UINT128)
    if "refundNonce" in inner:
        _uint(inner["refundNonce"], "refundNonce")
    if "claims" in inner:
        _claims(inner["claims"], "claims", allow_empty=True)
    _optional_hex(inner, "refundAuthorizerSignature")
    _optional_hex(inner, "claimAuthorizerSignature")


def _claims(value: Any, name: str, *, allow_empty: bool = False) -> None:
    if not isinstance(value, list) or (not value and not allow_empty) or len(value) > _MAX_CLAIMS:
        raise ValueError(f"{name} must be a list of 1 to {_MAX_CLAIMS} claims")
    for index, claim in enumerate(value):
        entry = _object(claim, f"{name}[{index}]")
        voucher = _object(entry.get("voucher"), f"{name}[{index}].voucher")
        _config(voucher.get("channel"), f"{name}[{index}].voucher.channel")
        _uint(voucher.get("maxClaimableAmount"), f"{name}[{index}].voucher.maxClaimableAmount", _UINT128)
        _hex(entry.get("signature"), f"{name}[{index}].signature")
        _uint(entry.get("totalClaimed"), f"{name}[{index}].totalClaimed", _UINT128)


def _config(value: Any, name: str) -> None:
    config = _object(value, name)
    for field in _CONFIG_ADDRESSES:
        _hex(config.get(field), f"{name}.{field}", 20)
    delay = config.get("withdrawDelay")
    if isinstance(delay, bool) or not isinstance(delay, (int, str)):
        raise ValueError(f"{name}.withdrawDelay must be an integer")
    _uint(delay, f"{name}.withdrawDelay", 2**40)
    _hex(config.get("salt"), f"{name}.salt", 32)


def _object(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object")
    return value


def _uint(value: Any, name: str, bound: int = 2**256) -> None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{name} must be a decimal integer string")
    text = str(value)
    if not _UINT.fullmatch(text) or int(text) >= bound:
        raise ValueError(f"{name} must be a decimal integer below 2^{bound.bit_length() - 1}")


def _hex(value: Any, name: str, length: int | None = None) -> None:
    if not isinstance(value, str) or not _HEX_BYTES.fullmatch(value):
        raise ValueError(f"{name} must be a 0x-prefixed hex string")
    if length is not None and len(value) != 2 + 2 * length:
        raise ValueError(f"{name} must be {length} bytes")


def _optional_hex(inner: dict[str, Any], name: str) -> None:
    if inner.get(name) is not None:
        _hex(inner[name], name)
