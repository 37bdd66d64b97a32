"""The benchmark runs end to end with tiny parameters and reports every case.

No timing assertions: this only proves `python -m bench` starts every server, drives
it, measures it, cleans up, and prints a table with a number for each case.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the benchmark needs its extras: pip install -e '.[bench]'")
pytest.importorskip("psutil", reason="the benchmark needs its extras: pip install -e '.[bench]'")
pytest.importorskip("a2a.server.routes", reason="the benchmark needs its extras: pip install -e '.[bench]'")

REPO = Path(__file__).parents[1]
# Every row of the table, by the case that measures it (case b measures its own floor too).
ROWS = {
    "a": {
        "bare": "bare Starlette echo",
        "sdk": "a2a-sdk server",
        "gate": "a2a-gate (API key)",
        "gate-w2": "--workers 2",
    },
    "b": {"bare": "bare Starlette echo", "gate-402": "a2a-gate 402", "gate-429": "a2a-gate 429"},
    "c": {
        "x402": "x402 ASGI payment middleware",
        "gate-paid": "a2a-gate paid",
        "gate-paid-real": "real-crypto facilitator",
    },
    "d": {},
}
ADDRESSES = 1000
# Seconds measured per server: on a busy machine the real-crypto facilitator needs seconds to answer a few.
DURATION = {"a": "0.5", "b": "0.5", "c": "3", "d": "0.5"}


@pytest.mark.parametrize("case", sorted(ROWS))
def test_bench_runs_every_case(tmp_path: Path, case: str) -> None:
    """One case per test, so a parallel run spreads the servers they start over its workers."""
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--cases",
            case,
            "--duration",
            DURATION[case],
            "--warmup",
            "0.2",
            "--concurrency",
            "4",
            "--addresses",
            str(ADDRESSES),
            "--paid-tokens",
            "40",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = done.stdout
    document = json.loads(out.read_text())

    assert set(document["rows"]) == set(ROWS[case])
    for key, label in ROWS[case].items():
        assert label in table, f"{label!r} missing from the table:\n{table}"
        row = document["rows"][key]
        result = row["result"]
        assert result["requests"] > 0 and result["rps"] > 0, (key, result)
        assert result["p50_ms"] > 0 and result["p99_ms"] > 0, (key, result)
        assert result["ok_fraction"] > 0.5, (key, result)  # the expected answers, not errors
        assert row["peak_rss"] > 0, key

    if case == "d":
        memory = document["memory"]
        assert memory["addresses"] == ADDRESSES
        assert memory["rss_before"] > 0 and memory["rss_after"] > 0
        assert sum(int(n) for n in memory["statuses"].values()) >= ADDRESSES * 0.95
        assert "limiter" in table and "RSS before" in table

    # one target per comparison the issue names, each with a measured number
    assert {t["case"] for t in document["targets"]} == {case}
    assert all(t["measured"] != 0 for t in document["targets"] if t["case"] != "d")
    assert "targets:" in table
