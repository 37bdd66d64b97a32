"""The Starlette application: routes, start-up, and the one branch on the principal.

`POST /a2a/{agent}` decides exactly once who is calling. A principal takes the free
path below; everyone else goes to the anonymous path the app was given
(`server.anonymous`; in a2a-gate, the payment gate), which never sees a principal and
which a principal never touches.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from email.utils import formatdate, parsedate_to_datetime

from starlette.applications import Starlette
from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import Message, Receive, Scope, Send

from server import request_log, signing_key, tracing
from server.anonymous import AnonymousFactory, KeysOnly, Parts
from server.card_signing import CardSigner
from server.cards import INDEX_PATHS, agent_card, index_entry
from server.config import ConfigError, Settings
from server.database import Database, DatabaseUnavailable
from server.engines import open_database
from server.execution import PAST_DEADLINE, Runner
from server.headers import header
from server.jsonrpc import (
    INTERNAL_ERROR,
    UNSUPPORTED_OPERATION,
    Call,
    RpcError,
    answering_call,
    error_response,
    internal_error,
    read_call,
    result_response,
    store_unavailable,
)
from server.methods import Methods, plan_send
from server.metrics import CONSOLE_PATH, Metrics, MetricsAccess, agent_label
from server.principals import Principals, create_tables
from server.proxy import TrustedProxyMiddleware, public_base_url
from server.registry import AgentRegistry
from server.reload import Reloaded, reloading_on_sighup, waiting_for_restart
from server.request_counts import FLUSH_SECONDS, RequestCounts
from server.request_log import RequestInfo
from server.shutdown import draining_on_signals
from server.tasks import TaskStore, agent_message, set_status
from server.traced_store import traced

logger = logging.getLogger("a2a_gate")

DATABASE_START_SECONDS = 30.0  # how long a starting process waits for its database


class Services:
    """Everything a request needs, built once per process."""

    def __init__(
        self,
        settings: Settings,
        anonymous: AnonymousFactory = KeysOnly,
        reread: Callable[[], Settings] | None = None,
    ) -> None:
        self.settings = settings
        self.reread = reread  # the configuration as the file says now (None: nothing to read again)
        # the operator's signing key, read once at start (a reload keeps it; a new key needs a restart)
        self.signing_key = signing_key.load(settings.signing)
        self.sign_card = CardSigner(self.signing_key)
        self.tracing = tracing.start(settings.tracing)  # once, for the process: off costs nothing per request
        self.db = open_database(settings.database)
        if tracing.active():
            self.db = traced(self.db)
        self.store = TaskStore(self.db, deadline_seconds=settings.task_deadline_seconds)
        self.principals = Principals(self.db, settings.keys)
        self.agents = AgentRegistry(settings.agents)
        self.runner = Runner(self.store, self.agents)
        self.methods = Methods(self.store, self.runner, streams=settings.streams)
        self.metrics = Metrics()
        self.counts = RequestCounts(self.db)
        self.anonymous = anonymous(
            Parts(settings, self.db, self.store, self.agents, self.runner, self.methods, self.metrics, self.signing_key)
        )
        request_log.allow(self.anonymous.outcomes)
        self.console = self.anonymous.console()  # the operator's console, if the path keeps one
        self.methods.scrub = self.anonymous.scrub_message  # what the anonymous path says may not stay in a message
        self.runner.agent_view = self.anonymous.agent_view  # ... and what an agent may not see of one
        self.configured_at = time.time()  # cards come from the configuration read then (a reload moves it)
        self.background: list[asyncio.Task[None]] = []
        self.draining: asyncio.Task[None] | None = None

    async def open_store(self) -> None:
        """Connect to the database and bring every table up to date: the server's, then the anonymous path's."""
        await open_until_ready(self.db, DATABASE_START_SECONDS)
        await self.store.create_tables()
        await create_tables(self.db)
        await self.counts.create_tables()
        await self.anonymous.open_store()

    async def start(self) -> None:
        await self.open_store()
        await self.store.sync_clock()
        await self.anonymous.start()
        self.background.append(asyncio.create_task(self.runner.follow_cancel_requests()))
        self.background.append(asyncio.create_task(self._store_counts()))

    async def _store_counts(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            await self.counts.flush()
            await self.principals.flush_use()

    def begin_drain(self) -> None:
        """Stop taking on work and drain what runs (`Runner.drain`); once, from the stop signal on."""
        if self.draining is None:
            self.methods.watches.stop()  # streams of tasks running elsewhere end now, retryably
            self.draining = asyncio.create_task(self.runner.drain(self.settings.http.drain_seconds), name="drain")

    def reload(self) -> None:
        """Read the configuration again (SIGHUP), while serving: see `server.reload`."""
        if self.reread is not None and self.draining is None:
            self.background.append(asyncio.create_task(self._reload(self.reread), name="reload"))

    async def _reload(self, reread: Callable[[], Settings]) -> None:
        try:
            read = reread()
            taken = await self.anonymous.reload(read)
        except ConfigError as exc:
            self._refused("; ".join(exc.problems))
            return
        except Exception as exc:  # a fault of ours, not the file's: the running configuration stays
            logger.exception("configuration reload failed")
            self._refused(f"{type(exc).__name__}: {exc}")
            return
        self.configured_at = time.time()  # cards and the index say what is offered now
        self.metrics.reloads.labels("applied").inc()
        self.metrics.reload_successful.set(1)
        reloaded = Reloaded(taken.applied, [*waiting_for_restart(self.settings, read), *taken.waiting])
        logger.info("%s", reloaded.line(read.source))

    def _refused(self, why: str) -> None:
        self.metrics.reloads.labels("refused").inc()
        self.metrics.reload_successful.set(0)
        logger.error("configuration reload refused (%s); serving on with the configuration loaded before", why)

    async def close(self) -> None:
        for job in self.background:
            job.cancel()
        self.begin_drain()
        assert self.draining is not None
        await self.draining
        await self.counts.flush()
        await self.principals.flush_use()
        await self.anonymous.close()
        await self.agents.aclose()
        await self.db.close()
        if self.tracing:
            tracing.stop()

    async def database_writable(self) -> str:
        try:
            await self.db.check_writable()
        except Exception as exc:  # noqa: BLE001 -- reported, not raised: this is a health check
            return f"error: {type(exc).__name__}"
        return "ok"

    async def housekeeping(self) -> None:
        """Expire old finished tasks and fail the turns running past their own deadline (uncharged),
        by the database's clock."""
        await self.store.sync_clock()
        await self.store.expire(self.settings.task_retention_days * 86400)
        await self.anonymous.expire(self.settings.task_retention_days * 86400)
        for task in await self.store.stuck():
            execution = self.runner.live.get(task["id"])
            if execution is not None:
                self.runner.stop_past_deadline(execution)
                continue
            set_status(task, "failed", agent_message(task, PAST_DEADLINE))
            await self.store.save(task)


