"""The embedded engine: one SQLite file (WAL), shared by the workers of one machine.

One connection per process in autocommit mode; a transaction is ``BEGIN IMMEDIATE``, so
writers of every worker serialise at its start, not at its first write. Statements run
inline: SQLite answers in microseconds, and a coroutine that never suspends keeps a
transaction whole on the event loop. A lock still queues transactions of one process
behind each other, should one ever wait on something else.

What does not take microseconds is the WAL checkpoint: copying the log back into the
database file and syncing it, which SQLite runs inside whichever commit crosses
``wal_autocheckpoint`` pages (a commit in twenty then took milliseconds, on the event
loop). Here the serving connection never checkpoints; a thread of the process does, on
a connection of its own, after every `CHECKPOINT_WRITES` write statements or `CHECKPOINT_SECONDS`.
A checkpoint does not block writers (PASSIVE), and a crash loses nothing: the WAL is the
record until it is copied.

Under steady writes a PASSIVE checkpoint never finishes: the frames committed while it copies
are still to copy when it ends (it counts those there when it began), and SQLite starts the
WAL over only once every frame is back in the database. The file then grows without bound
(half a gigabyte in a half-minute benchmark), and every commit and every read searches a
longer WAL index (a commit's cost more than doubled). So after a pass over a long WAL, the
thread catches up with what was committed meanwhile (a few shorter passes), then asks the
event loop to hold this process's writes (the lock a transaction takes) and copies the rest:
a few milliseconds' worth, during which the loop goes on serving and the writes wait in
their group. The next commit starts the WAL from its beginning. Writes of
another process on the file are not held; a pass they outrun is tried again the next time.

A commit is the other cost that is not a statement's (the WAL frames of every page it
touched, written out): a write outside a transaction is therefore committed together with
the other such writes issued in the same turn of the event loop (group commit), one
``BEGIN IMMEDIATE ... COMMIT`` for all, and its caller resumes only once that commit is
done. Each keeps its own outcome (rowcount or error); none waits longer than the loop's turn.
A `write_together` group joins the same commit as one unit: its statements apply all together or
not at all, whatever the others in the commit do. A commit runs without savepoints first (a
statement that fails leaves nothing of itself, so a group that fails at its first statement is
undone already); only a group failing after some of it applied has the commit undone whole and
redone with a savepoint per group, which then undoes that group alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

import sqlite_utils

from server.database import Database, DatabaseRefused, DatabaseUnavailable, Row

logger = logging.getLogger("a2a_gate.database")

# write statements between two checkpoints, at most: a few pages each (a row, its indexes), so
# about 4,000 WAL frames; counted by statement, since a group commit holds any number of them
CHECKPOINT_WRITES = 1000
CHECKPOINT_SECONDS = 1.0  # and at least this often while anything was committed
# A WAL this long has its checkpoint finished with the writes held, so that it starts over: as
# long as one segment of the WAL index (4,096 frames, 16 MiB of pages), so that a page's lookup
# searches one or two, and rarely enough that the holds (a few milliseconds) cost nothing to speak of.
RESTART_FRAMES = 4096
HOLD_SECONDS = 10.0  # how long the thread waits for the event loop to hold the writes, at most
HELD_FRAMES = 512  # the held pass copies about this many frames at most (about 2 MiB: milliseconds)
CATCH_UP_PASSES = 4  # unheld passes, at most, to get there
WAL_LIMIT_BYTES = 64 * 1024 * 1024  # what a checkpointed WAL is truncated back to
WRITES = ("INSERT", "UPDATE", "DELETE", "insert", "update", "delete")  # statements committed in groups

# One write waiting for the group commit: its statements, whether they stand or fall together
# (a `write_together` group, in a savepoint), and the future its caller awaits: a rowcount,
# or a group's list of them.
Write = tuple[list[tuple[str, tuple[Any, ...]]], bool, "asyncio.Future[Any]"]


class Halfway(Exception):
    """A statement group failed after some of it applied, in a commit without savepoints."""


def connect(path: str) -> sqlite3.Connection:
    """A connection to the file, or DatabaseRefused naming it when it cannot be opened at all (no
    such directory, or not ours to write): waiting would not help."""
    try:
        return sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10.0)
    except sqlite3.OperationalError as exc:
        raise DatabaseRefused(f"{path}: {exc} (its directory must exist and be writable by this user)") from None


class Checkpointer:
    """A thread that checkpoints one SQLite file's WAL, off the event loop.

    `held`: runs a function on a worker thread while the serving connection writes nothing,
    and answers when it is done (from any thread); the last pass of a checkpoint that writes
    kept outrunning goes through it."""

    def __init__(self, path: str, held: Callable[[Callable[[], Any]], Any]) -> None:
        self.path = path
        self.held = held
        self.writes = 0  # since the last wake-up; only the event loop's thread writes it
        self.wake = threading.Event()
        self.stopping = False
        self.thread = threading.Thread(target=self.run, name="sqlite-checkpoint", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def wrote(self, statements: int) -> None:
        self.writes += statements
        if self.writes >= CHECKPOINT_WRITES:
            self.writes = 0
            self.wake.set()

    def run(self) -> None:
        # the last pass of a checkpoint runs on a worker thread of the loop, while this one waits
        conn = connect(self.path)
        try:
            conn.execute("PRAGMA busy_timeout=10000")
            while not self.stopping:
                self.wake.wait(CHECKPOINT_SECONDS)
                self.wake.clear()
                try:
                    _, frames, _ = self.checkpoint(conn)  # the frames there when it began
                    if frames >= RESTART_FRAMES:
                        self.finish(conn, frames)
                except sqlite3.Error as exc:  # busy, full: the WAL waits for the next pass
                    logger.warning("sqlite checkpoint failed: %s", exc)
                except (RuntimeError, TimeoutError):  # the loop is closed or too busy to hold: next time
                    pass
        finally:
            conn.close()

    def finish(self, conn: sqlite3.Connection, frames: int) -> None:
        """Copy back the frames committed while the last pass ran, without holding anything while
        there are many (each pass is shorter than the one before while copying outpaces the writes),
        then the last few with this process's writes held."""
        for _ in range(CATCH_UP_PASSES):
            _, now, _ = self.checkpoint(conn)
            if now - frames <= HELD_FRAMES:  # committed during the pass just run: the held one copies about as many
                break
            frames = now
        self.held(lambda: self.checkpoint(conn))

    @staticmethod
    def checkpoint(conn: sqlite3.Connection) -> tuple[int, int, int]:
        """One PASSIVE pass: (busy, frames in the WAL, frames copied back); never waits for a writer."""
        busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return busy, frames, copied

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()
        self.thread.join(timeout=30.0)


