"""The in-band a2a-x402 flow, the limiters, and principals on priced agents."""

from __future__ import annotations

import httpx
import pytest

from tests.support.gate_helpers import create_key
from tests.support.gate_process import free_port
from tests.support.paid import PaidView, Payer, paid_config, send_body

EXTENSION = "https://github.com/google-agentic-commerce/a2a-x402/blob/main/spec/v0.2"


@pytest.fixture
def paid(shared_paid: PaidView) -> PaidView:
    """The shared paid gate; each test counts only its own payer's work (PaidView)."""
    return shared_paid


def test_in_band_payment_required_then_paid_with_the_same_task(paid):
    headers = {"X-A2A-Extensions": EXTENSION}
    first = paid.post("paid", send_body("in band"), headers)
    assert first.status_code == 200
    assert first.headers["X-A2A-Extensions"] == EXTENSION
    task = first.json()["result"]
    assert task["status"]["state"] == "input-required"
    metadata = task["status"]["message"]["metadata"]
    assert metadata["x402.payment.status"] == "payment-required"
    required = metadata["x402.payment.required"]
    assert required["x402Version"] == 1
    [offer] = required["accepts"]
    assert offer["network"] == "base-sepolia" and offer["maxAmountRequired"] == "1000"
    assert offer["resource"] == f"{paid.gate.url}/a2a/paid"

    payload = Payer().sign_v1(offer)
    paid_answer = paid.post(
        "paid", send_body("in band", task_id=task["id"], metadata={"x402.payment.payload": payload}), headers
    )
    done = paid_answer.json()["result"]
    assert done["id"] == task["id"]
    assert done["status"]["state"] == "completed"
    assert done["metadata"]["x402.payment.status"] == "payment-completed"
    assert len(paid.ledger()["settlements"]) == 1


def test_card_declares_the_x402_extension_and_price(paid):
    card = httpx.get(f"{paid.gate.url}/a2a/paid/.well-known/agent-card.json").json()
    extensions = card["capabilities"]["extensions"]
    assert [e["uri"] for e in extensions] == [
        EXTENSION,
        "https://google-a2a.github.io/A2A/extensions/payments/x402/v0.1",
        "https://github.com/google-a2a/a2a-x402/v0.1",
    ]
    for extension in extensions:
        assert extension["required"] is False
        [offer] = extension["params"]["accepts"]
        assert (offer["amount"], offer["network"]) == ("1000", "eip155:84532")
    assert card["url"] == f"{paid.gate.url}/a2a/paid"
    # the bearer key in both card shapes; on a priced agent paying anonymously is the other way in
    [scheme] = card["securitySchemes"].values()
    assert (scheme["type"], scheme["scheme"], scheme["httpAuthSecurityScheme"]["scheme"]) == (
        "http",
        "bearer",
        "Bearer",
    )
    assert card["security"] == [{"apiKey": []}, {}]
    assert card["securityRequirements"] == [{"schemes": {"apiKey": {"list": []}}}, {}]
    free = httpx.get(f"{paid.gate.url}/a2a/echo/.well-known/agent-card.json").json()
    assert free["security"] == [{"apiKey": []}] and "extensions" not in free["capabilities"]
    assert httpx.get(f"{paid.gate.url}/a2a/unpaid-hidden/.well-known/agent-card.json").status_code == 404


def test_no_facilitator_configured_is_501(tmp_path, start_gate, write_config):
    port = free_port()
    text = paid_config(f"http://127.0.0.1:{port}", "http://127.0.0.1:1").replace('url = "http://127.0.0.1:1"\n', "")
    gate = start_gate(write_config(text), port=port)
    response = httpx.post(f"{gate.url}/a2a/paid", json=send_body("x"))
    assert response.status_code == 501
    assert httpx.post(f"{gate.url}/a2a/nope", json=send_body("x")).status_code == 401


def test_per_ip_limiter_answers_429_before_anything_else(tmp_path, facilitator, start_gate, write_config):
    port = free_port()
    gate = start_gate(write_config(paid_config(f"http://127.0.0.1:{port}", facilitator, per_ip=5)), port=port)
    codes = [httpx.post(f"{gate.url}/a2a/paid", json=send_body("x")).status_code for _ in range(8)]
    assert codes[:5] == [402] * 5
    assert codes[5:] == [429] * 3
    limited = httpx.post(f"{gate.url}/a2a/nope", content=b"not even json")
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
    # a spoofed X-Forwarded-For from a direct, untrusted peer changes nothing
    spoofed = httpx.post(f"{gate.url}/a2a/paid", json=send_body("x"), headers={"X-Forwarded-For": "203.0.113.9"})
    assert spoofed.status_code == 429
    # each refusal is counted by the limiter that made it
    metrics = httpx.get(f"{gate.url}/metrics").text
    assert 'a2a_gate_limiter_refusals_total{limiter="ip"} 5.0' in metrics, metrics
    assert 'a2a_gate_limiter_refusals_total{limiter="agent"} 0.0' in metrics


def test_trusted_proxy_forwarded_address_is_the_limiter_key(tmp_path, facilitator, start_gate, write_config):
    port = free_port()
    text = paid_config(f"http://127.0.0.1:{port}", facilitator, per_ip=2) + '\n[proxy]\ntrusted = ["127.0.0.1"]\n'
    text = text.replace("[agents.echo]", '[proxy]\ntrusted = ["127.0.0.1"]\n\n[agents.echo]', 1).rsplit("\n[proxy]", 1)[
        0
    ]
    gate = start_gate(write_config(text), port=port)

    def post(client_ip: str) -> int:
        return httpx.post(
            f"{gate.url}/a2a/paid", json=send_body("x"), headers={"X-Forwarded-For": client_ip}
        ).status_code

    assert [post("198.51.100.1") for _ in range(3)] == [402, 402, 429]
    assert post("198.51.100.2") == 402  # another client behind the same proxy has its own bucket


def test_principal_on_a_priced_agent_never_touches_the_payment_path(paid, tmp_path):
    key = create_key(paid.gate.config, "edges-ops", ["paid"])  # a name of its own on the shared gate
    headers = {"Authorization": f"Bearer {key}", **Payer().header_for(paid.gate.url)}
    task = paid.post("paid", send_body("free"), headers).json()["result"]
    assert task["status"]["state"] == "completed"
    assert "metadata" not in task
    assert paid.ledger()["verify_calls"] == 0 and paid.payment_rows() == []
    refused = paid.post("vip", send_body("x"), headers)  # a known key not allowed here: final
    assert refused.status_code == 403 and refused.json() == {"detail": "Forbidden"}
