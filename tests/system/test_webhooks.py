"""Webhooks from real `a2a-gate serve` processes, paid through the development facilitator, to a real
receiving server on loopback (tests/support/webhook_receiver.py) that fails, hangs past the timeout
and recovers: every settlement arrives at least once, signed (checked with the lines docs/operations.md
prints), under one id per event, and carrying nothing secret the payer sent; a dead endpoint leaves
paid requests as fast as without one; a gate killed with events owed delivers them after its restart;
two replicas on PostgreSQL never have one event in flight twice at once, and a frozen one's
endpoint is taken over when its lease lapses."""

# ruff: noqa: F811  (the `replicas` fixture, imported, is a test's argument)
from __future__ import annotations

import json
import sqlite3
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.gate_helpers import wait_for
from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import Payer, paid_config, send_body
from tests.support.replicas import Replicas, frozen, replicas  # noqa: F401  (the fixture)
from tests.support.webhook_receiver import Receiver, documented_check

pytestmark = pytest.mark.system

SECRET = "whsec-test-2c3f9a"


def webhooks(url: str, *, timeout: float = 1.0, events: str = '"payment.settled"') -> str:
    return f"""
[webhooks]
timeout_seconds = {timeout}
lease_seconds = {max(3.0, 3 * timeout)}
backoff_seconds = 0.2
max_backoff_seconds = 1
poll_interval_seconds = 0.2

[[webhooks.endpoints]]
name = "books"
url = "{url}"
events = [{events}]
secret_env = "BOOKS_WEBHOOK_SECRET"
"""


def start(home: Path, facilitator: str, after: str = "") -> GateProcess:
    """A gate of its own in `home` (its own SQLite file), on the paid test configuration."""
    home.mkdir(exist_ok=True)
    port = free_port()
    config = home / "gate.toml"
    config.write_text(paid_config(f"http://127.0.0.1:{port}", facilitator) + after)
    env = {"BOOKS_WEBHOOK_SECRET": SECRET}
    return GateProcess(config, home / "gate.log", port=port, env=env).start()


def pay(gate: GateProcess, payer: Payer, text: str, sent: list[dict[str, Any]] | None = None) -> float:
    """One paid request, completed and settled; how long it took (seconds)."""
    token = payer.token_for(gate.url)
    if sent is not None:
        sent.append(token)
    from devnet.payer import encode_header

    began = time.monotonic()
    answer = httpx.post(
        f"{gate.url}/a2a/paid", json=send_body(text), headers={"PAYMENT-SIGNATURE": encode_header(token)}, timeout=30
    )
    took = time.monotonic() - began
    assert answer.status_code == 200, answer.text
    status = answer.json()["result"]["status"]
    assert (
        status["state"] == "completed" and status["message"]["metadata"]["x402.payment.status"] == "payment-completed"
    )
    return took


