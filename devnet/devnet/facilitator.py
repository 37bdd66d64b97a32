"""A development x402 facilitator backed by a simulated token ledger.

It speaks the standard facilitator HTTP API (``POST /verify``, ``POST /settle``,
``GET /supported``, and the bazaar's ``GET /discovery/resources``: ``devnet.discovery``)
and decides every payment with the x402 package's own EVM schemes: ``exact`` (v2 and v1;
EIP-3009, and Permit2 in v2) and ``upto`` (v2, Permit2). Only the blockchain is fake: the
schemes talk to ``LedgerEvmSigner``
(``devnet.chain``), which answers the contract calls they make (``balanceOf``,
``authorizationState``, ``transferWithAuthorization``, the x402 Permit2 proxies'
``settle`` and so on) from a SQLite ledger (``devnet.ledger``) instead of an RPC
node; Permit2 and the proxies are ``devnet.permit2`` (``permit2=False`` leaves
them off the chain, and Permit2 payments are refused as unsupported).

``trust_signatures=True`` is a development-only mode for benchmarks: signature
recovery is skipped, everything else (amounts, recipient, time window, nonces,
balances) is still checked. Never point real money at it.

Tests can make the facilitator misbehave through ``POST /dev/faults``
(``devnet.faults``; they apply to every scheme alike) and count charges and read
balances through ``GET /dev/ledger``. The simulated chain
answers Ethereum JSON-RPC at ``POST /rpc`` and takes the transactions anyone may send
to the token without the facilitator: ``POST /dev/chain/cancelAuthorization`` (a payer
gives up an authorization it signed) and ``POST /dev/chain/transferWithAuthorization``
(someone else submits a signed authorization first).
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from x402 import x402FacilitatorSync
from x402.mechanisms.evm.batch_settlement import SCHEME_BATCH_SETTLEMENT
from x402.mechanisms.evm.constants import SCHEME_EXACT, SCHEME_UPTO
from x402.mechanisms.evm.exact import ExactEvmFacilitatorScheme
from x402.mechanisms.evm.exact.v1 import ExactEvmSchemeV1Facilitator
from x402.mechanisms.evm.types import is_permit2_payload
from x402.mechanisms.evm.upto import UptoEvmFacilitatorScheme
from x402.schemas import (
    PaymentPayload,
    PaymentPayloadV1,
    PaymentRequirements,
    PaymentRequirementsV1,
    SettleResponse,
    VerifyResponse,
)
from x402.schemas.helpers import detect_version, parse_payment_payload, parse_payment_requirements

from .batch_settlement import BatchSettlementContract
from .chain import (
    DEV_CHAIN_ID,
    DEV_NETWORK,
    DEV_NETWORK_V1,
    FACILITATOR_ADDRESS,
    ChainRpc,
    JsonRpcError,
    LedgerEvmSigner,
    TokenInfo,
    default_tokens,
)
from .channel_requests import channel_payer, check_channel_payload
from .channels import ChannelFacilitator, channel_routes
from .discovery import Catalog, discovery_resources
from .faults import DEV_FAULT_REASON, FaultInjector
from .ledger import DEFAULT_INITIAL_BALANCE, DevLedger, LedgerRevert, Transfer
from .permit2 import Permit2Contracts

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
    "run",
]

logger = logging.getLogger(__name__)

#: Reason code for Permit2 payments when the dev chain runs without Permit2 (``permit2=False``).
UNSUPPORTED_PERMIT2 = "unsupported_asset_transfer_method"

MAX_BODY_SIZE = 1024 * 1024
MAX_JSON_BRACKETS = 1000


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
        response = JSONResponse({"error": "unauthorized"}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
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
    amount = requirements.amount if isinstance(requirements, PaymentRequirements) else requirements.max_amount_required
    _require_uint(amount, "paymentRequirements amount")
    _require_address(requirements.pay_to, "paymentRequirements.payTo")
    _require_address(requirements.asset, "paymentRequirements.asset")

    inner = payload.payload
    if payload.get_scheme() == SCHEME_BATCH_SETTLEMENT:
        try:
            check_channel_payload(inner)
        except ValueError as exc:
            raise BadRequest(f"paymentPayload.payload: {exc}") from None
        return
    if is_permit2_payload(inner):
        _check_permit2_shape(inner)
        return
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


def _check_permit2_shape(inner: dict[str, Any]) -> None:
    """A Permit2 payload's fields, typed (the schemes would raise on a missing or malformed one)."""
    auth = inner.get("permit2Authorization")
    if not isinstance(auth, dict):
        raise BadRequest("paymentPayload.payload.permit2Authorization must be an object")
    permitted, witness = auth.get("permitted"), auth.get("witness")
    if not isinstance(permitted, dict) or not isinstance(witness, dict):
        raise BadRequest("permit2Authorization.permitted and .witness must be objects")
    for name, value in (("from", auth.get("from")), ("spender", auth.get("spender"))):
        _require_address(value, f"permit2Authorization.{name}")
    _require_address(permitted.get("token"), "permit2Authorization.permitted.token")
    _require_address(witness.get("to"), "permit2Authorization.witness.to")
    if "facilitator" in witness:
        _require_address(witness["facilitator"], "permit2Authorization.witness.facilitator")
    for name, value in (("nonce", auth.get("nonce")), ("deadline", auth.get("deadline"))):
        _require_uint(value, f"permit2Authorization.{name}")
    _require_uint(permitted.get("amount"), "permit2Authorization.permitted.amount")
    _require_uint(witness.get("validAfter"), "permit2Authorization.witness.validAfter")
    _require_hex(inner.get("signature"), "payload.signature")


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


