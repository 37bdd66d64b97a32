"""Leases are judged by the database's clock, never by a replica's own.

Two replicas on one PostgreSQL schema with the usual 30 s lease; one of them runs with
its wall clock 45 s ahead (tests/support/skewed_clock: `time.time()` shifted, the
monotonic clock untouched, as on a host whose NTP went wrong). Its reconciler, passing
every half second, must not take the other replica's live claim for a lapsed one: the
payer, retrying its in-flight request, gets one delivery and pays once. And the skewed
replica says at start that its clock strays from the database's, in its log and in the
`a2a_gate_clock_skew_seconds` gauge.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import httpx

from devnet.payer import encode_header
from tests.support import replicas as support
from tests.support.gate_helpers import wait_for
from tests.support.gate_process import GateProcess
from tests.support.paid import Payer, send_body
from tests.support.replicas import post

replicas = support.replicas  # the fixture, bound by assignment (see tests/support/dev_facilitator_helpers.py)

LEASE = 30.0
SKEW = 45.0
WORK = "sleep 5"
ANSWER = "slept 5"


def delivered(answer: httpx.Response | None) -> bool:
    """The payer got the agent's work in this answer (anywhere in it, in any state), from an
    execution, not a replay of another's answer."""
    if answer is None or answer.headers.get("X-Idempotent-Replay") == "true":
        return False
    return ANSWER in answer.text


def clock_skew_metric(gate: GateProcess) -> float | None:
    for line in httpx.get(f"{gate.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("a2a_gate_clock_skew_seconds"):
            return float(line.rsplit(" ", 1)[1])
    return None


def says_its_clock_strays(log: str) -> bool:
    return any(re.search(r"clock", line, re.I) and re.search(r"database", line, re.I) for line in log.splitlines())


def test_a_replica_with_a_clock_45_s_ahead_takes_no_live_claim_and_says_its_clock_strays(replicas) -> None:
    normal = replicas.start("normal", lease=LEASE, reconcile=0.5)
    skewed = replicas.start("skewed", lease=LEASE, reconcile=0.5, clock_offset=SKEW)
    payer = Payer()
    headers = {"PAYMENT-SIGNATURE": encode_header(payer.token_for(normal.url, "paid-slow"))}
    body = send_body(WORK)
    answers: list[httpx.Response] = []
    first: dict[str, Any] = {}

    sender = threading.Thread(target=lambda: first.update(answer=post(normal, "paid-slow", body, headers, timeout=40)))
    sender.start()
    wait_for(lambda: "verify" in replicas.payment_actions())  # claimed and verified: the agent is working
    while sender.is_alive():  # the payer retries while its request is in flight, as the answer invites it to
        retry = post(normal, "paid-slow", body, headers, timeout=40)
        answers.append(retry)
        if (retry.json().get("error") or {}).get("data", {}).get("code") == "in_flight":
            time.sleep(0.3)
    sender.join()
    answers.append(first["answer"])
    wait_for(lambda: "running" not in replicas.claim_states() and "settling" not in replicas.claim_states())

    skew = clock_skew_metric(skewed)
    observed = {
        "deliveries": sum(delivered(a) for a in answers),
        "completed_tasks": replicas.completed_tasks(payer.address),
        "transfers": len(replicas.ledger()["settlements"]),
        "claim": replicas.claim_states(),
        "skewed_replica_says_its_clock_strays": says_its_clock_strays(skewed.log.read_text()),
        "skew_gauge_above_30_s": skew is not None and skew > 30,
    }
    assert observed == {
        "deliveries": 1,
        "completed_tasks": 1,
        "transfers": 1,
        "claim": ["settled"],
        "skewed_replica_says_its_clock_strays": True,
        "skew_gauge_above_30_s": True,
    }, f"observed {observed}; a2a_gate_clock_skew_seconds {skew}; payment log {replicas.payment_actions()}"