def settle_ids(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {f"log-{r[0]}" for r in conn.execute("SELECT id FROM payments WHERE action = 'settle'")}


def secrets_in(token: dict[str, Any]) -> list[str]:
    """What of a token is secret: its signature and nonce (and the token itself, as sent)."""
    from devnet.payer import encode_header

    found = [encode_header(token)]

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key in ("signature", "nonce") and isinstance(item, str):
                    found.append(item.lower().removeprefix("0x"))
                walk(item)

    walk(token)
    return found


def sample(gate: GateProcess, name: str, labels: str) -> float:
    for line in httpx.get(f"{gate.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(f"{name}{{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def until(what: Callable[[], Any], timeout: float = 60) -> None:
    wait_for(lambda: bool(what()), timeout=timeout, interval=0.1)


def test_events_arrive_through_failures_and_a_hang_signed_once_each_and_with_nothing_secret(
    tmp_path: Path, facilitator: str
):
    verified = documented_check()
    with Receiver() as receiver:
        receiver.mode, receiver.hang_seconds = "fail", 2.5
        gate = start(tmp_path / "gate", facilitator, webhooks(receiver.url))
        try:
            payer, sent = Payer(), []
            for text in ("one", "two", "three"):
                pay(gate, payer, text, sent)
            expected = settle_ids(tmp_path / "gate" / "gate.db")
            assert len(expected) == 3
            # refused (500), each event again and again
            until(lambda: all(sum(a.event_id == i for a in receiver.answered("500")) >= 2 for i in expected))
            receiver.mode = "hang"  # no answer within the gate's timeout
            until(lambda: len(receiver.answered("hung")) >= 2)
            assert not receiver.delivered()
            receiver.mode = "ok"  # the endpoint recovers
            until(lambda: set(receiver.delivered()) == expected)
            until(lambda: sample(gate, "a2a_gate_webhook_backlog", 'endpoint="books"') == 0)
            assert sample(gate, "a2a_gate_webhook_deliveries_total", 'outcome="delivered"') == 3
            assert sample(gate, "a2a_gate_webhook_deliveries_total", 'outcome="failed"') >= 8
            assert sample(gate, "a2a_gate_webhook_deliveries_total", 'outcome="given_up"') == 0
        finally:
            gate.stop()
        for attempt in receiver.attempts:
            assert attempt.event_id in expected  # only the events asked for, under their ids
            assert verified(SECRET, attempt.headers, attempt.body), attempt.headers
            assert not verified("another secret", attempt.headers, attempt.body)
            event = json.loads(attempt.body)
            assert event["id"] == attempt.event_id and event["type"] == "payment.settled"
            assert event["data"]["payer"] == payer.address.lower() and event["data"]["amount"] == "1000"
            assert event["data"]["transaction"].startswith("0x")
            text = attempt.body.decode().lower()
            for secret in [s for token in sent for s in secrets_in(token)] + [payer.key.lower().removeprefix("0x")]:
                assert secret.lower() not in text
            assert SECRET not in text
        # every attempt of one event is the same event: the same bytes, the same id
        for event_id in expected:
            assert len({a.body for a in receiver.attempts if a.event_id == event_id}) == 1
        log = (tmp_path / "gate" / "gate.log").read_text()
        assert SECRET not in log and "Traceback" not in log


def test_a_dead_endpoint_does_not_slow_paid_requests(tmp_path: Path, facilitator: str):
    payer = Payer()
    plain = start(tmp_path / "plain", facilitator)
    try:
        pay(plain, payer, "warm up")
        without = [pay(plain, payer, f"plain {i}") for i in range(8)]
    finally:
        plain.stop()
    with Receiver() as receiver:
        receiver.mode, receiver.hang_seconds = "hang", 30.0
        hooked = start(tmp_path / "hooked", facilitator, webhooks(receiver.url, timeout=3.0))
        try:
            pay(hooked, payer, "warm up")
            until(lambda: receiver.attempts)  # its deliveries hang from here on
            with_dead = [pay(hooked, payer, f"hooked {i}") for i in range(8)]
            hanging = [a for a in receiver.attempts if not a.ended]
            assert hanging, "the endpoint was not hanging while the paid requests ran"
        finally:
            hooked.stop()
    # the same order, and no delivery timeout (3 s) inside any paid request
    assert max(with_dead) < 1.5, with_dead
    assert statistics.median(with_dead) < 3 * statistics.median(without) + 0.05, (with_dead, without)


def test_a_gate_killed_with_events_owed_delivers_them_after_its_restart(tmp_path: Path, facilitator: str):
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"  # nobody listens yet: connections refused
    gate = start(tmp_path / "gate", facilitator, webhooks(url))
    payer = Payer()
    for text in ("one", "two"):
        pay(gate, payer, text)
    expected = settle_ids(tmp_path / "gate" / "gate.db")
    until(lambda: sample(gate, "a2a_gate_webhook_deliveries_total", 'outcome="failed"') >= 2)
    gate.kill()  # SIGKILL: nothing handed over, the lease left to lapse
    with Receiver(port) as receiver:
        again = GateProcess(gate.config, gate.log, port=gate.port, env=gate.env).start()
        try:
            until(lambda: set(receiver.delivered()) == expected)
        finally:
            again.stop()


def test_two_replicas_on_postgresql_never_send_one_event_twice_at_once_and_take_over_from_a_frozen_one(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("BOOKS_WEBHOOK_SECRET", SECRET)
    with Receiver() as receiver:
        receiver.mode, receiver.fail_first = "slow", True  # each event refused once, then taken slowly
        sections = webhooks(receiver.url)
        gates = [replicas.start(name, lease=30, reconcile=3600, sections=sections) for name in ("a", "b")]
        payer = Payer()
        for i in range(6):
            pay(gates[i % 2], payer, f"request {i}")
        expected = {f"log-{r[0]}" for r in replicas.rows("SELECT id FROM payments WHERE action = 'settle'")}
        assert len(expected) == 6
        until(lambda: set(receiver.delivered()) == expected)
        # a frozen replica (a long pause) loses the endpoint when its lease lapses; the other takes over,
        # whichever of the two held it
        for still, other in ((gates[0], gates[1]), (gates[1], gates[0])):
            # frozen between sends: one frozen after the receiver's 200 but before its own record of it
            # is resent by the other, as documented (at least once); that is not what this test measures
            until(lambda: replicas.rows("SELECT COUNT(*) FROM webhook_deliveries WHERE state = 'pending'")[0][0] == 0)
            with frozen(still):
                pay(other, payer, "while the other replica is frozen")
                expected = {f"log-{r[0]}" for r in replicas.rows("SELECT id FROM payments WHERE action = 'settle'")}
                until(lambda expected=expected: set(receiver.delivered()) == expected)
        assert len(expected) == 8
        time.sleep(1.0)  # a second sender, if there were one, would have sent again by now
        assert receiver.overlaps == []
        assert all(sum(a.event_id == i for a in receiver.answered("200")) == 1 for i in expected)
