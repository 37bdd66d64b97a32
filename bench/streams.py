"""`python -m bench.streams [STREAMS] [--against REF]`: what resubscription streams on one task cost PostgreSQL.

A gate on a database of its own (created, then dropped: `pg_stat_database` counts per
database, so no other client of a shared server is counted), one task stored as
`working` that no process runs, then STREAMS (default 300) `tasks/resubscribe` streams on
it from one client. Reported: the database's transactions per second (``xact_commit +
xact_rollback``) with the gate idle and with the streams open, over windows that start and
end more than 10 s after the last burst (an idle backend reports its counts within 10 s),
and the task reads the gate itself counted (bench/roundtrips.py). With ``--against REF``,
that commit's gate (bench/reference.py) instead, without the `[streams]` caps it may not know.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg

from bench import postgres, servers
from bench.cases import create_key, gate_config

WINDOW = 20.0
REPORTED = 12.0  # seconds after which an idle backend's counts are in pg_stat_database
TASK_READ = "SELECT document FROM tasks WHERE id"


def transactions(stats: psycopg.Connection, database: str) -> int:
    row = stats.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (database,)
    ).fetchone()
    return int(row[0]) if row else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.streams")
    parser.add_argument("streams", type=int, nargs="?", default=300)
    parser.add_argument(
        "--postgres", default="postgresql://postgres@127.0.0.1:5432/test", help="the server (admin URL)"
    )
    parser.add_argument("--against", metavar="REF", help="measure that commit's gate instead")
    args = parser.parse_args(argv)
    database = f"a2a_gate_streams_{uuid.uuid4().hex[:8]}"
    parts = args.postgres.rsplit("/", 1)
    url = f"{parts[0]}/{database}"
    src, python, caps = servers.REPO, sys.executable, True
    if args.against:
        from bench.reference import prepare

        ref = prepare(args.against, print)
        src, python, caps = ref.src, str(ref.python), False
    folder = Path(tempfile.mkdtemp(prefix="a2a-gate-streams-"))
    with psycopg.connect(args.postgres, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {database}")
    try:
        config, port = gate_config(folder, database=url)
        if caps:
            config.write_text(
                config.read_text() + "\n[streams]\nmax_per_task = 1000\nmax_per_owner = 1000\nmax_per_client = 1000\n"
            )
        key = create_key(config, src, python)
        counted = folder / "roundtrips.json"
        sealing = {"A2A_GATE_SEALING_KEY": "a" * 43 + "="}
        with (
            servers.gate(
                config, port, folder / "log.txt", env=sealing, counted=counted, src=src, python=python
            ) as gate,
            psycopg.connect(args.postgres, autocommit=True) as stats,
        ):
            trips = postgres.RoundTrips([(gate.process.pid, counted)])
            task_id = str(uuid.uuid4())
            now = time.time()
            task = {"kind": "task", "id": task_id, "contextId": "c", "history": [], "artifacts": []}
            task["status"] = {"state": "working", "timestamp": "2026-01-01T00:00:00.000Z"}
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO tasks (id, agent, context_id, state, owner, document, backend_ref, created_at,"
                    " updated_at, deadline_at) VALUES (%s, 'echo', 'c', 'working', 'key:bench', %s, '{}', %s, %s, %s)",
                    (task_id, json.dumps(task), now, now, now + 3600),
                )

            def window() -> tuple[float, float]:
                time.sleep(REPORTED)
                before, started = transactions(stats, database), time.monotonic()
                trips.marks = []
                trips.mark()
                time.sleep(WINDOW)
                trips.mark()
                counted = trips.window()
                reads = sum(e["count"] for s, e in counted["statements"].items() if s.startswith(TASK_READ))
                seconds = time.monotonic() - started
                print(f"  the gate's round trips in the window: {counted['round_trips'] / seconds:.2f}/s", flush=True)
                time.sleep(REPORTED)
                return (transactions(stats, database) - before) / seconds, reads / seconds

            idle, idle_reads = window()
            busy, busy_reads = asyncio.run(follow(gate.url, key, task_id, args.streams, window))
        print(
            f"{args.streams} streams on one task that runs nowhere ({'this tree' if caps else args.against}): "
            f"{busy:.2f} transactions/s in the gate's database against {idle:.2f} idle, {busy - idle:+.2f}/s; "
            f"task reads counted in the gate {busy_reads:.2f}/s ({idle_reads:.2f} idle)"
        )
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        shutil.rmtree(folder, ignore_errors=True)
    return 0


async def follow(base: str, key: str, task_id: str, streams: int, window) -> tuple[float, float]:
    """Open `streams` resubscriptions, measure `window` (in a thread) while they stay open."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/resubscribe", "params": {"id": task_id}}
    opened = 0
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=streams + 10)) as client:

        async def one() -> None:
            nonlocal opened
            headers = {"Authorization": f"Bearer {key}"}
            async with client.stream("POST", f"{base}/a2a/echo", json=body, headers=headers) as response:
                first = True
                async for line in response.aiter_lines():  # reading on: leaving the loop closes the stream
                    if first and line.startswith("data:"):
                        first, opened = False, opened + 1

        jobs = [asyncio.create_task(one()) for _ in range(streams)]
        while opened < streams:
            await asyncio.sleep(0.1)
        measured = await asyncio.get_running_loop().run_in_executor(None, window)
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
    return measured


if __name__ == "__main__":
    sys.exit(main())
