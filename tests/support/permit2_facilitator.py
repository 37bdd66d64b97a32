"""A facilitator that takes Permit2 payments the way the x402 package's own does.

The development facilitator refuses Permit2 (its simulated chain has no Permit2
contract). A production facilitator built on the x402 package accepts it: its
exact-EVM scheme verifies ``payload.permit2Authorization`` whenever that key is present,
whatever else the payload holds. This one runs that same scheme, unchanged, over the
development ledger with the two things Permit2 needs on chain: the payer's standing
approval of the Permit2 contract, and the x402 Permit2 proxy's `settle`, which spends
each Permit2 nonce once. It exists to attack the gate with; never a development tool.
"""

from __future__ import annotations

import hashlib
from typing import Any

from eth_utils import to_checksum_address
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from x402 import x402FacilitatorSync
from x402.mechanisms.evm.constants import PERMIT2_ADDRESS, TX_STATUS_SUCCESS, X402_EXACT_PERMIT2_PROXY_ADDRESS
from x402.mechanisms.evm.exact import ExactEvmFacilitatorScheme
from x402.mechanisms.evm.types import TransactionReceipt
from x402.schemas.helpers import parse_payment_payload, parse_payment_requirements

from devnet.chain import DEV_NETWORK, LedgerEvmSigner
from devnet.ledger import DevLedger

MAX_UINT256 = 2**256 - 1


class Permit2LedgerSigner(LedgerEvmSigner):
    """The development chain plus Permit2: approvals granted, proxy settles spend a nonce once."""

    def __init__(self, ledger: DevLedger) -> None:
        super().__init__(ledger)
        self.permit2_nonces: dict[tuple[str, int], str] = {}  # (owner, nonce) -> transaction

    def read_contract(self, address: str, abi: list[dict[str, Any]], function_name: str, *args: Any) -> Any:
        if function_name == "allowance" and to_checksum_address(args[1]) == to_checksum_address(PERMIT2_ADDRESS):
            return MAX_UINT256  # the payer approved Permit2 once, as Permit2 requires
        return super().read_contract(address, abi, function_name, *args)

    def write_contract(
        self, address: str, abi: list[dict[str, Any]], function_name: str, *args: Any, data_suffix: str | None = None
    ) -> str:
        if to_checksum_address(address) != to_checksum_address(X402_EXACT_PERMIT2_PROXY_ADDRESS):
            return super().write_contract(address, abi, function_name, *args, data_suffix=data_suffix)
        permit, owner = args[0], to_checksum_address(args[1])
        key = (owner, int(permit[1]))
        if key in self.permit2_nonces:
            raise RuntimeError("execution reverted: InvalidNonce")  # Permit2 spends a nonce once
        tx = "0x" + hashlib.sha256(f"permit2|{owner}|{permit[1]}".encode()).hexdigest()
        self.permit2_nonces[key] = tx
        return tx

    def wait_for_transaction_receipt(self, tx_hash: str) -> TransactionReceipt:
        if tx_hash in self.permit2_nonces.values():
            return TransactionReceipt(status=TX_STATUS_SUCCESS, block_number=1, tx_hash=tx_hash, logs=[])
        return super().wait_for_transaction_receipt(tx_hash)


def create_permit2_facilitator_app(db_path: str) -> Starlette:
    signer = Permit2LedgerSigner(DevLedger(db_path))
    facilitator = x402FacilitatorSync()
    facilitator.register([DEV_NETWORK], ExactEvmFacilitatorScheme(signer))
    calls = {"verify": 0, "settle": 0, "valid": 0, "settled": 0}

    async def decide(request: Request, kind: str) -> JSONResponse:
        calls[kind] += 1
        body = await request.json()
        payload = parse_payment_payload(body["paymentPayload"])
        requirements = parse_payment_requirements(2, body["paymentRequirements"])
        result = await run_in_threadpool(getattr(facilitator, kind), payload, requirements)
        calls["valid" if kind == "verify" else "settled"] += bool(
            getattr(result, "is_valid", None) or getattr(result, "success", None)
        )
        return JSONResponse(result.model_dump(mode="json", by_alias=True, exclude_none=True))

    async def verify(request: Request) -> JSONResponse:
        return await decide(request, "verify")

    async def settle(request: Request) -> JSONResponse:
        return await decide(request, "settle")

    async def supported(request: Request) -> JSONResponse:
        return JSONResponse(facilitator.get_supported().model_dump(mode="json", by_alias=True, exclude_none=True))

    async def counts(request: Request) -> JSONResponse:
        return JSONResponse({**calls, "permit2_settlements": len(signer.permit2_nonces)})

    return Starlette(
        routes=[
            Route("/verify", verify, methods=["POST"]),
            Route("/settle", settle, methods=["POST"]),
            Route("/supported", supported, methods=["GET"]),
            Route("/healthz", lambda request: JSONResponse({"status": "ok"}), methods=["GET"]),
            Route("/dev/counts", counts, methods=["GET"]),
        ]
    )
