"""The answer is not shown before its delivery is recorded, so a lost claim shows nothing.

Replica A on PostgreSQL runs a paid slow agent. When the agent finishes, A stores the task and
records the delivery on the claim in one transaction; if that write changes no row (the claim
was taken over after its lease lapsed) the transaction rolls back and, by design, "no artifact is
stored, streamed or answered". Here the claim row is locked while A's delivery waits on it
(a lock held at the moment of the fenced write: A's renewals wait too, so its lease lapses by
the database's clock), and the lock holder does what another replica's recovery does with a
lapsed `running` claim: takes it under a new fence and releases it "not delivered".

While A's delivery waits, the payer asks A for the task (tasks/get, and a resubscription). If
either shows the agent's answer, the payer has the work, the claim is released uncharged, and the
same token buys the work again: two deliveries for one signature.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg

from devnet.payer import encode_header
from tests.support import replicas as support
from tests.support.gate_helpers import wait_for
from tests.support.paid import Payer, send_body
from tests.support.replicas import Replicas, post

replicas = support.replicas

LEASE = 3.0
WORK = "sleep 1.5"
ANSWER = "slept 1.5"


@contextlib.contextmanager
def claim_row_locked(fleet: Replicas) -> Iterator[psycopg.Connection[Any]]:
    """A transaction holding the one claim row (FOR UPDATE) for the block; committed at its end."""
    conn = psycopg.connect(fleet.postgres.url)
    try:
        conn.execute(f'SET search_path = "{fleet.postgres.schema}"')
        conn.execute("SELECT token_digest FROM claims FOR UPDATE").fetchall()
        yield conn
        conn.commit()
    finally:
        conn.close()


DELIVERY_WRITE = "%UPDATE claims SET state = %withheld%"  # A's write recording the delivery


def blocked_by(fleet: Replicas, holder: psycopg.Connection[Any], *statements: str) -> list[int]:
    """The backends waiting behind `holder`'s lock, directly or behind another waiter (a second
    writer of the row queues behind the first: A's lease renewal often), running one of
    `statements` (LIKE patterns). This test's own: pg_stat_activity lists the whole server's, and
    other tests' same statements may wait on locks of their own at the same moment."""
    like = " OR ".join(["query LIKE %s"] * len(statements))
    rows = fleet.rows(
        "WITH RECURSIVE behind(pid) AS ("
        " SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
        " UNION SELECT waiting.pid FROM pg_stat_activity waiting"
        " JOIN behind ON behind.pid = ANY(pg_blocking_pids(waiting.pid)))"
        f" SELECT pid FROM pg_stat_activity JOIN behind USING (pid) WHERE wait_event_type = 'Lock' AND ({like})",
        holder.info.backend_pid,
        *statements,
    )
    return [pid for (pid,) in rows]


def delivery_waiting(fleet: Replicas, holder: psycopg.Connection[Any]) -> bool:
    """A's write recording the delivery (it sets `withheld`) waits on `holder`'s row lock."""
    return bool(blocked_by(fleet, holder, DELIVERY_WRITE))


def take_over_and_release(conn: psycopg.Connection[Any]) -> int:
    """What another replica's recovery does with a lapsed running claim (`Claims.take_orphan`,
    then `Claims.release`), by the database's clock; how many claims it released."""
    wait_for(
        lambda: (
            conn.execute(
                "SELECT COUNT(*) FROM claims WHERE lease_until < EXTRACT(EPOCH FROM clock_timestamp())"
            ).fetchone()[0]  # type: ignore[index]
            == 1
        ),
        timeout=20,
    )
    conn.execute(
        "UPDATE claims SET owner_instance = 'replica-b', fence = 'fence-b'"
        " WHERE state = 'running' AND lease_until < EXTRACT(EPOCH FROM clock_timestamp())"
    )
    return conn.execute("DELETE FROM claims WHERE fence = 'fence-b' AND state = 'running'").rowcount


def first_sse_event(url: str, body: dict[str, Any], headers: dict[str, str]) -> str:
    """The first event of a resubscription (or the whole answer, if it is not a stream)."""
    with httpx.stream("POST", url, json=body, headers=headers, timeout=10) as response:
        text = ""
        for chunk in response.iter_text():
            text += chunk
            if "\n\n" in text:
                break
        return text


def test_the_answer_is_not_visible_while_its_delivery_is_unrecorded(replicas) -> None:
    a = replicas.start("a", lease=LEASE, reconcile=0.5)
    payer = Payer()
    headers = {"PAYMENT-SIGNATURE": encode_header(payer.token_for(a.url, "paid-slow"))}
    body = send_body(WORK)
    answers: dict[str, Any] = {}

    def send_on_a() -> None:
        try:
            answers["first"] = post(a, "paid-slow", body, headers, timeout=40)
        except httpx.HTTPError as exc:
            answers["first_error"] = type(exc).__name__

    on_a = threading.Thread(target=send_on_a)
    on_a.start()
    wait_for(
        lambda: [(s, bool(t)) for s, t in replicas.rows("SELECT state, task_id FROM claims")] == [("running", True)]
    )
    [(task_id,)] = replicas.rows("SELECT task_id FROM claims")
    with claim_row_locked(replicas) as conn:
        wait_for(lambda: delivery_waiting(replicas, conn), timeout=20)
        get = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task_id}}
        seen_by_get = post(a, "paid-slow", get, headers, timeout=10).text
        resubscribe = {"jsonrpc": "2.0", "id": 3, "method": "tasks/resubscribe", "params": {"id": task_id}}
        seen_by_resubscribe = first_sse_event(f"{a.url}/a2a/paid-slow", resubscribe, headers)
        released = take_over_and_release(conn)
    on_a.join(30)
    assert not on_a.is_alive(), "replica A never answered"
    time.sleep(0.5)
    retry = post(a, "paid-slow", send_body(WORK), headers, timeout=30)  # the same token, released: it buys again
    wait_for(lambda: "running" not in replicas.claim_states() and "settling" not in replicas.claim_states())

    observed = {
        "released_uncharged": released,
        "answer_in_first_reply": ANSWER in answers.get("first", httpx.Response(599)).text,
        "answer_in_tasks_get_before_delivery_recorded": ANSWER in seen_by_get,
        "answer_in_resubscribe_before_delivery_recorded": ANSWER in seen_by_resubscribe,
        "answer_in_retry": ANSWER in retry.text,
        "transfers": len(replicas.ledger()["settlements"]),
    }
    assert observed == {
        "released_uncharged": 1,
        "answer_in_first_reply": False,
        "answer_in_tasks_get_before_delivery_recorded": False,
        "answer_in_resubscribe_before_delivery_recorded": False,
        "answer_in_retry": True,
        "transfers": 1,
    }, f"observed {observed}; payment log {replicas.payment_actions()}"
