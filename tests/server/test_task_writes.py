"""How often a task is written, and that it is written before its answer leaves.

A free blocking send (nobody can name its task before the answer) writes the task once,
with its outcome: one INSERT, no UPDATE. A non-blocking send, whose answer names the task
at once, writes it first. A blocking send that runs long is written as it stands while it
runs, so listing and housekeeping see it, then again with its outcome. Against a real
SQLite file, counting the statements SQLite was given.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from server import methods
from server.app import Services, dispatch_free
from server.config import default_settings
from server.jsonrpc import Call

OWNER = "key:ops"


def send_call(blocking: bool = True) -> Call:
    message = {"kind": "message", "role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": "hi"}]}
    params: dict[str, Any] = {"message": message, "configuration": {"blocking": blocking}}
    return Call(id=1, method="message/send", dialect="0.3", operation="send", params=params)


def with_services(tmp_path, body: Callable[[Services, list[str]], Awaitable[None]]) -> None:
    """Services on a SQLite file; `body` gets them and the task writes SQLite runs from then on."""

    async def run() -> None:
        services = Services(default_settings(str(tmp_path / "gate.db")))
        await services.open_store()
        writes: list[str] = []
        services.db.conn.set_trace_callback(  # type: ignore[attr-defined]
            lambda sql: (
                writes.append(sql.split()[0]) if " tasks " in sql and sql.startswith(("INSERT", "UPDATE")) else None
            )
        )
        try:
            await body(services, writes)
        finally:
            await services.db.close()

    asyncio.run(run())


def answer_of(response: Any) -> dict[str, Any]:
    return json.loads(response.body)["result"]


def stored(services: Services, task_id: str) -> Awaitable[dict[str, Any] | None]:
    return services.store.get(task_id, OWNER, "echo")


def test_a_blocking_free_send_writes_its_task_once_before_answering(tmp_path):
    async def body(services: Services, writes: list[str]) -> None:
        task = answer_of(await dispatch_free(services, send_call(), "echo", OWNER))
        assert task["status"]["state"] == "completed"
        assert writes == ["INSERT"]
        row = await stored(services, task["id"])
        assert row is not None and row["status"]["state"] == "completed" and row["artifacts"]
        assert services.store.unwritten == {}

    with_services(tmp_path, body)


def test_a_non_blocking_send_is_written_before_its_answer(tmp_path):
    async def body(services: Services, writes: list[str]) -> None:
        task = answer_of(await dispatch_free(services, send_call(blocking=False), "echo", OWNER))
        assert writes[:1] == ["INSERT"]
        assert await stored(services, task["id"]) is not None  # the answer names it: it exists
        await services.runner.drain(5.0)

    with_services(tmp_path, body)


def test_a_blocking_send_that_runs_long_is_written_while_it_runs(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(methods, "UNWRITTEN_SECONDS", 0.0)
    release = asyncio.Event()

    async def body(services: Services, writes: list[str]) -> None:
        echo = services.agents.backend("echo")
        run = echo.run

        async def slow(request: Any, progress: Any) -> Any:
            await release.wait()
            return await run(request, progress)

        echo.run = slow  # type: ignore[method-assign]
        answer = asyncio.create_task(dispatch_free(services, send_call(), "echo", OWNER))
        for _ in range(200):  # bounded: the timer fires at once, the write follows
            if writes:
                break
            await asyncio.sleep(0.01)
        assert writes == ["INSERT"]  # the running task, as it stands
        page, total, _ = await services.store.page(OWNER, "echo", methods.TaskQuery(size=10))
        assert total == 1 and page[0]["status"]["state"] == "working"
        release.set()
        task = answer_of(await answer)
        assert task["status"]["state"] == "completed"
        assert writes == ["INSERT", "UPDATE"]
        row = await stored(services, task["id"])
        assert row is not None and row["status"]["state"] == "completed"

    with_services(tmp_path, body)


def test_a_new_task_is_written_with_the_rows_that_belong_with_it(tmp_path):
    """`start_send(with_writes=...)`: the caller's rows for the new task, in the task's own
    transaction (one commit here; one round trip on PostgreSQL)."""

    async def body(services: Services, writes: list[str]) -> None:
        db = services.db
        await db.execute("CREATE TABLE notes (task_id TEXT PRIMARY KEY)")
        statements: list[str] = []
        db.conn.set_trace_callback(statements.append)  # type: ignore[attr-defined]
        plan = methods.plan_send(send_call(blocking=False))
        execution = await services.methods.start_send(
            plan,
            "echo",
            OWNER,
            with_writes=lambda task, final: [("INSERT INTO notes (task_id) SELECT ? WHERE 1 = 1", (task["id"],))],
        )
        db.conn.set_trace_callback(None)  # type: ignore[attr-defined]
        assert await db.fetchval("SELECT task_id FROM notes") == execution.task["id"]
        assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")] == ["BEGIN IMMEDIATE", "COMMIT"]
        await services.runner.drain(5.0)

    with_services(tmp_path, body)


def test_a_deferred_task_written_by_its_final_statements_is_not_written_again(tmp_path):
    """A deferred task whose final statements (a delivery's write) committed while their caller was
    being cancelled is still in `unwritten`: writing it again changes nothing and raises nothing, the
    stored task is the final one, and the rows that belong with it (a payment's verify row) are not
    added a second time."""
    from server.tasks import new_task, set_status

    async def body(services: Services, writes: list[str]) -> None:
        store, db = services.store, services.db
        await db.execute("CREATE TABLE notes (task_id TEXT, n INTEGER)")
        task = new_task(None, {"kind": "message", "role": "user", "messageId": "m", "parts": []})
        note = ("INSERT INTO notes (task_id, n) SELECT ?, 1 WHERE 1 = 1", (task["id"],))
        await store.create(task, agent="echo", owner=OWNER, deferred=True, with_writes=lambda final: [note])
        final = {**task}
        set_status(final, "completed")
        async with store.writing(task["id"]):
            await db.write_together(store.final_statements(final))  # landed; `written` never called
        set_status(task, "failed")  # what its caller, cancelled, then writes as it stands
        assert await store.write(task)
        stored = await store.get(task["id"], OWNER, "echo")
        assert stored is not None and stored["status"]["state"] == "completed"
        assert await db.fetchval("SELECT COUNT(*) FROM tasks WHERE id = ?", (task["id"],)) == 1
        assert await db.fetchval("SELECT COUNT(*) FROM notes WHERE task_id = ?", (task["id"],)) == 1

    with_services(tmp_path, body)