class SQLiteDatabase(Database):
    dialect = "sqlite"
    # One machine, one clock: the same wall clock every process on it reads, in SQL.
    clock_sql = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, path: str) -> None:
        self.path = path
        self._db: sqlite_utils.Database | None = None
        self._checkpointer: Checkpointer | None = None
        self._transaction = asyncio.Lock()
        self._batch: list[Write] = []  # writes to commit together
        self._later: set[asyncio.Future[None]] = set()  # batches waiting for a transaction to end
        self._inside: ContextVar[bool] = ContextVar(f"sqlite-transaction-{id(self)}", default=False)

    @property
    def conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise DatabaseUnavailable("the database is not open")
        return self._db.conn

    async def open(self) -> None:
        if self._db is not None:
            return
        conn = connect(self.path)
        try:
            db = sqlite_utils.Database(conn)
            if self.path != ":memory:":
                db.enable_wal()  # needs the file to itself for a moment: busy while others start too
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=10000")
            if self.path != ":memory:":
                conn.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer's job, off the loop
                conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
        except sqlite3.OperationalError as exc:
            conn.close()
            raise DatabaseUnavailable(f"sqlite: {exc}") from exc
        self._db = db
        if self.path != ":memory:":
            self._checkpointer = Checkpointer(self.path, held=self._held_from(asyncio.get_running_loop()))
            self._checkpointer.start()

    def _held_from(self, loop: asyncio.AbstractEventLoop) -> Callable[[Callable[[], Any]], Any]:
        """For the checkpointer's thread: `run` on a worker thread while this process writes nothing."""

        async def holding(run: Callable[[], Any]) -> Any:
            async with self._transaction:  # a transaction's lock: the group commits wait behind it too
                return await asyncio.to_thread(run)

        def held(run: Callable[[], Any]) -> Any:
            future = asyncio.run_coroutine_threadsafe(holding(run), loop)
            try:
                return future.result(HOLD_SECONDS)
            finally:
                future.cancel()  # not left to run later beside the next pass (a no-op once done)

        return held

    async def close(self) -> None:
        if self._batch and self._db is not None:  # writes issued are committed before the file closes
            self._commit_batch()
        if self._later:
            await asyncio.wait(self._later)
        if self._checkpointer is not None:
            await asyncio.to_thread(self._checkpointer.stop)
            self._checkpointer = None
        if self._db is not None:
            self._db.conn.close()
            self._db = None

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        if self._inside.get() or not sql.lstrip().startswith(WRITES):
            return self._run(sql, tuple(args))
        return await self._in_next_commit([(sql, tuple(args))], together=False)

    async def write_together(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[int]:
        if self._inside.get():  # joined to the caller's transaction
            return [self._run(sql, tuple(args)) for sql, args in statements]
        return await self._in_next_commit([(sql, tuple(args)) for sql, args in statements], together=True)

    async def _in_next_commit(self, statements: list[tuple[str, tuple[Any, ...]]], *, together: bool) -> Any:
        self.conn  # noqa: B018 -- raises DatabaseUnavailable when closed, as a statement would
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._batch.append((statements, together, future))
        if len(self._batch) == 1:
            asyncio.get_running_loop().call_soon(self._commit_batch)
        return await future  # a write issued is committed, even if its caller is cancelled meanwhile

    def _run(self, sql: str, args: tuple[Any, ...]) -> int:
        conn = self.conn
        try:
            changed = conn.execute(sql, args).rowcount
        except sqlite3.OperationalError as exc:  # locked, full, read-only, I/O
            raise DatabaseUnavailable(f"sqlite: {exc}") from exc
        if self._checkpointer is not None and sql.lstrip().startswith(WRITES):  # alone, or in a transaction
            self._checkpointer.wrote(1)
        return changed

    def _commit_batch(self) -> None:
        batch, self._batch = self._batch, []
        if self._transaction.locked():  # a transaction of this process is open: after it
            job = asyncio.ensure_future(self._commit_after_transaction(batch))
            self._later.add(job)
            job.add_done_callback(self._later.discard)
            return
        self._commit(batch)

    async def _commit_after_transaction(self, batch: list[Write]) -> None:
        async with self._transaction:
            self._commit(batch)

    def _commit(self, batch: list[Write]) -> None:
        """One transaction for `batch`: each write's rowcount (a group's list of them) or error to its own future."""
        try:
            try:
                outcomes = self._apply(batch, savepoints=False)
            except Halfway:  # undone whole; then again, each group in a savepoint of its own
                self._roll_back()
                outcomes = self._apply(batch, savepoints=True)
        except (sqlite3.Error, DatabaseUnavailable) as exc:
            self._roll_back()
            failed = exc if isinstance(exc, DatabaseUnavailable) else DatabaseUnavailable(f"sqlite: {exc}")
            outcomes = [failed] * len(batch)
        else:
            if self._checkpointer is not None:
                self._checkpointer.wrote(sum(len(statements) for statements, _, _ in batch))
        for (_, _, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():  # its caller was cancelled: the write stands all the same
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _apply(self, batch: list[Write], *, savepoints: bool) -> list[Any]:
        """BEGIN, the batch's writes, COMMIT: their outcomes. A write that fails is undone alone: a
        statement that fails leaves nothing of itself (SQLite undoes it), so a group needs undoing
        only when it fails after its first statement applied. Without `savepoints` that raises
        `Halfway` (the commit is redone with them: rare); with them, the group's savepoint undoes it.
        A savepoint a group cost a voucher's write about as much as its statements did."""
        outcomes: list[Any] = []
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        for statements, together, _ in batch:
            isolated = together and savepoints
            if isolated:
                conn.execute("SAVEPOINT together")
            counts: list[int] = []
            try:
                for sql, args in statements:
                    counts.append(conn.execute(sql, args).rowcount)
            except sqlite3.Error as exc:  # a constraint, a lock: this write alone is undone
                if counts and not savepoints:  # some of the group applied: only the whole commit undoes it
                    raise Halfway from exc
                if isolated and conn.in_transaction:
                    conn.execute("ROLLBACK TO together")
                    conn.execute("RELEASE together")
                unavailable = isinstance(exc, sqlite3.OperationalError)
                outcomes.append(DatabaseUnavailable(f"sqlite: {exc}") if unavailable else exc)
            else:
                if isolated:
                    conn.execute("RELEASE together")
                outcomes.append(counts if together else counts[0])
            if not conn.in_transaction:  # SQLite gave the whole transaction up (full, I/O)
                raise DatabaseUnavailable("sqlite: the transaction was rolled back")
        conn.execute("COMMIT")
        return outcomes

    def _roll_back(self) -> None:
        with contextlib.suppress(sqlite3.Error, DatabaseUnavailable):
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        try:
            cursor = self.conn.execute(sql, tuple(args))
            columns = [c[0] for c in cursor.description]
            return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
        except sqlite3.OperationalError as exc:
            raise DatabaseUnavailable(f"sqlite: {exc}") from exc

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        if self._inside.get():  # a transaction already holds this task: its statements join it
            yield
            return
        async with self._transaction:
            self._run("BEGIN IMMEDIATE", ())
            token = self._inside.set(True)
            try:
                yield
                self._run("COMMIT", ())
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
                raise
            finally:
                self._inside.reset(token)

    async def check_writable(self) -> None:
        async with self.transaction():
            pass

    def json_text(self, column: str, *path: str) -> str:
        return f"json_extract({column}, '$.{'.'.join(path)}')"

    async def lock_schema(self) -> None:
        return None  # BEGIN IMMEDIATE already holds every other writer off

    async def lock(self, name: str) -> None:
        return None  # the same
