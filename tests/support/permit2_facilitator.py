"""The development facilitator (Permit2 on its chain, ``devnet.permit2``) with the counts attack tests read.

A production facilitator built on the x402 package accepts Permit2: its exact-EVM scheme verifies
``payload.permit2Authorization`` whenever that key is present, whatever else the payload holds.
The development facilitator runs that same scheme, unchanged, over its simulated Permit2 and x402
proxy contracts. ``/dev/counts`` says how many verify and settle calls reached it and how many
settlements moved money, so a test can tell "refused by the gate" from "refused by the chain".
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse

from devnet.facilitator import create_facilitator_app


def create_permit2_facilitator_app(db_path: str) -> Starlette:
    app = create_facilitator_app(db_path)

    async def counts(request: Request) -> JSONResponse:
        state = request.app.state
        permit2 = await run_in_threadpool(state.permit2.settlements)
        eip3009 = await run_in_threadpool(state.ledger.settlements)
        return JSONResponse(
            {
                **state.calls,
                "settled": len(permit2) + len(eip3009),
                "permit2_settlements": len(permit2),
            }
        )

    app.add_route("/dev/counts", counts, methods=["GET"])
    return app
