"""The fault matrix: every facilitator and agent fault, its answer, and what was charged.

One test, printing its table. Each row starts from a fresh token; "charged" counts
settlements in the development facilitator's ledger caused by that row.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable

import httpx

from devnet.chain import DEV_NETWORK
from devnet.ledger import DevLedger
from devnet.payer import encode_header, sign_payment
from tests.support.gate_process import free_port
from tests.support.paid import ASSET, PaidSetup, Payer, decode_header, paid_config, send_body

LEASE = "claim_lease_seconds = 1.5\n"  # a dead owner's claims are orphans within seconds


def in_background(work: Callable[[], None]) -> Callable[[], None]:
    return lambda: threading.Thread(target=work, daemon=True).start()


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


def test_fault_matrix(tmp_path, facilitator, start_gate, write_config, capsys):
    port = free_port()
    chain = f'\n[networks."{DEV_NETWORK}"]\nrpc_url = "{facilitator}/rpc"\n'
    gate = start_gate(write_config(LEASE + paid_config(f"http://127.0.0.1:{port}", facilitator) + chain), port=port)
    paid = PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")
    refused_port = free_port()
    rows: list[tuple[str, str, int, str]] = []

    def row(
        fault: str,
        expected: str,
        agent: str = "paid",
        setup: Callable[[], None] = lambda: None,
        after: Callable[[dict[str, str]], str] | None = None,
        payer_setup: Callable[[Payer], None] | None = None,
    ) -> None:
        before = len(paid.ledger()["settlements"])
        payer = Payer()
        headers = payer.header_for(gate.url, agent)
        setup()
        if payer_setup is not None:
            payer_setup(payer)
        answer = answer_of(paid.post(agent, send_body(fault), headers))
        paid.faults()
        note = after(headers) if after else ""
        charged = len(paid.ledger()["settlements"]) - before
        rows.append((fault, answer, charged, note))
        assert answer == expected, (fault, answer)

    row("none", "task completed, payment-completed")
    row("verify slow past timeout", "-32603 verify_unavailable", setup=lambda: paid.faults(verify="slow:3", count=1))
    row("verify HTTP 500", "-32603 verify_unavailable", setup=lambda: paid.faults(verify="http500"))
    row("verify malformed JSON", "-32603 verify_unavailable", setup=lambda: paid.faults(verify="malformed"))
    row("verify says invalid", "HTTP 403 dev_fault", setup=lambda: paid.faults(verify="invalid"))
    row(
        "settle pending (first attempt times out)",
        "task completed, payment-completed",
        setup=lambda: paid.faults(settle="slow:2.5", count=1),
    )

    def recover(headers: dict[str, str]) -> str:
        replay = paid.post("paid", send_body("settle failing then recovering"), headers).json()["result"]
        return f"retry -> {replay['metadata']['x402.payment.status']}"

    row(
        "settle failing then recovering",
        "task completed, payment-verified",
        setup=lambda: paid.faults(settle="http500"),
        after=recover,
    )
    row("upstream agent down", "task failed, -", agent="paid-upstream-down")

    def hold_lock_after_settle() -> None:
        wait_until(lambda: len(paid.ledger()["settlements"]) > settled_before[0])
        lock = sqlite3.connect(paid.db_path, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # past the gate's 10 s busy timeout, as settle answers
        time.sleep(12)
        lock.execute("ROLLBACK")
        lock.close()

    def logged(_: dict[str, str]) -> str:
        last = paid.payment_rows()[-1]
        return f"log: {last['action']} {last['error']}".strip()

    settled_before = [len(paid.ledger()["settlements"])]
    row(
        "database locked when settle returns",
        "task completed, payment-completed",
        setup=lambda: (paid.faults(settle="late:1", count=1), in_background(hold_lock_after_settle)()),
        after=logged,
    )
    row(
        "settle unknown, then landed",
        "task completed, payment-completed",
        setup=lambda: paid.faults(settle="late:3", count=1),
        after=logged,
    )

    def poor_after_verify(payer: Payer) -> None:
        def drain() -> None:
            wait_until(lambda: len(paid.payment_rows("verify")) > verified_before)
            ledger = DevLedger(str(tmp_path / "ledger.db"))
            ledger.set_balance(DEV_NETWORK, ASSET, payer.address, 0)
            ledger.close()

        in_background(drain)()

    verified_before = len(paid.payment_rows("verify"))
    row(
        "settle definitively refused (no funds)",
        "task completed, payment-failed",
        agent="paid-slow",
        payer_setup=poor_after_verify,
        after=logged,
    )

    # a restart whose process has the pid the dead one had (pid 1 in a container)
    before = len(paid.ledger()["settlements"])
    headers = Payer().header_for(gate.url)
    paid.faults(settle="slow:15", count=1)
    threading.Thread(
        target=lambda: _swallow(lambda: paid.post("paid", send_body("restart"), headers, timeout=10)), daemon=True
    ).start()
    wait_until(lambda: _claim_states(paid) == ["settling"])
    gate.kill()
    _pretend_owner_is_pid_1(paid)
    gate.start()
    wait_until(lambda: "settling" not in _claim_states(paid) and "settle_failed" not in _claim_states(paid), 20)
    answer = answer_of(paid.post("paid", send_body("restart"), headers))
    rows.append(
        (
            "restart with the same pid, mid-settle",
            answer,
            len(paid.ledger()["settlements"]) - before,
            "replay after restart",
        )
    )
    assert answer == "task completed, payment-completed"

    # a token whose window closes before the work could be settled: refused before any work
    short = decode_header(httpx.post(f"{gate.url}/a2a/paid", json=send_body("x")).headers["PAYMENT-REQUIRED"])
    short["accepts"][0]["maxTimeoutSeconds"] = 7
    verified = paid.ledger()["verify_calls"]
    answer = answer_of(
        paid.post(
            "paid", send_body("short window"), {"PAYMENT-SIGNATURE": encode_header(sign_payment(short, Payer().key))}
        )
    )
    rows.append(
        (
            "token window too short to collect",
            answer,
            0,
            f"verify calls: {paid.ledger()['verify_calls'] - verified}, no work",
        )
    )
    assert answer == "HTTP 403 payment_window_too_short" and paid.ledger()["verify_calls"] == verified

    # the facilitator refusing connections: a gate pointed at a port nobody listens on
    port2 = free_port()
    down = start_gate(
        write_config(paid_config(f"http://127.0.0.1:{port2}", f"http://127.0.0.1:{refused_port}"), name="down.toml"),
        port=port2,
    )
    required = decode_header(httpx.post(f"{down.url}/a2a/paid", json=send_body("x")).headers["PAYMENT-REQUIRED"])
    answer = answer_of(
        httpx.post(
            f"{down.url}/a2a/paid",
            json=send_body("x"),
            headers={"PAYMENT-SIGNATURE": encode_header(sign_payment(required, Payer().key))},
        )
    )
    rows.append(("facilitator refuses connections", answer, 0, ""))
    assert answer == "-32603 verify_unavailable"
    # after breaker_failures (5) such failures in a row the breaker opens and answers at once
    token = {"PAYMENT-SIGNATURE": encode_header(sign_payment(required, Payer().key))}
    for _ in range(4):
        httpx.post(f"{down.url}/a2a/paid", json=send_body("x"), headers=token)
    started = time.monotonic()
    response = httpx.post(f"{down.url}/a2a/paid", json=send_body("x"), headers=token)
    elapsed = time.monotonic() - started
    retry_after = response.json()["error"]["data"].get("retry_after")
    rows.append(
        ("facilitator breaker open", answer_of(response), 0, f"retry_after {retry_after} s, {elapsed * 1000:.0f} ms")
    )
    assert answer_of(response) == "-32603 verify_unavailable" and retry_after and retry_after > 0

    # settle pending: the slow first call wakes up later and must not charge twice
    time.sleep(2.0)
    assert len(paid.ledger()["settlements"]) == 6  # each charged row above, once
    expected_charges = {
        "none": 1,
        "settle pending (first attempt times out)": 1,
        "settle failing then recovering": 1,
        "database locked when settle returns": 1,
        "settle unknown, then landed": 1,
        "restart with the same pid, mid-settle": 1,
    }
    for fault, _, charged, _ in rows:
        assert charged == expected_charges.get(fault, 0), fault

    width = max(len(r[0]) for r in rows)
    lines = [f"{'fault':<{width}}  {'answer':<36} charged  note"]
    lines += [f"{f:<{width}}  {a:<36} {c:>7}  {n}" for f, a, c, n in rows]
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def _claim_states(paid: PaidSetup) -> list[str]:
    conn = sqlite3.connect(paid.db_path)
    try:
        return [r[0] for r in conn.execute("SELECT state FROM claims WHERE state NOT IN ('settled', 'unsettled')")]
    finally:
        conn.close()


def _pretend_owner_is_pid_1(paid: PaidSetup) -> None:
    conn = sqlite3.connect(paid.db_path)
    try:
        conn.execute("UPDATE claims SET owner_pid = 1")
        conn.commit()
    finally:
        conn.close()


def _swallow(call: Callable[[], object]) -> None:
    try:
        call()
    except Exception:  # noqa: BLE001 -- the call is expected to fail in any way; only the state after counts
        pass
