"""The servers the benchmark compares, and the processes that run them.

`ServerProcess` starts one server as its own process group on a free 127.0.0.1 port,
waits until it answers, measures it (peak RSS, CPU time, over the whole process tree)
and stops it. Every process started here is registered, so `stop_all()` (called on
exit, Ctrl-C or an error) leaves nothing behind.

The reference servers run from this module: `python -m bench.servers KIND --port P`.
- `bare`: a bare Starlette JSON-RPC echo: parse the body, answer a minimal result. The floor.
- `sdk`: the official a2a-sdk 1.x server: DefaultRequestHandler with an echo
  AgentExecutor, InMemoryTaskStore, JSON-RPC routes with `enable_v0_3_compat=True`.
- `x402`: the x402 package's own FastAPI/ASGI payment middleware (`PaymentMiddlewareASGI`,
  `x402ResourceServer`, `HTTPFacilitatorClient`) protecting an equivalent echo route.
All run under uvicorn with the same settings as `a2a-gate serve --log-level warning`, and
all on the same stack (`use_stack`): asyncio and h11, or uvloop and httptools.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Self

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"

# The price every paid server in the benchmark asks (the gate's config uses the same).
NETWORK = "eip155:84532"
ASSET = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"  # USDC on Base Sepolia
PAY_TO = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
AMOUNT = "1000"


STACKS = ("asyncio-h11", "uvloop-httptools")
HOOK = Path(__file__).with_name("stack_hook")  # its sitecustomize hides uvloop and httptools on asyncio-h11
_STACK_ENV: dict[str, str] = {}  # added to every server's environment


def use_stack(stack: str) -> None:
    """Run every server started from now on on `stack` (see bench/stack_hook/sitecustomize.py)."""
    if stack not in STACKS:
        raise ValueError(f"unknown stack {stack!r}; choose from {', '.join(STACKS)}")
    path = os.pathsep.join(p for p in (str(HOOK), os.environ.get("PYTHONPATH", "")) if p)
    _STACK_ENV.clear()
    _STACK_ENV.update({"A2A_BENCH_STACK": stack, "PYTHONPATH": path})


def stack_missing(python: str = sys.executable) -> str:
    """Why `python` cannot run the uvloop-httptools stack ("" when it can)."""
    done = subprocess.run([python, "-c", "import uvloop, httptools"], capture_output=True, text=True, check=False)
    return "" if done.returncode == 0 else f"uvloop or httptools is not installed for {python}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------

_RUNNING: list[ServerProcess] = []


class ServerProcess:
    """One server process (and any children, e.g. uvicorn workers) on a loopback port."""

    def __init__(
        self,
        label: str,
        command: list[str],
        port: int,
        log: Path,
        ready_path: str = "/healthz",
        cwd: Path = REPO,
        env: dict[str, str] | None = None,
    ) -> None:
        self.label = label
        self.cwd = cwd
        self.env = {**os.environ, **_STACK_ENV, **(env or {})}
        self.command = command
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.log = log
        self.ready_path = ready_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Self:
        with open(self.log, "ab") as out:
            # its own session: stop() can end the server and its workers, and only them
            self.process = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, cwd=self.cwd, env=self.env, start_new_session=True
            )
        _RUNNING.append(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.label} exited with {self.process.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=1.0).status_code < 500:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"{self.label} did not start within {timeout:g}s:\n{self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def tree(self) -> list[psutil.Process]:
        if self.process is None or self.process.poll() is not None:
            return []
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_seconds(self) -> float:
        total = 0.0
        for proc in self.tree():
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
        return total

    def rss(self) -> int:
        """Current resident memory of the whole tree, bytes."""
        return sum(_status_kib(p.pid, "VmRSS") for p in self.tree()) * 1024

    def peak_rss(self) -> int:
        """Peak resident memory (VmHWM) summed over the tree, bytes."""
        return sum(_status_kib(p.pid, "VmHWM") for p in self.tree()) * 1024

    def stop(self, timeout: float = 10.0) -> None:
        if self in _RUNNING:
            _RUNNING.remove(self)
        if self.process is None or self.process.poll() is not None:
            return
        pgid = self.process.pid  # start_new_session: the group is ours alone
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout)
                # reap stragglers of the group (uvicorn workers) too
                os.killpg(pgid, signal.SIGKILL)
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                pass
            return

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _status_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def stop_all() -> None:
    for server in _RUNNING.copy():  # stop() removes from the list
        server.stop(timeout=5.0)


atexit.register(stop_all)


class Group:
    """Several processes measured as one server (replicas): CPU and memory summed, one port to send to."""

    def __init__(self, label: str, port: int, members: list[ServerProcess]) -> None:
        self.label = label
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.members = members

    def cpu_seconds(self) -> float:
        return sum(m.cpu_seconds() for m in self.members)

    def rss(self) -> int:
        return sum(m.rss() for m in self.members)

    def peak_rss(self) -> int:
        return sum(m.peak_rss() for m in self.members)


def reference(kind: str, log: Path, *extra: str) -> ServerProcess:
    port = free_port()
    command = [sys.executable, "-m", "bench.servers", kind, "--port", str(port), *extra]
    return ServerProcess(f"{kind} server", command, port, log)


def gate(
    config: Path,
    port: int,
    log: Path,
    *extra: str,
    src: Path = REPO,
    env: dict[str, str] | None = None,
    counted: Path | None = None,
    python: str = sys.executable,
    label: str = "a2a-gate",
    module: str = "gate.cli",
) -> ServerProcess:
    """`a2a-gate serve --config ... --port P` (as `python -m gate.cli`, the same entry point).

    `src`: the tree whose `server/` and `gate/` run (another checkout, a patched copy);
    `python -m` puts its working directory first on the import path; `python`: the
    interpreter (another commit's venv). `counted`: run it through `bench/roundtrips.py`,
    which counts its PostgreSQL round trips into that file.
    """
    entry = [str(Path(__file__).with_name("roundtrips.py")), str(counted)] if counted else ["-m", module]
    command = [
        python,
        *entry,
        "serve",
        "--config",
        str(config),
        "--port",
        str(port),
        "--log-level",
        "warning",
        *extra,
    ]
    return ServerProcess(label, command, port, log, cwd=src, env=env)


NGINX_CONF = """\
# generated by bench/servers.py: the README's proxy site, balancing over the replicas
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
daemon off;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    upstream gates {{
{servers}
        keepalive 64;
    }}
    server {{
        listen {host}:{port};
        location / {{
            proxy_pass http://gates;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_set_header X-Forwarded-Proto {forwarded_proto};
            proxy_buffering off;
            proxy_buffer_size 8k;
            proxy_read_timeout 1h;
        }}
    }}
}}
"""


def nginx_conf(
    root: Path, port: int, upstreams: list[int], *, forwarded_proto: str = "$scheme", server_options: str = ""
) -> str:
    """The site above (also the tests' nginx), listening on `port`, round-robin over `upstreams`."""
    servers = "\n".join(f"        server {HOST}:{p}{server_options};" for p in upstreams)
    return NGINX_CONF.format(root=root, host=HOST, port=port, servers=servers, forwarded_proto=forwarded_proto)


def nginx_binary() -> str | None:
    import shutil

    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)


