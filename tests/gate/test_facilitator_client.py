"""The facilitator client on a real gate: its circuit breaker and per-call credentials."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from gate.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from gate.config import FacilitatorConfig
from gate.facilitator import FacilitatorClient, Unavailable
from tests.support.gate_process import free_port
from tests.support.paid import PaidSetup, Payer, paid_config, send_body


def with_facilitator_settings(config: str, **settings: object) -> str:
    lines = "".join(f"{k} = {v!r}\n" if not isinstance(v, str) else f'{k} = "{v}"\n' for k, v in settings.items())
    return config.replace("[facilitator]\n", "[facilitator]\n" + lines, 1)


def breaker_state(gate_url: str) -> float:
    text = httpx.get(f"{gate_url}/metrics").text
    return float(re.search(r"^a2a_gate_facilitator_breaker_state (\S+)$", text, re.MULTILINE).group(1))


@pytest.fixture
def breaker_gate(tmp_path, facilitator, start_gate, write_config):
    port = free_port()
    config = with_facilitator_settings(
        paid_config(f"http://127.0.0.1:{port}", facilitator), breaker_failures=3, breaker_cooldown_seconds=4.0
    )
    gate = start_gate(write_config(config), port=port)
    return PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")


def test_the_breaker_opens_answers_at_once_then_probes(breaker_gate):
    paid, payer = breaker_gate, Payer()
    paid.faults(verify="http500")
    started = time.monotonic()
    for _ in range(3):
        answer = paid.post("paid", send_body("x"), payer.header_for(paid.gate.url)).json()
        assert answer["error"]["data"] == {"code": "verify_unavailable", "retryable": True}
    assert paid.ledger()["verify_calls"] == 3 and breaker_state(paid.gate.url) == 2
    tokens = [payer.header_for(paid.gate.url) for _ in range(5)]
    started = time.monotonic()
    for token in tokens:  # open: refused at once, the facilitator is not asked
        answer = paid.post("paid", send_body("x"), token).json()
        assert answer["error"]["data"]["code"] == "verify_unavailable" and answer["error"]["data"]["retryable"] is True
        assert 1 <= answer["error"]["data"]["retry_after"] <= 4
    assert paid.ledger()["verify_calls"] == 3
    # half-open after the cool-down: one probe; it fails, so the breaker opens again
    probe = payer.header_for(paid.gate.url)
    time.sleep(max(0.0, started + 4.2 - time.monotonic()))
    assert breaker_state(paid.gate.url) == 1
    assert paid.post("paid", send_body("x"), probe).json()["error"]["data"]["code"] == "verify_unavailable"
    assert paid.ledger()["verify_calls"] == 4 and breaker_state(paid.gate.url) == 2
    # the facilitator comes back: the next probe closes the breaker and the payment goes through
    paid.faults()
    probe = payer.header_for(paid.gate.url)
    time.sleep(4.1)
    answer = paid.post("paid", send_body("x"), probe).json()
    assert answer["result"]["metadata"]["x402.payment.status"] == "payment-completed"
    assert breaker_state(paid.gate.url) == 0
    assert "a2a_gate_facilitator_breaker_opened_total 2.0" in httpx.get(f"{paid.gate.url}/metrics").text


def test_a_payer_refusal_never_opens_the_breaker(breaker_gate):
    paid, payer = breaker_gate, Payer()
    paid.faults(verify="invalid")  # the facilitator answers: these payments are invalid
    for _ in range(5):
        assert paid.post("paid", send_body("x"), payer.header_for(paid.gate.url)).status_code == 403
    assert breaker_state(paid.gate.url) == 0


def test_breaker_states_in_order():
    now = [0.0]
    breaker = CircuitBreaker(2, 10.0, clock=lambda: now[0])
    breaker.failed()
    assert breaker.state == CLOSED and breaker.allow()
    breaker.failed()
    assert breaker.state == OPEN and not breaker.allow() and breaker.retry_after() == 10
    now[0] = 10.0
    assert breaker.state == HALF_OPEN and breaker.allow() and not breaker.allow()  # one probe at a time
    breaker.abandoned()  # the probe got no verdict (our busy gate): another may go
    assert breaker.allow()
    breaker.succeeded()
    assert breaker.state == CLOSED and breaker.failures == 0


SECRET = "s3cr3t-facilitator-signing-key"


@pytest.fixture
def guarded_facilitator(tmp_path):
    from devnet.facilitator import create_facilitator_app
    from tests.support.facilitator_auth import OneUseBearer
    from tests.support.serve import serve_app

    guard = OneUseBearer(create_facilitator_app(str(tmp_path / "ledger.db")), SECRET)
    with serve_app(guard) as url:
        yield url, guard


def start_guarded_gate(tmp_path, start_gate, write_config, facilitator: str, **settings: object):
    from tests.support.facilitator_auth import SECRET_ENV

    port = free_port()
    config = with_facilitator_settings(paid_config(f"http://127.0.0.1:{port}", facilitator), **settings)
    gate = start_gate(write_config(config, f"gate-{len(settings)}-{port}.toml"), port=port, env={SECRET_ENV: SECRET})
    return PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")


@pytest.mark.parametrize(
    "target", ["tests.support.facilitator_auth:create_headers", "tests.support.facilitator_auth:create_headers_async"]
)
def test_auth_callable_mints_headers_for_every_call(tmp_path, start_gate, write_config, guarded_facilitator, target):
    facilitator, guard = guarded_facilitator
    paid = start_guarded_gate(tmp_path, start_gate, write_config, facilitator, auth=target)
    for _ in range(2):
        answer = paid.post("paid", send_body("x"), Payer().header_for(paid.gate.url))
        assert answer.json()["result"]["metadata"]["x402.payment.status"] == "payment-completed", answer.text
    assert len(guard.seen) >= 4 and len(set(guard.seen)) == len(guard.seen)  # verify + settle, each fresh
    assert httpx.get(f"{paid.gate.url}/readyz").status_code == 200  # /supported carries one too


def test_without_credentials_or_with_a_broken_callable_it_is_our_outage(
    tmp_path, start_gate, write_config, guarded_facilitator
):
    facilitator, guard = guarded_facilitator
    for settings in ({}, {"auth": "tests.support.facilitator_auth:broken"}):
        paid = start_guarded_gate(tmp_path, start_gate, write_config, facilitator, **settings)
        answer = paid.post("paid", send_body("x"), Payer().header_for(paid.gate.url))
        assert answer.json()["error"]["data"]["code"] == "verify_unavailable", (settings, answer.text)
        paid.gate.stop()
    assert guard.seen == []
    log = paid.gate.log.read_text()
    assert "facilitator auth callable failed: RuntimeError" in log and SECRET not in log


def test_a_call_once_the_client_is_closed_is_our_outage_not_an_error():
    """A settle still retrying while the gate stops (its drain over, the client closed) gets
    `Unavailable("closed")`: the claim stays owed for the reconciler, nothing raises past the
    settlement's handling (httpx's own RuntimeError did, as a traceback in the stop's log), and
    the breaker, which judges the facilitator, is not moved by it."""

    async def run() -> None:
        client = FacilitatorClient(FacilitatorConfig(url="http://127.0.0.1:9", breaker_failures=1))
        await client.aclose()
        for call in (client.settle, client.verify):
            with pytest.raises(Unavailable) as raised:
                await call(2, {}, {})
            assert raised.value.reason == "closed"
        assert client.breaker.state == CLOSED

    asyncio.run(run())
