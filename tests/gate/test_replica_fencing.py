"""Ownership is fenced: a replica that lost its claim neither delivers nor writes.

Replica A runs a paid slow agent and stalls (SIGSTOP: a long pause, a VM migration) past
its 3 s lease. Replica B finds the lease lapsed and releases the claim "not delivered";
the payer's retry of the same token on B is delivered and charged. Then A wakes up. Its
work must stop there: no second delivery for the one signature, no write onto B's claim
for the same token (which stays `settled`), and A says in its log that it lost the claim.

Two `a2a-gate serve` processes on one PostgreSQL schema, in front of the development facilitator.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import httpx

from devnet.chain import DEV_NETWORK
from devnet.payer import encode_header
from tests.support import replicas as support
from tests.support.gate_helpers import wait_for
from tests.support.paid import Payer, send_body
from tests.support.replicas import frozen, post

replicas = support.replicas  # the fixture, bound by assignment (see tests/support/dev_facilitator_helpers.py)

LEASE = 3.0
WORK = "sleep 4"  # A is frozen inside this; B's retry runs it again
ANSWER = "slept 4"


def delivered(answer: httpx.Response | None) -> bool:
    """The payer got the agent's work in this answer (anywhere in it, in any state), from an
    execution, not a replay of another's answer."""
    if answer is None or answer.headers.get("X-Idempotent-Replay") == "true":
        return False
    return ANSWER in answer.text


def says_it_lost_the_claim(log: str) -> bool:
    return any(re.search(r"\blost\b", line, re.I) and "claim" in line.lower() for line in log.splitlines())


def test_a_replica_that_lost_its_lease_while_frozen_neither_delivers_nor_writes(replicas) -> None:
    a = replicas.start("a", lease=LEASE, reconcile=0.5)
    b = replicas.start("b", lease=LEASE, reconcile=0.5)
    payer = Payer()
    headers = {"PAYMENT-SIGNATURE": encode_header(payer.token_for(a.url, "paid-slow"))}
    body = send_body(WORK)  # the same request, retried with the same token
    answers: dict[str, Any] = {"a": None}

    def send_on_a() -> None:
        try:
            answers["a"] = post(a, "paid-slow", body, headers, timeout=30)
        except httpx.HTTPError as exc:
            answers["a_error"] = type(exc).__name__

    on_a = threading.Thread(target=send_on_a)
    on_a.start()
    wait_for(
        lambda: [(s, bool(t)) for s, t in replicas.rows("SELECT state, task_id FROM claims")] == [("running", True)]
    )
    with frozen(a):
        wait_for(lambda: replicas.claim_states() == [], timeout=30)  # B: the lease lapsed, "not delivered"
        answers["b"] = post(b, "paid-slow", body, headers, timeout=40)  # the payer's retry, on B
        wait_for(lambda: replicas.claim_states() == ["settled"], timeout=30)
    on_a.join(35)
    assert not on_a.is_alive(), "replica A never answered"
    wait_for(lambda: "running" not in replicas.claim_states() and "settling" not in replicas.claim_states())

    observed = {
        "deliveries": sum(delivered(answers[name]) for name in ("a", "b")),
        "completed_tasks": replicas.completed_tasks(payer.address),
        "transfers": len(replicas.ledger()["settlements"]),
        "claim": replicas.claim_states(),
        "a_says_it_lost_the_claim": says_it_lost_the_claim(a.log.read_text()),
    }
    assert delivered(answers["b"]), answers["b"].text  # the retry on B is the one delivery
    assert observed == {
        "deliveries": 1,
        "completed_tasks": 1,
        "transfers": 1,
        "claim": ["settled"],
        "a_says_it_lost_the_claim": True,
    }, f"observed {observed}; payment log {replicas.payment_actions()}"


HOLD = 10.0  # the facilitator holds A's settle this long, then decides


def test_a_replica_frozen_while_settling_an_owed_claim_writes_no_outcome_over_the_new_owners(replicas) -> None:
    """The same fence on the reconciler's path: A takes an owed claim and sends its settle, which
    the facilitator holds; A freezes past its lease; B takes the claim over and settles it. A
    wakes to an answer about a claim that is no longer its own: it records nothing (one `settle`
    row, the one transfer), and says it lost the claim."""
    chain = f'\n[networks."{DEV_NETWORK}"]\nrpc_url = "{replicas.facilitator}/rpc"\n'
    settings = {"lease": LEASE, "reconcile": 0.5, "facilitator_extra": "settle_passes = 100\n", "sections": chain}
    a = replicas.start("a", **settings)
    replicas.faults(settle="http500")
    owed = post(a, "paid", send_body("owed"), Payer().header_for(a.url)).json()["result"]
    assert owed["metadata"]["x402.payment.status"] == "payment-verified", owed  # delivered, owed
    replicas.faults(settle=f"slow:{HOLD}", count=1)  # A's next pass: its settle is held
    calls = replicas.ledger()["settle_calls"]
    wait_for(lambda: replicas.ledger()["settle_calls"] > calls and replicas.claim_states() == ["settling"])
    with frozen(a):
        held_since = time.monotonic()
        b = replicas.start("b", **settings)  # finds A's lease lapsed, takes the claim over, settles it
        wait_for(lambda: replicas.claim_states() == ["settled"], timeout=30)
        time.sleep(max(0.0, HOLD + 1 - (time.monotonic() - held_since)))  # A's held settle is answered meanwhile
    time.sleep(3)  # A wakes and hears that answer: whatever it does with it, it has done it now
    assert b.process is not None and b.process.poll() is None

    actions = replicas.payment_actions()
    observed = {
        "settle_rows": actions.count("settle"),
        "claim": replicas.claim_states(),
        "transfers": len(replicas.ledger()["settlements"]),
        "a_says_it_lost_the_claim": says_it_lost_the_claim(a.log.read_text()),
    }
    assert observed == {
        "settle_rows": 1,
        "claim": ["settled"],
        "transfers": 1,
        "a_says_it_lost_the_claim": True,
    }, f"observed {observed}; payment log {actions}"