def nginx(upstreams: list[int], root: Path) -> ServerProcess:
    """nginx on a free port, round-robin over `upstreams`, keeping connections to them alive
    (as a production site would; without `keepalive` every request opens a new one)."""
    binary = nginx_binary()
    if binary is None:
        raise RuntimeError("nginx is not installed (apt-get install nginx-light)")
    port = free_port()
    conf = root / "nginx.conf"
    conf.write_text(nginx_conf(root, port, upstreams))
    return ServerProcess("nginx", [binary, "-c", str(conf), "-p", str(root)], port, root / "nginx-log.txt", cwd=root)


def facilitator(db: Path, log: Path, *, trust_signatures: bool) -> ServerProcess:
    """The development facilitator (`a2a-gate-devnet facilitator`), logging warnings only.

    A log line per verify and settle would make the facilitator, shared by every
    compared server, slower for all of them.
    """
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "devnet",
        "facilitator",
        "--port",
        str(port),
        "--db",
        str(db),
        "--log-level",
        "warning",
    ]
    if trust_signatures:
        command.append("--trust-signatures")
    label = "facilitator (trusting)" if trust_signatures else "facilitator (real crypto)"
    return ServerProcess(label, command, port, log)


# ---------------------------------------------------------------------------
# Reference servers (run in their own process by `python -m bench.servers`)
# ---------------------------------------------------------------------------


