"""A development x402 facilitator backed by a simulated token ledger.

It speaks the standard facilitator HTTP API (``POST /verify``, ``POST /settle``,
``GET /supported``) and decides every payment with the x402 package's own
exact-EVM schemes (v2 and v1). Only the blockchain is fake: the schemes talk to
``LedgerEvmSigner``, which answers the contract calls they make
(``balanceOf``, ``authorizationState``, ``transferWithAuthorization`` and so
on) from a SQLite ledger (``gate.dev_ledger``) instead of an RPC node.

``trust_signatures=True`` is a development-only mode for benchmarks: signature
recovery is skipped, everything else (amounts, recipient, time window, nonces,
balances) is still checked. Never point real money at it.

Tests can make the facilitator misbehave through ``POST /dev/faults`` and count
charges through ``GET /dev/ledger``.
"""

from __future__ import annotations

import argparse
import functools
import hmac
import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from typing import Any

import anyio
from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_keys import keys
from eth_utils import keccak, to_checksum_address
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from x402 import x402FacilitatorSync
from x402.mechanisms.evm.constants import (
    AUTHORIZATION_STATE_ABI,
    BALANCE_OF_ABI,
    EIP1271_MAGIC_VALUE,
    ERC20_ALLOWANCE_ABI,
    IS_VALID_SIGNATURE_ABI,
    MULTICALL3_ADDRESS,
    NAME_ABI,
    SCHEME_EXACT,
    TRANSFER_WITH_AUTHORIZATION_BYTES_ABI,
    TRANSFER_WITH_AUTHORIZATION_VRS_ABI,
    TX_STATUS_SUCCESS,
    VERSION_ABI,
)
from x402.mechanisms.evm.default_assets import DEFAULT_ASSETS
from x402.mechanisms.evm.eip712 import hash_eip3009_authorization
from x402.mechanisms.evm.exact import ExactEvmFacilitatorScheme
from x402.mechanisms.evm.exact.eip3009_utils import ERC20_TRANSFER_EVENT_TOPIC
from x402.mechanisms.evm.exact.v1 import ExactEvmSchemeV1Facilitator
from x402.mechanisms.evm.types import (
    ExactEIP3009Authorization,
    TransactionReceipt,
    TypedDataDomain,
    TypedDataField,
    is_permit2_payload,
)
from x402.schemas import (
    PaymentPayload,
    PaymentPayloadV1,
    PaymentRequirements,
    PaymentRequirementsV1,
    SettleResponse,
    VerifyResponse,
)
from x402.schemas.helpers import detect_version, parse_payment_payload, parse_payment_requirements

from .dev_ledger import DEFAULT_INITIAL_BALANCE, DevLedger, LedgerRevert, Transfer

__all__ = [
    "DEV_CHAIN_ID",
    "DEV_FAULT_REASON",
    "DEV_NETWORK",
    "DEV_NETWORK_V1",
    "FACILITATOR_ADDRESS",
    "FaultInjector",
    "LedgerEvmSigner",
    "TokenInfo",
    "create_facilitator_app",
    "default_tokens",
    "main",
    "run",
]

logger = logging.getLogger(__name__)

DEV_NETWORK = "eip155:84532"  # Base Sepolia, CAIP-2 (x402 v2)
DEV_NETWORK_V1 = "base-sepolia"  # the same chain under its x402 v1 name
DEV_CHAIN_ID = 84532

#: The address the facilitator claims to send transactions from (it never signs any).
FACILITATOR_ADDRESS = to_checksum_address(keccak(text="a2a-gate dev facilitator")[-20:])

#: Reason code used by the ``invalid`` fault.
DEV_FAULT_REASON = "dev_fault"

#: Reason code for Permit2 payments, which the dev chain does not support.
UNSUPPORTED_PERMIT2 = "unsupported_asset_transfer_method"

# Not in gate.dev_ledger: the ledger is pure state, signatures are the token's business.
REVERT_INVALID_SIGNATURE = "FiatTokenV2: invalid signature"

