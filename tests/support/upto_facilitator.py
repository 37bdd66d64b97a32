"""A facilitator that takes x402 `upto` payments the way the x402 package's own does, for tests.

It runs the package's upto facilitator scheme, unchanged, over the development ledger with
what Permit2 needs on chain: every payer's standing approval of the Permit2 contract, and
x402's upto proxy, whose `settle` spends each Permit2 nonce once and moves the settled
amount (at most the permitted one) from the owner to the witness's `to` on the ledger, so
a test reads the payer's balance falling by exactly what was charged.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

from eth_utils import to_checksum_address
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from x402 import x402FacilitatorSync
from x402.mechanisms.evm.constants import PERMIT2_ADDRESS, TX_STATUS_SUCCESS, X402_UPTO_PERMIT2_PROXY_ADDRESS
from x402.mechanisms.evm.types import TransactionReceipt
from x402.mechanisms.evm.upto import UptoEvmFacilitatorScheme
from x402.schemas.helpers import parse_payment_payload, parse_payment_requirements

from devnet.chain import DEV_NETWORK, LedgerEvmSigner
from devnet.ledger import DevLedger

MAX_UINT256 = 2**256 - 1


class UptoLedgerSigner(LedgerEvmSigner):
    """The development chain plus Permit2 and x402's upto proxy."""

    def __init__(self, ledger: DevLedger) -> None:
        super().__init__(ledger)
        self.lock = threading.Lock()
        self.settled: dict[str, dict[str, Any]] = {}  # tx -> the transfer it made
        self.nonces: set[tuple[str, int]] = set()

    def read_contract(self, address: str, abi: list[dict[str, Any]], function_name: str, *args: Any) -> Any:
        if function_name == "allowance" and to_checksum_address(args[1]) == to_checksum_address(PERMIT2_ADDRESS):
            return MAX_UINT256  # every payer approved Permit2 once, as Permit2 requires
        if self._is_proxy(address) and function_name == "settle":  # the verify's simulation
            self._check(*args)
            return None
        return super().read_contract(address, abi, function_name, *args)

    def write_contract(
        self, address: str, abi: list[dict[str, Any]], function_name: str, *args: Any, data_suffix: str | None = None
    ) -> str:
        if not self._is_proxy(address):
            return super().write_contract(address, abi, function_name, *args, data_suffix=data_suffix)
        permit, amount, owner, witness = args[0], int(args[1]), to_checksum_address(args[2]), args[3]
        token, to = to_checksum_address(permit[0][0]), to_checksum_address(witness[0])
        with self.lock:
            self._check(*args)
            self.nonces.add((owner, int(permit[1])))
            paid = self.ledger.balance_of(DEV_NETWORK, token, owner)
            received = self.ledger.balance_of(DEV_NETWORK, token, to)
            self.ledger.set_balance(DEV_NETWORK, token, owner, paid - amount)
            self.ledger.set_balance(DEV_NETWORK, token, to, received + amount)
            tx = "0x" + hashlib.sha256(f"upto|{owner}|{permit[1]}".encode()).hexdigest()
            self.settled[tx] = {"from": owner, "to": to, "amount": amount, "token": token}
        return tx

    def wait_for_transaction_receipt(self, tx_hash: str) -> TransactionReceipt:
        if tx_hash in self.settled:
            return TransactionReceipt(status=TX_STATUS_SUCCESS, block_number=1, tx_hash=tx_hash, logs=[])
        return super().wait_for_transaction_receipt(tx_hash)

    def _check(self, permit: Any, amount: Any, owner: Any, witness: Any, signature: Any) -> None:
        """What the proxy reverts on: a spent nonce, more than permitted, more than the owner holds."""
        owner = to_checksum_address(owner)
        if (owner, int(permit[1])) in self.nonces:
            raise RuntimeError("execution reverted: InvalidNonce")
        if int(amount) > int(permit[0][1]):
            raise RuntimeError("execution reverted: AmountExceedsPermitted")
        if self.ledger.balance_of(DEV_NETWORK, to_checksum_address(permit[0][0]), owner) < int(amount):
            raise RuntimeError("execution reverted: insufficient balance")

    @staticmethod
    def _is_proxy(address: str) -> bool:
        return to_checksum_address(address) == to_checksum_address(X402_UPTO_PERMIT2_PROXY_ADDRESS)


def create_upto_facilitator_app(db_path: str) -> Starlette:
    ledger = DevLedger(db_path)
    signer = UptoLedgerSigner(ledger)
    facilitator = x402FacilitatorSync()
    facilitator.register([DEV_NETWORK], UptoEvmFacilitatorScheme(signer))
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
        return JSONResponse({**calls, "transfers": list(signer.settled.values())})

    async def balance(request: Request) -> JSONResponse:
        address, asset = request.path_params["address"], request.query_params["asset"]
        return JSONResponse({"balance": str(ledger.balance_of(DEV_NETWORK, asset, address))})

    return Starlette(
        routes=[
            Route("/verify", verify, methods=["POST"]),
            Route("/settle", settle, methods=["POST"]),
            Route("/supported", supported, methods=["GET"]),
            Route("/healthz", lambda request: JSONResponse({"status": "ok"}), methods=["GET"]),
            Route("/dev/counts", counts, methods=["GET"]),
            Route("/dev/balance/{address}", balance, methods=["GET"]),
        ]
    )
