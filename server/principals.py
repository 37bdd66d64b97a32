"""Principals: operator-issued API keys, stored as SHA-256 digests.

`identify` answers one of three things for a request (DESIGN section 3): anonymous
(no bearer, or a bearer that is no known key, such as a payment token), refused
(a known key that may not use this agent, is revoked or has expired: HTTP 403, final), or the
principal.

A key may carry an expiry; each process notes when a key was last used in memory and writes it
with the request counts (at most every few seconds, never on the request's path). A revoked key
frees its name: only live keys' names are unique.
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
from server.database import Database, DatabaseUnavailable, Migration

KEY_PREFIX = "a2g_"


@dataclass(frozen=True)
class Principal:
    name: str
    agents: tuple[str, ...]
    revoked: bool = False
    expires_at: float | None = None  # epoch seconds; None: never

    @property
    def owner(self) -> str:
        return f"key:{self.name}"

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and time.time() >= self.expires_at

    def may_use(self, agent: str) -> bool:
        return not self.revoked and not self.expired and ("*" in self.agents or agent in self.agents)


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
# a revoked key frees its name: only live keys' names are unique
_LIVE_NAMES = (
    "DROP INDEX IF EXISTS api_keys_name",
    "CREATE UNIQUE INDEX IF NOT EXISTS api_keys_live_name ON api_keys (name) WHERE revoked = 0",
)
_ADDED = ("expires_at DOUBLE PRECISION", "last_used_at DOUBLE PRECISION")
MIGRATIONS = (
    Migration(_TABLES[:1]),
    Migration(_TABLES[1:]),
    Migration.add_columns("api_keys", _ADDED),
    Migration(_LIVE_NAMES),
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
        self.used: dict[str, float] = {}  # digest -> when this process last saw it, until `flush_use`

    async def identify(self, authorization: str | None) -> Principal | None:
        """The principal for a bearer key, or None for an anonymous caller."""
        key = bearer(authorization)
        if key is None:
            return ANONYMOUS
        wanted = digest(key)
        stored, principal = await self.lookup(wanted)
        if principal is None or not hmac.compare_digest(stored, wanted):
            return ANONYMOUS
        if wanted not in self.configured:
            self.used[wanted] = time.time()
        return principal

    async def lookup(self, wanted: str) -> tuple[str, Principal | None]:
        if wanted in self.configured:
            return wanted, self.configured[wanted]
        cached = self.cache.get(wanted)
        if cached is not None:
            return cached
        row = await self.db.fetchrow(
            "SELECT sha256, name, agents, revoked, expires_at FROM api_keys WHERE sha256 = ?", (wanted,)
        )
        found: tuple[str, Principal | None] = ("", None)
        if row is not None:
            agents = tuple(json.loads(row["agents"]))
            found = (row["sha256"], Principal(row["name"], agents, bool(row["revoked"]), row["expires_at"]))
        self.cache[wanted] = found
        return found

    async def flush_use(self) -> None:
        """Write when each key was last used here (a later time never goes back to an earlier one)."""
        used, self.used = self.used, {}
        if not used:
            return
        try:
            async with self.db.transaction():
                for sha256, when in sorted(used.items()):
                    await self.db.execute(
                        "UPDATE api_keys SET last_used_at = ?"
                        " WHERE sha256 = ? AND (last_used_at IS NULL OR last_used_at < ?)",
                        (when, sha256, when),
                    )
        except DatabaseUnavailable:  # kept for the next flush; a newer use of the same key wins
            for sha256, when in used.items():
                self.used[sha256] = max(when, self.used.get(sha256, 0.0))


async def create_key(db: Database, name: str, agents: list[str], expires_at: float | None = None) -> tuple[str, str]:
    """Store a new key; returns (the key, its digest). The key itself is never stored."""
    key = generate_key()
    added = await db.execute(
        "INSERT INTO api_keys (sha256, name, agents, revoked, created_at, expires_at) VALUES (?, ?, ?, 0, ?, ?)"
        " ON CONFLICT DO NOTHING",
        (digest(key), name, json.dumps(agents), time.time(), expires_at),
    )
    if not added:
        raise ValueError(f"a live key named {name!r} exists already")
    return key, digest(key)


async def revoke_key(db: Database, name: str) -> int:
    """Revoke the live key of that name; its name is free again."""
    return await db.execute("UPDATE api_keys SET revoked = 1 WHERE name = ? AND revoked = 0", (name,))


async def list_keys(db: Database) -> list[dict]:
    rows = await db.fetch(
        "SELECT name, sha256, agents, revoked, created_at, expires_at, last_used_at FROM api_keys ORDER BY created_at"
    )
    return [{**r, "agents": json.loads(r["agents"]), "revoked": bool(r["revoked"])} for r in rows]
