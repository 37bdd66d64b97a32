"""Nothing grows without bound: finished tasks expire, stuck tasks fail uncharged."""

from __future__ import annotations

import time
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
    services = Services(settings, PaymentGate.from_parts)
    try:
        store = services.store
        stuck = new_task(None, message("stuck"))
        set_status(stuck, "working")
        store.create(stuck, agent="echo", owner="key:ops")
        waiting = new_task(None, message("waiting"))
        set_status(waiting, "input-required")
        store.create(waiting, agent="echo", owner="key:ops")
        time.sleep(0.05)
        services.housekeeping()
        assert store.get(stuck["id"], "key:ops", "echo")["status"]["state"] == "failed"
        assert store.get(waiting["id"], "key:ops", "echo")["status"]["state"] == "input-required"
        pending = new_task(None, message("unpaid"))
        store.create(pending, agent="paid-echo", owner=PENDING_OWNER)
        time.sleep(0.15)
        services.housekeeping()  # past the retention: finished and abandoned tasks are gone
        assert store.get(stuck["id"], "key:ops", "echo") is None
        assert store.get(waiting["id"], "key:ops", "echo") is None
        assert store.get(pending["id"], PENDING_OWNER, "paid-echo") is None
    finally:
        services.db.conn.close()