async def open_until_ready(db: Database, patience: float) -> None:
    """Open the database, trying again while it is unreachable (a replica may start before
    its PostgreSQL); gives up, raising, after `patience` seconds."""
    deadline = time.monotonic() + patience
    while True:
        try:
            await db.open()
            return
        except DatabaseUnavailable as exc:
            if time.monotonic() > deadline:
                raise
            logger.warning("the database is not reachable yet (%s); trying again", exc)
        await asyncio.sleep(1.0)


def forbidden() -> JSONResponse:
    return JSONResponse({"detail": "Forbidden"}, status_code=403)


async def a2a_endpoint(request: Request) -> Response:
    services: Services = request.app.state.services
    name = request.path_params["agent"]
    info = RequestInfo(
        agent=agent_label(name, services.agents.get(name)), client=request.client.host if request.client else "-"
    )
    # the request's span: a proxy's traceparent continues; the agent as metrics name it, never unknown names
    with tracing.span("a2a.request", kind="server", headers=request.headers) as span:
        response = await answered(info, branch(services, request, name, info))
        if not info.outcome:
            info.set(outcome_of(response))
        if span is not tracing.OFF:  # named only when traced: off, no attribute is even made
            span.set_attribute("a2a.agent", info.agent)
            span.set_attribute("a2a.method", info.method or "-")
            span.set_attribute("a2a.caller", info.caller.partition(":")[0])  # "key" or "anonymous", never who
            span.set_attribute("a2a.outcome", info.outcome)
            span.set_attribute("http.response.status_code", response.status_code)
    services.metrics.count_request(info.agent, info.caller.partition(":")[0], info.outcome)
    services.counts.count(info.agent, info.outcome)
    request_log.write(info, response.status_code)
    return response


