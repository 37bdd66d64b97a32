"""The SQL a gate executed for some requests, run again without the gate: what storage alone costs.

Run by `bench/inprocess.py` under valgrind as `python -c <this file's text> DB CAPTURE UPTO`: on DB (a
copy of the gate's database as it was before the captured run), every statement the capture holds
(`bench/inprocess_child.py`'s capture mode), up to the UPTO-th, each on a connection of its own number
(the checkpointer's passes on theirs), with the arguments it had, its rows fetched, and SQLite's clock
set to the time it ran at for the gate (`julianday`). One that changes another number of rows than it
did for the gate, or fails where it ran (or runs where it failed), is counted as diverged, and the
bench refuses a replay with any. What is left is SQLite, the `sqlite3` module, a loop and the clock:
no Python of the gate's. Two runs up to two points of the same capture (both load it whole) differ
by exactly the statements between them.
"""

import os
import pickle
import sqlite3
import sys

database, capture, upto = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(capture, "rb") as file:
    statements = pickle.load(file)["statements"]
connections: dict[int, sqlite3.Connection] = {}
dates = sqlite3.connect(":memory:")  # SQLite's own `julianday`, for any other argument than 'now'
clock = 0.0  # the time the statement being replayed ran at, for the gate


def julianday(value: object) -> float:
    """SQLite's `julianday`, whose 'now' is the time the gate ran the statement at: a lease, a
    reservation or a mirror's freshness is judged as it was for the gate, however long after the
    capture the replay runs."""
    if value == "now":
        return clock / 86400.0 + 2440587.5
    return dates.execute("SELECT julianday(?)", (value,)).fetchone()[0]


diverged = 0  # statements whose outcome here is not the gate's: another count of rows changed, or an error
for number, sql, parameters, outcome, ran_at in statements[:upto]:
    clock = ran_at
    conn = connections.get(number)
    if conn is None:
        conn = connections[number] = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
        conn.create_function("julianday", 1, julianday)  # (an application's function overrides a built-in one)
    try:
        cursor = conn.execute(sql, parameters)
        changed = cursor.rowcount  # read where the capture read it, before any row is fetched
        cursor.fetchall()
    except sqlite3.Error:
        diverged += outcome is not None
    else:
        diverged += outcome != changed
print(f"replayed {upto} statements, {diverged} diverged", file=sys.stderr, flush=True)
# the connections are left open: closing the last one checkpoints the WAL, which is longer in one of the
# two runs than in the other, and the difference would be counted as the statements'
os._exit(0)
