"""A real nginx in front of the gate, on loopback, with the README's proxy settings."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.gate_process import free_port

NGINX_CONF = """
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
daemon off;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    upstream gates {{
{servers}
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://gates;
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_set_header X-Forwarded-Proto https;
            proxy_buffering off;
            proxy_read_timeout 1h;
        }}
    }}
}}
"""


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)


@contextmanager
def nginx_in_front(upstream: int | list[int], root: Path) -> Iterator[str]:
    """Run nginx proxying to one port, or round-robin over several (replicas); yields its URL.
    It reports the public scheme as https."""
    ports = [upstream] if isinstance(upstream, int) else upstream
    # max_fails=0: the start-up probe below runs before the gates are up, and a refused upstream
    # would otherwise be left out for fail_timeout (10 s): every request a 502 "no live upstreams"
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=0;" for p in ports)
    binary = nginx_binary()
    assert binary, "nginx is not installed (.ci/run installs it with apt-get)"
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = root / "nginx.conf"
    conf.write_text(NGINX_CONF.format(root=root, port=port, servers=servers))
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