async def answered(info: RequestInfo, answer: Awaitable[Response]) -> Response:
    """`answer`, or the answer for what it raised: the one place a request's failures are caught,
    on both paths (the free path below, the anonymous path's `handle`), so no input a client can
    send ends in a 500 or a stack trace. An `RpcError` is its own answer; an unreachable store the
    retryable `store_unavailable`; anything else a bug of ours, logged with its traceback and
    answered `internal_error`. Each with the call's id once the envelope named one."""
    answering_call.set(None)
    try:
        return await answer
    except RpcError as exc:
        return error_response(answering_call.get() if exc.call_id is None else exc.call_id, exc)
    except DatabaseUnavailable as exc:
        logger.warning("the task store is unavailable: %s", exc)
        info.set("store_unavailable")
        return error_response(answering_call.get(), store_unavailable())
    except Exception:
        logger.exception("internal error in %s (caller %s)", info.method or "a request", info.caller)
        return error_response(answering_call.get(), internal_error())


async def branch(services: Services, request: Request, name: str, info: RequestInfo) -> Response:
    """The one branch on the principal: the free path here, or the anonymous path. What either
    raises is answered by `answered`."""
    principal = await services.principals.identify(header(request.headers, "authorization"))
    if principal is None:
        return await services.anonymous.handle(request, name, info)
    info.caller = principal.owner
    if not principal.may_use(name):
        return forbidden()
    if services.agents.get(name) is None:
        return JSONResponse({"detail": "Agent not found"}, status_code=404)
    call = await read_call(request, services.settings.max_body_bytes)
    info.method = call.method
    return await dispatch_free(services, call, name, principal.owner, info.client)


