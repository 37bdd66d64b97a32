"""A failed upstream agent reads as a failure in the gate's own request log: `outcome=agent_error`
with a short detail of ours (never the upstream's words), as an agent that raised does; a
completed upstream turn stays `ok`. Real gate, real a2a-sdk upstreams, an unreachable one."""

from __future__ import annotations

import json

import httpx

from tests.support.gate_helpers import create_key
from tests.support.paid import send_body
from tests.support.serve import serve_app
from tests.support.upstream_agents import build_upstream_app


def test_a_failed_upstream_turn_is_logged_as_the_agents_failure(tmp_path, start_gate, write_config):
    with (
        serve_app(build_upstream_app("echo"), wait_on_exit=False) as echo,
        serve_app(build_upstream_app("fail"), wait_on_exit=False) as failing,
        serve_app(build_upstream_app("garbage"), wait_on_exit=False) as garbage,
    ):
        agents = {"up-echo": echo, "up-fail": failing, "up-garbage": garbage, "up-down": "http://127.0.0.1:9"}
        text = 'database = "gate.db"\n' + "".join(
            f'\n[agents.{name}]\nbackend = "upstream"\nurl = "{url}/"\ntimeout_seconds = 3\n'
            for name, url in agents.items()
        )
        config = write_config(text)
        key = create_key(config, "ops")
        gate = start_gate(config, extra_args=["--log-json"])
        states = {}
        for name in agents:
            answer = httpx.post(
                f"{gate.url}/a2a/{name}", json=send_body("hi"), headers={"Authorization": f"Bearer {key}"}, timeout=30
            )
            states[name] = answer.json()["result"]["status"]["state"]
        gate.stop()
    assert states == {"up-echo": "completed", "up-fail": "failed", "up-garbage": "failed", "up-down": "failed"}
    lines = [json.loads(line) for line in gate.log.read_text().splitlines() if line.startswith("{")]
    outcome = {
        line["agent"]: (line["outcome"], line["detail"]) for line in lines if line.get("agent", "").startswith("up-")
    }
    assert outcome["up-echo"] == ("ok", "")
    assert outcome["up-fail"] == ("agent_error", "upstream task failed")
    assert outcome["up-garbage"] == ("agent_error", "upstream malformed")
    assert outcome["up-down"] == ("agent_error", "upstream malformed")
