"""Run a2a-gate as a real server process on a free loopback port.

A separate process, started the way an operator starts it (`a2a-gate serve`), so
tests can stop it, restart it on the same database, or kill it mid-flight. Its
output goes to a log file the secret-leak tests read.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

# Processes asked to stop by a teardown, not yet waited for (see GateProcess.stop_later).
_stopping: list[subprocess.Popen[bytes]] = []


def reap_stopped(timeout: float = 15.0) -> None:
    """Wait for every process stop_later asked to stop; kill the ones past `timeout`."""
    deadline = time.monotonic() + timeout
    while _stopping:
        process = _stopping.pop()
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _own_ports() -> itertools.cycle[int]:
    """This test process's own slice of 20000-31999, below the kernel's ephemeral range.

    A port the kernel hands out for `bind(0)` is free only until the caller lets it go:
    another pytest worker asking next may be handed the same one, and the first server to
    bind it answers both workers' health checks. Each worker takes ports from a slice of
    its own, in turn, and the kernel never picks from below 32768 for outgoing connections.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    size = 12000 // max(workers, 1)
    first = 20000 + size * (worker % max(workers, 1))
    start = os.getpid() % size
    return itertools.cycle([*range(first + start, first + size), *range(first, first + start)])


_ports = _own_ports()


def free_port() -> int:
    """A loopback port nothing listens on now, from this worker's own slice."""
    for _ in range(1000):
        port = next(_ports)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in this worker's slice")


def _listener_inodes(port: int) -> set[str]:
    """The socket inodes listening on `port` in this network namespace (/proc/net/tcp)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _holds_any(pid: int, inodes: set[str]) -> bool:
    """Whether `pid` or one of its children (uvicorn's workers) holds one of the sockets."""
    pids = [pid]
    try:
        pids += [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    for each in pids:
        try:
            fds = list(Path(f"/proc/{each}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return True
    return False


class GateProcess:
    """One `a2a-gate serve` process; `url` is its base URL."""

    def __init__(
        self,
        config: Path,
        log: Path,
        *,
        port: int | None = None,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        prefix: list[str] | None = None,
        python: str = sys.executable,
        cwd: Path | None = None,
    ) -> None:
        self.config = config
        self.log = log
        self.host = host
        self.port = port or free_port()
        self.url = f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"
        self.extra_args = extra_args or []
        self.env = env or {}
        self.prefix = prefix or []  # e.g. a namespace wrapper: the command runs under it
        self.python = python  # another release's interpreter runs that release's gate
        self.cwd = cwd or Path(__file__).parents[2]  # (python -m finds this checkout's gate from its root)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> GateProcess:
        """Start and wait for /healthz; generous, for a busy machine running the suite in parallel."""
        command = [
            *self.prefix,
            self.python,
            "-m",
            "gate.cli",
            "serve",
            "--config",
            str(self.config),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--log-level",
            "info",
            *self.extra_args,
        ]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                cwd=self.cwd,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"a2a-gate exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2.0).status_code == 200 and self._answers_itself():
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"a2a-gate did not start:\n{self.log.read_text()[-3000:]}")

    def _answers_itself(self) -> bool:
        """Whether the health check was answered by this process, not another on the same port.

        Only checkable where the listener is in this network namespace and on loopback; a
        process under a namespace wrapper (`prefix`) is taken at its word.
        """
        if self.prefix or self.process is None:
            return True
        inodes = _listener_inodes(self.port)
        if not inodes:
            return True
        if _holds_any(self.process.pid, inodes):
            return True
        raise RuntimeError(f"port {self.port} is held by another process, not this a2a-gate")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def stop_later(self) -> None:
        """SIGTERM, without waiting for the exit: for a teardown, which has no use for it.

        uvicorn's graceful stop is about a quarter of a second of its own timers; the tests
        go on meanwhile, and `reap_stopped` waits for the processes at the end of the session.
        A test that reads the log or the exit status after a stop calls `stop`, which waits.
        """
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        _stopping.append(self.process)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def __enter__(self) -> GateProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop_later()


@dataclass
class Gate:
    """A running gate and the headers its test's calls carry (an API key)."""

    process: GateProcess
    headers: dict[str, str]

    def agent(self, name: str) -> str:
        return f"{self.process.url}/a2a/{name}"


@contextlib.contextmanager
def serving(command: list[str], log: Path, url: str, *, cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """`command` (an `a2a-gate serve` as a reader types it) until its `/readyz` answers 200; after the
    block its log holds no traceback, and it is stopped (SIGTERM, then SIGKILL after 20 s)."""
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, f"serve exited with {process.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"serve did not come up:\n{log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        yield
        text = log.read_text()
        assert "Traceback" not in text, text[-3000:]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
