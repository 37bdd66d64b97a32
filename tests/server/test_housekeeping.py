"""Nothing grows without bound: finished tasks expire, stuck tasks fail uncharged."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from gate.config import default_settings
from gate.gate import PaymentGate
from server.app import Services
from server.tasks import PENDING_OWNER, new_task, set_status
from tests.support.gate_helpers import artifact_texts, bearer, status_text, wait_for
from tests.support.gate_process import GateProcess, free_port
from tests.support.in_band import ACTIVATE, offer_v1, paying_body, payment_metadata, task_of
from tests.support.paid import ASSET, PAY_TO, PaidSetup, Payer, paid_config, send_body


def message(text: str) -> dict:
    return {"kind": "message", "role": "user", "messageId": "m", "parts": [{"kind": "text", "text": text}]}


def test_stuck_tasks_fail_and_old_finished_tasks_expire(tmp_path):
    settings = replace(
        default_settings(str(tmp_path / "gate.db")), task_deadline_seconds=0.01, task_retention_days=0.1 / 86400
    )

    async def run() -> None:
        services = Services(settings, PaymentGate.from_parts)
        await services.open_store()
        try:
            store = services.store
            stuck = new_task(None, message("stuck"))
            set_status(stuck, "working")
            await store.create(stuck, agent="echo", owner="key:ops")
            waiting = new_task(None, message("waiting"))
            set_status(waiting, "input-required")
            await store.create(waiting, agent="echo", owner="key:ops")
            await asyncio.sleep(0.05)
            await services.housekeeping()
            assert (await store.get(stuck["id"], "key:ops", "echo"))["status"]["state"] == "failed"
            assert (await store.get(waiting["id"], "key:ops", "echo"))["status"]["state"] == "input-required"
            pending = new_task(None, message("unpaid"))
            await store.create(pending, agent="paid-echo", owner=PENDING_OWNER)
            await asyncio.sleep(0.15)
            await services.housekeeping()  # past the retention: finished and abandoned tasks are gone
            assert await store.get(stuck["id"], "key:ops", "echo") is None
            assert await store.get(waiting["id"], "key:ops", "echo") is None
            assert await store.get(pending["id"], PENDING_OWNER, "paid-echo") is None
        finally:
            await services.db.close()

    asyncio.run(run())


TURN_DEADLINE = 2.0  # task_deadline_seconds of the gate below
TURN_KEY = "a2g_turn-deadline-principal-key-000000"
PRICE = f'price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}\n'


@pytest.fixture(scope="module")
def turns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PaidSetup]:
    """A gate whose turns may last 2 s, housekept every 0.2 s, with an agent that asks, then works
    (free with a key, and priced)."""
    from devnet.facilitator import create_facilitator_app
    from tests.support.serve import serve_app

    folder = tmp_path_factory.mktemp("turns")
    with serve_app(create_facilitator_app(str(folder / "ledger.db")), wait_on_exit=False) as facilitator:
        port = free_port()
        agents = "".join(
            f'\n[agents.{name}]\nbackend = "python"\ncallable = "tests.support.agents:ask_then_work"\n{price}'
            for name, price in (("asks-then-works", ""), ("paid-asks-then-works", PRICE))
        )
        digest = hashlib.sha256(TURN_KEY.encode()).hexdigest()
        config = folder / "gate.toml"
        config.write_text(
            f"task_deadline_seconds = {TURN_DEADLINE}\nhousekeeping_interval_seconds = 0.2\n"
            + paid_config(f"http://127.0.0.1:{port}", facilitator)
            + agents
            + f'\n[[keys]]\nname = "turns"\nsha256 = "{digest}"\nagents = ["*"]\n'
        )
        with GateProcess(config, folder / "gate.log", port=port) as gate:
            yield PaidSetup(gate=gate, facilitator_url=facilitator, db_path=folder / "gate.db")


def stored(setup: PaidSetup, task_id: str) -> dict[str, Any]:
    conn = sqlite3.connect(setup.db_path)
    try:
        [(document,)] = conn.execute("SELECT document FROM tasks WHERE id = ?", (task_id,)).fetchall()
    finally:
        conn.close()
    import json

    return json.loads(document)


@pytest.mark.parametrize("path", ["free", "paid"])
def test_a_continued_turn_gets_a_deadline_of_its_own(turns: PaidSetup, path: str) -> None:
    """The next turn starts after the task's first deadline passed and works for less than a
    deadline: housekeeping leaves it alone and it completes (paid: charged once)."""
    agent = "asks-then-works" if path == "free" else "paid-asks-then-works"
    payer = Payer()

    def credentials() -> dict[str, str]:
        return bearer(TURN_KEY) if path == "free" else payer.header_for(turns.gate.url, agent)

    first = turns.post(agent, send_body("start"), credentials()).json()["result"]
    assert first["status"]["state"] == "input-required"
    time.sleep(TURN_DEADLINE + 1.0)  # the task is older than a deadline when its next turn starts
    task = turns.post(agent, send_body("sleep 1.5", task_id=first["id"]), credentials()).json()["result"]
    assert task["status"]["state"] == "completed", status_text(task)
    assert artifact_texts(task) == ["slept 1.5"]
    if path == "paid":
        assert task["status"]["message"]["metadata"]["x402.payment.status"] == "payment-completed"
        charged = [s for s in turns.ledger()["settlements"] if s["from_address"].lower() == payer.address.lower()]
        assert len(charged) == 1


def test_an_in_band_task_continued_after_its_deadline_gets_a_deadline_of_its_own(turns: PaidSetup) -> None:
    """Paid in-band: the first paid turn asks for more, the next one (paid again, after the first
    turn's deadline passed) works for less than a deadline and completes, charged once."""
    agent, payer = "paid-asks-then-works", Payer()
    asked = task_of(turns.post(agent, send_body("start"), ACTIVATE).json()["result"])
    offer = offer_v1(asked)
    paying = paying_body("paying", asked["id"], payer.sign_v1(offer))
    first = task_of(turns.post(agent, paying, ACTIVATE).json()["result"])
    assert first["status"]["state"] == "input-required"  # the agent asks; nothing charged
    time.sleep(TURN_DEADLINE + 1.0)
    next_turn = paying_body("sleep 1.5", asked["id"], payer.sign_v1(offer))
    task = task_of(turns.post(agent, next_turn, ACTIVATE).json()["result"])
    assert task["status"]["state"] == "completed", status_text(task)
    assert artifact_texts(task) == ["slept 1.5"]
    assert payment_metadata(task)["x402.payment.status"] == "payment-completed"
    charged = [s for s in turns.ledger()["settlements"] if s["from_address"].lower() == payer.address.lower()]
    assert len(charged) == 1


def test_a_continued_turn_past_its_own_deadline_is_failed(turns: PaidSetup) -> None:
    """The fresh deadline binds: a next turn that outlasts it is failed, uncharged."""
    first = turns.post("asks-then-works", send_body("start"), bearer(TURN_KEY)).json()["result"]
    body = send_body("sleep 30", task_id=first["id"], blocking=False)
    assert turns.post("asks-then-works", body, bearer(TURN_KEY)).json()["result"]["status"]["state"] != "completed"
    wait_for(lambda: stored(turns, first["id"])["status"]["state"] not in ("submitted", "working"), timeout=15)
    task = stored(turns, first["id"])
    assert task["status"]["state"] == "failed" and "deadline" in status_text(task), task["status"]
