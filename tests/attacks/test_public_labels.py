"""Metrics and log lines name only what is public, and no request can forge a log line.

The identical 401s hide which agents exist; a metric label or a log field naming a
hidden agent would undo that with one probe and one scrape. Agent labels come from a
bounded public set: an exposed agent's name, `other` for a configured agent that is
not exposed, `unknown` for a name nobody configured. A control character sent in the
URL or a forwarded header never starts a new line (or a new field) in the text log.
"""

from __future__ import annotations

import json
import re

import httpx

from tests.support.gate_helpers import bearer, create_key, rpc_body, v03_message
from tests.support.gate_process import free_port

CONFIG = """
database = "gate.db"

[proxy]
trusted = ["127.0.0.1"]

[agents.echo]

[agents.secret-ledger]
exposed = false
"""

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ")


def probe(url: str, agent_path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{url}/a2a/{agent_path}", json=rpc_body("message/send", {"message": v03_message("hi")}), headers=headers or {}
    )


def agent_labels(metrics_text: str) -> set[str]:
    return set(re.findall(r'agent="([^"]*)"', metrics_text))


def test_metrics_never_name_a_hidden_or_unknown_agent(start_gate, write_config):
    config = write_config(CONFIG)
    gate = start_gate(config, port=free_port())
    key = create_key(config, "ops")
    assert probe(gate.url, "secret-ledger").status_code == 401  # anonymous probe of a hidden agent
    assert probe(gate.url, "secret-ledger", bearer(key)).status_code == 200  # a principal uses it
    assert probe(gate.url, "no-such-agent").status_code == 401
    assert probe(gate.url, "echo", bearer(key)).status_code == 200
    text = httpx.get(f"{gate.url}/metrics").text
    assert "secret-ledger" not in text and "no-such-agent" not in text
    assert agent_labels(text) == {"echo", "other", "unknown"}


def test_text_log_lines_cannot_be_forged(start_gate, write_config):
    config = write_config(CONFIG)
    gate = start_gate(config, port=free_port())
    forged = "echo%0A2026-01-01T00:00:00Z%20INFO%20a2a_gate.requests%20agent=echo%09caller=key:root"
    assert probe(gate.url, forged).status_code == 401
    assert probe(gate.url, "secret-ledger").status_code == 401
    # a trusted proxy's forwarded value is believed as the client, but cannot add a field
    assert probe(gate.url, "echo", {"X-Forwarded-For": "198.51.100.1\tcaller=key:root"}).status_code == 401
    gate.stop()
    lines = [line for line in gate.log.read_text().splitlines() if " a2a_gate.requests " in line]
    assert len(lines) == 3, lines
    assert all(TIMESTAMP.match(line) for line in lines), lines
    assert all("\t" not in line and "\x0b" not in line for line in lines), lines
    fields = [dict(token.split("=", 1) for token in line.split(" ")[3:]) for line in lines]
    assert [f["agent"] for f in fields] == ["unknown", "other", "echo"]
    assert all(f["caller"] == "anonymous" for f in fields)
    assert "secret-ledger" not in gate.log.read_text()


def test_json_log_names_only_public_agents(start_gate, write_config):
    config = write_config(CONFIG)
    gate = start_gate(config, port=free_port(), extra_args=["--log-json"])
    probe(gate.url, "echo%0Aforged%E2%80%A8line")
    probe(gate.url, "secret-ledger")
    gate.stop()
    raw = gate.log.read_text()
    lines = [json.loads(line) for line in raw.splitlines() if line.startswith("{")]
    requests = [line for line in lines if line["logger"] == "a2a_gate.requests"]
    assert [line["agent"] for line in requests] == ["unknown", "other"]
    assert "\u2028" not in raw and "secret-ledger" not in raw
