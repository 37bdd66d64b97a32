"""`python -m bench.drivers` runs end to end with tiny parameters: every driver, case and mode
measured against the real PostgreSQL, its schema dropped after. No timing assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.services import PostgresSchema

pytest.importorskip("asyncpg", reason="the driver benchmark needs asyncpg: pip install -e '.[test]'")

REPO = Path(__file__).parents[2]


def test_the_driver_benchmark_measures_every_driver_case_and_mode(
    tmp_path: Path, postgres_schema: PostgresSchema
) -> None:
    import psycopg

    def bench_schemas() -> set[str]:
        with psycopg.connect(postgres_schema.url, autocommit=True) as conn:
            rows = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench_drivers_%'").fetchall()
        return {r[0] for r in rows}

    before = bench_schemas()
    out = tmp_path / "drivers.json"
    tiny = ["--ops", "20", "--rounds", "1", "--concurrency", "4", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.drivers", "--url", postgres_schema.url, *tiny],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())
    measured = {(r["driver"], r["case"], r["mode"]) for r in results if r["ops"] == 20 and r["ops_per_second"] > 0}
    drivers = {"asyncpg", "asyncpg-noreset", "psycopg", "psycopg+check", "store"}
    cases = {"claim", "task", "log", "get", "settle"}
    assert measured == {(d, c, m) for d in drivers for c in cases for m in ("sequential", "concurrent")}
    assert "get" in done.stdout and "p99 ms" in done.stdout
    assert bench_schemas() <= before  # its own schema is gone
