"""What the benchmark measures on PostgreSQL besides the load: a schema per case, round trips, backends.

- `Schema`: a fresh schema for one case, dropped afterwards; the gate's URL points into it
  (``options=-csearch_path``) and names its connections (``application_name``), so the
  backends serving this case can be told from everyone else's on a shared server.
- `RoundTrips`: reads the counters `bench/roundtrips.py` keeps inside each replica, as
  the window opens and closes (SIGUSR1, then the file it writes).
- `Backends`: the CPU of this case's PostgreSQL backend processes (found by
  application_name in `pg_stat_activity`), measured like any other process.
- `Activity`: samples `pg_stat_activity` and `pg_locks` for this case's backends through
  the window: how many are busy, what they wait on, how many lock requests wait. A step
  every replica serialises on (one hot row, a table lock) shows as Lock waits here.

All of it reads the server through the statistics views; none needs `pg_stat_statements`
(a preloaded library the shared test server does not have).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import psutil

DEFAULT_URL = os.environ.get("A2A_GATE_TEST_POSTGRES_URL") or "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = os.environ.get("A2A_GATE_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"


def unreachable(url: str) -> str:
    """Why PostgreSQL at `url` cannot be used ("" when it can)."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed"
    try:
        with psycopg.connect(libpq(url), connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL is not answering ({type(exc).__name__})"
    return ""


def redis_unreachable(url: str) -> str:
    """Why Redis at `url` cannot be used ("" when it can)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
    try:
        client.ping()
    except redis.RedisError as exc:
        return f"Redis is not answering ({type(exc).__name__})"
    finally:
        client.close()
    return ""


def libpq(url: str) -> str:
    """The URL without the gate's own pool parameters (``pool_max_size=20``), which libpq refuses."""
    parts = urlsplit(url)
    kept = [pair for pair in parts.query.split("&") if pair and not pair.startswith("pool_")]
    return urlunsplit(parts._replace(query="&".join(kept)))


def connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(libpq(url), autocommit=True, connect_timeout=5)


class Schema:
    """A schema of the case's own, created on enter and dropped (with everything in it) on exit."""

    def __init__(self, url: str, case: str) -> None:
        self.url = url
        self.name = f"bench_{case.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
        self.application = f"a2a-gate-{self.name}"

    @property
    def gate_url(self) -> str:
        """The gate's `database`: this schema first on the search path, its connections named.
        `options` already in the URL (``-csynchronous_commit%3Doff``) are kept after the schema's."""
        parts = urlsplit(self.url)
        options = [f"-csearch_path={self.name}"]
        query = []
        for pair in parts.query.split("&") if parts.query else []:
            name, _, value = pair.partition("=")
            if name == "options":
                options.append(unquote(value))
            elif name != "application_name":
                query.append(pair)
        query += [f"options={quote(' '.join(options), safe='')}", f"application_name={self.application}"]
        return urlunsplit(parts._replace(query="&".join(query)))

    def __enter__(self) -> Schema:
        with connect(self.url) as conn:
            conn.execute(f'CREATE SCHEMA "{self.name}"')
        return self

    def __exit__(self, *exc: object) -> None:
        with connect(self.url) as conn:
            # the replicas are stopped by now; a straggling backend would only delay the drop
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                (self.application,),
            )
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')

    def table_rows(self) -> dict[str, int]:
        """Rows in each of the schema's tables (what a run left behind)."""
        with connect(self.url) as conn:
            tables = conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1", (self.name,)
            ).fetchall()
            return {
                name: conn.execute(f'SELECT count(*) FROM "{self.name}"."{name}"').fetchone()[0] for (name,) in tables
            }


class Backends:
    """This case's backend processes, measured as one process (CPU seconds, summed)."""

    label = "PostgreSQL backends"

    def __init__(self, url: str, application: str) -> None:
        self.url = url
        self.application = application

    def pids(self) -> list[int]:
        with connect(self.url) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (self.application,)
            ).fetchall()
        return [pid for (pid,) in rows]

    def cpu_seconds(self) -> float:
        total = 0.0
        for pid in self.pids():
            try:
                times = psutil.Process(pid).cpu_times()
                total += times.user + times.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return total


class ServerRest:
    """Every other process of the PostgreSQL server on this machine (WAL writer, checkpointer,
    autovacuum, other clients' backends), measured as one: where the rest of its CPU goes."""

    label = "PostgreSQL's other processes"

    def __init__(self, backends: Backends) -> None:
        self.backends = backends
        self.user = next(
            (p.info["username"] for p in psutil.process_iter(["name", "username"]) if p.info["name"] == "postgres"),
            None,
        )

    def cpu_seconds(self) -> float:
        ours = set(self.backends.pids())
        total = 0.0
        for proc in psutil.process_iter(["name", "username", "cpu_times"]):
            if proc.info["name"] == "postgres" and proc.info["username"] == self.user and proc.pid not in ours:
                times = proc.info["cpu_times"]
                total += times.user + times.system if times else 0.0
        return total


class Sampler:
    """This process (the benchmark's parent: the samplers' queries), measured like a server."""

    label = "bench sampling"

    def cpu_seconds(self) -> float:
        times = psutil.Process().cpu_times()
        return times.user + times.system


