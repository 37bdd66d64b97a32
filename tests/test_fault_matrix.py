"""The fault matrix: every facilitator and agent fault, its answer, and what was charged.

One test, printing its table. Each row starts from a fresh token; "charged" counts
settlements in the development facilitator's ledger caused by that row.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from devnet.payer import encode_header, sign_payment
from tests.support.gate_process import free_port
from tests.support.paid import PaidSetup, Payer, decode_header, paid_config, send_body


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
    gate = start_gate(write_config(paid_config(f"http://127.0.0.1:{port}", facilitator)), port=port)
    paid = PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")
    refused_port = free_port()
    rows: list[tuple[str, str, int, str]] = []

    def row(fault: str, expected: str, agent: str = "paid", setup: Callable[[], None] = lambda: None,
            after: Callable[[dict[str, str]], str] | None = None) -> None:
        before = len(paid.ledger()["settlements"])
        headers = Payer().header_for(gate.url, agent)
        setup()
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
    row("settle pending (first attempt times out)", "task completed, payment-completed",
        setup=lambda: paid.faults(settle="slow:2.5", count=1))

    def recover(headers: dict[str, str]) -> str:
        replay = paid.post("paid", send_body("settle failing then recovering"), headers).json()["result"]
        return f"retry -> {replay['metadata']['x402.payment.status']}"

    row("settle failing then recovering", "task completed, payment-verified",
        setup=lambda: paid.faults(settle="http500"), after=recover)
    row("upstream agent down", "task failed, -", agent="paid-upstream-down")

    # the facilitator refusing connections: a gate pointed at a port nobody listens on
    port2 = free_port()
    down = start_gate(write_config(paid_config(f"http://127.0.0.1:{port2}", f"http://127.0.0.1:{refused_port}"),
                                   name="down.toml"), port=port2)
    required = decode_header(httpx.post(f"{down.url}/a2a/paid", json=send_body("x")).headers["PAYMENT-REQUIRED"])
    answer = answer_of(httpx.post(f"{down.url}/a2a/paid", json=send_body("x"),
                                  headers={"PAYMENT-SIGNATURE": encode_header(sign_payment(required, Payer().key))}))
    rows.append(("facilitator refuses connections", answer, 0, ""))
    assert answer == "-32603 verify_unavailable"

    # settle pending: the slow first call wakes up later and must not charge twice
    time.sleep(2.0)
    assert len(paid.ledger()["settlements"]) == 3  # rows: none, settle pending, settle recovering
    expected_charges = {"none": 1, "settle pending (first attempt times out)": 1, "settle failing then recovering": 1}
    for fault, _, charged, _ in rows:
        assert charged == expected_charges.get(fault, 0), fault

    width = max(len(r[0]) for r in rows)
    lines = [f"{'fault':<{width}}  {'answer':<36} charged  note"]
    lines += [f"{f:<{width}}  {a:<36} {c:>7}  {n}" for f, a, c, n in rows]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
