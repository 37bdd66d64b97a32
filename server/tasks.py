"""The task store: every Task, its owner and its state, in the shared database.

Reads by id always go through the owner, so "does not exist" and "not yours" are
the same answer by construction. Finished tasks expire after a retention period and
tasks stuck past their deadline are failed, so the table never grows without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from server import json_text
from server.database import Database, Migration, Statement
from server.ids import random_bytes

PENDING_OWNER = "payment-pending"  # an in-band payment request nobody has paid for yet
_PENDING_LIKE = PENDING_OWNER + "%"


def pending_owner(client: str) -> str:
    """The owner of a request awaiting its first payment: the caller's address, for a per-caller cap."""
    return f"{PENDING_OWNER}:{client}"


_second: list[Any] = [-1, ""]  # the second last formatted, and its text up to the milliseconds


def now_iso() -> str:
    """The time now, to the millisecond, as a status timestamp (`2026-12-01T10:00:00.123Z`). Its
    second is formatted once a second (`time.strftime`); each call adds only the milliseconds, a fifth
    of what formatting a datetime costs, and a task changes state twice or more per request."""
    seconds, milliseconds = divmod(time.time_ns() // 1_000_000, 1000)
    if seconds != _second[0]:
        _second[:] = [seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))]
    return f"{_second[1]}.{milliseconds:03d}Z"