def where(url: str) -> str:
    """host:port of a URL, without any password in it."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


class RedisServer:
    """The Redis server the replicas share (found by the pid it reports), measured as a process."""

    label = "Redis"

    def __init__(self, url: str, prefix: str) -> None:
        import redis

        self.prefix = prefix  # the case's own keys, deleted on close
        self.client = redis.Redis.from_url(url, socket_timeout=2.0)
        self.pid = int(self.client.info("server")["process_id"])

    def cpu_seconds(self) -> float:
        try:
            times = psutil.Process(self.pid).cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return 0.0
        return times.user + times.system

    def close(self) -> None:
        for key in self.client.scan_iter(match=f"{self.prefix}*", count=1000):
            self.client.delete(key)
        self.client.close()


class RoundTrips:
    """The round-trip counters of the replicas run through `bench/roundtrips.py`."""

    def __init__(self, replicas: list[tuple[int, Path]]) -> None:
        self.replicas = replicas  # (pid, stats file)
        self.marks: list[list[dict[str, Any]]] = []

    def read(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Ask every replica for its counters and wait for the answers."""
        before = {path: _seq(path) for _, path in self.replicas}
        for pid, _ in self.replicas:
            os.kill(pid, signal.SIGUSR1)
        documents = []
        deadline = time.monotonic() + timeout
        for _, path in self.replicas:
            while _seq(path) <= before[path]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no round-trip counters in {path}")
                time.sleep(0.005)
            documents.append(json.loads(path.read_text()))
        return documents

    def mark(self) -> None:
        self.marks.append(self.read())

    start = stop = mark  # as a probe: a mark as the window opens and as it closes

    def window(self) -> dict[str, Any]:
        """The counters' growth between the first two marks, summed over the replicas."""
        first, last = self.marks[0], self.marks[-1]
        names = (
            "round_trips",
            "request_round_trips",
            "round_trip_seconds",
            "checkouts",
            "checkout_seconds",
            "held_seconds",
            "redis_commands",
            "requests",
        )
        out: dict[str, Any] = dict.fromkeys(names, 0)
        statements: dict[str, dict[str, float]] = {}
        for a, b in zip(first, last, strict=True):
            for name in out:
                out[name] += b.get(name, 0) - a.get(name, 0)
            for sql, entry in b["statements"].items():
                old = a["statements"].get(sql, {"count": 0, "seconds": 0.0})
                mine = statements.setdefault(sql, {"count": 0, "seconds": 0.0})
                mine["count"] += entry["count"] - old["count"]
                mine["seconds"] += entry["seconds"] - old["seconds"]
        out["statements"] = {sql: e for sql, e in statements.items() if e["count"]}
        return out


def _seq(path: Path) -> int:
    try:
        return int(json.loads(path.read_text())["seq"])
    except (OSError, ValueError, KeyError):
        return 0


class ServerTotals:
    """The whole server's commits and WAL flushes over the window (`pg_stat_database`, `pg_stat_wal`).

    Server-wide: on a shared server, every other client's work counts too. Commits per WAL
    flush show group commit at work: one flush makes many transactions durable at once, so
    the flush, which every replica needs, does not serialise them one by one.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.marks: list[dict[str, int]] = []

    def read(self) -> dict[str, int]:
        with connect(self.url) as conn:
            commits = conn.execute(
                "SELECT sum(xact_commit + xact_rollback) FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()[0]
            syncs, writes, wal_bytes = conn.execute("SELECT wal_sync, wal_write, wal_bytes FROM pg_stat_wal").fetchone()
        return {
            "transactions": int(commits),
            "wal_syncs": int(syncs),
            "wal_writes": int(writes),
            "wal_bytes": int(wal_bytes),
        }

    def start(self) -> None:
        self.marks = [self.read()]

    def stop(self) -> None:
        self.marks.append(self.read())

    def window(self) -> dict[str, int]:
        if len(self.marks) != 2:
            return {}
        # cumulative statistics reach the views within a second (PostgreSQL 15 flushes them
        # at most once a second per backend): the window must be several seconds long
        return {k: self.marks[1][k] - self.marks[0][k] for k in self.marks[0]}


@dataclass
class ActivityResult:
    samples: int = 0
    backends: float = 0.0  # mean connections of this case open
    active: float = 0.0  # mean running a statement (or waiting inside one)
    waiting: dict[str, float] = field(default_factory=dict)  # mean backends per "type:event" while active
    lock_waits: float = 0.0  # mean ungranted lock requests of this case's backends
    max_lock_waits: int = 0
    locks_waited: dict[str, int] = field(default_factory=dict)  # locktype: samples it was waited on
    lock_waiters: dict[str, int] = field(default_factory=dict)  # statement waiting on a lock: samples


class Activity:
    """Samples this case's backends every `interval` seconds between `start()` and `stop()`."""

    def __init__(self, url: str, application: str, interval: float = 0.05) -> None:
        self.url = url
        self.application = application
        self.interval = interval
        self.result = ActivityResult()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pg-activity", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        waiting: Counter[str] = Counter()
        locks: Counter[str] = Counter()
        waiters: Counter[str] = Counter()
        backends = active = lock_waits = samples = most = 0
        with connect(self.url) as conn:
            while not self._stop.wait(self.interval):
                rows = conn.execute(
                    "SELECT state, wait_event_type, wait_event, left(query, 100) FROM pg_stat_activity"
                    " WHERE application_name = %s",
                    (self.application,),
                ).fetchall()
                ungranted = conn.execute(
                    "SELECT l.locktype FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE NOT l.granted AND a.application_name = %s",
                    (self.application,),
                ).fetchall()
                samples += 1
                backends += len(rows)
                for state, kind, event, query in rows:
                    if state == "active":
                        active += 1
                        waiting[f"{kind}:{event}" if kind else "CPU"] += 1
                        if kind == "Lock":
                            waiters[" ".join(query.split())] += 1
                lock_waits += len(ungranted)
                most = max(most, len(ungranted))
                locks.update(locktype for (locktype,) in ungranted)
        if samples:
            self.result = ActivityResult(
                samples,
                backends / samples,
                active / samples,
                {k: v / samples for k, v in waiting.most_common()},
                lock_waits / samples,
                most,
                dict(locks),
                dict(waiters.most_common()),
            )