async def _apply_fault(request: Request, kind: str, mode: str) -> Response | None:
    """Return the faulty response for this call, or None to answer normally."""
    if mode == "none" or mode.startswith("late:"):
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
        return _model_response(VerifyResponse(is_valid=False, invalid_reason=DEV_FAULT_REASON, payer=payer))
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
    except ValueError:
        return None, ""
    payer = _dig(data, "paymentPayload", "payload", "authorization", "from")
    if payer is None:
        payer = _dig(data, "paymentPayload", "payload", "permit2Authorization", "from")
    if payer is None:
        payer = channel_payer(_dig(data, "paymentPayload", "payload"))
    network = _dig(data, "paymentRequirements", "network")
    return (
        payer if isinstance(payer, str) else None,
        network if isinstance(network, str) else "",
    )


def _dig(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _payer_of(payload: PaymentPayload | PaymentPayloadV1) -> str | None:
    if channel_payer(payload.payload) is not None:
        return channel_payer(payload.payload)
    authorization = payload.payload.get("authorization")
    if isinstance(authorization, dict):
        return authorization.get("from")
    permit = payload.payload.get("permit2Authorization")
    return permit.get("from") if isinstance(permit, dict) else None


def _unsupported_reason(payload: PaymentPayload | PaymentPayloadV1, permit2: bool) -> str | None:
    """Why this facilitator cannot take the payment at all, or None.

    The network is checked here because x402's registry widens
    ``eip155:84532`` to ``eip155:*``, and the simulated chain is Base Sepolia only.
    ``upto`` is Permit2 only and x402 v2 only; without Permit2 (``permit2=False``) the chain
    has no Permit2 contract, and a Permit2 payment is refused as unsupported, as it is in x402 v1.
    """
    scheme = payload.get_scheme()
    if scheme == SCHEME_BATCH_SETTLEMENT and payload.x402_version == 2:
        return None if payload.get_network() == DEV_NETWORK else "invalid_network"
    if scheme != SCHEME_EXACT and not (scheme == SCHEME_UPTO and permit2 and payload.x402_version == 2):
        return "unsupported_scheme"
    if is_permit2_payload(payload.payload) and not (permit2 and payload.x402_version == 2):
        return UNSUPPORTED_PERMIT2
    network = DEV_NETWORK if payload.x402_version == 2 else DEV_NETWORK_V1
    return None if payload.get_network() == network else "invalid_network"


async def verify(request: Request) -> Response:
    return await _decide(request, "verify")


async def settle(request: Request) -> Response:
    return await _decide(request, "settle")


async def _decide(request: Request, kind: str) -> Response:
    """One verify or settle call: faults first, then the x402 scheme, off the event loop."""
    state = request.app.state
    state.calls[kind] += 1
    mode = state.faults.take(kind)
    faulty = await _apply_fault(request, kind, mode)
    if faulty is not None:
        return faulty
    answer = await _answer(request, kind)
    if mode.startswith("late:"):  # decided (a settle has moved the money); the answer comes late
        await anyio.sleep(float(mode.removeprefix("late:")))
    return answer


async def _answer(request: Request, kind: str) -> Response:
    state = request.app.state
    try:
        payload, requirements = await _parse_payment_request(request)
    except BadRequest as exc:
        return _error(400, "invalid_request", str(exc))
    reason = _unsupported_reason(payload, state.permit2 is not None)
    try:
        if reason is not None:
            result = _refusal(kind, reason, payload, requirements)
        else:
            result = await run_in_threadpool(getattr(state.facilitator, kind), payload, requirements)
    except (ValueError, TypeError, KeyError) as exc:
        return _error(400, "invalid_request", f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        logger.error("%s failed unexpectedly: %s", kind, type(exc).__name__, exc_info=True)
        return _error(500, "internal_error")
    if isinstance(result, SettleResponse) and result.success:  # a settled resource enters the bazaar
        await run_in_threadpool(state.discovery.record, payload, requirements)
    exact = payload.get_scheme() == SCHEME_EXACT
    if exact and isinstance(result, SettleResponse) and result.success and result.amount is None:
        # The exact scheme always moves exactly the required amount; say so.
        result = result.model_copy(update={"amount": requirements.get_amount()})
    if isinstance(result, VerifyResponse):
        outcome = f"valid={result.is_valid} reason={result.invalid_reason}"
    else:
        outcome = f"success={result.success} reason={result.error_reason} tx={result.transaction}"
    logger.info("%s v%s payer=%s %s", kind, payload.x402_version, result.payer, outcome)
    return _model_response(result)


def _refusal(kind: str, reason: str, payload: Any, requirements: Any) -> VerifyResponse | SettleResponse:
    """The answer for a payment the dev chain cannot take at all."""
    if kind == "verify":
        return VerifyResponse(is_valid=False, invalid_reason=reason, payer=_payer_of(payload))
    return SettleResponse(
        success=False, error_reason=reason, payer=_payer_of(payload), transaction="", network=str(requirements.network)
    )


async def chain_rpc(request: Request) -> Response:
    """The simulated chain's Ethereum JSON-RPC (``eth_call``, ``eth_getLogs``, ``eth_getTransactionReceipt``)."""
    try:
        call = _load_json(await request.body())
    except ValueError as exc:
        return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": str(exc)}})
    if not isinstance(call, dict):
        return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "not an object"}})
    params = call.get("params")
    try:
        result = await run_in_threadpool(
            request.app.state.chain.answer, call.get("method"), params if isinstance(params, list) else []
        )
    except JsonRpcError as exc:
        return JSONResponse({"jsonrpc": "2.0", "id": call.get("id"), "error": {"code": exc.code, "message": str(exc)}})
    return JSONResponse({"jsonrpc": "2.0", "id": call.get("id"), "result": result})


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
    """Settlements, cancellations and call counts; ``?address=A&address=B[&asset=T]`` adds their balances.

    ``permit2_settlements`` are the Permit2 proxies' (``exact`` by Permit2, ``upto``): the amount
    moved, and ``permitted_amount``, the ceiling the payer signed.
    """
    state = request.app.state
    addresses = request.query_params.getlist("address")
    asset = request.query_params.get("asset") or next(iter(state.signer.tokens))
    try:
        for address in (*addresses, asset):
            _require_address(address, "address")
    except BadRequest as exc:
        return _error(400, "invalid_request", str(exc))
    settlements = await run_in_threadpool(state.ledger.settlements)
    cancellations = await run_in_threadpool(state.ledger.cancellations)
    content: dict[str, Any] = {
        "settlements": settlements,
        "cancellations": cancellations,
        "verify_calls": state.calls["verify"],
        "settle_calls": state.calls["settle"],
    }
    if state.permit2 is not None:
        content["permit2_settlements"] = await run_in_threadpool(state.permit2.settlements)
    if addresses:
        balances = [await run_in_threadpool(state.signer.get_balance, a, asset) for a in addresses]
        content["balances"] = {a: str(b) for a, b in zip(addresses, balances, strict=True)}
        content["asset"] = asset
    return JSONResponse(content)


