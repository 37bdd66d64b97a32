"""`bench/sql_replay.py` runs a capture again as it ran for the gate, and says when it did not.

The floor (`python -m bench.inprocess --instructions --floor`) counts a replay's instructions as
the SQL's own, so a replay that did other work than the gate's must be refused, and one that did the
same must not be, however long after the capture it runs.
"""

from __future__ import annotations

import pickle
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

REPLAY = Path(__file__).parents[2] / "bench" / "sql_replay.py"
# a reservation as the channel store writes one: only while the mirrored state is fresh, by SQLite's clock
RESERVE = (
    "UPDATE channels SET reserved_by = ? WHERE channel_id = ? AND reserved_by = ''"
    " AND synced_at >= ((julianday('now') - 2440587.5) * 86400.0) - ?"
)


def replay(tmp_path: Path, statements: list[tuple[object, ...]]) -> str:
    """The replay's report, for `statements` run on a fresh database holding one channel synced at
    the first statement's time."""
    database = tmp_path / "gate.db"
    conn = sqlite3.connect(database)
    conn.execute("CREATE TABLE channels (channel_id TEXT PRIMARY KEY, reserved_by TEXT, synced_at REAL)")
    conn.execute("INSERT INTO channels VALUES ('0xc1', '', ?)", (statements[0][4],))
    conn.commit()
    conn.close()
    capture = tmp_path / "capture.pickle"
    capture.write_bytes(pickle.dumps({"statements": statements, "warm_end": 0, "ends": [len(statements)]}))
    done = subprocess.run(
        [sys.executable, "-c", REPLAY.read_text(), str(database), str(capture), str(len(statements))],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stderr.strip()


def test_a_replay_reads_the_clock_the_gate_read(tmp_path: Path) -> None:
    # captured an hour ago, the mirror then 10 s old against a freshness of 30 s: it reserved; by
    # today's clock the mirror is stale and the reservation would change nothing
    at = time.time() - 3600
    statements = [(1, RESERVE, ("digest-1", "0xc1", 30.0), 1, at + 10)]
    assert replay(tmp_path, statements) == "replayed 1 statements, 0 diverged"


def test_a_replay_that_does_other_work_than_the_gate_says_so(tmp_path: Path) -> None:
    at = time.time()
    statements = [
        (1, RESERVE, ("digest-1", "0xc1", 30.0), 1, at),
        # captured as reserving, but the channel is held by the statement before: the replay changes nothing
        (1, RESERVE, ("digest-2", "0xc1", 30.0), 1, at),
        # captured as failing, but it runs here
        (2, "SELECT channel_id FROM channels", (), None, at),
    ]
    assert replay(tmp_path, statements) == "replayed 3 statements, 2 diverged"
