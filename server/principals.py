"""Principals: operator-issued API keys, stored as SHA-256 digests.

`identify` answers one of three things for a request (DESIGN section 3): anonymous
(no bearer, or a bearer that is no known key, such as a payment token), refused
(a known key that may not use this agent: HTTP 403, final), or the principal.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from cachetools import TTLCache

from server.config import ApiKey
from server.database import Database, Migration

KEY_PREFIX = "a2g_"


@dataclass(frozen=True)
class Principal:
    name: str
    agents: tuple[str, ...]
    revoked: bool = False

    @property
    def owner(self) -> str:
        return f"key:{self.name}"

    def may_use(self, agent: str) -> bool:
        return not self.revoked and ("*" in self.agents or agent in self.agents)


ANONYMOUS = None


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    value = value.strip()
    if scheme.lower() != "bearer" or not value:
        return None
    return value


_TABLES = (
    "CREATE TABLE IF NOT EXISTS api_keys (sha256 TEXT PRIMARY KEY, name TEXT, agents TEXT, revoked INTEGER,"
    " created_at DOUBLE PRECISION)",
    "CREATE UNIQUE INDEX IF NOT EXISTS api_keys_name ON api_keys (name)",
)
MIGRATIONS = (
    Migration(sqlite=_TABLES[:1], postgresql=_TABLES[:1]),
    Migration(sqlite=_TABLES[1:], postgresql=_TABLES[1:]),
)


async def create_tables(db: Database) -> None:
    await db.migrate("api_keys", MIGRATIONS)


class Principals:
    """Looks keys up by digest in the configuration and the database.

    Database keys are cached briefly, so a revocation takes effect within
    `cache_seconds` in every worker and replica without a query on every request.
    """

    def __init__(self, db: Database, configured: tuple[ApiKey, ...] = (), cache_seconds: float = 2.0) -> None:
        self.db = db
        self.configured = {k.sha256: Principal(k.name, k.agents, k.revoked) for k in configured}
        self.cache: TTLCache[str, tuple[str, Principal | None]] = TTLCache(maxsize=4096, ttl=cache_seconds)

    async def identify(self, authorization: str | None) -> Principal | None:
        """The principal for a bearer key, or None for an anonymous caller."""
        key = bearer(authorization)
        if key is None:
            return ANONYMOUS
        wanted = digest(key)
        stored, principal = await self.lookup(wanted)
        if principal is None or not hmac.compare_digest(stored, wanted):
            return ANONYMOUS
        return principal

    async def lookup(self, wanted: str) -> tuple[str, Principal | None]:
        if wanted in self.configured:
            return wanted, self.configured[wanted]
        cached = self.cache.get(wanted)
        if cached is not None:
            return cached
        row = await self.db.fetchrow("SELECT sha256, name, agents, revoked FROM api_keys WHERE sha256 = ?", (wanted,))
        found: tuple[str, Principal | None] = ("", None)
        if row is not None:
            found = (row["sha256"], Principal(row["name"], tuple(json.loads(row["agents"])), bool(row["revoked"])))
        self.cache[wanted] = found
        return found


async def create_key(db: Database, name: str, agents: list[str]) -> tuple[str, str]:
    """Store a new key; returns (the key, its digest). The key itself is never stored."""
    key = generate_key()
    added = await db.execute(
        "INSERT INTO api_keys (sha256, name, agents, revoked, created_at) VALUES (?, ?, ?, 0, ?)"
        " ON CONFLICT DO NOTHING",
        (digest(key), name, json.dumps(agents), time.time()),
    )
    if not added:
        raise ValueError(f"a key named {name!r} exists already")
    return key, digest(key)


async def revoke_key(db: Database, name: str) -> int:
    return await db.execute("UPDATE api_keys SET revoked = 1 WHERE name = ?", (name,))


async def list_keys(db: Database) -> list[dict]:
    rows = await db.fetch("SELECT name, sha256, agents, revoked, created_at FROM api_keys ORDER BY created_at")
    return [{**r, "agents": json.loads(r["agents"]), "revoked": bool(r["revoked"])} for r in rows]