async def _chain_request(request: Request, fields: tuple[str, ...]) -> dict[str, Any]:
    """A direct transaction's fields, all present and well-formed, or BadRequest."""
    try:
        data = _load_json(await request.body())
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    for name in fields:
        if name in ("asset", "authorizer", "from", "to"):
            _require_address(data.get(name), name)
        elif name == "nonce":
            _require_hex(data.get(name), name, length=32)
        elif name == "signature":
            _require_hex(data.get(name), name, length=65)
        else:
            _require_uint(data.get(name), name)
    return data


async def _chain_transaction(request: Request, fields: tuple[str, ...], send: Any) -> Response:
    try:
        data = await _chain_request(request, fields)
    except BadRequest as exc:
        return _error(400, "invalid_request", str(exc))
    try:
        tx_hash = await run_in_threadpool(send, data)
    except LedgerRevert as exc:
        return _error(400, "reverted", exc.reason)
    return JSONResponse({"transactionHash": tx_hash})


async def dev_cancel_authorization(request: Request) -> Response:
    """EIP-3009 ``cancelAuthorization(authorizer, nonce, signature)``, sent to the token directly."""
    signer = request.app.state.signer

    def send(data: dict[str, Any]) -> str:
        signature = bytes.fromhex(data["signature"].removeprefix("0x"))
        return signer.cancel_authorization(data["asset"], data["authorizer"], data["nonce"], signature)

    return await _chain_transaction(request, ("asset", "authorizer", "nonce", "signature"), send)


