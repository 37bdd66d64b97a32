"""A delivery whose record could not be written is not delivered: the payer gets no answer for it.

Replica A on PostgreSQL runs a paid slow agent; when it finishes, A stores the task and records the
delivery on the claim in one transaction. Here that transaction fails: its connection is cut while
the write waits on the claim row (a database restart, a failover, an administrator ending a stuck
backend). Nothing is recorded: the claim is still `running`, so once its lease lapses it is released
"not delivered" and the same token may buy the work again. The answer to the first request must
therefore not carry the agent's work (a retryable error, or a failed Task), or the delivery must be
recorded after all. Otherwise one signature buys the work twice and pays once.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from devnet.payer import encode_header
from tests.attacks.test_redteam_delivery_window import (
    ANSWER,
    DELIVERY_WRITE,
    LEASE,
    WORK,
    blocked_by,
    claim_row_locked,
    delivery_waiting,
)
from tests.support import replicas as support
from tests.support.gate_helpers import wait_for
from tests.support.paid import Payer, send_body
from tests.support.replicas import post

replicas = support.replicas


def test_an_unrecorded_delivery_does_not_answer_with_the_work(replicas) -> None:
    a = replicas.start("a", lease=LEASE, reconcile=0.5)
    payer = Payer()
    headers = {"PAYMENT-SIGNATURE": encode_header(payer.token_for(a.url, "paid-slow"))}
    answers: dict[str, Any] = {}

    def send_on_a() -> None:
        try:
            answers["first"] = post(a, "paid-slow", send_body(WORK), headers, timeout=40)
        except httpx.HTTPError as exc:
            answers["first_error"] = type(exc).__name__

    on_a = threading.Thread(target=send_on_a)
    on_a.start()
    wait_for(
        lambda: [(s, bool(t)) for s, t in replicas.rows("SELECT state, task_id FROM claims")] == [("running", True)]
    )
    with claim_row_locked(replicas) as holder:
        wait_for(lambda: delivery_waiting(replicas, holder), timeout=20)
        [pid] = blocked_by(replicas, holder, DELIVERY_WRITE)
        cut = replicas.rows("SELECT pg_terminate_backend(%s)", pid)
        assert cut == [(True,)], cut
    on_a.join(30)
    assert not on_a.is_alive(), "replica A never answered"
    first = answers.get("first")
    state_after = replicas.claim_states()
    # the claim was never marked delivered: its lease lapses and it is released "not delivered"
    wait_for(lambda: replicas.claim_states() in ([], ["settling"], ["settled"], ["settle_failed"]), timeout=30)
    time.sleep(0.5)
    retry = post(a, "paid-slow", send_body(WORK), headers, timeout=30)
    wait_for(lambda: "running" not in replicas.claim_states() and "settling" not in replicas.claim_states())

    got_work = [
        first is not None and ANSWER in first.text,
        retry.headers.get("X-Idempotent-Replay") != "true" and ANSWER in retry.text,
    ]
    observed = {
        "claim_after_the_cut": state_after,
        "deliveries_for_one_signature": sum(got_work),
        "transfers": len(replicas.ledger()["settlements"]),
    }
    assert observed["deliveries_for_one_signature"] <= 1, (
        f"observed {observed}; first answer {first.text[:600] if first is not None else answers}; "
        f"payment log {replicas.payment_actions()}"
    )