MAX_BODY_SIZE = 1024 * 1024
MAX_JSON_BRACKETS = 1000

# Stand-in bytecode: only its non-emptiness matters to the x402 package.
_TOKEN_CODE = bytes.fromhex("6080604052")
_TRUSTING_WALLET_CODE = bytes.fromhex("ef0100")


# ---------------------------------------------------------------------------
# Tokens and the signer adapter
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenInfo:
    """What the simulated token contract reports about itself (its EIP-712 domain)."""

    name: str
    version: str
    decimals: int = 6
    symbol: str = ""


def default_tokens(network: str = DEV_NETWORK) -> dict[str, TokenInfo]:
    """The x402 package's default assets, so token names and versions match its clients."""
    return {
        to_checksum_address(entry["asset"]): TokenInfo(
            name=entry["name"],
            version=entry["version"],
            decimals=entry["decimals"],
            symbol=entry["symbol"],
        )
        for entry in DEFAULT_ASSETS.get(network, [])
    }


def _function_table() -> dict[bytes, tuple[str, list[str], list[str]]]:
    """Selector -> (name, input types, output types) for the calls multicall may batch."""
    abis: list[list[dict[str, Any]]] = [
        BALANCE_OF_ABI,
        NAME_ABI,
        VERSION_ABI,
        AUTHORIZATION_STATE_ABI,
        ERC20_ALLOWANCE_ABI,
        IS_VALID_SIGNATURE_ABI,
        TRANSFER_WITH_AUTHORIZATION_VRS_ABI,
        TRANSFER_WITH_AUTHORIZATION_BYTES_ABI,
    ]
    table: dict[bytes, tuple[str, list[str], list[str]]] = {}
    for abi in abis:
        for entry in abi:
            inputs = [item["type"] for item in entry["inputs"]]
            outputs = [item["type"] for item in entry["outputs"]]
            selector = keccak(text=f"{entry['name']}({','.join(inputs)})")[:4]
            table[selector] = (entry["name"], inputs, outputs)
    return table


_FUNCTIONS = _function_table()
_ERROR_STRING_SELECTOR = keccak(text="Error(string)")[:4]


@functools.lru_cache(maxsize=4096)
def _recover_eoa(digest: bytes, signature: bytes) -> str | None:
    """ecrecover, cached because verify and settle recover the same signature.

    The pure-Python secp256k1 backend costs milliseconds per recovery.
    """
    if len(signature) != 65:
        return None
    v = signature[64]
    if v >= 27:
        v -= 27
    if v not in (0, 1):
        return None
    try:
        sig = keys.Signature(signature_bytes=signature[:64] + bytes([v]))
        return sig.recover_public_key_from_msg_hash(digest).to_checksum_address()
    except Exception:
        return None


