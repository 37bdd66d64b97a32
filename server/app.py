"""The Starlette application: routes, start-up, and the one branch on the principal.

`POST /a2a/{agent}` decides exactly once who is calling. A principal takes the free
path below; everyone else goes through the payment gate (`gate.pipeline`), which
never sees a principal and which a principal never touches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from server.agents import AgentRegistry
from server.cards import agent_card
from server.config import Settings
from server.database import open_database
from server.execution import Runner
from server.jsonrpc import (
    INTERNAL_ERROR,
    UNSUPPORTED_OPERATION,
    Call,
    RpcError,
    error_response,
    parse_call,
    read_body,
    result_response,
)
from server.methods import Methods, plan_send, unsupported
from server.principals import Principals
from server.tasks import TaskStore, agent_message, set_status

logger = logging.getLogger("a2a_gate")

HOUSEKEEPING_SECONDS = 60.0


class Services:
    """Everything a request needs, built once per process."""

    def __init__(self, settings: Settings) -> None:
        from gate.gate import PaymentGate  # the gate builds on the server, not the other way

        self.settings = settings
        self.db = open_database(settings.database)
        self.store = TaskStore(self.db, deadline_seconds=settings.task_deadline_seconds)
        self.principals = Principals(self.db, settings.keys)
        self.agents = AgentRegistry(settings.agents)
        self.runner = Runner(self.store, self.agents)
        self.methods = Methods(self.store, self.runner)
        self.gate = PaymentGate(self)

    async def start(self) -> None:
        await self.gate.start()

    async def close(self) -> None:
        await self.runner.drain(timeout=10.0)
        await self.gate.close()
        await self.agents.aclose()
        self.db.conn.close()

    def housekeeping(self) -> None:
        """Expire old finished tasks and fail the ones stuck past their deadline (uncharged)."""
        self.store.expire(self.settings.task_retention_days * 86400)
        for task in self.store.stuck():
            execution = self.runner.live.get(task["id"])
            if execution is not None:
                if not execution.delivering and execution.job is not None:
                    execution.job.cancel()
                continue
            set_status(task, "failed", agent_message(task, "The task passed its deadline."))
            self.store.save(task)


def forbidden() -> JSONResponse:
    return JSONResponse({"detail": "Forbidden"}, status_code=403)


async def a2a_endpoint(request: Request) -> Response:
    services: Services = request.app.state.services
    name = request.path_params["agent"]
    principal = services.principals.identify(request.headers.get("authorization"))
    if principal is None:
        return await services.gate.handle(request, name)
    if not principal.may_use(name):
        return forbidden()
    if services.agents.get(name) is None:
        return JSONResponse({"detail": "Agent not found"}, status_code=404)
    try:
        call = parse_call(await read_body(request, services.settings.max_body_bytes))
    except RpcError as exc:
        return error_response(exc.call_id, exc)
    return await dispatch_free(services, call, name, principal.owner)


async def dispatch_free(services: Services, call: Call, agent: str, owner: str) -> Response:
    """The free path: the method, with no payment step anywhere."""
    methods = services.methods
    try:
        if call.operation == "send":
            plan = plan_send(call)
            execution = methods.start_send(plan, agent, owner)
            return result_response(call.id, await methods.send(plan, execution))
        if call.operation == "stream":
            if not services.agents.get(agent).streaming:  # type: ignore[union-attr]
                raise RpcError(UNSUPPORTED_OPERATION, "This agent does not stream")
            plan = plan_send(call)
            return methods.stream(plan, methods.start_send(plan, agent, owner))
        if call.operation == "get":
            return result_response(call.id, methods.get(call, agent, owner))
        if call.operation == "cancel":
            return result_response(call.id, await methods.cancel(call, agent, owner))
        raise unsupported(call)
    except RpcError as exc:
        return error_response(call.id, exc)
    except Exception:
        logger.exception("internal error in %s", call.method)
        return error_response(call.id, RpcError(INTERNAL_ERROR))


async def card_endpoint(request: Request) -> Response:
    services: Services = request.app.state.services
    name = request.path_params.get("agent") or services.settings.default_agent
    agent = services.agents.get(name)
    if agent is None or not agent.exposed:
        return JSONResponse({"detail": "Not Found"}, status_code=404)
    return JSONResponse(agent_card(agent, services.settings.public_url))


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


# Some libraries raise the interpreter's recursion limit at import (py_ecc, under x402 and
# eth-account, sets 100000); then deeply nested JSON overflows the C stack instead of
# raising RecursionError. Untrusted JSON is parsed here, so the limit is kept sane.
SAFE_RECURSION_LIMIT = 4000


def create_app(settings: Settings) -> Starlette:
    if sys.getrecursionlimit() > SAFE_RECURSION_LIMIT:
        sys.setrecursionlimit(SAFE_RECURSION_LIMIT)
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        services = Services(settings)
        app.state.services = services
        await services.start()
        keeper = asyncio.create_task(_housekeeping_loop(services))
        try:
            yield
        finally:
            keeper.cancel()
            await services.close()

    routes = [
        Route("/a2a/{agent}", a2a_endpoint, methods=["POST"]),
        Route("/a2a/{agent}/.well-known/agent-card.json", card_endpoint, methods=["GET"]),
        Route("/a2a/{agent}/.well-known/agent.json", card_endpoint, methods=["GET"]),
        Route("/.well-known/agent-card.json", card_endpoint, methods=["GET"]),
        Route("/.well-known/agent.json", card_endpoint, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
    middleware = []
    if settings.trusted_proxies:
        # uvicorn's own proxy-header handling: forwarded headers count only from these peers
        middleware.append(Middleware(ProxyHeadersMiddleware, trusted_hosts=list(settings.trusted_proxies)))
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware)


async def _housekeeping_loop(services: Services) -> None:
    while True:
        try:
            services.housekeeping()
        except Exception:
            logger.exception("housekeeping failed")
        await asyncio.sleep(HOUSEKEEPING_SECONDS)
