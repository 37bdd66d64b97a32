"""The fault matrix: every facilitator and agent fault, its answer, and what was charged.

One case per row, each printing its line of the table. Each row starts from a fresh token
and payer; "charged" counts settlements in the development facilitator's ledger caused by
that row (PaidView: only what happened since the row began). The rows share one gate and
facilitator per worker, as they shared one gate when they ran in sequence; the rows that
kill a gate or need one without a facilitator start their own.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from devnet.chain import DEV_NETWORK
from devnet.ledger import DevLedger
from devnet.payer import encode_header, sign_payment
from tests.support import gate_helpers
from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import ASSET, PaidSetup, PaidView, Payer, decode_header, paid_config, send_body

LEASE = "claim_lease_seconds = 1.5\n"  # a dead owner's claims are orphans within seconds


def in_background(work: Callable[[], None]) -> None:
    threading.Thread(target=work, daemon=True).start()


def wait_until(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def answer_of(response) -> str:
    if response.status_code != 200:
        body = response.json()
        return f"HTTP {response.status_code} {body.get('error') or body.get('detail')}"
    body = response.json()
    if "error" in body:
        data = body["error"].get("data") or {}
        return f"-32603 {data.get('code')}" if data else f"{body['error']['code']}"
    task = body["result"]
    status = (task.get("metadata") or {}).get("x402.payment.status", "-")
    return f"task {task['status']['state']}, {status}"


def print_row(fault: str, answer: str, charged: int, note: str, capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print(f"\n{fault:<42}  {answer:<36} {charged:>7}  {note}")


def start_matrix_gate(folder: Path, facilitator: str) -> PaidSetup:
    port = free_port()
    chain = f'\n[networks."{DEV_NETWORK}"]\nrpc_url = "{facilitator}/rpc"\n'
    config = folder / "gate.toml"
    config.write_text(LEASE + paid_config(f"http://127.0.0.1:{port}", facilitator) + chain)
    gate = GateProcess(config, folder / "gate.log", port=port).start()
    return PaidSetup(gate=gate, facilitator_url=facilitator, db_path=folder / "gate.db")


@dataclass
class Matrix:
    setup: PaidSetup
    ledger_path: Path


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    from devnet.facilitator import create_facilitator_app
    from tests.support.serve import serve_app

    folder = tmp_path_factory.mktemp("matrix")
    with serve_app(create_facilitator_app(str(folder / "ledger.db"))) as facilitator:
        setup = start_matrix_gate(folder, facilitator)
        try:
            yield Matrix(setup, folder / "ledger.db")
        finally:
            setup.gate.stop_later()


# --- the rows on the shared gate ---------------------------------------------------------
# Each: (fault, expected answer, agent, what it charges). `setup` runs before the paid
# request, `after` after it (its note goes in the table).


@dataclass
class Row:
    fault: str
    expected: str
    charges: int
    agent: str = "paid"
    setup: Callable[[PaidView, Matrix, Payer], None] = lambda paid, matrix, payer: None
    after: Callable[[PaidView, dict[str, str]], str] | None = None
    settles_late_by: float = 0.0  # a slow first settle still running: wait it out before counting


def hold_lock_after_settle(paid: PaidView, matrix: Matrix, payer: Payer) -> None:
    """Once the facilitator has settled, hold the gate's database past its 10 s busy timeout."""
    paid.faults(settle="late:1", count=1)

    def hold() -> None:
        wait_until(lambda: len(paid.ledger()["settlements"]) > 0)
        lock = sqlite3.connect(paid.db_path, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # past the gate's 10 s busy timeout, as settle answers
        time.sleep(12)
        lock.execute("ROLLBACK")
        lock.close()

    in_background(hold)


def poor_after_verify(paid: PaidView, matrix: Matrix, payer: Payer) -> None:
    def drain() -> None:
        wait_until(lambda: len(paid.payment_rows("verify")) > 0)
        ledger = DevLedger(str(matrix.ledger_path))
        ledger.set_balance(DEV_NETWORK, ASSET, payer.address, 0)
        ledger.close()

    in_background(drain)


def recover(paid: PaidView, headers: dict[str, str]) -> str:
    """The payer's retry answers from the claim (its next pass is not due); a reconciler pass collects."""
    early = paid.post("paid", send_body("settle failing then recovering"), headers).json()["result"]
    gate_helpers.cli("reconcile", "--config", str(paid.gate.config))
    late = paid.post("paid", send_body("settle failing then recovering"), headers).json()["result"]
    return f"retry -> {early['metadata']['x402.payment.status']}, after a pass -> {late['metadata']['x402.payment.status']}"


def logged(paid: PaidView, _: dict[str, str]) -> str:
    last = paid.payment_rows()[-1]
    return f"log: {last['action']} {last['error']}".strip()


ROWS = [
    Row("none", "task completed, payment-completed", 1),
    Row(
        "verify slow past timeout",
        "-32603 verify_unavailable",
        0,
        setup=lambda paid, m, p: paid.faults(verify="slow:3", count=1),
    ),
    Row("verify HTTP 500", "-32603 verify_unavailable", 0, setup=lambda paid, m, p: paid.faults(verify="http500")),
    Row(
        "verify malformed JSON",
        "-32603 verify_unavailable",
        0,
        setup=lambda paid, m, p: paid.faults(verify="malformed"),
    ),
    Row("verify says invalid", "HTTP 403 dev_fault", 0, setup=lambda paid, m, p: paid.faults(verify="invalid")),
    Row(
        "settle pending (first attempt times out)",
        "task completed, payment-completed",
        1,
        setup=lambda paid, m, p: paid.faults(settle="slow:2.5", count=1),
        settles_late_by=2.5,  # the slow first call wakes up later and must not charge twice
    ),
    Row(
        "settle failing then recovering",
        "task completed, payment-verified",
        1,
        setup=lambda paid, m, p: paid.faults(settle="http500"),
        after=recover,
    ),
    Row("upstream agent down", "task failed, -", 0, agent="paid-upstream-down"),
    Row(
        "database locked when settle returns",
        "task completed, payment-completed",
        1,
        setup=hold_lock_after_settle,
        after=logged,
    ),
    Row(
        "settle unknown, then landed",
        "task completed, payment-completed",
        1,
        setup=lambda paid, m, p: paid.faults(settle="late:3", count=1),
        after=logged,
    ),
    Row(
        "settle definitively refused (no funds)",
        "task completed, payment-failed",
        0,
        agent="paid-slow",
        setup=poor_after_verify,
        after=logged,
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.fault for r in ROWS])
def test_fault_row(matrix: Matrix, row: Row, capsys: pytest.CaptureFixture[str]) -> None:
    paid = PaidView.since_now(matrix.setup)
    payer = Payer()
    headers = payer.header_for(paid.gate.url, row.agent)
    started = time.monotonic()
    row.setup(paid, matrix, payer)
    answer = answer_of(paid.post(row.agent, send_body(row.fault), headers))
    paid.faults()
    note = row.after(paid, headers) if row.after else ""
    if row.settles_late_by:  # the slow first call wakes up later and must not charge twice
        time.sleep(max(0.0, started + row.settles_late_by + 1.0 - time.monotonic()))
    charged = len(paid.ledger()["settlements"])
    print_row(row.fault, answer, charged, note, capsys)
    assert answer == row.expected, (row.fault, answer)
    assert charged == row.charges, row.fault


def test_token_window_too_short_to_collect(matrix: Matrix, capsys: pytest.CaptureFixture[str]) -> None:
    """A token whose window closes before the work could be settled: refused before any work."""
    paid = PaidView.since_now(matrix.setup)
    short = decode_header(httpx.post(f"{paid.gate.url}/a2a/paid", json=send_body("x")).headers["PAYMENT-REQUIRED"])
    short["accepts"][0]["maxTimeoutSeconds"] = 7
    answer = answer_of(
        paid.post(
            "paid", send_body("short window"), {"PAYMENT-SIGNATURE": encode_header(sign_payment(short, Payer().key))}
        )
    )
    verify_calls = paid.ledger()["verify_calls"]
    print_row("token window too short to collect", answer, 0, f"verify calls: {verify_calls}, no work", capsys)
    assert answer == "HTTP 403 payment_window_too_short" and verify_calls == 0
    assert paid.count_tasks("paid") == 0 and len(paid.ledger()["settlements"]) == 0


# --- the rows with a gate of their own ---------------------------------------------------


def test_restart_with_the_same_pid_mid_settle(
    tmp_path: Path, facilitator: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A restart whose process has the pid the dead one had (pid 1 in a container)."""
    paid = start_matrix_gate(tmp_path, facilitator)
    try:
        headers = Payer().header_for(paid.gate.url)
        paid.send_while_settle_held(headers, "restart")
        paid.gate.kill()
        paid.pretend_owner_is_pid_1()
        paid.gate.start()
        wait_until(lambda: not {"settling", "settle_failed"} & set(paid.claim_states()), 20)
        answer = answer_of(paid.post("paid", send_body("restart"), headers))
        charged = len(paid.ledger()["settlements"])
        print_row("restart with the same pid, mid-settle", answer, charged, "replay after restart", capsys)
        assert answer == "task completed, payment-completed"
        assert charged == 1
    finally:
        paid.gate.stop_later()


def test_facilitator_refusing_connections_then_the_breaker(
    tmp_path: Path, start_gate, write_config, capsys: pytest.CaptureFixture[str]
) -> None:
    """A gate pointed at a port nobody listens on; after breaker_failures (5) such failures
    in a row the breaker opens and answers at once."""
    port, refused_port = free_port(), free_port()
    down = start_gate(
        write_config(paid_config(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{refused_port}"), name="down.toml"),
        port=port,
    )
    required = decode_header(httpx.post(f"{down.url}/a2a/paid", json=send_body("x")).headers["PAYMENT-REQUIRED"])
    answer = answer_of(
        httpx.post(
            f"{down.url}/a2a/paid",
            json=send_body("x"),
            headers={"PAYMENT-SIGNATURE": encode_header(sign_payment(required, Payer().key))},
        )
    )
    print_row("facilitator refuses connections", answer, 0, "", capsys)
    assert answer == "-32603 verify_unavailable"
    token = {"PAYMENT-SIGNATURE": encode_header(sign_payment(required, Payer().key))}
    for _ in range(4):
        httpx.post(f"{down.url}/a2a/paid", json=send_body("x"), headers=token)
    started = time.monotonic()
    response = httpx.post(f"{down.url}/a2a/paid", json=send_body("x"), headers=token)
    elapsed = time.monotonic() - started
    retry_after = response.json()["error"]["data"].get("retry_after")
    note = f"retry_after {retry_after} s, {elapsed * 1000:.0f} ms"
    print_row("facilitator breaker open", answer_of(response), 0, note, capsys)
    assert answer_of(response) == "-32603 verify_unavailable" and retry_after and retry_after > 0