class A2AEndpoint:
    """`POST /a2a/{agent}` as an ASGI application of its own (Starlette routes to a class
    endpoint as it is). A function endpoint is wrapped per request in closures that catch what
    it raises for Starlette's exception handlers and relay every message it sends; this one
    answers every failure itself (`answered`)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await a2a_endpoint(Request(scope, receive, send))
        await response(scope, receive, send)


def outcome_of(response: Response) -> str:
    """The log and metric outcome of an answer no step named explicitly."""
    code = getattr(response, "rpc_error", None)
    if code is not None:
        return "internal_error" if code == INTERNAL_ERROR else "rpc_error"
    return {
        200: "ok",
        401: "unauthenticated",
        403: "forbidden",
        404: "not_found",
        429: "limited",
        501: "unavailable",
    }.get(response.status_code, "rpc_error")


async def dispatch_free(services: Services, call: Call, agent: str, owner: str, client: str = "") -> Response:
    """The free path: the method, with no payment step anywhere (what it raises: `answered`)."""
    methods = services.methods
    if call.operation == "send":
        plan = plan_send(call)
        execution = await methods.start_send(plan, agent, owner)
        return result_response(call.id, await methods.send(plan, execution))
    if call.operation == "stream":
        if not services.agents.get(agent).streaming:  # type: ignore[union-attr]
            raise RpcError(UNSUPPORTED_OPERATION, "This agent does not stream")
        plan = plan_send(call)
        return methods.stream(plan, await methods.start_send(plan, agent, owner))
    return await methods.task_call(call, agent, owner, client)


async def card_endpoint(request: Request) -> Response:
    services: Services = request.app.state.services
    name = request.path_params.get("agent") or services.settings.default_agent
    agent = services.agents.get(name)
    if agent is None or not agent.exposed:
        return JSONResponse({"detail": "Not Found"}, status_code=404)
    public_url = public_base_url(request, services.settings.public_url)
    card = JSONResponse(
        services.sign_card(agent_card(agent, public_url, services.anonymous.card_extensions(agent, public_url)))
    )
    return cached(request, card, services.configured_at)


async def index_endpoint(request: Request) -> Response:
    """The exposed agents, each with its card's URL, its endpoint and what its card declares: a
    person or an agent finds every door here (hidden agents stay as unknown as on their cards)."""
    services: Services = request.app.state.services
    public_url = public_base_url(request, services.settings.public_url)
    agents = [
        index_entry(agent_card(agent, public_url, services.anonymous.card_extensions(agent, public_url)), public_url)
        for agent in services.agents.configs.values()
        if agent.exposed
    ]
    return cached(request, JSONResponse({"agents": agents}), services.configured_at)


CARD_MAX_AGE_SECONDS = 300


def cached(request: Request, response: Response, modified: float) -> Response:
    """Caching headers for a card: a strong ETag from the body's bytes, `Last-Modified` (when
    the configuration it comes from was read), `Cache-Control`; 304 when the client has it."""
    tag = f'"{hashlib.sha256(response.body).hexdigest()[:32]}"'
    headers = {
        "ETag": tag,
        "Last-Modified": formatdate(modified, usegmt=True),
        "Cache-Control": f"public, max-age={CARD_MAX_AGE_SECONDS}",
    }
    if not_modified(request.headers, tag, modified):
        return Response(status_code=304, headers=headers)
    response.headers.update(headers)
    return response


def not_modified(headers: Headers, tag: str, modified: float) -> bool:
    """RFC 9110 13.1: If-None-Match (weak comparison) decides; If-Modified-Since only without it."""
    wanted = headers.get("if-none-match")
    if wanted is not None:
        return wanted.strip() == "*" or tag in (t.strip().removeprefix("W/") for t in wanted.split(","))
    since = headers.get("if-modified-since")
    if since is None:
        return False
    try:
        return int(modified) <= parsedate_to_datetime(since).timestamp()
    except (TypeError, ValueError):  # an unreadable date is ignored, as the RFC says
        return False


async def healthz(request: Request) -> Response:
    """Alive: the process answers."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready: this replica can serve, because its store takes writes. What the anonymous path
    depends on (the facilitator) is reported beside it and never decides: a load balancer that
    dropped every replica with the facilitator would take the free path down too, while the
    paid path answers its own outage (501, verify_unavailable)."""
    services: Services = request.app.state.services
    database = await services.database_writable()
    ready = database == "ok"
    body = {"status": "ready" if ready else "not ready", "database": database, **await services.anonymous.readiness()}
    return JSONResponse(body, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    services: Services = request.app.state.services
    try:
        return await services.metrics.endpoint(request)
    except DatabaseUnavailable:
        return JSONResponse({"detail": "The task store is unavailable"}, status_code=503)


async def console(scope: Scope, receive: Receive, send: Send) -> None:
    """The anonymous path's console under /console/ (`AnonymousPath.console`): `MetricsAccess` lets
    only the operations listener reach it, with the token; no answer of it is kept by any cache."""
    services: Services = scope["app"].state.services
    if services.console is None:
        await JSONResponse({"detail": "Not Found"}, status_code=404)(scope, receive, send)
        return

    async def no_store(message: Message) -> None:
        if message["type"] == "http.response.start":
            MutableHeaders(scope=message)["Cache-Control"] = "no-store"
        await send(message)

    await services.console(scope, receive, no_store)


# Some libraries raise the interpreter's recursion limit at import (py_ecc, under x402 and
# eth-account, sets 100000); then deeply nested JSON overflows the C stack instead of
# raising RecursionError. Untrusted JSON is parsed here, so the limit is kept sane.
SAFE_RECURSION_LIMIT = 4000


# The cyclic garbage collector's first threshold: allocations (less frees) between two
# young collections. Python's 700 ran one every few requests, each walking every object
# the requests in flight hold; short-lived request objects die by reference count anyway.
YOUNG_COLLECTION_THRESHOLD = 20_000


def settle_heap() -> None:
    """Once started: what start-up made (modules, configuration, the agents) lives as long as
    the process, so the collector stops walking it (`gc.freeze`); a full collection then walks
    only what came later, instead of tens of milliseconds over every module's objects, and
    young collections run less often. Garbage cycles are still collected."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)


