"""Who may read /metrics: on a listener of its own (loopback, say), away from the public port,
or behind a bearer token; either way the public A2A port does not hand it to anyone."""

from __future__ import annotations

import httpx
import pytest

from tests.support.gate_helpers import create_key
from tests.support.gate_process import free_port

CONFIG = """
public_url = "http://127.0.0.1:{port}"
database = "gate.db"

[http]
{http}

[agents.echo]
"""


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])  # a loopback listener, or every address's
def test_metrics_on_their_own_listener_are_not_served_on_the_public_port(start_gate, write_config, host):
    port, admin = free_port(), free_port()
    config = write_config(CONFIG.format(port=port, http=f'metrics_listen = "{host}:{admin}"'))
    gate = start_gate(config, port=port)
    key = create_key(config, "ops")
    sent = httpx.post(
        f"{gate.url}/a2a/echo",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "message/send",
            "params": {
                "message": {
                    "kind": "message",
                    "role": "user",
                    "messageId": "m",
                    "parts": [{"kind": "text", "text": "hi"}],
                }
            },
        },
        headers={"Authorization": f"Bearer {key}"},
    )
    assert sent.status_code == 200
    assert httpx.get(f"{gate.url}/metrics").status_code == 404
    assert httpx.get(f"{gate.url}/healthz").status_code == 200  # the probes stay on the public port
    assert httpx.get(f"{gate.url}/readyz").status_code == 200
    metrics = httpx.get(f"http://127.0.0.1:{admin}/metrics")
    assert metrics.status_code == 200 and 'a2a_gate_requests_total{agent="echo"' in metrics.text
    assert httpx.get(f"http://127.0.0.1:{admin}/readyz").status_code == 200
    assert httpx.post(f"http://127.0.0.1:{admin}/a2a/echo", json={}).status_code == 404  # no A2A there


def test_metrics_behind_a_bearer_token(start_gate, write_config):
    port = free_port()
    config = write_config(CONFIG.format(port=port, http='metrics_token_env = "GATE_METRICS_TOKEN"'))
    token = "metrics-token-4f1c"
    gate = start_gate(config, port=port, env={"GATE_METRICS_TOKEN": token})
    refused = httpx.get(f"{gate.url}/metrics")
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{gate.url}/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    allowed = httpx.get(f"{gate.url}/metrics", headers={"Authorization": f"Bearer {token}"})
    assert allowed.status_code == 200 and "a2a_gate_requests_total" in allowed.text
    gate.stop()
    assert token not in gate.log.read_text()


def test_a_metrics_token_variable_that_is_not_set_stops_serve(tmp_path, write_config):
    from tests.support.gate_helpers import cli

    config = write_config(CONFIG.format(port=free_port(), http='metrics_token_env = "GATE_METRICS_UNSET"'))
    done = cli("serve", "--config", str(config), "--port", str(free_port()), check=False)
    assert done.returncode == 2 and "GATE_METRICS_UNSET" in done.stderr and "Traceback" not in done.stderr
