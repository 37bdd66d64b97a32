"""Per-call facilitator credentials for tests: a one-use bearer, like a short-lived JWT.

`create_headers` is what a gate's ``[facilitator] auth`` names; it has the x402
package's `create_headers` shape. `OneUseBearer` is the facilitator's side: it
refuses a missing, foreign or reused credential with 401.
"""

from __future__ import annotations

import hmac
import itertools
import os
import uuid

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

SECRET_ENV = "A2A_GATE_TEST_FACILITATOR_SECRET"
_serial = itertools.count()


def mint(secret: str) -> str:
    ticket = f"{uuid.uuid4().hex}.{next(_serial)}"
    return f"Bearer {ticket}.{hmac.new(secret.encode(), ticket.encode(), 'sha256').hexdigest()}"


def create_headers() -> dict[str, dict[str, str]]:
    secret = os.environ[SECRET_ENV]
    return {call: {"Authorization": mint(secret)} for call in ("verify", "settle", "supported")}


async def create_headers_async() -> dict[str, dict[str, str]]:
    return create_headers()


def broken() -> dict[str, dict[str, str]]:
    raise RuntimeError(f"credential store down, key was {os.environ.get(SECRET_ENV, '')}")


class OneUseBearer:
    """Require a fresh, valid `mint`ed bearer on every call except /healthz."""

    def __init__(self, app: ASGIApp, secret: str) -> None:
        self.app = app
        self.secret = secret
        self.seen: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in ("/healthz", "/dev/ledger", "/dev/faults"):
            presented = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            if not self.valid(presented):
                await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
                return
            self.seen.append(presented)
        await self.app(scope, receive, send)

    def valid(self, presented: str) -> bool:
        ticket, _, mac = presented.removeprefix("Bearer ").rpartition(".")
        expected = hmac.new(self.secret.encode(), ticket.encode(), "sha256").hexdigest()
        return bool(ticket) and hmac.compare_digest(mac, expected) and presented not in self.seen
