"""API keys below the HTTP layer (server/principals.py): digests, the bearer header, configured and stored keys."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from server.config import ApiKey
from server.database import Database
from server.engines import open_database
from server.principals import (
    Principal,
    Principals,
    bearer,
    create_key,
    create_tables,
    digest,
    list_keys,
    revoke_key,
)

ADDRESS = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
USDC = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"


# --- principals -------------------------------------------------------------------------


def test_digest_is_sha256_hex() -> None:
    assert digest("a2g_abc") == hashlib.sha256(b"a2g_abc").hexdigest()


@pytest.mark.parametrize(
    "header,expected",
    [
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic abc", None),
        ("Token abc", None),
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("BEARER   abc  ", "abc"),
        ("Bearer a b", "a b"),
    ],
)
def test_bearer(header: str | None, expected: str | None) -> None:
    assert bearer(header) == expected


async def keys_database() -> Database:
    db = open_database(":memory:")
    await db.open()
    await create_tables(db)
    return db


def test_identify_configured_and_stored_keys() -> None:
    async def run() -> None:
        db = await keys_database()
        configured = ApiKey(name="ops", sha256=digest("a2g_ops"), agents=("echo",))
        gone = ApiKey(name="gone", sha256=digest("a2g_gone"), agents=("*",), revoked=True)
        key, stored_digest = await create_key(db, "svc", ["echo", "slow"])
        principals = Principals(db, (configured, gone), cache_seconds=0.05)

        assert await principals.identify(None) is None
        assert await principals.identify("Bearer a2g_unknown") is None
        assert await principals.identify(f"Basic {key}") is None
        assert await principals.identify("Bearer a2g_ops") == Principal("ops", ("echo",))
        ops = await principals.identify("Bearer a2g_ops")
        assert ops is not None and ops.may_use("echo") and not ops.may_use("slow") and ops.owner == "key:ops"
        svc = await principals.identify(f"Bearer {key}")
        assert svc == Principal("svc", ("echo", "slow")) and stored_digest == digest(key)
        old = await principals.identify("Bearer a2g_gone")
        assert old is not None and old.revoked and not old.may_use("echo")

        assert await revoke_key(db, "svc") == 1
        assert await revoke_key(db, "nobody") == 0
        await asyncio.sleep(0.1)  # past the cache
        refused = await principals.identify(f"Bearer {key}")
        assert refused is not None and refused.revoked and not refused.may_use("echo")

    asyncio.run(run())


def test_wildcard_keys_may_use_any_agent() -> None:
    assert Principal("root", ("*",)).may_use("anything")
    assert not Principal("root", ("*",), revoked=True).may_use("anything")
    assert not Principal("none", ()).may_use("echo")


def test_created_keys_are_stored_only_as_digests() -> None:
    async def run() -> None:
        db = await keys_database()
        key, _ = await create_key(db, "svc", ["*"])

        assert key.startswith("a2g_") and len(key) > 40
        rows = await db.fetch("SELECT * FROM api_keys")
        assert key not in json.dumps(rows)
        assert (await list_keys(db))[0]["sha256"] == digest(key)
        with pytest.raises(ValueError, match="exists already"):
            await create_key(db, "svc", ["*"])

    asyncio.run(run())