async def dev_transfer_with_authorization(request: Request) -> Response:
    """``transferWithAuthorization`` sent to the token directly, by anyone holding the signature."""
    signer = request.app.state.signer
    fields = ("asset", "from", "to", "value", "validAfter", "validBefore", "nonce", "signature")

    def send(data: dict[str, Any]) -> str:
        transfer = Transfer.create(
            network=signer.network,
            asset=data["asset"],
            from_address=data["from"],
            to_address=data["to"],
            value=int(data["value"]),
            valid_after=int(data["validAfter"]),
            valid_before=int(data["validBefore"]),
            nonce=data["nonce"],
        )
        return signer.submit_transfer(transfer, bytes.fromhex(data["signature"].removeprefix("0x")))

    return await _chain_transaction(request, fields, send)


def create_facilitator_app(
    db_path: str,
    *,
    trust_signatures: bool = False,
    initial_balance: int = DEFAULT_INITIAL_BALANCE,
    auth_token: str | None = None,
    permit2: bool = True,
    receiver_authorizer_key: str | None = None,
) -> Starlette:
    """Build the facilitator app over the SQLite ledger at ``db_path``.

    ``trust_signatures=True`` is the dev-trusting benchmark mode described in
    the module docstring. ``app.state.ledger`` exposes the ledger to tests.
    ``permit2`` (the default) puts Permit2 and x402's Permit2 proxies on the chain
    (``devnet.permit2``) and serves ``exact`` by Permit2 and ``upto`` (x402 v2).
    ``receiver_authorizer_key`` is the key the ``batch-settlement`` scheme signs claims and
    refunds with for channels that name it (``devnet.channels``).
    """
    ledger = DevLedger(db_path, initial_balance=initial_balance)
    contracts = Permit2Contracts(ledger, trust_signatures=trust_signatures) if permit2 else None
    channel_contract = BatchSettlementContract(ledger, trust_signatures=trust_signatures, permit2=contracts)
    signer = LedgerEvmSigner(
        ledger, trust_signatures=trust_signatures, contracts=[*([contracts] if contracts else []), channel_contract]
    )
    facilitator = x402FacilitatorSync()
    facilitator.register([DEV_NETWORK], ExactEvmFacilitatorScheme(signer))
    facilitator.register_v1([DEV_NETWORK_V1], ExactEvmSchemeV1Facilitator(signer))
    if contracts is not None:
        facilitator.register([DEV_NETWORK], UptoEvmFacilitatorScheme(signer))
    channels = ChannelFacilitator(signer, channel_contract, receiver_authorizer_key)
    facilitator.register([DEV_NETWORK], channels.scheme)

    routes = [
        Route("/verify", verify, methods=["POST"]),
        Route("/settle", settle, methods=["POST"]),
        Route("/supported", supported, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/discovery/resources", discovery_resources, methods=["GET"]),
        Route("/dev/faults", dev_faults, methods=["POST"]),
        Route("/dev/ledger", dev_ledger, methods=["GET"]),
        Route("/dev/chain/cancelAuthorization", dev_cancel_authorization, methods=["POST"]),
        Route("/dev/chain/transferWithAuthorization", dev_transfer_with_authorization, methods=["POST"]),
        Route("/rpc", chain_rpc, methods=["POST"]),
        *channel_routes(),
    ]
    middleware = [Middleware(BearerAuthMiddleware, token=auth_token)] if auth_token else []
    app = Starlette(routes=routes, middleware=middleware, max_body_size=MAX_BODY_SIZE)
    app.state.ledger = ledger
    app.state.signer = signer
    app.state.permit2 = contracts
    app.state.chain = ChainRpc(signer)
    app.state.facilitator = facilitator
    app.state.faults = FaultInjector()
    app.state.discovery = Catalog()
    app.state.calls = {"verify": 0, "settle": 0}
    app.state.trust_signatures = trust_signatures
    app.state.channels = channels
    return app


def run(
    host: str = "127.0.0.1",
    port: int = 8402,
    db_path: str = "dev-ledger.db",
    trust_signatures: bool = False,
    *,
    initial_balance: int = DEFAULT_INITIAL_BALANCE,
    auth_token: str | None = None,
    receiver_authorizer_key: str | None = None,
    log_level: str = "info",
    permit2: bool = True,
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
        permit2=permit2,
        receiver_authorizer_key=receiver_authorizer_key,
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level)
