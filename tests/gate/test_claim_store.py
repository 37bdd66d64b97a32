"""The claim store and the settlement decision, below the HTTP layer.

Typed rows, leases instead of pids, an additive migration of SQLite files written by
older versions (tests/server/test_store_engines.py holds both engines to the same interface). The chain decision runs
against the development facilitator's real `/rpc` (its simulated chain).
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from gate.chain import Chain
from gate.claims import (
    LIVE_STATES,
    MIGRATED_COLUMNS,
    ClaimLost,
    Claims,
    ClaimState,
    Hold,
    mint_fence,
    state_condition,
)
from gate.config import FacilitatorConfig, NetworkConfig
from gate.facilitator import FacilitatorClient
from gate.flows import Flows
from gate.flows.authorization import AuthorizationFlow
from gate.payment_log import PaymentLog
from gate.schemes.exact_eip3009 import SCHEME as EXACT_EIP3009
from gate.settlement import Payment, Settler
from server.database import Database
from server.engines import open_database

OLD_CLAIMS = """CREATE TABLE claims (token_digest TEXT PRIMARY KEY, nonce_key TEXT, request_digest TEXT, agent TEXT,
 state TEXT, task_id TEXT, payer TEXT, answer TEXT, owner_pid INTEGER, created_at FLOAT, updated_at FLOAT,
 sealed_payment TEXT)"""


async def opened(path: Path) -> Database:
    db = open_database(str(path))
    await db.open()
    return db


async def claims_on(db: Database, lease_seconds: float = 30.0) -> Claims:
    claims = Claims(db, lease_seconds=lease_seconds)
    await claims.create_tables()
    return claims


def test_a_claims_table_from_an_older_version_gains_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute(OLD_CLAIMS)
    conn.execute(
        "INSERT INTO claims VALUES ('d1', 'n1', 'r1', 'paid', 'settle_failed', 't1', '0xabc', '', 4242, 1, 1, 'sealed')"
    )
    conn.commit()
    conn.close()

    async def run() -> None:
        db = await opened(path)
        claims = await claims_on(db)
        columns = {row["name"] for row in await db.fetch("PRAGMA table_info(claims)")}
        assert set(MIGRATED_COLUMNS) <= columns
        [owed] = await claims.due()
        assert (owed.token_digest, owed.state, owed.settle_unknown, owed.owner_instance) == (
            "d1",
            ClaimState.SETTLE_FAILED,
            False,
            "",
        )
        await claims_on(db)  # a second worker starting on the same file migrates nothing twice
        await claims_on(await opened(path))  # nor does a second process
        await db.close()

    asyncio.run(run())


def test_a_claim_is_found_by_its_task_through_its_states_index_and_no_task_index_is_kept(tmp_path: Path) -> None:
    """Only `reopen` finds a claim by its task, and it asks for a state too: claims_lease serves it,
    so the index on task_id an older version made (written twice by every paid request) is dropped."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute(OLD_CLAIMS)
    conn.execute("CREATE INDEX idx_claims_task_id ON claims (task_id)")
    for digest, task in (("d1", "t1"), ("d2", "t2")):
        conn.execute(
            "INSERT INTO claims VALUES (?, '', 'r', 'paid', ?, ?, '0xabc', '', 0, 1, 1, 'sealed')",
            (digest, str(ClaimState.NEEDS_ATTENTION), task),
        )
    conn.commit()
    conn.close()

    async def run() -> None:
        db = await opened(path)
        claims = await claims_on(db)
        indexes = {row["name"] for row in await db.fetch("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "idx_claims_task_id" not in indexes and "claims_lease" in indexes
        statements: list[str] = []
        db.conn.set_trace_callback(statements.append)  # type: ignore[attr-defined]
        assert await claims.reopen("t1") == 1
        db.conn.set_trace_callback(None)  # type: ignore[attr-defined]
        [update] = [sql for sql in statements if sql.startswith("UPDATE claims")]
        plan = " ".join(row["detail"] for row in await db.fetch(f"EXPLAIN QUERY PLAN {update}"))
        assert "claims_lease" in plan, plan
        assert [c.token_digest for c in await claims.due(now=True)] == ["d1"]  # t2's stays where it was
        await db.close()

    asyncio.run(run())


def test_orphans_are_lapsed_leases_and_renewal_keeps_a_claim(tmp_path: Path) -> None:
    async def run() -> None:
        db = await opened(tmp_path / "gate.db")
        live, other = await claims_on(db, lease_seconds=1.0), await claims_on(db, lease_seconds=1.0)
        assert live.instance != other.instance  # one id per process start, never a pid
        first = await live.claim("d1", "", "r", "paid", "")
        assert first.kind == "new" and first.hold is not None
        assert (await other.claim("d1", "", "r", "paid", "")).kind == "in_flight"
        await asyncio.sleep(0.6)
        await live.renew()
        await asyncio.sleep(0.6)
        assert await other.orphans() == []  # past the first lease, but renewed: its owner is alive
        await asyncio.sleep(1.1)
        [orphan] = await other.orphans()  # not renewed for a lease: whoever finds it may take it
        taken = await other.take_orphan(orphan)
        assert taken is not None
        assert await live.take_orphan(orphan) is None  # only once
        with pytest.raises(ClaimLost):  # fenced: the previous owner can write nothing any more
            await live.mark_delivered(first.hold)
        await other.mark_delivered(taken)
        with pytest.raises(ClaimLost):  # a claim whose settle may have been sent is never released
            await other.release(taken)
        assert (await live.find("d1")).state == ClaimState.SETTLING
        await db.close()

    asyncio.run(run())


def test_unused_and_expired_authorization_is_written_off_by_the_chain(tmp_path: Path, facilitator: str) -> None:
    """At the pass cap the chain decides: the authorization was never used and can no longer be."""
    authorization = {
        "from": "0x" + "11" * 20,
        "to": "0x" + "22" * 20,
        "value": "1000",
        "validAfter": "0",
        "validBefore": str(int(time.time()) - 60),
        "nonce": "0x" + "ab" * 32,
    }
    requirements = {
        "scheme": "exact",
        "network": "eip155:84532",
        "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
        "amount": "1000",
        "payTo": "0x" + "22" * 20,
    }
    payload = {
        "x402Version": 2,
        "accepted": requirements,
        "payload": {"signature": "0x00", "authorization": authorization},
    }
    payment = Payment(
        "d1", 2, payload, requirements, "paid", "0x" + "11" * 20, "1000", "eip155:84532", requirements["asset"]
    )
    config = FacilitatorConfig(url=facilitator, timeout_seconds=2, settle_attempts=1, settle_passes=1)
    chain = Chain({"eip155:84532": NetworkConfig(rpc_url=f"{facilitator}/rpc")})
    assert EXACT_EIP3009.authorization(payload, requirements, "eip155:84532") is not None
    httpx.post(f"{facilitator}/dev/faults", json={"settle": "http500"}).raise_for_status()  # no answer, ever

    async def settle() -> None:
        db = await opened(tmp_path / "gate.db")
        claims, log = await claims_on(db), PaymentLog(db)
        await log.create_tables()
        hold = (await claims.claim("d1", "", "r", "paid", "")).hold
        assert hold is not None
        await claims.mark_delivered(hold)
        client = FacilitatorClient(config)
        try:
            flows = Flows({"exact": AuthorizationFlow(client, chain)})
            collection = await Settler(client, claims, log, config, flows).settle(payment, "t1", hold)
        finally:
            await client.aclose()
            await chain.aclose()
        assert collection.state == ClaimState.UNSETTLED
        assert "unused and expired" in collection.metadata["x402.payment.error"]
        assert (await claims.find("d1")).state == ClaimState.UNSETTLED
        assert [r["action"] for r in await log.rows()] == ["write_off"]
        await db.close()

    asyncio.run(settle())


def test_authorization_of_a_payload_that_is_not_eip3009_is_none() -> None:
    requirements = {"asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e"}
    assert EXACT_EIP3009.authorization({"payload": {"permit2Authorization": {}}}, requirements, "eip155:84532") is None
    assert (
        EXACT_EIP3009.authorization({"payload": {"authorization": {"from": "x", "nonce": "y"}}}, requirements, "n")
        is None
    )


def test_a_fenced_write_names_the_states_it_expects_and_ours_matches_every_state(tmp_path: Path) -> None:
    """A claim write expecting a state the claim has left changes nothing (`ClaimLost`), while a row
    written "while the claim is ours" (`ours`, `bind_statement`: any state) applies in every state, and
    never under another fence. The every-state condition is written without a state list
    (`state_condition`): the same rows, a cheaper probe."""

    async def run() -> None:
        db = await opened(tmp_path / "gate.db")
        claims = await claims_on(db)
        await db.execute("CREATE TABLE notes (n INTEGER)")
        outcome = await claims.claim("d1", "", "r1", "paid", "")
        assert outcome.hold is not None
        hold = outcome.hold
        await claims.mark_delivered(hold, payer="0xabc", task_id="t1")  # running -> settling
        with pytest.raises(ClaimLost):  # expects running: the claim is settling now
            await claims.delivered_settled(hold, {}, payer="0xabc", task_id="t1")
        await claims.recharge(hold, "sealed")  # expects settling: applies
        for held, applies in ((hold, 1), (Hold(hold.token_digest, "another fence"), 0)):
            sql, args = claims.ours(held)
            [bound, noted] = await db.write_together(
                [claims.bind_statement(held, "0xabc", "t2"), (f"INSERT INTO notes (n) SELECT 1 WHERE {sql}", args)]
            )
            assert (bound, noted) == (applies, applies)
        assert await db.fetchval("SELECT task_id FROM claims WHERE token_digest = 'd1'") == "t2"
        assert state_condition(tuple(ClaimState)) == ("", ())
        assert state_condition(LIVE_STATES) == (" AND state IN (?, ?)", LIVE_STATES)
        await db.close()

    asyncio.run(run())


def test_fences_are_random_and_never_handed_out_twice_nor_to_a_forked_child() -> None:
    """A fence tells one holder of a claim from the next (and names a write): 8 random bytes each,
    never repeated, past several refills of the random block, nor shared with a forked worker."""
    minted = [mint_fence() for _ in range(2000)]  # 16,000 bytes: four blocks of the OS CSPRNG
    assert len(set(minted)) == len(minted)
    assert all(re.fullmatch(r"[0-9a-f]{16}", fence) for fence in minted)
    mint_fence()  # the parent holds a block with bytes still to hand out
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.write(write, "".join(mint_fence() for _ in range(8)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    from_child = os.read(read, 128).decode()
    os.close(read)
    theirs = {from_child[i : i + 16] for i in range(0, 128, 16)}
    ours = {mint_fence() for _ in range(8)}
    assert len(theirs) == 8 and not theirs & ours
