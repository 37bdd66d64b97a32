"""Nothing grows without bound: finished tasks expire, stuck tasks fail uncharged."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from gate.gate import PaymentGate
from server.app import Services
from server.config import default_settings
from server.tasks import PENDING_OWNER, new_task, set_status


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
