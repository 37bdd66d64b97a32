"""A real nginx in front of the gate, on loopback, with the README's proxy settings (the
benchmark's site, `bench/servers.py:nginx_conf`, telling the gate the public scheme is https)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.servers import nginx_binary, nginx_conf
from tests.support.gate_process import free_port


@contextmanager
def nginx_in_front(upstream: int | list[int], root: Path) -> Iterator[str]:
    """Run nginx proxying to one port, or round-robin over several (replicas); yields its URL.
    It reports the public scheme as https."""
    ports = [upstream] if isinstance(upstream, int) else upstream
    binary = nginx_binary()
    assert binary, "nginx is not installed (.ci/run installs it with apt-get)"
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
