"""The in-band payment state machine, explored: random runs of asking, declining, paying,
messages to finished tasks and expiry against one gate app, checked after every step.

One in-process gate (`a2a-gate`'s own app, its lifespan run by Starlette's TestClient) over a
fresh SQLite file per run, and the development facilitator in the same process (real signature
checks, reached through httpx's ASGI transport). Expiry is the row's deadline moved into the
past, as the clock would, then housekeeping. Invariants:
- the caller never has more requests awaiting payment than the cap;
- a task seen finished never changes state again (it may only be deleted by expiry);
- every paid turn delivers at most once: one artifact, one settlement, per completed task.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule
from starlette.testclient import TestClient

from devnet.facilitator import create_facilitator_app
from gate.app import build_app
from gate.config import parse_config
from tests.support.in_band import ACTIVATE, offer_v1, paying_body, task_of
from tests.support.paid import ASSET, PAY_TO, Payer, send_body

CAP = 3
CONFIG = f"""
public_url = "http://gate.test"
database = "gate.db"

[limits]
per_ip_per_minute = 100000
per_agent_per_minute = 100000

[facilitator]
url = "http://facilitator.test"

[in_band]
pending_per_ip = {CAP}

[agents.paid]
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}
"""
TERMINAL = {"completed", "canceled", "failed", "rejected"}


class InBandFlow(RuleBasedStateMachine):
    tasks = Bundle("tasks")

    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.TemporaryDirectory()
        folder = Path(self.folder.name)
        self.db_path = folder / "gate.db"
        self.client = TestClient(build_app(parse_config(tomllib.loads(CONFIG), base_dir=folder)))
        self.client.__enter__()
        self.services = self.client.app.state.services
        facilitator = self.services.anonymous.facilitator
        in_process = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_facilitator_app(str(folder / "ledger.db"))),
            base_url="http://facilitator.test",
            headers={"content-type": "application/json"},
            timeout=10,
        )
        self.client.portal.call(facilitator.client.aclose)
        facilitator.client = in_process
        self.offers: dict[str, dict[str, Any]] = {}  # the v1 requirements each task asked with
        self.finished: dict[str, str] = {}  # task id -> the terminal state it was seen in
        self.declined: set[str] = set()  # requests the client declined: finished while never paid
        self.paid_turns = 0  # paying messages answered with a completed task (not replays)
        self.last_payment: dict[str, Any] | None = None

    def teardown(self) -> None:
        self.client.__exit__(None, None, None)
        self.folder.cleanup()

    # -- talking to the gate

    def post(self, body: dict[str, Any]) -> httpx.Response:
        response = self.client.post("/a2a/paid", json=body, headers=ACTIVATE)
        assert response.status_code in (200, 402), response.text[:300]
        return response

    def rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(self.db_path)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def state_of(self, task_id: str) -> str | None:
        found = self.rows("SELECT state FROM tasks WHERE id = ?", (task_id,))
        return found[0][0] if found else None

    def seen(self, response: httpx.Response) -> dict[str, Any] | None:
        """The Task of an answer, remembered: its offer while it asks for payment, its state once finished."""
        doc = response.json()
        if response.status_code != 200 or "result" not in doc:
            return None
        task = task_of(doc["result"])
        state = task["status"]["state"]
        if state == "input-required":
            self.offers[task["id"]] = offer_v1(task)
        if state in TERMINAL:
            self.finished.setdefault(task["id"], state)
        return task

    def expect_finished_answer(self, task_id: str, response: httpx.Response) -> None:
        """A message naming a declined request (still stored) is answered as for any finished task."""
        if task_id in self.declined and self.state_of(task_id) is not None:
            error = response.json().get("error")
            assert error is not None and error["code"] == -32004, response.text[:300]

    # -- rules

    @initialize(target=tasks)
    def first_request(self) -> str:
        return self.send_unpaid("hello")

    @rule(target=tasks, text=st.sampled_from(["weather?", "a poem", "x"]))
    def send_unpaid(self, text: str) -> str:
        before = self.awaiting()
        response = self.post(send_body(text))
        if before >= CAP:
            assert response.status_code == 402
            return "no-such-task"
        task = self.seen(response)
        assert task is not None and task["status"]["state"] == "input-required"
        return task["id"]

    @rule(task_id=tasks)
    def decline(self, task_id: str) -> None:
        awaiting = self.is_awaiting(task_id)
        response = self.post(paying_body("no thanks", task_id, None, status="payment-rejected"))
        self.expect_finished_answer(task_id, response)
        task = self.seen(response)
        if awaiting:
            assert task is not None and task["id"] == task_id and task["status"]["state"] == "canceled"
            self.declined.add(task_id)
        event(
            f"decline: {'awaiting' if awaiting else 'not awaiting'}, {task['status']['state'] if task else 'refused'}"
        )

    @rule(task_id=tasks)
    def pay(self, task_id: str) -> None:
        offer = self.offers.get(task_id) or next(iter(self.offers.values()), None)
        if offer is None:
            return
        awaiting = self.is_awaiting(task_id)
        self.last_payment = paying_body("paying", task_id, Payer().sign_v1(offer))
        response = self.post(self.last_payment)
        self.expect_finished_answer(task_id, response)
        task = self.seen(response)
        if awaiting:
            assert task is not None and task["id"] == task_id and task["status"]["state"] == "completed"
        if task is not None and task["status"]["state"] == "completed":
            assert response.headers.get("X-Idempotent-Replay") is None
            self.paid_turns += 1
        event(f"pay: {'awaiting' if awaiting else 'not awaiting'}, {task['status']['state'] if task else 'refused'}")

    @rule()
    def retry_the_last_payment(self) -> None:
        """The same paying message again (a client retry): a replay of its answer, never a second run."""
        if self.last_payment is None:
            return
        response = self.post(self.last_payment)
        task = self.seen(response)
        replayed = response.headers.get("X-Idempotent-Replay") == "true"
        event(f"retry: {'replay' if replayed else task['status']['state'] if task else 'refused'}")

    @rule(task_id=tasks)
    def continue_unpaid(self, task_id: str) -> None:
        """An unpaid message naming the task: a finished one is refused and stays finished."""
        response = self.post(send_body("are you there?", task_id=task_id))
        self.expect_finished_answer(task_id, response)
        task = self.seen(response)
        event(f"unpaid message to a task: {task['status']['state'] if task else response.status_code}")

    @rule(task_id=tasks)
    def let_expire(self, task_id: str) -> None:
        """The request's requirements run out (its deadline moved into the past), then housekeeping."""
        conn = sqlite3.connect(self.db_path)
        try:
            conn.execute(
                "UPDATE tasks SET deadline_at = ? WHERE id = ? AND owner LIKE 'payment-pending%'",
                (time.time() - 1, task_id),
            )
            conn.commit()
        finally:
            conn.close()
        self.client.portal.call(self.services.housekeeping)

    # -- what holds after every step

    def awaiting(self) -> int:
        [(count,)] = self.rows(
            "SELECT COUNT(*) FROM tasks WHERE owner LIKE 'payment-pending%' AND state = 'input-required'"
            " AND deadline_at > ?",
            (time.time(),),
        )
        return int(count)

    def is_awaiting(self, task_id: str) -> bool:
        return bool(
            self.rows(
                "SELECT 1 FROM tasks WHERE id = ? AND owner LIKE 'payment-pending%' AND state = 'input-required'"
                " AND deadline_at > ?",
                (task_id, time.time()),
            )
        )

    @invariant()
    def never_more_awaiting_payment_than_the_cap(self) -> None:
        assert self.awaiting() <= CAP

    @invariant()
    def a_finished_task_never_changes(self) -> None:
        for task_id, state in self.finished.items():
            now = self.state_of(task_id)
            assert now in (state, None), f"task {task_id} was {state}, is now {now}"

    @invariant()
    def each_paid_turn_delivers_once(self) -> None:
        completed = self.rows("SELECT document FROM tasks WHERE state = 'completed'")
        for (document,) in completed:
            assert len(json.loads(document).get("artifacts") or []) == 1
        settled = self.rows("SELECT COUNT(*) FROM claims WHERE state = 'settled'")[0][0]
        assert settled == self.paid_turns == len(completed)


TestInBandFlow = InBandFlow.TestCase
TestInBandFlow.settings = settings(
    max_examples=30,
    stateful_step_count=12,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