def new_id() -> str:
    """A time-ordered (version 7, RFC 9562) UUID as text: the millisecond it was made, then 74
    random bits. Tasks are keyed by their id, so ids that grow with time append to the key's
    B-tree instead of landing on a random page of it, and a commit writes fewer pages (on
    SQLite 3-6% less CPU per API-key send on a fresh database, more as the table grows). The
    random part keeps an id unguessable; the time in it is the task's own creation time,
    which the task shows anyway."""
    raw = bytearray((time.time_ns() // 1_000_000).to_bytes(6, "big") + random_bytes(10))
    raw[6] = (raw[6] & 0x0F) | 0x70  # version 7
    raw[8] = (raw[8] & 0x3F) | 0x80  # the RFC 9562 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def new_task(context_id: str | None, message: dict[str, Any]) -> dict[str, Any]:
    task_id = new_id()
    context_id = context_id or new_id()
    message = {**message, "taskId": task_id, "contextId": context_id}
    if "messageId" not in message:  # required of a request: an id is minted only when missing
        message["messageId"] = new_id()
    return {
        "kind": "task",
        "id": task_id,
        "contextId": context_id,
        "status": {"state": "submitted", "timestamp": now_iso()},
        "history": [message],
        "artifacts": [],
    }


def set_status(task: dict[str, Any], state: str, message: dict[str, Any] | None = None) -> None:
    status: dict[str, Any] = {"state": state, "timestamp": now_iso()}
    if message is not None:
        status["message"] = message
    task["status"] = status


def agent_message(task: dict[str, Any], text: str, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "kind": "message",
        "role": "agent",
        "messageId": new_id(),
        "taskId": task["id"],
        "contextId": task["contextId"],
        "parts": [{"kind": "text", "text": text}],
    }
    if metadata:
        message["metadata"] = metadata
    return message


def trim_history(task: dict[str, Any], length: int | None) -> dict[str, Any]:
    """A copy honouring `historyLength`: None keeps all, 0 drops the history."""
    if length is None:
        return task
    out = dict(task)
    history = task.get("history") or []
    out["history"] = history[-length:] if length else []
    return out


@dataclass(frozen=True)
class TaskQuery:
    """ListTasks filters: all optional but the page size; `after` is the cursor."""

    size: int
    context_id: str | None = None
    state: str | None = None
    status_after: str | None = None  # an ISO timestamp as `now_iso` writes them
    after: tuple[float, str] | None = None


_TABLES = (
    "CREATE TABLE IF NOT EXISTS tasks (id TEXT PRIMARY KEY, agent TEXT, context_id TEXT, state TEXT,"
    " owner TEXT,"  # "key:<name>" for a principal, "payer:<address>" for a payer
    " document TEXT,"  # the Task as JSON, canonical (v0.3) shape
    " backend_ref TEXT,"  # a backend's memory for the task (an upstream's task id)
    " created_at DOUBLE PRECISION, updated_at DOUBLE PRECISION, deadline_at DOUBLE PRECISION)",
    "CREATE INDEX IF NOT EXISTS idx_tasks_state_updated_at ON tasks (state, updated_at)",
    # requests awaiting payment are counted per caller (replaced by idx_tasks_awaiting_payment, below)
    "CREATE INDEX IF NOT EXISTS idx_tasks_owner_state ON tasks (owner, state)",
    # ListTasks: one owner's tasks at one agent, newest first
    "CREATE INDEX IF NOT EXISTS idx_tasks_owner_agent_updated_at ON tasks (owner, agent, updated_at)",
)
# a cancel asked of another process (worker or replica) than the one running the task
_CANCEL_COLUMN = ("ALTER TABLE tasks ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0",)
# requests awaiting payment, counted per caller (`count_pending`): only those tasks are in the index.
# (owner, state) held every task, so each task written (a paid or a key's, nearly all of them born
# final) changed one index more: about a fifth of writing a task and committing it, in a replay.
_AWAITING_PAYMENT = (
    "DROP INDEX IF EXISTS idx_tasks_owner_state",
    "CREATE INDEX IF NOT EXISTS idx_tasks_awaiting_payment ON tasks (owner, deadline_at)"
    " WHERE state = 'input-required'",
)
MIGRATIONS = (Migration(_TABLES), Migration(_CANCEL_COLUMN), Migration(_AWAITING_PAYMENT))


@dataclass
class Unwritten:
    """A task created but not written yet (see `TaskStore.create`): what its INSERT needs."""

    agent: str
    owner: str
    created_at: float
    deadline_at: float
    # the rows that belong with it, written with its INSERT (`final`: the INSERT stores it as it ends)
    with_writes: Callable[[bool], Sequence[Statement]] | None = None
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)


def is_key(value: Any) -> bool:
    """A string a row's key can be: PostgreSQL text holds no NUL, so one with a NUL matches nothing."""
    return isinstance(value, str) and "\x00" not in value


class TaskStore:
    def __init__(self, db: Database, *, deadline_seconds: float = 600.0) -> None:
        self.db = db
        self.deadline_seconds = deadline_seconds
        self.unwritten: dict[str, Unwritten] = {}
        self.clock_offset = 0.0  # the database's clock minus this process's (`sync_clock`)

    def now(self) -> float:
        """The database's time, as this process reckons it: deadlines and retention are judged by
        one clock on every replica, so one whose own clock is off fails no other's live task."""
        return time.time() + self.clock_offset

    async def sync_clock(self) -> float:
        """Measure how far this process's clock is from the database's; returns the offset."""
        before = time.time()
        database = float(await self.db.fetchval(f"SELECT {self.db.clock_sql} AS now"))
        self.clock_offset = database - (before + time.time()) / 2
        return self.clock_offset

    async def create_tables(self) -> None:
        await self.db.migrate("tasks", MIGRATIONS)

    # a task's id is new, so its row exists only if this INSERT ran already: a deferred task whose
    # delivery wrote it while its caller was being cancelled (a shutdown) is not written twice
    _COLUMNS = "(id, agent, context_id, state, owner, document, backend_ref, created_at, updated_at, deadline_at)"
    _INSERT = f"INSERT INTO tasks {_COLUMNS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING"
    # the same row as a SELECT, so a condition can follow its WHERE (`final_statements`); typed like
    # the columns: PostgreSQL reads an untyped parameter of a SELECT list as text
    _INSERT_SELECT = (
        f"INSERT INTO tasks {_COLUMNS} SELECT ?, ?, ?, ?, ?, ?, ?, CAST(? AS DOUBLE PRECISION),"
        " CAST(? AS DOUBLE PRECISION), CAST(? AS DOUBLE PRECISION) WHERE NOT EXISTS (SELECT 1 FROM tasks WHERE id = ?)"
    )

    # read from idx_tasks_awaiting_payment, whose WHERE the query's `state = 'input-required'` implies
    COUNT_PENDING = "SELECT COUNT(*) FROM tasks WHERE owner = ? AND state = 'input-required' AND deadline_at > ?"

    async def create(
        self,
        task: dict[str, Any],
        *,
        agent: str,
        owner: str,
        deadline_seconds: float | None = None,
        deferred: bool = False,
        with_writes: Callable[[bool], Sequence[Statement]] | None = None,
    ) -> None:
        """Store a new task; `deferred`: at its first `save` (or `write`, or with the statements
        of `final_statements`) instead, in its state then, one statement for both. For a task
        nobody can name before its answer (a blocking send): the answer waits for `write`.
        `with_writes(final)`: other rows that belong with it (the anonymous path's bookkeeping), in
        the same transaction and, on PostgreSQL, the same round trip (`Database.write_together`);
        each with its WHERE clause last, and written only by the INSERT that stores the task.
        `final` says that INSERT stores the task as it ends, with the statements of its delivery
        (`final_statements`), which may say some of what the rows would."""
        now = self.now()
        deadline = self.deadline_seconds if deadline_seconds is None else deadline_seconds
        unwritten = Unwritten(agent, owner, now, now + deadline, with_writes)
        if deferred:
            self.unwritten[task["id"]] = unwritten
            return
        if with_writes is not None:
            await self.db.write_together([self._insert_statement(task, unwritten, {}), *with_writes(False)])
            return
        await self._insert(task, unwritten, {})

    async def _insert(self, task: dict[str, Any], row: Unwritten, backend_ref: dict[str, Any]) -> None:
        if row.with_writes is not None:
            await self.db.write_together(
                [*self._with_insert(task["id"], row, final=False), self._insert_statement(task, row, backend_ref)]
            )
        else:
            await self.db.execute(*self._insert_statement(task, row, backend_ref))

    @staticmethod
    def _with_insert(task_id: str, row: Unwritten, *, final: bool) -> list[Statement]:
        """The rows that belong with a task's INSERT, each applying only if that INSERT does: a task
        written already (its write committed, its writer cancelled before it heard) adds none again."""
        if row.with_writes is None:
            return []
        return [
            (f"{sql} AND NOT EXISTS (SELECT 1 FROM tasks WHERE id = ?)", (*args, task_id))
            for sql, args in row.with_writes(final)
        ]

    def _insert_statement(
        self, task: dict[str, Any], row: Unwritten, backend_ref: dict[str, Any]
    ) -> tuple[str, tuple[Any, ...]]:
        return (
            self._INSERT,
            (
                task["id"],
                row.agent,
                task["contextId"],
                task["status"]["state"],
                row.owner,
                json_text.dumps(task),
                json_text.dumps(backend_ref),
                row.created_at,
                self.now(),
                row.deadline_at,
            ),
        )

    async def create_pending(
        self, task: dict[str, Any], *, agent: str, owner: str, deadline_seconds: float, cap: int
    ) -> bool:
        """Create a request awaiting payment unless its owner (one caller) already has `cap` of them
        awaiting it: counted and created as one step, however many requests of that caller arrive
        at once, on any process or replica. False, and nothing created, at the cap."""
        async with self.db.transaction():
            await self.db.lock(owner)
            if await self.count_pending(owner) >= cap:
                return False
            await self.create(task, agent=agent, owner=owner, deadline_seconds=deadline_seconds)
        return True

    async def write(self, task: dict[str, Any], backend_ref: dict[str, Any] | None = None) -> bool:
        """Write a deferred task as it is now, once; False when it was written already."""
        row = self.unwritten.get(task["id"])
        if row is None:
            return False
        async with row.writing:  # one INSERT, even when two writers come at once
            if task["id"] not in self.unwritten:
                return False
            await self._insert(task, row, backend_ref or {})
            del self.unwritten[task["id"]]
        return True

    def writing(self, task_id: str) -> AbstractAsyncContextManager[Any]:
        """Held while a deferred task's statements are built and sent (`final_statements`): no
        other write of it comes between (a no-op for a task that is stored)."""
        row = self.unwritten.get(task_id)
        return row.writing if row is not None else contextlib.nullcontext()

    def final_statements(self, task: dict[str, Any]) -> list[Statement]:
        """The statements that store `task` as it ends, to send with others, each with its WHERE
        clause last (a caller may make it conditional with `AND ...`): its save, or for a deferred
        task its INSERT and the rows that belong with it, which `written` then marks done. Build
        and send them under `writing`."""
        row = self.unwritten.get(task["id"])
        if row is None:
            return [self.save_statement(task)]
        _, args = self._insert_statement(task, row, {})
        return [*self._with_insert(task["id"], row, final=True), (self._INSERT_SELECT, (*args, task["id"]))]

    def written(self, task_id: str) -> None:
        """The statements of `final_statements` for a deferred task were committed."""
        self.unwritten.pop(task_id, None)

    @staticmethod
    def save_statement(task: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
        """`save`'s statement for a stored task, to send with others (`Database.write_together`).
        Its WHERE clause comes last: a caller may make it conditional with `AND ...`."""
        document = json_text.dumps(task)
        return (
            "UPDATE tasks SET state = ?, document = ?, updated_at = ? WHERE id = ?",
            (task["status"]["state"], document, time.time(), task["id"]),
        )

    async def save(self, task: dict[str, Any], backend_ref: dict[str, Any] | None = None) -> None:
        if task["id"] in self.unwritten and await self.write(task, backend_ref):
            return
        if backend_ref is None:
            sql, args = self.save_statement(task)
        else:
            document = json_text.dumps(task)
            sql = "UPDATE tasks SET state = ?, document = ?, backend_ref = ?, updated_at = ? WHERE id = ?"
            args = (task["status"]["state"], document, json_text.dumps(backend_ref), self.now(), task["id"])
        await self.db.execute(sql, args)

    async def start_turn(self, task: dict[str, Any], interrupted: str) -> bool:
        """Store `task` as its next turn starts, only while it is still `interrupted` (the state
        it was read in): the turn's deadline counts from now. False when the task changed meanwhile
        (another turn started, or it was canceled), and then nothing is written."""
        now = self.now()
        changed = await self.db.execute(
            "UPDATE tasks SET state = ?, document = ?, updated_at = ?, deadline_at = ? WHERE id = ? AND state = ?",
            (
                task["status"]["state"],
                json_text.dumps(task),
                now,
                now + self.deadline_seconds,
                task["id"],
                interrupted,
            ),
        )
        return changed == 1

    async def backend_ref(self, task_id: str) -> dict[str, Any]:
        found = await self.db.fetchval("SELECT backend_ref FROM tasks WHERE id = ?", (task_id,))
        return json.loads(found) if found else {}

    async def get(self, task_id: Any, owner: str, agent: str) -> dict[str, Any] | None:
        """The task when it exists, belongs to `owner` and was made by `agent`; else None."""
        if not is_key(task_id):
            return None
        document = await self.db.fetchval(
            "SELECT document FROM tasks WHERE id = ? AND owner = ? AND agent = ?", (task_id, owner, agent)
        )
        return None if document is None else json.loads(document)

    async def page(
        self, owner: str, agent: str, query: TaskQuery
    ) -> tuple[list[dict[str, Any]], int, tuple[float, str] | None]:
        """One page of `owner`'s tasks at `agent`, most recently updated first: the tasks,
        how many match in all, and the cursor after the last one (None on the last page)."""
        where = ["owner = ?", "agent = ?"]
        args: list[Any] = [owner, agent]
        if query.context_id is not None:
            where.append("context_id = ?")
            args.append(query.context_id)
        if query.state is not None:
            where.append("state = ?")
            args.append(query.state)
        if query.status_after is not None:  # timestamps of one format compare as strings
            where.append(f"{self.db.json_text('document', 'status', 'timestamp')} > ?")
            args.append(query.status_after)
        condition = " AND ".join(where)
        total = await self.db.fetchval(f"SELECT COUNT(*) FROM tasks WHERE {condition}", args)
        if query.after is not None:
            condition += " AND (updated_at < ? OR (updated_at = ? AND id < ?))"
            args += [query.after[0], query.after[0], query.after[1]]
        rows = await self.db.fetch(
            f"SELECT document, updated_at, id FROM tasks WHERE {condition} ORDER BY updated_at DESC, id DESC LIMIT ?",
            [*args, query.size + 1],
        )
        more = len(rows) > query.size
        rows = rows[: query.size]
        cursor = (rows[-1]["updated_at"], rows[-1]["id"]) if more and rows else None
        return [json.loads(r["document"]) for r in rows], int(total), cursor

    async def unpaid(self, task_id: Any, agent: str) -> dict[str, Any] | None:
        """A request of `agent` nobody has paid for, whoever asked: one awaiting its first
        payment (unexpired), or one that ended unpaid (declined) and is not deleted yet."""
        if not is_key(task_id):
            return None
        document = await self.db.fetchval(
            "SELECT document FROM tasks WHERE id = ? AND agent = ? AND owner LIKE ?"
            " AND (state <> 'input-required' OR deadline_at > ?)",
            (task_id, agent, _PENDING_LIKE, self.now()),
        )
        return None if document is None else json.loads(document)

    async def save_unpaid(self, task: dict[str, Any]) -> bool:
        """Store a request awaiting payment as `task` now stands, only while it still awaits it
        (unexpired, unpaid, not declined): False when it changed meanwhile, and then nothing is written."""
        now = self.now()
        document = json_text.dumps(task)
        changed = await self.db.execute(
            "UPDATE tasks SET state = ?, document = ?, updated_at = ? WHERE id = ? AND owner LIKE ?"
            " AND state = 'input-required' AND deadline_at > ?",
            (task["status"]["state"], document, now, task["id"], _PENDING_LIKE, now),
        )
        return changed == 1

    async def count_pending(self, owner: str) -> int:
        """How many unexpired requests of one caller are awaiting payment."""
        count = await self.db.fetchval(self.COUNT_PENDING, (owner, self.now()))
        return int(count)

    async def adopt(self, task_id: Any, owner: str, agent: str) -> dict[str, Any] | None:
        """Give a request awaiting its first payment to the payer who paid for it (once).

        From now on the task runs, so its deadline becomes an execution's.
        """
        if not is_key(task_id):
            return None
        now = self.now()
        changed = await self.db.execute(
            "UPDATE tasks SET owner = ?, deadline_at = ?, updated_at = ? WHERE id = ? AND agent = ? AND owner LIKE ?"
            " AND state = 'input-required' AND deadline_at > ?",
            (owner, now + self.deadline_seconds, now, task_id, agent, _PENDING_LIKE, now),
        )
        return await self.get(task_id, owner, agent) if changed == 1 else None

    async def request_cancel(self, task_id: str) -> bool:
        """Ask whichever process runs this task to cancel it (`cancel_requests` is how it learns)."""
        changed = await self.db.execute(
            "UPDATE tasks SET cancel_requested = 1 WHERE id = ? AND state IN ('submitted', 'working')", (task_id,)
        )
        return changed == 1

    async def cancel_requests(self, task_ids: list[str]) -> list[str]:
        """Which of these tasks (the ones running here) another process was asked to cancel."""
        if not task_ids:
            return []
        marks = ", ".join("?" for _ in task_ids)
        rows = await self.db.fetch(f"SELECT id FROM tasks WHERE cancel_requested = 1 AND id IN ({marks})", task_ids)
        return [row["id"] for row in rows]

    async def expire(self, retention_seconds: float) -> int:
        """Delete tasks idle past the retention (finished or waiting on their caller), and
        unpaid in-band payment requests past their deadline; returns how many went."""
        now = self.now()
        return await self.db.execute(
            "DELETE FROM tasks WHERE (state NOT IN ('submitted', 'working') AND updated_at < ?)"
            " OR (owner LIKE ? AND deadline_at < ?)",
            (now - retention_seconds, _PENDING_LIKE, now),
        )

    async def stuck(self, limit: int = 100) -> list[dict[str, Any]]:
        """Unfinished tasks past their deadline (not interrupted ones: those wait for the caller)."""
        rows = await self.db.fetch(
            "SELECT document FROM tasks WHERE state IN ('submitted', 'working') AND deadline_at < ? LIMIT ?",
            (self.now(), limit),
        )
        return [json.loads(r["document"]) for r in rows]
