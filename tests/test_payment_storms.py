"""Concurrency: one token pays for one request, however many arrive at once.

The claim lives in the shared SQLite file; these storms check it against the
ledger (charges) and the task table (executions).
"""

from __future__ import annotations

import asyncio

import httpx

from tests.support.paid import Payer, send_body


async def _storm(url: str, bodies: list[dict], headers: dict[str, str]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        return await asyncio.gather(*(client.post(url, json=b, headers=headers) for b in bodies))


def test_fifty_concurrent_sends_same_token_same_text_execute_once(paid):
    headers = Payer().header_for(paid.gate.url)
    bodies = [send_body("storm", call_id=i) for i in range(50)]
    responses = asyncio.run(_storm(f"{paid.gate.url}/a2a/paid", bodies, headers))
    assert all(r.status_code == 200 for r in responses), {r.status_code for r in responses}
    results = [r.json() for r in responses]
    completed = [r["result"] for r in results if "result" in r]
    in_flight = [r["error"] for r in results if "error" in r]
    assert completed, "at least the first request completes"
    assert all(e["code"] == -32603 and e["data"] == {"code": "in_flight", "retryable": True} for e in in_flight)
    assert len({t["id"] for t in completed}) == 1  # replays answer the same task
    assert paid.count_tasks("paid") == 1
    assert len(paid.ledger()["settlements"]) == 1
    actions = [r["action"] for r in paid.payment_rows()]
    assert actions.count("verify") == 1 and actions.count("settle") == 1


def test_twenty_concurrent_sends_same_token_different_texts_execute_once(paid):
    headers = Payer().header_for(paid.gate.url)
    bodies = [send_body(f"text {i}", call_id=i) for i in range(20)]
    responses = asyncio.run(_storm(f"{paid.gate.url}/a2a/paid", bodies, headers))
    ok = [r for r in responses if r.status_code == 200 and "result" in r.json()]
    rejected = [r for r in responses if r.status_code == 403]
    assert len(ok) == 1
    assert len(rejected) == 19
    assert all(r.json()["error"] == "payment_already_used" for r in rejected)
    assert paid.count_tasks("paid") == 1
    assert len(paid.ledger()["settlements"]) == 1


def test_the_claim_holds_across_worker_processes(tmp_path, facilitator, start_gate, write_config):
    from tests.support.gate_process import free_port
    from tests.support.paid import PaidSetup, paid_config

    port = free_port()
    gate = start_gate(
        write_config(paid_config(f"http://127.0.0.1:{port}", facilitator)), port=port, extra_args=["--workers", "2"]
    )
    paid = PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")
    headers = Payer().header_for(gate.url)
    bodies = [send_body(f"text {i % 2}", call_id=i) for i in range(30)]  # two different requests, one token
    responses = asyncio.run(_storm(f"{gate.url}/a2a/paid", bodies, headers))
    assert all(r.status_code in (200, 403) for r in responses)
    assert paid.count_tasks("paid") == 1
    assert len(paid.ledger()["settlements"]) == 1
    assert len({r["result"]["id"] for r in (x.json() for x in responses if x.status_code == 200) if "result" in r}) == 1
