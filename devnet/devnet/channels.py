"""The development facilitator's ``batch-settlement`` side: the package's scheme over the
simulated ``x402BatchSettlement`` contract, and the dev routes around it.

Deciding is the x402 package's own ``BatchSettlementEvmFacilitator`` (deposit verify and
settle, voucher and refund verify, ``claim`` / ``settle`` / ``refund`` settle actions). It
reaches the chain only through ``LedgerEvmSigner``, which runs the contract
(``devnet.batch_settlement``) among its simulated contracts.

The facilitator holds a receiver-authorizer key and advertises its address in ``/supported``
(``extra.receiverAuthorizer``); a server may name it in its offers and leave claim and refund
signatures to the facilitator, or name its own and sign them itself. The default key is a
fixed, public development key (the dev chain's money is not real); ``--receiver-authorizer-key``
or ``A2A_GATE_DEVNET_RECEIVER_AUTHORIZER_KEY`` replaces it. Neither is ever logged.
"""

from __future__ import annotations

from typing import Any

from eth_utils import keccak
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from x402.mechanisms.evm.batch_settlement.authorizer_signer import LocalAuthorizerSigner
from x402.mechanisms.evm.batch_settlement.facilitator.scheme import BatchSettlementEvmFacilitator
from x402.mechanisms.evm.batch_settlement.types import is_settle_payload
from x402.schemas import PaymentPayload, PaymentRequirements, SettleResponse

from .batch_settlement import EVENT_TOPICS, BatchSettlementContract
from .chain import LedgerEvmSigner

__all__ = ["DEV_RECEIVER_AUTHORIZER_KEY", "ChannelFacilitator", "channel_routes"]

#: The development receiver-authorizer key: public on purpose, dev chain only.
DEV_RECEIVER_AUTHORIZER_KEY = "0x" + keccak(text="a2a-gate dev receiver authorizer").hex()

#: How far one ``/dev/chain/advanceTime`` may move the contract's clock (a year).
MAX_ADVANCE_SECONDS = 365 * 24 * 3600


class DevBatchSettlementFacilitator(BatchSettlementEvmFacilitator):
    """The package's scheme, with the ``settle`` action's amount read from its ``Settled`` log.

    The package decodes that log with the signer's web3 contract object, which a ledger-backed
    signer does not have; without this the answer's ``amount`` would always be empty.
    """

    def __init__(self, signer: LedgerEvmSigner, contract: BatchSettlementContract, **kwargs: Any) -> None:
        super().__init__(signer, **kwargs)
        self._contract = contract

    def settle(self, payload: PaymentPayload, requirements: PaymentRequirements, context: Any = None) -> SettleResponse:
        result = super().settle(payload, requirements, context)
        if result.success and not result.amount and is_settle_payload(payload.payload):
            _, logs = self._contract.receipt(result.transaction) or ("", [])
            settled = [log for log in logs if log["topics"][0] == EVENT_TOPICS["Settled"]]
            amount = sum(int(log["data"], 16) for log in settled)
            result = result.model_copy(update={"amount": str(amount)})
        return result


class ChannelFacilitator:
    """The simulated contract, attached to ``signer``, and the package's scheme over it."""

    def __init__(
        self, signer: LedgerEvmSigner, contract: BatchSettlementContract, receiver_authorizer_key: str | None = None
    ) -> None:
        self.contract = contract
        try:
            self.authorizer = LocalAuthorizerSigner(receiver_authorizer_key or DEV_RECEIVER_AUTHORIZER_KEY)
        except Exception:  # noqa: BLE001 -- whatever the key was, say so without it
            raise ValueError("the receiver-authorizer key is not a 32-byte secp256k1 private key") from None
        self.scheme = DevBatchSettlementFacilitator(signer, self.contract, authorizer_signer=self.authorizer)

    def snapshot(self) -> dict[str, Any]:
        """Every channel and every receiver's totals, for ``GET /dev/channels``."""
        return self.contract.snapshot()


async def dev_advance_time(request: Request) -> Response:
    """Move the contract's clock forward (past a withdraw delay) without waiting."""
    try:
        body = await request.json()
    except ValueError:
        body = None
    seconds = body.get("seconds") if isinstance(body, dict) else None
    if type(seconds) is not int or not 0 <= seconds <= MAX_ADVANCE_SECONDS:
        return JSONResponse(
            {"error": "invalid_request", "detail": f"seconds must be an integer from 0 to {MAX_ADVANCE_SECONDS}"},
            status_code=400,
        )
    contract = request.app.state.channels.contract
    contract.time_offset += seconds
    return JSONResponse({"now": contract.now(), "offset": contract.time_offset})


async def dev_channels(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(request.app.state.channels.snapshot))


def channel_routes() -> list[Route]:
    return [
        Route("/dev/chain/advanceTime", dev_advance_time, methods=["POST"]),
        Route("/dev/channels", dev_channels, methods=["GET"]),
    ]