def healthz_route() -> Any:
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def healthz(request: Any) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Route("/healthz", healthz, methods=["GET"])


def bare_app() -> Any:
    """Parse the JSON-RPC body, answer a minimal result, nothing else."""
    import json

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def echo(request: Request) -> JSONResponse:
        call = json.loads(await request.body())
        parts = call.get("params", {}).get("message", {}).get("parts", [])
        return JSONResponse(
            {
                "jsonrpc": "2.0",
                "id": call.get("id"),
                "result": {"kind": "message", "role": "agent", "messageId": "echo", "parts": parts},
            }
        )

    return Starlette(routes=[Route("/a2a/{agent}", echo, methods=["POST"]), healthz_route()])


def sdk_app() -> Any:
    """The a2a-sdk 1.x server with an echo agent (as tests/support/upstream_agents.py builds one)."""
    from contextlib import asynccontextmanager

    from a2a.helpers import new_task_from_user_message, new_text_part
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
    from a2a.types.a2a_pb2 import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
    from starlette.applications import Starlette

    class EchoExecutor(AgentExecutor):
        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            task = context.current_task
            if task is None:
                task = new_task_from_user_message(context.message)
                await event_queue.enqueue_event(task)
            updater = TaskUpdater(event_queue, task.id, task.context_id)
            await updater.add_artifact([new_text_part(context.get_user_input())], name="result")
            await updater.complete()

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()

    card = AgentCard(
        name="echo",
        description="echo",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url="http://127.0.0.1/a2a/echo", protocol_binding="JSONRPC", protocol_version="0.3")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="Echo", description="echo", tags=[])],
    )
    handler = DefaultRequestHandler(agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(), agent_card=card)

    @asynccontextmanager
    async def lifespan(app: Any):
        yield
        await handler.aclose()

    routes = [*create_jsonrpc_routes(handler, "/a2a/echo", enable_v0_3_compat=True), healthz_route()]
    return Starlette(routes=routes, lifespan=lifespan)


def x402_app(facilitator_url: str) -> Any:
    """The x402 package's payment middleware in front of an echo route answering like the gate."""
    import json

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from x402.http import FacilitatorConfig, HTTPFacilitatorClient
    from x402.http.middleware.fastapi import PaymentMiddlewareASGI
    from x402.http.types import PaymentOption, RouteConfig
    from x402.mechanisms.evm.exact import register_exact_evm_server
    from x402.server import x402ResourceServer

    server = x402ResourceServer(HTTPFacilitatorClient(FacilitatorConfig(url=facilitator_url)))
    register_exact_evm_server(server, NETWORK)
    price = {"amount": AMOUNT, "asset": ASSET, "extra": {"name": "USDC", "version": "2"}}
    routes = {
        "POST /a2a/paid-echo": RouteConfig(
            accepts=PaymentOption(scheme="exact", pay_to=PAY_TO, price=price, network=NETWORK, max_timeout_seconds=300),
            description="paid echo",
            mime_type="application/json",
        )
    }
    app = FastAPI()
    app.add_middleware(PaymentMiddlewareASGI, routes=routes, server=server)

    async def echo(request: Request) -> JSONResponse:
        call = json.loads(await request.body())
        message = call.get("params", {}).get("message", {})
        task_id, context_id = str(uuid.uuid4()), str(uuid.uuid4())
        task = {
            "kind": "task",
            "id": task_id,
            "contextId": context_id,
            "status": {"state": "completed", "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "history": [{**message, "taskId": task_id, "contextId": context_id}],
            "artifacts": [{"artifactId": str(uuid.uuid4()), "name": "result", "parts": message.get("parts", [])}],
        }
        return JSONResponse({"jsonrpc": "2.0", "id": call.get("id"), "result": task})

    app.router.routes.append(healthz_route())
    app.add_route("/a2a/paid-echo", echo, methods=["POST"])
    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m bench.servers")
    parser.add_argument("kind", choices=["bare", "sdk", "x402"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--facilitator", help="facilitator URL (x402)")
    args = parser.parse_args(argv)
    if args.kind == "bare":
        app = bare_app()
    elif args.kind == "sdk":
        app = sdk_app()
    else:
        app = x402_app(args.facilitator)
    # the same uvicorn settings as `a2a-gate serve --log-level warning`
    uvicorn.run(app, host=HOST, port=args.port, proxy_headers=False, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
