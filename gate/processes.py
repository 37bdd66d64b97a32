"""The processes `a2a-gate serve` runs: uvicorn's workers on shared listeners, the development
facilitator as a child, and the signal handling that lets both be cleaned up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn


def unwind_on_sigterm() -> None:
    """Let SIGTERM unwind the stack like Ctrl-C does, so cleanup (`finally`, `with`) runs.

    uvicorn handles SIGTERM itself (the server drains: `server.shutdown`), shuts down, then
    raises the signal again; with the default action the process ended right there, before the
    development facilitator was stopped. Exit status 143 (128 + SIGTERM) is what a supervisor
    expects. SIGHUP never ends the gate: it is held until the server can reload
    (`server.reload.hold_sighup`).
    """
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


@contextlib.contextmanager
def dev_facilitator(port: int, ledger: str) -> Iterator[str]:
    """The development facilitator as a child process; yields its URL, stops it on the way out.

    On Linux the child also asks the kernel for SIGTERM when this process dies, however
    it dies (SIGKILL, a crash), so it never outlives the gate holding its port.
    """
    if not devnet_installed():
        raise SystemExit(
            f"error: --dev-facilitator {port}: the development network is not installed"
            " (pip install ./devnet from a2a-gate's repository: the a2a-gate-devnet distribution)"
        )
    url = f"http://127.0.0.1:{port}"
    taken = port_in_use("127.0.0.1", port)
    if taken:
        raise SystemExit(
            f"error: --dev-facilitator {port}: 127.0.0.1:{port} is in use ({taken}):"
            " stop what holds it, or name a free port"
        )
    process = subprocess.Popen(
        [sys.executable, "-m", "devnet", "facilitator", "--port", str(port), "--db", ledger],
        preexec_fn=die_with_parent(),
    )
    try:
        wait_for(f"{url}/healthz", process, port=port)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def devnet_installed() -> bool:
    """Whether this interpreter can run `python -m devnet` (the a2a-gate-devnet distribution), found
    without importing it: the gate imports nothing of the development network. A folder named
    `devnet` without the package (the repository's, seen from its root) is a namespace: no origin."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("devnet")
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes Linux send the child SIGTERM when this process ends; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return preexec


def run_workers(config: Any, metrics_listen: tuple[str, int] | None = None) -> None:
    """`uvicorn.run(..., workers=N)`, but with TCP_NODELAY on every accepted connection.

    uvicorn's `Config.bind_socket()` creates the listener with `proto` 0, accepted sockets
    inherit it, and asyncio only sets TCP_NODELAY when `proto == IPPROTO_TCP`, so every
    keep-alive request after the first waited ~40 ms for a delayed ACK
    (https://github.com/Kludex/uvicorn/issues/3149). Re-wrapping the descriptor makes
    Python ask the kernel, which says IPPROTO_TCP.
    """
    from uvicorn.supervisors import Multiprocess

    class Reloading(Multiprocess):
        """uvicorn's supervisor, but SIGHUP reloads each worker's configuration (`server.reload`)
        instead of replacing the workers: nothing drains, and a file a worker refuses leaves it
        serving as it was.

        SIGHUP stays held (blocked) in the supervisor, so every worker it spawns is born holding
        it until it can reload; the supervisor takes a held one at each tick of its loop."""

        announced = False

        def handle_signals(self) -> None:
            if signal.sigtimedwait([signal.SIGHUP], 0) is not None:
                self.signal_queue.append(signal.SIGHUP)
            super().handle_signals()
            if not self.announced and all(worker.is_ready(timeout=1) for worker in self.processes):
                self.announced = True
                notify_ready()  # every worker serves: systemd may now send a reload or a stop

        def handle_hup(self) -> None:
            for worker in self.processes:
                if worker.process.pid is not None and worker.process.is_alive():
                    os.kill(worker.process.pid, signal.SIGHUP)

    sockets = [tcp(config.bind_socket())]
    if metrics_listen:
        sockets.append(listen(metrics_listen))
    Reloading(config, sockets=sockets).run()


class Serving(uvicorn.Server):
    """uvicorn's server, telling its service manager when it serves (`notify_ready`)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            notify_ready()


def notify_ready() -> None:
    """Tell systemd (`Type=notify`) the gate serves: the listeners are open and every worker's
    start-up is done. Until then `systemctl start` waits and a `systemctl reload` is queued behind
    it, so no SIGHUP reaches a process still starting. Without $NOTIFY_SOCKET, nothing to tell."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"READY=1", address)
    except OSError as exc:
        logging.getLogger("a2a_gate").warning("could not tell the service manager the gate is ready: %s", exc)


def tcp(sock: socket.socket) -> socket.socket:
    """The listener re-wrapped so Python asks the kernel its protocol: accepted connections then
    get TCP_NODELAY (see `run_workers`)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock = socket.socket(fileno=sock.detach())
    return sock


def listen(address: tuple[str, int]) -> socket.socket:
    """A listener on `[http] metrics_listen` (an IP literal), as uvicorn binds its own."""
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=128)
    except OSError as exc:
        raise SystemExit(f"error: http.metrics_listen {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return tcp(sock)


def port_in_use(host: str, port: int) -> str:
    """Why `host:port` cannot be listened on (the system's words), or empty if it can. Bound as
    uvicorn binds (SO_REUSEADDR), so a connection of an earlier run in TIME_WAIT is no obstacle."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return (exc.strerror or str(exc)).lower()
    return ""


def wait_for(url: str, process: subprocess.Popen[bytes], timeout: float = 60.0, *, port: int = 0) -> None:
    """Wait for `process` to answer on `url`; stop at once if it exits (the message is its own).

    With `port`, the answer counts only once `process` is seen listening there (Linux: /proc):
    a process that took the port after `port_in_use` looked would otherwise answer for it."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"error: the development facilitator exited with status {process.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200 and (not port or listens(process.pid, port)):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"error: {url} did not come up within {timeout:g}s")


def listens(pid: int, port: int) -> bool:
    """Whether `pid` holds a socket listening on `port`; True where /proc cannot say (not Linux)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as listing:
                lines = listing.read().splitlines()[1:]
        except OSError:
            return True
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return True
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False
