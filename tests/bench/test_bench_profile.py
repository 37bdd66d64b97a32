"""bench/profile.py: each py-spy sample goes to the bucket of its innermost frame that names one."""

from __future__ import annotations

import pytest

from bench.profile import OTHER, Breakdown, bucket_of, short

LOOP = "Runner.run (/usr/lib/python3.11/asyncio/runners.py:118)"
APP = "A2AEndpoint.__call__ (server/app.py:257)"
RAW = "\n".join(
    [
        f"{LOOP};{APP};paid_send (gate/pipeline.py:161);SQLiteDatabase._commit (server/sqlite_store.py:270) 6",
        f"{LOOP};{APP};paid_send (gate/pipeline.py:161);recover (/v/site-packages/coincurve/ecdsa.py:43) 2",
        f"{LOOP};{APP};paid_send (gate/pipeline.py:170) 1",
        f"{LOOP} 1",
        "not a stack line",
    ]
)


def test_a_sample_goes_to_its_innermost_named_frame() -> None:
    assert bucket_of(RAW.splitlines()[0].rpartition(" ")[0].split(";")) == (
        "SQLite statements",
        "SQLiteDatabase._commit (server/sqlite_store.py)",
    )
    assert bucket_of(["main (<frozen runpy>:1)"]) == (OTHER, "main (<frozen runpy>)")
    # the root frame py-spy adds for each process is its command line, which may name anything
    assert (
        bucket_of(['process 7:"python -m gate.cli serve --config /tmp/asyncio-h11/a.toml"', "f (x.py:1)"])[0] == OTHER
    )


def test_shares_and_cpu_per_request_add_up() -> None:
    breakdown = Breakdown.of(RAW)
    assert breakdown.total == 10
    rows = breakdown.per_request(2.0)
    assert rows[0] == ("SQLite statements", 0.6, pytest.approx(1.2))
    assert {name: share for name, share, _ in rows} == {
        "SQLite statements": 0.6,
        "signature recovery (secp256k1, keccak)": 0.2,
        "the gate's steps (gate/)": 0.1,
        "event loop (asyncio, uvloop)": 0.1,
    }
    assert sum(ms for _, _, ms in rows) == pytest.approx(2.0)
    assert breakdown.hottest("the gate's steps (gate/)") == [("paid_send (gate/pipeline.py)", 0.1)]


def test_frames_are_named_from_their_package() -> None:
    assert short("x (/work/tree/gate/schemes/batch_settlement.py:9)") == "x (gate/schemes/batch_settlement.py)"
    assert short("x (gate/schemes/batch_settlement.py:9)") == "x (gate/schemes/batch_settlement.py)"
    assert short("r (/venv/lib/python3.11/site-packages/coincurve/ecdsa.py:43)") == "r (coincurve/ecdsa.py)"
