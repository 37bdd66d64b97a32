"""The sealing key ring (gate/sealing.py), walked through a rotation on SQLite and a real
PostgreSQL with the gate's own claims and channels tables: the first key seals, every key
unseals; a replica whose ring lacks a key that sealed something stored refuses to start; after
`reseal` every stored value opens with the new key alone, and the old key may go."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import InvalidTag

from gate.claims import Claims
from gate.flows.channel.store import Channels
from gate.sealing import ENV_KEY, Sealer, SealingKeyMalformed, SealingKeyMismatch, decode_ring, load_key
from server.engines import open_database

OLD, NEW, STRAY = (os.urandom(32) for _ in range(3))


def text(*keys: bytes) -> str:
    return ",".join(base64.urlsafe_b64encode(k).decode() for k in keys)


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "ring.db")
    return request.getfixturevalue("postgres_schema").store_url()


async def stored(db, sealer: Sealer) -> None:
    await Claims(db).create_tables()
    await Channels(db).create_tables()
    await db.execute(
        "INSERT INTO claims (token_digest, state, sealed_payment) VALUES (?, 'settle_failed', ?)",
        ("t1", sealer.seal({"payload": "owed"}, "t1")),
    )
    await db.execute(
        "INSERT INTO channels (channel_id, network, asset, payer, receiver, config, sealed_voucher)"
        " VALUES ('c1', 'n', 'a', 'p', 'r', '{}', ?)",
        (sealer.seal({"signature": "0xsig"}, "c1"),),
    )


@contextlib.asynccontextmanager
async def sealed_store(location: str) -> AsyncIterator[Any]:
    """The store at `location`, an owed claim and a channel's voucher sealed with the old key."""
    db = open_database(location)
    await db.open()
    try:
        old = Sealer([OLD])
        await old.check(db)
        await stored(db, old)
        yield db
    finally:
        await db.close()


def values(db, sealer: Sealer):
    async def read():
        claim = await db.fetchval("SELECT sealed_payment FROM claims WHERE token_digest = 't1'")
        voucher = await db.fetchval("SELECT sealed_voucher FROM channels WHERE channel_id = 'c1'")
        return sealer.unseal(claim, "t1"), sealer.unseal(voucher, "c1")

    return read()


def test_a_ring_is_comma_separated_and_each_key_is_checked():
    assert decode_ring(text(NEW, OLD), ENV_KEY) == [NEW, OLD]
    with pytest.raises(SealingKeyMalformed, match=r"A2A_GATE_SEALING_KEY \(key 2 of 2\) is not a sealing key"):
        decode_ring(text(NEW) + ",nope", ENV_KEY)
    with pytest.raises(SealingKeyMalformed, match="is empty"):
        decode_ring(" , ", ENV_KEY)


def test_load_key_reads_the_ring_from_the_variable(monkeypatch):
    monkeypatch.setenv(ENV_KEY, text(NEW, OLD))
    assert load_key("postgresql://x/y") == [NEW, OLD]


def test_a_rotation_keeps_every_stored_value_open(location: str):
    async def walk():
        async with sealed_store(location) as db:
            old = Sealer([OLD])
            # 1. the new key added after the old one: it still seals with the old one
            await Sealer([OLD, NEW]).check(db)
            # 2. the new key first: it seals with the new key and says so; the old one still opens
            rotated = Sealer([NEW, OLD])
            await rotated.check(db)
            await db.execute(
                "UPDATE claims SET sealed_payment = ? WHERE token_digest = 't1'",
                (rotated.seal({"payload": "owed"}, "t1"),),
            )
            assert await values(db, rotated) == ({"payload": "owed"}, {"signature": "0xsig"})
            with pytest.raises(SealingKeyMismatch, match=Sealer([NEW]).fingerprint):
                await Sealer([OLD]).check(db)  # a replica left on the old key alone could not open the new
            with pytest.raises(SealingKeyMismatch, match=old.fingerprint):
                await Sealer([NEW]).check(db)  # the old key may not go before the re-seal
            # 3. re-seal: everything under the new key, which alone is recorded
            assert await rotated.reseal(db) == {"claims": 1, "channels": 1}
            # 4. the old key goes
            alone = Sealer([NEW])
            await alone.check(db)
            assert await values(db, alone) == ({"payload": "owed"}, {"signature": "0xsig"})
            with pytest.raises(SealingKeyMismatch):
                await Sealer([OLD]).check(db)
            with pytest.raises(SealingKeyMismatch):
                await Sealer([STRAY]).check(db)

    asyncio.run(walk())


def test_a_reseal_that_meets_a_value_no_key_opens_stops_and_forgets_no_key(location: str):
    async def walk():
        async with sealed_store(location) as db:
            await db.execute(
                "UPDATE channels SET sealed_voucher = ? WHERE channel_id = 'c1'",
                (Sealer([STRAY]).seal({"signature": "0xother"}, "c1"),),  # sealed by a key nobody recorded
            )
            with pytest.raises(InvalidTag):
                await Sealer([NEW, OLD]).reseal(db)
            return await Sealer([OLD]).recorded(db)

    recorded = asyncio.run(walk())
    assert set(recorded.values()) == {Sealer([OLD]).fingerprint, Sealer([NEW]).fingerprint}  # old not forgotten
