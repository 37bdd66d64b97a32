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
from typing import Any

import httpx

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