def create_app(
    settings: Settings, anonymous: AnonymousFactory = KeysOnly, reread: Callable[[], Settings] | None = None
) -> Starlette:
    """The A2A server for `settings`; callers without a key are handed to `anonymous`; `reread`
    reads the configuration again, as it was loaded (SIGHUP: `server.reload`)."""
    if sys.getrecursionlimit() > SAFE_RECURSION_LIMIT:
        sys.setrecursionlimit(SAFE_RECURSION_LIMIT)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        services = Services(settings, anonymous, reread)
        app.state.services = services
        await services.start()
        settle_heap()
        keeper = asyncio.create_task(_housekeeping_loop(services))
        try:
            # the drain starts at the signal, not after it; SIGHUP reloads the configuration
            with draining_on_signals(services.begin_drain), reloading_on_sighup(services.reload):
                yield
        finally:
            keeper.cancel()
            await services.close()

    routes: list[BaseRoute] = [
        Route("/a2a/{agent}", A2AEndpoint(), methods=["POST"]),
        Route("/a2a/{agent}/", A2AEndpoint(), methods=["POST"]),  # answered, not redirected: clients drop a 307's body
        Route("/a2a/{agent}/.well-known/agent-card.json", card_endpoint, methods=["GET"]),
        Route("/a2a/{agent}/.well-known/agent.json", card_endpoint, methods=["GET"]),
        Route("/.well-known/agent-card.json", card_endpoint, methods=["GET"]),
        Route("/.well-known/agent.json", card_endpoint, methods=["GET"]),
        *(Route(path, index_endpoint, methods=["GET"]) for path in INDEX_PATHS),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    if settings.http.metrics_listen and settings.http.metrics_token_env:  # its own listener and token, or none
        routes.append(Mount(CONSOLE_PATH, app=console))
    # the read deadlines live in the protocol (server/deadlines.py): a route may answer before it reads the body
    middleware: list[Middleware] = []
    if settings.http.metrics_listen or settings.http.metrics_token_env:
        middleware.append(Middleware(MetricsAccess, http=settings.http))  # /metrics: its listener, its token
    if settings.trusted_proxies:
        # uvicorn's proxy-header handling: forwarded headers count only from these peers
        middleware.append(Middleware(TrustedProxyMiddleware, trusted_hosts=list(settings.trusted_proxies)))
    # outermost: every line of a request, and its answer, carry the request's id
    middleware.insert(0, Middleware(request_log.RequestIds, trusted=settings.trusted_proxies))
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware)


async def _housekeeping_loop(services: Services) -> None:
    while True:
        try:
            await services.housekeeping()
        except Exception:
            logger.exception("housekeeping failed")
        await asyncio.sleep(services.settings.housekeeping_interval_seconds)
