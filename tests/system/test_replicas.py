"""Replicas behind a real nginx, on one PostgreSQL and one Redis: one token is still one
delivery and one charge, the limiters hold across replicas, any replica answers for a task
another runs, and a replica killed between delivery and settlement is settled by another."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.test_migration_schema import COMPONENTS
from tests.support.gate_helpers import artifact_texts, cli, sse_events, swallow, wait_for
from tests.support.gate_process import GateProcess, free_port
from tests.support.nginx import nginx_in_front
from tests.support.paid import Payer, paid_config, send_body
from tests.support.services import OwnPostgres, PostgresSchema, RedisService

LEASE = 1.5  # short leases: a dead replica's claims are found within seconds


def replica_config(public_url: str, facilitator: str, database: str, redis: RedisService, per_ip: int) -> str:
    text = paid_config(public_url, facilitator, per_ip=per_ip, reconcile=0.5)
    text = text.replace('database = "gate.db"', f'database = "{database}"\nclaim_lease_seconds = {LEASE}')
    text = text.replace(
        "per_agent_per_minute = 100000",
        f'per_agent_per_minute = 100000\nredis_url = "{redis.url}"\nredis_prefix = "{redis.prefix}"',
    )
    return text.replace("[facilitator]", '[proxy]\ntrusted = ["127.0.0.1"]\n\n[facilitator]', 1)


@dataclass
class Fleet:
    """Replicas (each its own directory and port) and the nginx in front of them."""

    replicas: list[GateProcess]
    url: str  # nginx
    facilitator: str
    postgres: PostgresSchema

    def post(self, base: str, agent: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        return httpx.post(f"{base}/a2a/{agent}", json=body, headers=headers, timeout=30)

    def ledger(self) -> dict[str, Any]:
        return httpx.get(f"{self.facilitator}/dev/ledger", timeout=10).json()

    def faults(self, **modes: Any) -> None:
        httpx.post(f"{self.facilitator}/dev/faults", json=modes, timeout=10).raise_for_status()

    def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.postgres.url, autocommit=True) as conn:
            conn.execute(f'SET search_path = "{self.postgres.schema}"')
            return conn.execute(sql, args).fetchall()

    def claim_states(self) -> list[str]:
        return [r[0] for r in self.rows("SELECT state FROM claims ORDER BY created_at")]


@pytest.fixture
def start_fleet(
    tmp_path: Path, facilitator: str, postgres_schema: PostgresSchema, redis_service: RedisService
) -> Iterator[Callable[..., Fleet]]:
    """Start `count` replicas and an nginx balancing over them; all stopped after the test."""
    with contextlib.ExitStack() as stack:

        def start(count: int = 3, per_ip: int = 100000) -> Fleet:
            ports = [free_port() for _ in range(count)]
            url = stack.enter_context(nginx_in_front(ports, tmp_path / "nginx"))
            key = base64.urlsafe_b64encode(os.urandom(32)).decode()  # one sealing key, every replica
            replicas = []
            for i, port in enumerate(ports):
                home = tmp_path / f"replica{i}"
                home.mkdir()
                config = home / "gate.toml"
                database = postgres_schema.store_url()
                config.write_text(replica_config(url, facilitator, database, redis_service, per_ip))
                gate = GateProcess(config, home / "gate.log", port=port, env={"A2A_GATE_SEALING_KEY": key})
                stack.callback(gate.stop)
                replicas.append(gate.start())
            return Fleet(replicas, url, facilitator, postgres_schema)

        yield start


def requests_served(gate: GateProcess) -> float:
    text = httpx.get(f"{gate.url}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("a2a_gate_requests_total")
    )


def concurrently(url: str, count: int, body: dict[str, Any], headers: dict[str, str]) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(url, json=body, headers=headers) for _ in range(count)))

    return asyncio.run(run())


def test_one_token_sent_30_times_at_once_over_the_replicas_buys_one_execution(start_fleet) -> None:
    fleet = start_fleet()
    headers = Payer().header_for(fleet.url, "paid-slow")
    body = send_body("sleep 0.5")  # one request: the same token for the same message, 30 times

    answers = concurrently(f"{fleet.url}/a2a/paid-slow", 30, body, headers)

    assert {a.status_code for a in answers} == {200}
    kinds = Counter()
    for answer in answers:
        doc = answer.json()
        if "result" in doc:
            kinds["replay" if answer.headers.get("X-Idempotent-Replay") == "true" else "executed"] += 1
        else:
            assert doc["error"]["data"] == {"code": "in_flight", "retryable": True}, doc
            kinds["in_flight"] += 1
    assert kinds["executed"] == 1, kinds
    assert fleet.rows("SELECT COUNT(*) FROM tasks WHERE agent = 'paid-slow'") == [(1,)]
    wait_for(lambda: fleet.claim_states() == ["settled"])
    assert len(fleet.ledger()["settlements"]) == 1
    assert all(requests_served(gate) > 0 for gate in fleet.replicas)  # nginx spread the burst


def test_per_ip_limit_holds_across_replicas_behind_nginx(start_fleet) -> None:
    fleet = start_fleet(per_ip=5)

    answers = concurrently(f"{fleet.url}/a2a/paid", 20, send_body("x"), {})

    assert Counter(a.status_code for a in answers) == {402: 5, 429: 15}
    assert all(requests_served(gate) > 0 for gate in fleet.replicas)


def test_get_cancel_and_resubscribe_are_answered_by_replicas_other_than_the_runner(start_fleet) -> None:
    fleet = start_fleet()
    runner, second, third = fleet.replicas
    headers = Payer().header_for(fleet.url, "paid-slow")
    task = fleet.post(runner.url, "paid-slow", send_body("sleep 30", blocking=False), headers).json()["result"]
    get = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task["id"]}}

    seen = fleet.post(second.url, "paid-slow", get, headers).json()
    assert seen["result"]["id"] == task["id"], seen
    cancel = {"jsonrpc": "2.0", "id": 3, "method": "tasks/cancel", "params": {"id": task["id"]}}
    canceled = fleet.post(third.url, "paid-slow", cancel, headers).json()
    assert canceled["result"]["status"]["state"] == "canceled", canceled
    on_runner = fleet.post(runner.url, "paid-slow", get, headers).json()["result"]
    assert on_runner["status"]["state"] == "canceled" and artifact_texts(on_runner) == []
    wait_for(lambda: fleet.claim_states() == [])  # released, uncharged
    assert fleet.ledger()["settle_calls"] == 0

    headers = Payer().header_for(fleet.url, "paid-slow")
    task = fleet.post(runner.url, "paid-slow", send_body("sleep 1.5", blocking=False), headers).json()["result"]
    follow = {"jsonrpc": "2.0", "id": 4, "method": "tasks/resubscribe", "params": {"id": task["id"]}}
    stream = fleet.post(second.url, "paid-slow", follow, headers)
    events = [e["result"] for e in sse_events(stream.text)]
    assert events[0]["id"] == task["id"]
    assert events[-1]["status"]["state"] == "completed" and events[-1]["final"] is True
    assert any(e.get("kind") == "artifact-update" for e in events[1:])


def test_a_replica_killed_between_delivery_and_settlement_is_settled_once_by_another(start_fleet) -> None:
    fleet = start_fleet()
    victim = fleet.replicas[0]
    headers = Payer().header_for(fleet.url, "paid")
    fleet.faults(settle="slow:15", count=1)  # the first settle hangs past the kill

    sender = threading.Thread(target=lambda: swallow(lambda: fleet.post(victim.url, "paid", send_body("x"), headers)))
    sender.start()
    wait_for(lambda: fleet.claim_states() == ["settling"])
    victim.kill()
    sender.join()

    wait_for(lambda: fleet.claim_states() == ["settled"])  # another replica's reconciler, after the lease
    time.sleep(2 * LEASE)  # more passes on every replica: still one charge
    assert len(fleet.ledger()["settlements"]) == 1
    [(task_id,)] = fleet.rows("SELECT task_id FROM claims")
    get = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task_id}}
    task = fleet.post(fleet.url, "paid", get, headers).json()["result"]
    assert task["status"]["state"] == "completed"
    assert task["metadata"]["x402.payment.status"] == "payment-completed"


def test_postgresql_restarted_mid_run_answers_retryably_and_loses_nothing(
    tmp_path: Path, facilitator: str, own_postgres: OwnPostgres, redis_service: RedisService
) -> None:
    """While PostgreSQL is down: `/readyz` 503, an anonymous send the retryable -32603 (nothing
    runs without a claim: no verify, no execution), a key's send the same; back up, the same
    replica serves and settles again, and what was stored before is all there."""
    port = free_port()
    config = tmp_path / "gate.toml"
    public = f"http://127.0.0.1:{port}"
    config.write_text(
        replica_config(public, facilitator, own_postgres.url, redis_service, 100000)
        + f'\n[[keys]]\nname = "ops"\nsha256 = "{hashlib.sha256(b"a2g_ops").hexdigest()}"\nagents = ["*"]\n'
    )
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    gate = GateProcess(config, tmp_path / "gate.log", port=port, env={"A2A_GATE_SEALING_KEY": key}).start()
    ops = {"Authorization": "Bearer a2g_ops"}
    ledger = lambda: httpx.get(f"{facilitator}/dev/ledger", timeout=10).json()  # noqa: E731
    try:
        first = Payer().header_for(public)
        before = httpx.post(f"{public}/a2a/paid", json=send_body("before"), headers=first, timeout=30).json()
        assert before["result"]["status"]["state"] == "completed"
        verifies = ledger()["verify_calls"]

        own_postgres.stop()
        assert httpx.get(f"{public}/readyz", timeout=10).status_code == 503
        second = Payer().header_for(public)  # the 402 needs no database
        down = httpx.post(f"{public}/a2a/paid", json=send_body("down"), headers=second, timeout=30).json()
        assert down["error"]["code"] == -32603
        assert down["error"]["data"] == {"code": "store_unavailable", "retryable": True}
        assert ledger()["verify_calls"] == verifies  # refused before verify: nothing runs without a claim
        free = httpx.post(f"{public}/a2a/echo", json=send_body("down"), headers=ops, timeout=30).json()
        assert free["error"]["data"] == {"code": "store_unavailable", "retryable": True}

        own_postgres.start()
        wait_for(lambda: httpx.get(f"{public}/readyz", timeout=10).status_code == 200)
        again = httpx.post(f"{public}/a2a/paid", json=send_body("down"), headers=second, timeout=30).json()
        assert again["result"]["status"]["state"] == "completed"  # the same token, now served
        assert again["result"]["metadata"]["x402.payment.status"] == "payment-completed"
        assert len(ledger()["settlements"]) == 2
        get = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": before["result"]["id"]}}
        kept = httpx.post(f"{public}/a2a/paid", json=get, headers=first, timeout=30).json()
        assert kept["result"]["metadata"]["x402.payment.status"] == "payment-completed"
    finally:
        gate.stop()


def test_migrate_command_brings_a_fresh_postgresql_schema_up_to_date_once(
    tmp_path: Path, postgres_schema: PostgresSchema
) -> None:
    """`a2a-gate migrate`, the deployment step before replicas start: every table at its newest
    version; run again (a second deploy), nothing changes."""
    config = tmp_path / "gate.toml"
    config.write_text(f'database = "{postgres_schema.store_url()}"\n')
    first = cli("migrate", "--config", str(config))
    again = cli("migrate", "--config", str(config))

    versions = dict(line.split("\tversion ") for line in first.stdout.splitlines())
    # each component's last step (the steps themselves are held by tests/server/test_migration_schema.py)
    assert versions == {name: str(len(steps)) for name, steps in COMPONENTS}
    assert again.stdout == first.stdout
    import psycopg

    with psycopg.connect(postgres_schema.url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1",
            (postgres_schema.schema,),
        ).fetchall()
    assert [t[0] for t in tables] == [
        "api_keys",
        "channels",
        "claims",
        "payments",
        "request_counts",
        "schema_versions",
        "sealing",
        "sign_in_nonces",
        "tasks",
        "webhook_deliveries",
        "webhook_endpoints",
    ]


def test_a_replica_on_postgresql_without_the_shared_sealing_key_refuses_to_start(
    tmp_path: Path, postgres_schema: PostgresSchema
) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(f'database = "{postgres_schema.store_url()}"\n')
    env_key = os.environ.pop("A2A_GATE_SEALING_KEY", None)
    try:
        done = cli("serve", "--config", str(config), "--port", str(free_port()), check=False)
    finally:
        if env_key is not None:
            os.environ["A2A_GATE_SEALING_KEY"] = env_key
    assert done.returncode == 2
    assert done.stderr.startswith("error: a PostgreSQL database needs A2A_GATE_SEALING_KEY"), done.stderr
    assert "Traceback" not in done.stderr
