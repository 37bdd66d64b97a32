"""The nginx sites the documentation hands out, run as they stand in a real nginx in front of a
real gate: the README's one-host site and deploy/nginx.conf. Both serve A2A, the agent cards and
/healthz, and neither hands /metrics to the public."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.dns import name_server
from tests.support.gate_helpers import create_key
from tests.support.gate_process import GateProcess, free_port
from tests.support.nginx import nginx_or_skip
from tests.support.paid import send_body

REPO = Path(__file__).parents[2]

HTTP = """\
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
daemon off;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
{site}
}}
"""


def readme_site() -> str:
    """The README's nginx block (the only one it has)."""
    blocks = re.findall(r"```nginx\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert len(blocks) == 1, "the README has one nginx site"
    return blocks[0]


@contextmanager
def nginx_site(site: str, root: Path) -> Iterator[str]:
    """nginx serving `site` (a server block and what it needs) on a free loopback port."""
    binary = nginx_or_skip()
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    site = site.replace("listen 80;", f"listen 127.0.0.1:{port};")
    conf = root / "nginx.conf"
    conf.write_text(HTTP.format(root=root, site=site))
    checked = subprocess.run([binary, "-t", "-c", str(conf), "-p", str(root)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    process = subprocess.Popen([binary, "-c", str(conf), "-p", str(root)], stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else "nginx exited"
            try:
                httpx.get(url, timeout=0.5)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(10)


def gate_behind(tmp_path: Path, start_gate, write_config) -> tuple[GateProcess, str]:
    port = free_port()
    config = write_config(
        'database = "gate.db"\n\n[proxy]\ntrusted = ["127.0.0.1"]\n\n[agents.echo]\ndescription = "Echo"\n'
    )
    return start_gate(config, port=port), create_key(config, "ops")


def assert_serves_the_public_and_keeps_metrics(url: str, key: str) -> None:
    sent = httpx.post(f"{url}/a2a/echo", json=send_body("hi"), headers={"Authorization": f"Bearer {key}"})
    assert sent.status_code == 200 and sent.json()["result"]["status"]["state"] == "completed"
    for card in ("/.well-known/agent-card.json", "/a2a/echo/.well-known/agent-card.json"):
        answer = httpx.get(f"{url}{card}")
        assert answer.status_code == 200 and answer.json()["name"] == "echo", card
    assert httpx.get(f"{url}/healthz").status_code == 200
    for path in ("/metrics", "/metrics/", "/metrics?x=1", "//metrics"):
        assert httpx.get(f"{url}{path}").status_code in (403, 404), path


def test_the_readme_site(tmp_path, start_gate, write_config):
    gate, key = gate_behind(tmp_path, start_gate, write_config)
    site = readme_site().replace("127.0.0.1:8000", f"127.0.0.1:{gate.port}")
    with nginx_site(site, tmp_path / "nginx") as url:
        assert_serves_the_public_and_keeps_metrics(url, key)


def deploy_site(replicas: str, resolver: str = "127.0.0.11") -> str:
    """deploy/nginx.conf with the replicas' name (and port) and the resolver it asks replaced."""
    site = (REPO / "deploy" / "nginx.conf").read_text()
    assert '"replicas:8000"' in site and "resolver 127.0.0.11 valid=10s" in site
    return site.replace('"replicas:8000"', f'"{replicas}"').replace(
        "resolver 127.0.0.11 valid=10s", f"resolver {resolver} valid=1s"
    )


def test_the_deploy_site(tmp_path, start_gate, write_config):
    gate, key = gate_behind(tmp_path, start_gate, write_config)
    with nginx_site(deploy_site(f"127.0.0.1:{gate.port}"), tmp_path / "nginx") as url:
        assert_serves_the_public_and_keeps_metrics(url, key)


def test_the_deploy_site_follows_the_replicas_name_without_a_reload(tmp_path, start_gate, write_config):
    """A replica recreated at another address is reached once the name says so: nginx asks the
    resolver again (here every second) instead of keeping what it resolved at start."""
    port = free_port()
    replicas = {}
    for address, label in (("127.0.0.2", "first"), ("127.0.0.3", "second")):
        config = write_config(
            f'database = "{label}.db"\n\n[proxy]\ntrusted = ["127.0.0.1"]\n\n'
            f'[agents.echo]\ndescription = "The {label} replica"\n',
            name=f"{label}.toml",
        )
        replicas[label] = start_gate(config, port=port, host=address)

    def answered_by(url: str) -> str:
        card = httpx.get(f"{url}/a2a/echo/.well-known/agent-card.json", timeout=5)
        return card.json()["description"] if card.status_code == 200 else f"HTTP {card.status_code}"

    with name_server() as dns:
        dns.names["replicas"] = "127.0.0.2"
        site = deploy_site(f"replicas:{port}", resolver=f"127.0.0.1:{dns.port}")
        with nginx_site(site, tmp_path / "nginx") as url:
            assert answered_by(url) == "The first replica"
            dns.names["replicas"] = "127.0.0.3"  # the first replica is gone; its name moved
            replicas["first"].stop()  # until nginx asks again (within a second) it answers 502
            deadline = time.monotonic() + 15
            while (seen := answered_by(url)) != "The second replica":
                assert time.monotonic() < deadline, seen
                time.sleep(0.25)
        assert dns.asked.count("replicas") >= 2
