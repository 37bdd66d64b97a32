"""The console's JSON API: the same records, summary and exports as `a2a-gate payments`, the
attention queue, the channels with unclaimed charges, request rates, and the re-open action.

Read-only but for `POST reopen`, which is `a2a-gate reconcile --reopen TASK` (`Claims.reopen`): the
token rides in a header, never a cookie, so a page elsewhere cannot make a browser send it; the
action still asks for a JSON body (a cross-site form cannot send one without a preflight this API
never grants) and refuses a request a browser says came from another origin (`Origin`,
`Sec-Fetch-Site`). Every filter is checked as the command checks it (`gate.payment_filters`): a bad
one is a 400 naming it, never a 500. Nothing secret is in any answer: payments are named by their
token's digest, never the token, its signature or its nonce.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gate import payment_exports as exports
from gate.claims import Claim, ClaimState
from gate.console.rates import RequestRates
from gate.flows.channel.flow import ChannelFlow
from gate.flows.channel.store import Channel
from gate.parts import GateParts
from gate.payment_filters import BadFilter, export_checked, record_filters
from gate.payment_records import Filters, PaymentRecord, PaymentRecords
from gate.payment_summary import summary
from server.database import DatabaseUnavailable

DEFAULT_LIMIT, MAX_LIMIT = 100, 1000
SUMMARY_SINCE = "30d"  # the summary's default window: the chart's month
REOPEN_BODY_BYTES = 4096
RECORD_PARAMS = frozenset({"since", "until", "agent", "payer", "state", "limit"})
SUMMARY_PARAMS = frozenset({"since", "until", "agent"})
EXPORT_PARAMS = frozenset({"what", "format", "since", "until", "agent", "payer", "state"})
MEDIA = {"csv": "text/csv; charset=utf-8", "json": "application/json"}

Handler = Callable[["ConsoleApi", Request], Awaitable[Response]]


def bad_request(error: str) -> JSONResponse:
    return JSONResponse({"error": error}, status_code=400)


def answered(handler: Handler) -> Handler:
    """A handler whose refusals are JSON: a bad filter 400, the database away 503."""

    async def answer(self: ConsoleApi, request: Request) -> Response:
        try:
            return await handler(self, request)
        except BadFilter as exc:
            return bad_request(str(exc))
        except DatabaseUnavailable:
            return JSONResponse({"error": "the database is unavailable; try again"}, status_code=503)

    return answer


def params(request: Request, allowed: frozenset[str]) -> dict[str, str]:
    """The query's parameters, each once and each one this endpoint takes."""
    found: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name not in allowed:
            raise BadFilter(f"unknown parameter {name!r} (this endpoint takes {', '.join(sorted(allowed))})")
        if name in found:
            raise BadFilter(f"parameter {name!r} given twice")
        found[name] = value
    return found


def filters_of(query: dict[str, str]) -> Filters:
    return record_filters(
        query.get("since"), query.get("until"), query.get("agent"), query.get("payer"), query.get("state"),
        time.time(), prefix="",
    )  # fmt: skip


def limit_of(query: dict[str, str]) -> int:
    text = query.get("limit", str(DEFAULT_LIMIT))
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise BadFilter(f"limit {text!r}: a whole number from 1 to {MAX_LIMIT}")
    return int(text)


def record_view(record: PaymentRecord) -> dict[str, Any]:
    """A record as the exports write it, with its story: every row of the log, oldest first."""
    story = [
        {"at": exports.utc(s.at), "action": s.action, "error": s.error, "transaction": s.transaction}
        for s in record.steps
    ]
    return {**exports.record_row(record), "story": story}


def claim_view(claim: Claim, now: float) -> dict[str, Any]:
    view = {
        "payment_id": claim.token_digest,
        "agent": claim.agent,
        "task_id": claim.task_id,
        "payer": claim.payer,
        "error": claim.last_error,
        "settle_passes": claim.settle_passes,
        "updated_at": exports.utc(claim.updated_at),
    }
    if claim.state == ClaimState.NEEDS_ATTENTION:
        view["reopenable"] = bool(claim.sealed_payment)  # what `Claims.reopen` needs: the payment kept sealed
    if claim.state == ClaimState.SETTLE_FAILED:
        view["next_retry_at"] = exports.utc(claim.next_settle_at)
        view["retry_in_seconds"] = round(max(0.0, claim.next_settle_at - now), 1)
    return view


def channel_view(channel: Channel) -> dict[str, Any]:
    finalizable = channel.finalizable_in()
    return {
        "channel": channel.channel_id,
        "payer": channel.payer,
        "network": channel.network,
        "asset": channel.asset,
        "charged": str(channel.charged),
        "claimed": str(channel.total_claimed),
        "unclaimed": str(channel.unclaimed),
        "balance": str(channel.balance),
        "oldest_unclaimed_charge_at": exports.utc(channel.first_charged_at or None),
        "oldest_unclaimed_age_seconds": round(max(0.0, channel.now - channel.first_charged_at), 1)
        if channel.first_charged_at
        else None,
        "withdrawal_finalizable_in_seconds": None if finalizable is None else round(finalizable, 1),
        "failed_claims": channel.claim_failures,
        "state": channel.claim_state(),
    }