class LedgerEvmSigner:
    """``FacilitatorEvmSigner`` that plays the token contract over a ``DevLedger``.

    The x402 schemes call it exactly as they would call a web3 signer; it
    answers like a FiatToken (USDC) contract on ``chain_id``. Code paths the
    dev ledger cannot honour (ERC-6492 wallet deployment, Permit2 settlement,
    arbitrary contracts) revert, which the schemes report as an ordinary
    invalid payment or failed settlement.

    With ``trust_signatures`` every non-token address looks like a smart
    wallet whose EIP-1271 ``isValidSignature`` accepts anything, and the token
    skips its own signature check. That is how the mode skips recovery without
    touching the package's verification logic.
    """

    def __init__(
        self,
        ledger: DevLedger,
        *,
        network: str = DEV_NETWORK,
        chain_id: int = DEV_CHAIN_ID,
        tokens: dict[str, TokenInfo] | None = None,
        trust_signatures: bool = False,
        address: str = FACILITATOR_ADDRESS,
    ) -> None:
        self.ledger = ledger
        self.network = network
        self.chain_id = chain_id
        self.tokens = {
            to_checksum_address(a): info for a, info in (tokens or default_tokens(network)).items()
        }
        self.trust_signatures = trust_signatures
        self.address = to_checksum_address(address)

    # -- FacilitatorEvmSigner ------------------------------------------------

    def get_addresses(self) -> list[str]:
        return [self.address]

    def get_chain_id(self) -> int:
        return self.chain_id

    def get_code(self, address: str) -> bytes:
        if to_checksum_address(address) in self.tokens:
            return _TOKEN_CODE
        return _TRUSTING_WALLET_CODE if self.trust_signatures else b""

    def get_balance(self, address: str, token_address: str) -> int:
        return self.ledger.balance_of(self.network, token_address, address)

    def read_contract(
        self, address: str, abi: list[dict[str, Any]], function_name: str, *args: Any
    ) -> Any:
        return self._call(address, function_name, args)

    def write_contract(
        self,
        address: str,
        abi: list[dict[str, Any]],
        function_name: str,
        *args: Any,
        data_suffix: str | None = None,
    ) -> str:
        token = self.tokens.get(to_checksum_address(address))
        if token is None or function_name != "transferWithAuthorization":
            raise LedgerRevert(f"dev ledger cannot execute {function_name} on {address}")
        transfer, signature = self._transfer_from_args(address, args)
        self._authorize(token, transfer, signature)
        return self.ledger.transfer_with_authorization(transfer)

    def send_transaction(self, to: str, data: bytes) -> str:
        # Only ERC-6492 factory deployments get here.
        raise LedgerRevert("dev ledger cannot deploy smart wallets (ERC-6492)")

    def wait_for_transaction_receipt(self, tx_hash: str) -> TransactionReceipt:
        row = self.ledger.settlement(tx_hash)
        if row is None:
            raise RuntimeError(f"transaction {tx_hash} not found in the dev ledger")
        log = {
            "address": row["asset"],
            "topics": [
                ERC20_TRANSFER_EVENT_TOPIC,
                _address_topic(row["from_address"]),
                _address_topic(row["to_address"]),
            ],
            "data": "0x" + int(row["amount"]).to_bytes(32, "big").hex(),
        }
        return TransactionReceipt(
            status=TX_STATUS_SUCCESS, block_number=1, tx_hash=tx_hash, logs=[log]
        )

    def verify_typed_data(
        self,
        address: str,
        domain: TypedDataDomain,
        types: dict[str, list[TypedDataField]],
        primary_type: str,
        message: dict[str, Any],
        signature: bytes,
    ) -> bool:
        """EOA-only EIP-712 check with eth-account (the exact schemes do their own)."""
        if self.trust_signatures:
            return True
        domain_data: dict[str, Any]
        if isinstance(domain, dict):
            domain_data = domain
        else:
            domain_data = {
                "name": domain.name,
                "version": domain.version,
                "chainId": domain.chain_id,
                "verifyingContract": domain.verifying_contract,
            }
        message_types = {
            name: [
                {"name": f.name, "type": f.type} if isinstance(f, TypedDataField) else f
                for f in fields
            ]
            for name, fields in types.items()
            if name != "EIP712Domain"
        }
        data = {
            key: "0x" + value.hex() if isinstance(value, bytes) else value
            for key, value in message.items()
        }
        try:
            signable = encode_typed_data(
                domain_data=domain_data, message_types=message_types, message_data=data
            )
            recovered = Account.recover_message(signable, signature=signature)
        except Exception:
            return False
        return recovered.lower() == address.lower()

    # -- the simulated contracts ---------------------------------------------

    def _call(self, address: str, function_name: str, args: tuple[Any, ...]) -> Any:
        target = to_checksum_address(address)
        if target == MULTICALL3_ADDRESS and function_name == "tryAggregate":
            return self._try_aggregate(args[1])
        token = self.tokens.get(target)
        if token is not None:
            return self._token_call(target, token, function_name, args)
        if self.trust_signatures and function_name == "isValidSignature":
            return EIP1271_MAGIC_VALUE
        raise LedgerRevert(f"{target} has no contract code in the dev ledger")

    def _token_call(
        self, asset: str, token: TokenInfo, function_name: str, args: tuple[Any, ...]
    ) -> Any:
        if function_name == "balanceOf":
            return self.ledger.balance_of(self.network, asset, args[0])
        if function_name == "authorizationState":
            return self.ledger.authorization_state(self.network, asset, args[0], args[1])
        if function_name == "transferWithAuthorization":  # eth_call: check, do not apply
            transfer, signature = self._transfer_from_args(asset, args)
            self._authorize(token, transfer, signature)
            self.ledger.check_transfer(transfer)
            return None
        if function_name == "name":
            return token.name
        if function_name == "version":
            return token.version
        if function_name == "symbol":
            return token.symbol
        if function_name == "decimals":
            return token.decimals
        if function_name == "allowance":
            return 0  # no approvals exist on the dev chain
        raise LedgerRevert(f"dev token does not implement {function_name}")

    def _transfer_from_args(self, asset: str, args: tuple[Any, ...]) -> tuple[Transfer, bytes]:
        if len(args) == 9:  # (from, to, value, validAfter, validBefore, nonce, v, r, s)
            v, r, s = args[6], args[7], args[8]
            signature = bytes(r) + bytes(s) + bytes([int(v)])
        elif len(args) == 7:  # (from, to, value, validAfter, validBefore, nonce, signature)
            signature = bytes(args[6])
        else:
            raise LedgerRevert("transferWithAuthorization: wrong number of arguments")
        transfer = Transfer.create(
            network=self.network,
            asset=asset,
            from_address=args[0],
            to_address=args[1],
            value=args[2],
            valid_after=args[3],
            valid_before=args[4],
            nonce=bytes(args[5]),
        )
        return transfer, signature

    def _authorize(self, token: TokenInfo, transfer: Transfer, signature: bytes) -> None:
        """The token's own signature check, against its real EIP-712 domain."""
        if self.trust_signatures:
            return
        authorization = ExactEIP3009Authorization(
            from_address=transfer.from_address,
            to=transfer.to_address,
            value=str(transfer.value),
            valid_after=str(transfer.valid_after),
            valid_before=str(transfer.valid_before),
            nonce=transfer.nonce,
        )
        digest = hash_eip3009_authorization(
            authorization, self.chain_id, transfer.asset, token.name, token.version
        )
        if _recover_eoa(digest, signature) != transfer.from_address:
            raise LedgerRevert(REVERT_INVALID_SIGNATURE)

    def _try_aggregate(self, calls: list[tuple[str, bytes]]) -> list[tuple[bool, bytes]]:
        """Multicall3 ``tryAggregate(false, calls)``: each call succeeds or reverts alone."""
        results = []
        for target, call_data in calls:
            entry = _FUNCTIONS.get(bytes(call_data[:4]))
            if entry is None:
                results.append((False, _encode_revert("unknown function selector")))
                continue
            name, input_types, output_types = entry
            try:
                args = tuple(abi_decode(input_types, bytes(call_data[4:])))
                value = self._call(target, name, args)
                encoded = abi_encode(output_types, [value]) if output_types else b""
                results.append((True, encoded))
            except LedgerRevert as exc:
                results.append((False, _encode_revert(exc.reason)))
            except Exception as exc:
                results.append((False, _encode_revert(str(exc))))
        return results


