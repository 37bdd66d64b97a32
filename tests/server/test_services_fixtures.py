"""The Redis and PostgreSQL fixtures: a per-test prefix or schema that is cleaned up, and a missing
server that skips with its reason, or fails under CI=true."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.support.gate_process import GateProcess, free_port
from tests.support.serve import serve_app

REPO = Path(__file__).parents[2]


def run_needing_redis(redis_url: str, ci: str) -> subprocess.CompletedProcess[str]:
    """Run one Redis-backed test in a child pytest, its Redis URL pointed somewhere."""
    env = {"A2A_GATE_TEST_REDIS_URL": redis_url, "CI": ci}
    return child_pytest(env, "tests/gate/test_shared_limiter.py::test_per_agent_limit_holds_across_replicas")


def child_pytest(env: dict[str, str], *tests: str) -> subprocess.CompletedProcess[str]:
    """Run tests in a child pytest (no xdist), with these environment variables changed."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-o",
            "addopts=",  # the project's options name xdist's
            *tests,
        ],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_missing_redis_skips_with_the_reason_outside_ci():
    done = run_needing_redis(f"redis://127.0.0.1:{free_port()}/0", ci="")
    assert "1 skipped" in done.stdout, done.stdout[-2000:]
    assert "is not answering" in done.stdout and "A2A_GATE_TEST_REDIS_URL" in done.stdout


def test_a_missing_redis_fails_under_ci():
    done = run_needing_redis(f"redis://127.0.0.1:{free_port()}/0", ci="true")
    assert done.returncode != 0
    assert "1 error" in done.stdout and "CI=true" in done.stdout, done.stdout[-2000:]


# Every test that runs nginx: the reverse-proxy tests, the replicas behind it, the benchmark's case e.
NEEDING_NGINX = (
    "tests/system/test_reverse_proxy.py",
    "tests/system/test_replicas.py::test_one_token_sent_30_times_at_once_over_the_replicas_buys_one_execution",
    "tests/system/test_replicas.py::test_per_ip_limit_holds_across_replicas_behind_nginx",
    "tests/system/test_replicas.py::test_get_cancel_and_resubscribe_are_answered_by_replicas_other_than_the_runner",
    "tests/system/test_replicas.py::test_a_replica_killed_between_delivery_and_settlement_is_settled_once_by_another",
    "tests/bench/test_bench_smoke.py::test_bench_runs_every_case[e]",
)


def test_without_nginx_the_tests_needing_it_skip_with_the_reason():
    """A machine without nginx (A2A_GATE_TEST_NGINX=none hides an installed one) runs the README's
    test command green: every test that needs nginx is skipped, saying why."""
    done = child_pytest({"A2A_GATE_TEST_NGINX": "none", "CI": ""}, *NEEDING_NGINX)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "failed" not in done.stdout and "error" not in done.stdout, done.stdout[-3000:]
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert sum(int(line.split("[", 1)[1].split("]", 1)[0]) for line in skipped) == 8, done.stdout[-3000:]
    assert all("nginx is not installed" in line for line in skipped), skipped


def test_without_nginx_the_tests_needing_it_fail_under_ci():
    done = child_pytest({"A2A_GATE_TEST_NGINX": "none", "CI": "true"}, "tests/system/test_reverse_proxy.py")
    assert done.returncode != 0
    assert "nginx is not installed" in done.stdout and "CI=true" in done.stdout, done.stdout[-2000:]


def test_redis_keys_live_under_the_tests_own_prefix(redis_service):
    other = redis_service.prefix.rsplit(":", 2)[0] + ":someone-else:"
    redis_service.client.set(f"{redis_service.prefix}k", "1", px=60_000)
    redis_service.client.set(f"{other}k", "1", px=60_000)
    try:
        assert redis_service.key_names() == [f"{redis_service.prefix}k"]
    finally:
        redis_service.client.delete(f"{other}k")


def test_postgres_schema_is_the_tests_own_and_is_dropped(postgres_schema):
    import psycopg

    with psycopg.connect(postgres_schema.url, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{postgres_schema.schema}".probe (id int primary key)')
        conn.execute(f'INSERT INTO "{postgres_schema.schema}".probe VALUES (1)')
        found = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (postgres_schema.schema,)
        ).fetchone()
    assert found == (1,)


def test_a_gate_whose_port_another_server_answers_on_is_not_taken_for_started(tmp_path):
    """Another server's /healthz on the port is not this gate starting (the port race of a parallel suite)."""
    config = tmp_path / "gate.toml"
    config.write_text(f'database = "{tmp_path / "gate.db"}"\n[agents.echo]\n')
    other = Starlette(routes=[Route("/healthz", lambda request: PlainTextResponse("ok"))])
    with serve_app(other) as url:
        gate = GateProcess(config, tmp_path / "gate.log", port=int(url.rsplit(":", 1)[1]))
        with pytest.raises(RuntimeError, match=r"another process|exited with"):
            gate.start(timeout=30)
        gate.stop()


def test_free_ports_come_from_the_workers_own_slice_below_the_ephemeral_range():
    ports = {free_port() for _ in range(50)}
    assert len(ports) == 50
    assert all(20000 <= port < 32000 for port in ports)