def same_origin(request: Request) -> str | None:
    """Why a state-changing request is refused as cross-site, or None: it came as JSON, and a browser
    that names where it came from names this origin."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        return "the action takes a JSON body (Content-Type: application/json)"
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"a request from another site ({site}) is refused"
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    if origin is not None and origin != own:
        return "a request from another origin is refused"
    return None


class ConsoleApi:
    def __init__(self, parts: GateParts, rates: RequestRates) -> None:
        self.parts = parts
        self.rates_of = rates
        self.db = parts.claims.db

    @answered
    async def records(self, request: Request) -> Response:
        """`GET records`: newest first, filtered as `a2a-gate payments records`, each with its story."""
        query = params(request, RECORD_PARAMS)
        filters, limit = filters_of(query), limit_of(query)
        found = []
        async for record in PaymentRecords(self.db).read(filters, newest_first=True):
            found.append(record_view(record))
            if len(found) >= limit:
                break
        return JSONResponse({"records": found, "limit": limit})

    @answered
    async def summary(self, request: Request) -> Response:
        """`GET summary`: the daily summary's rows (per UTC day, agent and money), the last 30 days unless asked."""
        query = params(request, SUMMARY_PARAMS)
        query.setdefault("since", SUMMARY_SINCE)
        filters = filters_of(query)
        rows = await summary(self.db, filters.since, filters.until, filters.agent)
        return JSONResponse({"rows": list(exports.summary_rows(rows))})

    @answered
    async def attention(self, request: Request) -> Response:
        """`GET attention`: the payments an operator must look at, and the owed ones with their next retry."""
        params(request, frozenset())
        claims = self.parts.claims
        now = await claims.database_time()
        needs = await claims.listing(ClaimState.NEEDS_ATTENTION, MAX_LIMIT)
        owed = await claims.listing(ClaimState.SETTLE_FAILED, MAX_LIMIT)
        return JSONResponse(
            {
                "needs_attention": [claim_view(c, now) for c in needs],
                "owed": sorted((claim_view(c, now) for c in owed), key=lambda v: v["next_retry_at"]),
            }
        )

    @answered
    async def channels(self, request: Request) -> Response:
        """`GET channels`: every channel holding charges not claimed on chain (oldest charge first)."""
        limit = limit_of(params(request, frozenset({"limit"})))
        flow = next((f for f in self.parts.flows if isinstance(f, ChannelFlow)), None)
        found: list[Channel] = []
        if flow is not None:
            async for page in flow.store.unclaimed():
                found.extend(page)
        found.sort(key=lambda c: (c.first_charged_at or float("inf"), c.channel_id))
        return JSONResponse({"channels": [channel_view(c) for c in found[:limit]], "count": len(found)})

    @answered
    async def rates(self, request: Request) -> Response:
        """`GET rates`: answers per second over the last minute, by outcome (this process's)."""
        params(request, frozenset())
        return JSONResponse(self.rates_of.read())

    @answered
    async def export(self, request: Request) -> Response:
        """`GET export`: `a2a-gate payments export`, streamed (records oldest first, or the summary)."""
        query = params(request, EXPORT_PARAMS)
        what, fmt = query.get("what", "records"), query.get("format", "csv")
        filters = filters_of(query)
        export_checked(what, fmt, filters, prefix="")
        rows: AsyncIterator[dict[str, Any]]
        if what == "summary":
            rows = exports.each(
                exports.summary_rows(await summary(self.db, filters.since, filters.until, filters.agent))
            )
            columns = exports.SUMMARY_COLUMNS
        else:
            rows, columns = exports.record_rows(PaymentRecords(self.db).read(filters)), exports.RECORD_COLUMNS
        disposition = f'attachment; filename="payments-{what}.{fmt}"'
        return StreamingResponse(
            exports.encoded(rows, columns, fmt), media_type=MEDIA[fmt], headers={"Content-Disposition": disposition}
        )

    @answered
    async def reopen(self, request: Request) -> Response:
        """`POST reopen` `{"task_id": "..."}`: a payment needing attention back to owed, with a fresh
        pass budget (`a2a-gate reconcile --reopen TASK`); the reconciler settles it on its next pass."""
        refused = same_origin(request)
        if refused is not None:
            return JSONResponse({"error": refused}, status_code=403)
        body = await request.body()
        if len(body) > REOPEN_BODY_BYTES:
            return bad_request("the body is too large")
        try:
            asked = json.loads(body)
        except (ValueError, RecursionError):
            return bad_request("the body is not JSON")
        task_id = asked.get("task_id") if isinstance(asked, dict) else None
        if not isinstance(task_id, str) or not task_id.strip() or len(task_id) > 200:
            return bad_request('the body names one task: {"task_id": "..."}')
        reopened = await self.parts.claims.reopen(task_id)
        if not reopened:
            return JSONResponse({"error": "no payment of that task needs attention", "reopened": 0}, status_code=404)
        return JSONResponse({"reopened": reopened})