def _address_topic(address: str) -> str:
    return "0x" + "00" * 12 + address.lower().removeprefix("0x")


def _encode_revert(reason: str) -> bytes:
    return _ERROR_STRING_SELECTOR + abi_encode(["string"], [reason])


# ---------------------------------------------------------------------------
# Fault injection
# ---------------------------------------------------------------------------

FAULT_KINDS = ("verify", "settle")
_SIMPLE_FAULTS = ("none", "http500", "malformed", "invalid")


@dataclass
class _Fault:
    mode: str = "none"
    remaining: int | None = None  # None: until reset


def _parse_fault_mode(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("fault mode must be a string")
    if value in _SIMPLE_FAULTS:
        return value
    if value.startswith("slow:"):
        try:
            seconds = float(value.removeprefix("slow:"))
        except ValueError:
            raise ValueError(f"bad slow fault {value!r}") from None
        if not 0 <= seconds <= 600:
            raise ValueError("slow fault must be between 0 and 600 seconds")
        return value
    raise ValueError(f"unknown fault mode {value!r}")


class FaultInjector:
    """The faults the next verify/settle calls should suffer.

    Each POST replaces the whole configuration: a kind left out goes back to
    ``none``, so ``{}`` resets everything.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults = {kind: _Fault() for kind in FAULT_KINDS}

    def configure(self, spec: Any) -> None:
        """Validate and apply ``{"verify": MODE, "settle": MODE, "count": N}``."""
        if not isinstance(spec, dict):
            raise ValueError("fault spec must be a JSON object")
        unknown = set(spec) - {*FAULT_KINDS, "count"}
        if unknown:
            raise ValueError(f"unknown fault keys: {sorted(unknown)}")
        count = spec.get("count")
        if count is not None and (type(count) is not int or count < 0):
            raise ValueError("count must be a non-negative integer or null")
        faults = {
            kind: _Fault(_parse_fault_mode(spec.get(kind, "none")), count) for kind in FAULT_KINDS
        }
        with self._lock:
            self._faults = faults

    def take(self, kind: str) -> str:
        """Return the mode for this call of ``kind``, using up one count."""
        with self._lock:
            fault = self._faults[kind]
            if fault.mode == "none":
                return "none"
            if fault.remaining is not None:
                if fault.remaining <= 0:
                    self._faults[kind] = _Fault()
                    return "none"
                fault.remaining -= 1
            return fault.mode

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                kind: {"mode": f.mode, "remaining": f.remaining} for kind, f in self._faults.items()
            }


# ---------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------


class BadRequest(Exception):
    """The request body is not a well-formed verify/settle request."""


class BearerAuthMiddleware:
    """Require ``Authorization: Bearer <token>`` everywhere except ``/healthz``."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/healthz" or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        response = JSONResponse(
            {"error": "unauthorized"}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
        )
        await response(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        presented = Headers(scope=scope).get("authorization", "").encode()
        return hmac.compare_digest(presented, self.expected)


_UINT = re.compile(r"[0-9]+")
_HEX_BYTES = re.compile(r"0x(?:[0-9a-fA-F]{2})*")

PaymentPair = tuple[PaymentPayload | PaymentPayloadV1, PaymentRequirements | PaymentRequirementsV1]


async def _parse_payment_request(request: Request) -> PaymentPair:
    """Parse and sanity-check ``{"x402Version", "paymentPayload", "paymentRequirements"}``.

    Everything the x402 schemes would choke on (``int("")``, bad hex) is
    rejected here, so a malformed body is a 400 rather than an exception.
    """
    try:
        data = _load_json(await request.body())
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    raw_payload = data.get("paymentPayload")
    raw_requirements = data.get("paymentRequirements")
    if not isinstance(raw_payload, dict) or not isinstance(raw_requirements, dict):
        raise BadRequest("paymentPayload and paymentRequirements must be JSON objects")
    try:
        version = detect_version(raw_payload)
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"paymentPayload: {exc}") from None
    if type(version) is not int:
        raise BadRequest("paymentPayload.x402Version must be 1 or 2")
    if data.get("x402Version", version) != version:
        raise BadRequest("x402Version does not match paymentPayload.x402Version")
    try:
        payload = parse_payment_payload(raw_payload)
        requirements = parse_payment_requirements(version, raw_requirements)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise BadRequest(_describe_validation_error(exc)) from None
    _check_shape(payload, requirements)
    return payload, requirements


def _load_json(body: bytes) -> Any:
    """``json.loads`` that cannot be made to crash the process.

    py_ecc (pulled in by eth-account) raises the interpreter's recursion limit
    to 100000 at import, so deeply nested JSON overflows the C stack instead
    of raising RecursionError. No payment request has this many brackets.
    """
    if body.count(b"[") + body.count(b"{") > MAX_JSON_BRACKETS:
        raise ValueError("body nests too deeply")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise ValueError("body is not valid JSON") from None


def _describe_validation_error(exc: ValueError) -> str:
    """Field locations and messages only: input values may carry signatures."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    parts = [".".join(str(p) for p in e.get("loc", ())) + ": " + e.get("msg", "") for e in errors()]
    return "invalid request: " + "; ".join(parts)


def _check_shape(
    payload: PaymentPayload | PaymentPayloadV1,
    requirements: PaymentRequirements | PaymentRequirementsV1,
) -> None:
    amount = (
        requirements.amount
        if isinstance(requirements, PaymentRequirements)
        else requirements.max_amount_required
    )
    _require_uint(amount, "paymentRequirements amount")
    _require_address(requirements.pay_to, "paymentRequirements.payTo")
    _require_address(requirements.asset, "paymentRequirements.asset")

    inner = payload.payload
    if is_permit2_payload(inner):
        return  # refused as unsupported, see _unsupported_reason
    authorization = inner.get("authorization")
    if not isinstance(authorization, dict):
        raise BadRequest("paymentPayload.payload.authorization must be an object")
    _require_address(authorization.get("from"), "authorization.from")
    _require_address(authorization.get("to"), "authorization.to")
    for field in ("value", "validAfter", "validBefore"):
        _require_uint(authorization.get(field), f"authorization.{field}")
    _require_hex(authorization.get("nonce"), "authorization.nonce", length=32)
    signature = inner.get("signature")
    if signature is not None:
        _require_hex(signature, "payload.signature")


def _require_uint(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise BadRequest(f"{name} must be a decimal integer string")
    text = str(value)
    # The length check comes first: int() refuses strings over 4300 digits.
    if not _UINT.fullmatch(text) or len(text) > 78 or int(text) >= 2**256:
        raise BadRequest(f"{name} must be a uint256 decimal string")


def _require_address(value: Any, name: str) -> None:
    _require_hex(value, name, length=20)


def _require_hex(value: Any, name: str, length: int | None = None) -> None:
    if not isinstance(value, str) or not _HEX_BYTES.fullmatch(value):
        raise BadRequest(f"{name} must be a 0x-prefixed hex string")
    if length is not None and len(value) != 2 + 2 * length:
        raise BadRequest(f"{name} must be {length} bytes")


def _error(status_code: int, error: str, detail: str | None = None) -> JSONResponse:
    content = {"error": error} if detail is None else {"error": error, "detail": detail}
    return JSONResponse(content, status_code=status_code)


def _model_response(model: VerifyResponse | SettleResponse) -> JSONResponse:
    return JSONResponse(model.model_dump(mode="json", by_alias=True, exclude_none=True))


async def _apply_fault(request: Request, kind: str) -> Response | None:
    """Return the faulty response for this call, or None to answer normally."""
    mode = request.app.state.faults.take(kind)
    if mode == "none":
        return None
    if mode.startswith("slow:"):
        await anyio.sleep(float(mode.removeprefix("slow:")))
        return None
    if mode == "http500":
        return _error(500, DEV_FAULT_REASON, "injected http500")
    if mode == "malformed":
        return Response(b"<html>dev fault: not json", media_type="application/json")
    # "invalid": a well-formed refusal that never touches the ledger.
    payer, network = await _hints(request)
    if kind == "verify":
        return _model_response(
            VerifyResponse(is_valid=False, invalid_reason=DEV_FAULT_REASON, payer=payer)
        )
    return _model_response(
        SettleResponse(
            success=False,
            error_reason=DEV_FAULT_REASON,
            payer=payer,
            transaction="",
            network=network,
        )
    )


async def _hints(request: Request) -> tuple[str | None, str]:
    """Best-effort payer and network from a body we have not validated."""
    try:
        data = _load_json(await request.body())
        payer = data["paymentPayload"]["payload"]["authorization"]["from"]
        payer = payer if isinstance(payer, str) else None
    except Exception:
        payer, data = None, None
    try:
        network = str(data["paymentRequirements"]["network"])  # type: ignore[index]
    except Exception:
        network = ""
    return payer, network


def _payer_of(payload: PaymentPayload | PaymentPayloadV1) -> str | None:
    authorization = payload.payload.get("authorization")
    if isinstance(authorization, dict):
        return authorization.get("from")
    permit = payload.payload.get("permit2Authorization")
    return permit.get("from") if isinstance(permit, dict) else None


def _unsupported_reason(payload: PaymentPayload | PaymentPayloadV1) -> str | None:
    """Why this facilitator cannot take the payment at all, or None.

    The network is checked here because x402's registry widens
    ``eip155:84532`` to ``eip155:*``, and the simulated chain is Base Sepolia only.
    """
    if payload.get_scheme() != SCHEME_EXACT:
        return "unsupported_scheme"
    if is_permit2_payload(payload.payload):
        # The package's Permit2 path needs x402[extensions] and on-chain
        # allowances; the dev chain has neither.
        return UNSUPPORTED_PERMIT2
    network = DEV_NETWORK if payload.x402_version == 2 else DEV_NETWORK_V1
    return None if payload.get_network() == network else "invalid_network"


async def verify(request: Request) -> Response:
    state = request.app.state
    state.calls["verify"] += 1
    faulty = await _apply_fault(request, "verify")
    if faulty is not None:
        return faulty
    try:
        payload, requirements = await _parse_payment_request(request)
    except BadRequest as exc:
        return _error(400, "invalid_request", str(exc))
    reason = _unsupported_reason(payload)
    try:
        if reason is not None:
            result = VerifyResponse(is_valid=False, invalid_reason=reason, payer=_payer_of(payload))
        else:
            result = await run_in_threadpool(state.facilitator.verify, payload, requirements)
    except (ValueError, TypeError, KeyError) as exc:
        return _error(400, "invalid_request", f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        logger.error("verify failed unexpectedly: %s", type(exc).__name__, exc_info=True)
        return _error(500, "internal_error")
    logger.info(
        "verify v%s payer=%s valid=%s reason=%s",
        payload.x402_version,
        result.payer,
        result.is_valid,
        result.invalid_reason,
    )
    return _model_response(result)


async def settle(request: Request) -> Response:
    state = request.app.state
    state.calls["settle"] += 1
    faulty = await _apply_fault(request, "settle")
    if faulty is not None:
        return faulty
    try:
        payload, requirements = await _parse_payment_request(request)
    except BadRequest as exc:
        return _error(400, "invalid_request", str(exc))
    reason = _unsupported_reason(payload)
    try:
        if reason is not None:
            result = SettleResponse(
                success=False,
                error_reason=reason,
                payer=_payer_of(payload),
                transaction="",
                network=str(requirements.network),
            )
        else:
            result = await run_in_threadpool(state.facilitator.settle, payload, requirements)
    except (ValueError, TypeError, KeyError) as exc:
        return _error(400, "invalid_request", f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        logger.error("settle failed unexpectedly: %s", type(exc).__name__, exc_info=True)
        return _error(500, "internal_error")
    if result.success and result.amount is None:
        # The exact scheme always moves exactly the required amount; say so.
        result = result.model_copy(update={"amount": requirements.get_amount()})
    logger.info(
        "settle v%s payer=%s success=%s reason=%s tx=%s",
        payload.x402_version,
        result.payer,
        result.success,
        result.error_reason,
        result.transaction,
    )
    return _model_response(result)


async def supported(request: Request) -> Response:
    kinds = request.app.state.facilitator.get_supported()
    return JSONResponse(kinds.model_dump(mode="json", by_alias=True, exclude_none=True))


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def dev_faults(request: Request) -> Response:
    try:
        spec = _load_json(await request.body() or b"{}")
        request.app.state.faults.configure(spec)
    except ValueError as exc:
        return _error(400, "invalid_fault", str(exc))
    return JSONResponse(request.app.state.faults.snapshot())


async def dev_ledger(request: Request) -> Response:
    state = request.app.state
    settlements = await run_in_threadpool(state.ledger.settlements)
    return JSONResponse(
        {
            "settlements": settlements,
            "verify_calls": state.calls["verify"],
            "settle_calls": state.calls["settle"],
        }
    )


def create_facilitator_app(
    db_path: str,
    *,
    trust_signatures: bool = False,
    initial_balance: int = DEFAULT_INITIAL_BALANCE,
    auth_token: str | None = None,
) -> Starlette:
    """Build the facilitator app over the SQLite ledger at ``db_path``.

    ``trust_signatures=True`` is the dev-trusting benchmark mode described in
    the module docstring. ``app.state.ledger`` exposes the ledger to tests.
    """
    ledger = DevLedger(db_path, initial_balance=initial_balance)
    signer = LedgerEvmSigner(ledger, trust_signatures=trust_signatures)
    facilitator = x402FacilitatorSync()
    facilitator.register([DEV_NETWORK], ExactEvmFacilitatorScheme(signer))
    facilitator.register_v1([DEV_NETWORK_V1], ExactEvmSchemeV1Facilitator(signer))

    routes = [
        Route("/verify", verify, methods=["POST"]),
        Route("/settle", settle, methods=["POST"]),
        Route("/supported", supported, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/dev/faults", dev_faults, methods=["POST"]),
        Route("/dev/ledger", dev_ledger, methods=["GET"]),
    ]
    middleware = [Middleware(BearerAuthMiddleware, token=auth_token)] if auth_token else []
    app = Starlette(routes=routes, middleware=middleware, max_body_size=MAX_BODY_SIZE)
    app.state.ledger = ledger
    app.state.signer = signer
    app.state.facilitator = facilitator
    app.state.faults = FaultInjector()
    app.state.calls = {"verify": 0, "settle": 0}
    app.state.trust_signatures = trust_signatures
    return app


def run(
    host: str = "127.0.0.1",
    port: int = 8402,
    db_path: str = "dev-ledger.db",
    trust_signatures: bool = False,
    *,
    initial_balance: int = DEFAULT_INITIAL_BALANCE,
    auth_token: str | None = None,
    log_level: str = "info",
) -> None:
    """Serve the facilitator with uvicorn until interrupted."""
    import uvicorn

    if trust_signatures:
        logger.warning("DEV-TRUSTING MODE: payment signatures are NOT verified (benchmarks only)")
    app = create_facilitator_app(
        db_path,
        trust_signatures=trust_signatures,
        initial_balance=initial_balance,
        auth_token=auth_token,
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level)


def main(argv: list[str] | None = None) -> int:
    """``a2a-gate facilitator [--host H] [--port P] [--db PATH] [--trust-signatures]``."""
    parser = argparse.ArgumentParser(
        prog="a2a-gate facilitator",
        description="Development x402 facilitator over a simulated SQLite token ledger.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8402)
    parser.add_argument("--db", default="dev-ledger.db", help="SQLite ledger file")
    parser.add_argument(
        "--trust-signatures",
        action="store_true",
        help="dev-trusting mode for benchmarks: skip signature recovery",
    )
    parser.add_argument("--initial-balance", type=int, default=DEFAULT_INITIAL_BALANCE)
    parser.add_argument(
        "--auth-token",
        default=os.environ.get("A2A_GATE_FACILITATOR_TOKEN"),
        help="require this bearer token (default: $A2A_GATE_FACILITATOR_TOKEN)",
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run(
        args.host,
        args.port,
        args.db,
        args.trust_signatures,
        initial_balance=args.initial_balance,
        auth_token=args.auth_token,
        log_level=args.log_level,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
