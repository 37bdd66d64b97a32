"""API keys an operator can let lapse and see used (server/principals.py), on SQLite and a real
PostgreSQL: an expired key is refused (403, final, never the payment path), when a key was last
used is written off the request's path, and a revoked key frees its name for a new one."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from server import principals
from server.engines import open_database
from tests.support.gate_helpers import cli
from tests.support.gate_process import GateProcess
from tests.support.paid import send_body


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "keys.db")
    return request.getfixturevalue("postgres_schema").store_url()


def run(location: str, work):
    async def go():
        db = open_database(location)
        await db.open()
        try:
            await principals.create_tables(db)
            return await work(db)
        finally:
            await db.close()

    return asyncio.run(go())


def test_an_expired_key_is_a_known_key_that_may_use_nothing(location: str):
    async def work(db):
        live, _ = await principals.create_key(db, "live", ["*"], expires_at=time.time() + 3600)
        lapsed, _ = await principals.create_key(db, "lapsed", ["*"], expires_at=time.time() - 1)
        keys = principals.Principals(db)
        return await keys.identify(f"Bearer {live}"), await keys.identify(f"Bearer {lapsed}")

    alive, gone = run(location, work)
    assert alive is not None and alive.may_use("echo")
    assert gone is not None and gone.expired and not gone.may_use("echo")  # known: 403, not anonymous


def test_a_revoked_keys_name_is_free_again_and_a_live_name_is_not(location: str):
    async def work(db):
        first, _ = await principals.create_key(db, "ci", ["*"])
        with pytest.raises(ValueError, match="live key named 'ci'"):
            await principals.create_key(db, "ci", ["*"])
        assert await principals.revoke_key(db, "ci") == 1
        second, _ = await principals.create_key(db, "ci", ["echo"])
        assert await principals.revoke_key(db, "ci") == 1 and await principals.revoke_key(db, "ci") == 0
        keys = principals.Principals(db)
        return [await keys.identify(f"Bearer {k}") for k in (first, second)], await principals.list_keys(db)

    (old, new), listed = run(location, work)
    assert old.revoked and new.revoked and new.agents == ("echo",)
    assert [(k["name"], k["revoked"]) for k in listed] == [("ci", True), ("ci", True)]


def test_last_use_is_written_by_the_flush_and_never_goes_back(location: str):
    async def work(db):
        key, digest = await principals.create_key(db, "agent", ["*"])
        keys = principals.Principals(db)
        before = time.time()
        await keys.identify(f"Bearer {key}")
        assert (await principals.list_keys(db))[0]["last_used_at"] is None  # not on the request's path
        await keys.flush_use()
        first = (await principals.list_keys(db))[0]["last_used_at"]
        keys.used[digest] = first - 100  # a slower replica's older note
        await keys.flush_use()
        return before, first, (await principals.list_keys(db))[0]["last_used_at"]

    before, first, after = run(location, work)
    assert before <= first <= time.time() and after == first


def test_a_real_gate_refuses_a_key_once_it_expires_and_records_its_use(tmp_path: Path):
    config = tmp_path / "gate.toml"
    config.write_text('database = "gate.db"\n\n[agents.echo]\ndescription = "Echo"\n')
    cli("migrate", "--config", str(config))
    gate = GateProcess(config, tmp_path / "gate.log").start()
    # made once the gate runs (a loaded machine may take seconds to start it), lapsing soon after
    expires = time.time() + 6
    key = run(str(tmp_path / "gate.db"), lambda db: principals.create_key(db, "short", ["*"], expires_at=expires))[0]
    try:
        headers = {"Authorization": f"Bearer {key}"}
        ok = httpx.post(f"{gate.url}/a2a/echo", json=send_body("hi"), headers=headers, timeout=10)
        assert ok.status_code == 200 and ok.json()["result"]["status"]["state"] == "completed"
        time.sleep(max(0.0, expires - time.time()) + 0.2)
        refused = httpx.post(f"{gate.url}/a2a/echo", json=send_body("hi"), headers=headers, timeout=10)
        assert refused.status_code == 403  # a known key that lapsed: final, never the anonymous path
    finally:
        gate.stop()  # the stop flushes what the process noted
    stopped = time.time()
    with sqlite3.connect(tmp_path / "gate.db") as conn:
        (used,) = conn.execute("SELECT last_used_at FROM api_keys WHERE name = 'short'").fetchone()
    # the refused attempt counts too: an operator sees that something still presents the lapsed key
    assert used is not None and expires <= used <= stopped
