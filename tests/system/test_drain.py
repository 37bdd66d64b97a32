"""SIGTERM drains: requests stop, running work gets `[http] drain_seconds` to finish, and
what is still undelivered then is stopped and released uncharged at once (not a lease later)."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from tests.support.gate_helpers import create_key, sse_events, wait_for
from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import PaidSetup, Payer, paid_config, send_body, start_paid_gate

DRAIN = "[http]\ndrain_seconds = 1\n"


def test_sigterm_stops_undelivered_work_and_releases_its_claim_uncharged(tmp_path, facilitator, write_config):
    # a long lease: without the drain's release the claim would stay "running" for minutes
    paid, _ = start_paid_gate(tmp_path, facilitator, write_config, after=DRAIN)
    gate = paid.gate
    headers = Payer().header_for(gate.url, "paid-slow")
    task = paid.post("paid-slow", send_body("sleep 30", blocking=False), headers).json()["result"]
    wait_for(lambda: paid.claim_states() == ["running"])

    started = time.monotonic()
    gate.stop()  # SIGTERM
    assert gate.process is not None and gate.process.returncode == 143  # a graceful exit on SIGTERM
    assert time.monotonic() - started < 10  # the drain, not the 30 s of work

    assert paid.claim_states() == []  # released by the drain, not left for a lease
    assert [r["action"] for r in paid.payment_rows()] == ["verify", "release"]
    assert paid.ledger()["settle_calls"] == 0
    gate.start()
    try:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": task["id"]}}
        after = paid.post("paid-slow", body, headers).json()["result"]
        assert after["status"]["state"] == "canceled"
        assert "shutdown" in after["status"]["message"]["parts"][0]["text"]
        retry = paid.post("paid-slow", send_body("sleep 0.1"), headers)  # the token was not spent
        assert retry.json()["result"]["status"]["state"] == "completed"
    finally:
        gate.stop()


def answer_during_stop(paid: PaidSetup, body: dict, sig: int) -> tuple[httpx.Response, list[str]]:
    """Send `body` (30 s of paid work), signal the gate once its claim runs, and return the
    answer with the claim states seen the moment it arrived."""
    headers = Payer().header_for(paid.gate.url, "paid-slow")
    answers: list[tuple[httpx.Response, list[str]]] = []

    def send() -> None:
        response = httpx.post(f"{paid.gate.url}/a2a/paid-slow", json=body, headers=headers, timeout=60)
        response.read()
        answers.append((response, paid.claim_states()))

    sender = threading.Thread(target=send)
    sender.start()
    wait_for(lambda: paid.claim_states() == ["running"])
    assert paid.gate.process is not None
    paid.gate.process.send_signal(sig)
    sender.join(60)
    assert answers, "no answer"
    paid.gate.process.wait(30)
    return answers[0]


STOPPED = "Stopped by a server shutdown; nothing was charged."


@pytest.mark.parametrize("sig", [signal.SIGTERM])  # (SIGHUP reloads the configuration: tests/system/test_reload.py)
def test_a_blocking_paid_send_running_at_a_stop_gets_its_canceled_task_and_its_claim_back(
    tmp_path, facilitator, write_config, sig
):
    """Past `drain_seconds` the undelivered work is stopped and the waiting client answered with
    the canceled Task (never a 500 or a cut connection); its claim is released before the answer."""
    paid, _ = start_paid_gate(tmp_path, facilitator, write_config, after=DRAIN)
    response, claims = answer_during_stop(paid, send_body("sleep 30"), sig)
    assert response.status_code == 200, response.text
    task = response.json()["result"]
    assert task["status"]["state"] == "canceled"
    assert task["status"]["message"]["parts"][0]["text"] == STOPPED
    assert claims == []  # released at once, not after a lease
    assert [r["action"] for r in paid.payment_rows()] == ["verify", "release"]
    assert paid.ledger()["settle_calls"] == 0
    assert paid.gate.process is not None and paid.gate.process.returncode == 128 + sig
    log = paid.gate.log.read_text()
    assert "Traceback" not in log and "Exception in ASGI application" not in log


def test_a_paid_stream_running_at_sigterm_ends_with_the_canceled_task(tmp_path, facilitator, write_config):
    paid, _ = start_paid_gate(tmp_path, facilitator, write_config, after=DRAIN)
    response, claims = answer_during_stop(paid, send_body("sleep 30", method="message/stream"), signal.SIGTERM)
    assert response.status_code == 200
    events = [e["result"] for e in sse_events(response.text)]
    final = events[-1]
    assert final["kind"] == "status-update" and final["final"] is True
    assert final["status"]["state"] == "canceled"
    assert final["status"]["message"]["parts"][0]["text"] == STOPPED
    assert claims == []
    assert "Traceback" not in paid.gate.log.read_text()


def test_a_free_blocking_send_running_at_sigterm_gets_its_canceled_task(tmp_path, write_config):
    port = free_port()
    config = write_config(
        f'public_url = "http://127.0.0.1:{port}"\ndatabase = "gate.db"\n{DRAIN}\n'
        '[agents.slow]\nbackend = "python"\ncallable = "tests.support.agents:slow"\n'
    )
    gate = GateProcess(config, tmp_path / "gate.log", port=port).start()
    headers = {"Authorization": f"Bearer {create_key(config, 'ops')}"}
    answers: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"{gate.url}/a2a/slow", json=send_body("sleep 30"), headers=headers, timeout=60)
        )
    )
    sender.start()
    time.sleep(0.5)  # the request is in: the work sleeps
    assert gate.process is not None
    gate.process.send_signal(signal.SIGTERM)
    sender.join(60)
    assert answers and answers[0].status_code == 200, answers
    task = answers[0].json()["result"]
    assert task["status"]["state"] == "canceled" and task["status"]["message"]["parts"][0]["text"] == STOPPED
    gate.process.wait(30)
    assert "Traceback" not in gate.log.read_text()


def test_delivered_work_still_settling_when_the_drain_ends_is_answered_retry_and_stays_owed(
    tmp_path, facilitator, write_config
):
    """Work delivered before the stop keeps its claim (a settle may be under way); a request still
    waiting on that settle when the drain is over gets a retryable error, never a 500."""
    port = free_port()
    text = paid_config(f"http://127.0.0.1:{port}", facilitator).replace("timeout_seconds = 1.5", "timeout_seconds = 30")
    gate = GateProcess(write_config("claim_lease_seconds = 300\n" + text + DRAIN), tmp_path / "gate.log", port=port)
    paid = PaidSetup(gate=gate.start(), facilitator_url=facilitator, db_path=tmp_path / "gate.db")
    paid.faults(settle="slow:40")
    headers = Payer().header_for(gate.url, "paid")
    answers: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"{gate.url}/a2a/paid", json=send_body("x"), headers=headers, timeout=60)
        )
    )
    sender.start()
    wait_for(lambda: paid.claim_states() == ["settling"])
    assert gate.process is not None
    gate.process.send_signal(signal.SIGTERM)
    sender.join(60)
    assert answers and answers[0].status_code == 200, answers
    error = answers[0].json()["error"]
    assert error["code"] == -32603 and error["data"] == {"code": "shutting_down", "retryable": True}
    gate.process.wait(30)
    assert paid.claim_states() != []  # owed: the reconciler or the payer's retry settles it
    assert "Traceback" not in gate.log.read_text()


def test_a_resubscription_to_work_running_elsewhere_ends_with_a_retryable_error_at_sigterm(tmp_path, write_config):
    """A stream that follows a task another process runs (through the store) cannot end with the
    task here: at a stop it ends with a retryable error, to resubscribe elsewhere, never cut off."""
    config = write_config(
        f'database = "gate.db"\n{DRAIN}\n[agents.slow]\nbackend = "python"\ncallable = "tests.support.agents:slow"\n'
    )
    runner = GateProcess(config, tmp_path / "runner.log").start()
    follower = GateProcess(config, tmp_path / "follower.log").start()  # the same SQLite file
    try:
        headers = {"Authorization": f"Bearer {create_key(config, 'ops')}"}
        body = send_body("sleep 30", blocking=False)
        task = httpx.post(f"{runner.url}/a2a/slow", json=body, headers=headers).json()["result"]
        follow = {"jsonrpc": "2.0", "id": 4, "method": "tasks/resubscribe", "params": {"id": task["id"]}}
        texts: list[str] = []

        def read() -> None:
            with httpx.stream("POST", f"{follower.url}/a2a/slow", json=follow, headers=headers, timeout=60) as r:
                texts.append(r.read().decode())

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(1.0)  # the stream is open and has its first event
        assert follower.process is not None
        follower.process.send_signal(signal.SIGTERM)
        reader.join(60)
        assert texts, "the stream was cut off"
        events = sse_events(texts[0])
        assert events[0]["result"]["id"] == task["id"]
        assert events[-1]["error"]["data"] == {"code": "shutting_down", "retryable": True}
        follower.process.wait(30)
        assert "Traceback" not in follower.log.read_text()
    finally:
        follower.stop()
        runner.stop()


def test_a_paid_stream_still_settling_when_the_drain_ends_ends_with_a_retryable_error(
    tmp_path, facilitator, write_config
):
    port = free_port()
    text = paid_config(f"http://127.0.0.1:{port}", facilitator).replace("timeout_seconds = 1.5", "timeout_seconds = 30")
    gate = GateProcess(write_config("claim_lease_seconds = 300\n" + text + DRAIN), tmp_path / "gate.log", port=port)
    paid = PaidSetup(gate=gate.start(), facilitator_url=facilitator, db_path=tmp_path / "gate.db")
    paid.faults(settle="slow:40")
    headers = Payer().header_for(gate.url, "paid")
    texts: list[str] = []

    def read() -> None:
        body = send_body("x", method="message/stream")
        with httpx.stream("POST", f"{gate.url}/a2a/paid", json=body, headers=headers, timeout=60) as r:
            texts.append(r.read().decode())

    reader = threading.Thread(target=read)
    reader.start()
    wait_for(lambda: paid.claim_states() == ["settling"])
    assert gate.process is not None
    gate.process.send_signal(signal.SIGTERM)
    reader.join(60)
    assert texts, "the stream was cut off"
    events = sse_events(texts[0])
    assert events[-1]["error"]["data"] == {"code": "shutting_down", "retryable": True}
    gate.process.wait(30)
    assert paid.claim_states() != []  # owed
    assert "Traceback" not in gate.log.read_text()
