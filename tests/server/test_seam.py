"""The server alone: a principal's free path works, and callers without a key get the uniform 401.

The server knows nothing of payments (import-linter holds that in CI); this pins what it does
without the gate plugged in, and that the gate is what the `a2a-gate` command plugs in.
"""

from __future__ import annotations

import hashlib
import tomllib

import pytest
from starlette.testclient import TestClient

from gate.app import build_app
from gate.config import parse_config
from server.app import create_app

KEY = "seam-test-key"
PRICE = (
    '{ network = "eip155:84532", asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e", amount = "1",'
    ' pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C" }'
)
CONFIG = f"""
public_url = "http://gate.example"
database = "gate.db"
keys = [{{ name = "ops", sha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}", agents = ["*"] }}]

[facilitator]
url = "http://127.0.0.1:9"

[agents.echo]

[agents.keys]
backend = "python"
callable = "tests.support.agents:metadata_keys"

[agents.priced]
price = {PRICE}
"""


def send(text: str, metadata: dict | None = None) -> dict:
    message = {"kind": "message", "role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": text}]}
    if metadata:
        message["metadata"] = metadata
    return {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": message}}


PAYMENT_METADATA = {"x402.payment.status": "payment-submitted", "x402.payment.payload": {"x": 1}, "trace": "t1"}


def seen_by_agent(client: TestClient) -> str:
    answer = client.post("/a2a/keys", json=send("hi", PAYMENT_METADATA), headers={"Authorization": f"Bearer {KEY}"})
    return answer.json()["result"]["artifacts"][0]["parts"][0]["text"]


def settings(tmp_path):
    return parse_config(tomllib.loads(CONFIG), base_dir=tmp_path)


def test_the_server_alone_serves_keys_and_answers_everyone_else_401(tmp_path):
    with TestClient(create_app(settings(tmp_path))) as client:
        free = client.post("/a2a/echo", json=send("hi"), headers={"Authorization": f"Bearer {KEY}"})
        assert free.json()["result"]["status"]["state"] == "completed"
        for agent in ("echo", "priced", "nobody"):
            anonymous = client.post(f"/a2a/{agent}", json=send("hi"))
            assert (anonymous.status_code, anonymous.json()) == (401, {"detail": "Not authenticated"})
        card = client.get("/a2a/priced/.well-known/agent-card.json").json()
        assert not card["capabilities"].get("extensions")  # no payment vocabulary without the gate
        assert "facilitator" not in client.get("/readyz").json()
        # no payment vocabulary: x402 keys are just metadata to the server, passed on as they came
        assert seen_by_agent(client) == "trace x402.payment.payload x402.payment.status"


@pytest.mark.system  # the a2a-gate command, as a process
def test_the_a2a_gate_command_plugs_the_payment_gate_in(tmp_path):
    with TestClient(build_app(settings(tmp_path))) as client:
        priced = client.post("/a2a/priced", json=send("hi"))
        assert priced.status_code == 402 and "PAYMENT-REQUIRED" in priced.headers
        card = client.get("/a2a/priced/.well-known/agent-card.json").json()
        assert card["capabilities"]["extensions"]
        assert "facilitator" in client.get("/readyz").json()
        assert seen_by_agent(client) == "trace"  # the gate keeps every x402 key from agents, on every path


def test_the_server_reads_its_own_keys_and_leaves_the_payment_keys_to_the_gate(tmp_path):
    from server import config as server_config

    raw = tomllib.loads(CONFIG)
    with pytest.raises(server_config.ConfigError) as alone:  # the server alone knows no payment key
        server_config.parse_config(raw, base_dir=tmp_path, source="gate.toml")
    assert sorted(alone.value.problems) == [
        "gate.toml: agents.priced.price: unknown key",
        "gate.toml: facilitator: unknown key",
    ]
    read = settings(tmp_path)
    assert read.sections == {"facilitator": {"url": "http://127.0.0.1:9"}}
    assert set(read.agents["priced"].sections) == {"price"} and not hasattr(read.agents["priced"], "price")
    assert read.anonymous.price("priced").amount == "1" and read.anonymous.price("echo") is None


def test_one_list_holds_both_halves_problems_with_their_key_paths(tmp_path):
    from gate.config import parse_config as parse
    from server.config import ConfigError

    raw = {
        "max_body_bytes": 0,
        "facilitator": {"url": "ftp://f"},
        "agents": {"a": {"timeout_seconds": -1, "price": {}}},
    }
    with pytest.raises(ConfigError) as caught:
        parse(raw, base_dir=tmp_path, source="gate.toml")
    paths = sorted(p.split(": ")[1] for p in caught.value.problems)
    assert paths == sorted(
        [
            "max_body_bytes",
            "agents.a.timeout_seconds",
            "facilitator.url",
            "agents.a.price.network",
            "agents.a.price.asset",
            "agents.a.price.pay_to",
            "agents.a.price.amount",
        ]
    ), caught.value.problems
