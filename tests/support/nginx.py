"""A real nginx in front of the gate, on loopback, with the README's proxy settings (the
benchmark's site, `bench/servers.py:nginx_conf`, telling the gate the public scheme is https).

The nginx is the one installed (on PATH, or /usr/sbin/nginx), or the binary named by
A2A_GATE_TEST_NGINX; `A2A_GATE_TEST_NGINX=none` runs the suite as if there were none. Without
one, a test that needs it is skipped with the reason, and fails under CI (`missing`).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.servers import nginx_binary as installed_nginx
from bench.servers import nginx_conf
from tests.support.gate_process import free_port
from tests.support.services import missing

NGINX_VARIABLE = "A2A_GATE_TEST_NGINX"


def nginx_binary() -> str | None:
    """The nginx the tests run, or None: A2A_GATE_TEST_NGINX (a path, or `none`), else the installed one."""
    chosen = os.environ.get(NGINX_VARIABLE, "").strip()
    if chosen.lower() == "none":
        return None
    if chosen:
        return chosen if Path(chosen).is_file() else None
    return installed_nginx()


def nginx_or_skip() -> str:
    """The nginx binary; without one the test is skipped (failed under CI) with the reason."""
    binary = nginx_binary()
    if binary is None:
        missing(f"nginx is not installed (apt-get install nginx-light, or set {NGINX_VARIABLE}=/path/to/nginx)")
    return binary


@contextmanager
def nginx_in_front(upstream: int | list[int], root: Path) -> Iterator[str]:
    """Run nginx proxying to one port, or round-robin over several (replicas); yields its URL.
    It reports the public scheme as https."""
    ports = [upstream] if isinstance(upstream, int) else upstream
    binary = nginx_or_skip()
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = root / "nginx.conf"
    # max_fails=0: the start-up probe below runs before the gates are up, and a refused upstream
    # would otherwise be left out for fail_timeout (10 s): every request a 502 "no live upstreams"
    conf.write_text(nginx_conf(root, port, ports, forwarded_proto="https", server_options=" max_fails=0"))
    process = subprocess.Popen([binary, "-c", str(conf), "-p", str(root)], stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else "nginx exited"
            try:
                httpx.get(f"{url}/healthz", timeout=0.5)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(10)
