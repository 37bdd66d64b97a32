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

import sqlite_utils
from cachetools import TTLCache

from server.config import ApiKey

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


class Principals:
    """Looks keys up by digest in the configuration and the database.

    Database keys are cached briefly, so a revocation takes effect within
    `cache_seconds` in every worker without a query on every request.
    """

    def __init__(
        self, db: sqlite_utils.Database, configured: tuple[ApiKey, ...] = (), cache_seconds: float = 2.0
    ) -> None:
        self.db = db
        self.configured = {k.sha256: Principal(k.name, k.agents, k.revoked) for k in configured}
        self.cache: TTLCache[str, tuple[str, Principal | None]] = TTLCache(maxsize=4096, ttl=cache_seconds)

    def identify(self, authorization: str | None) -> Principal | None:
        """The principal for a bearer key, or None for an anonymous caller."""
        key = bearer(authorization)
        if key is None:
            return ANONYMOUS
        wanted = digest(key)
        stored, principal = self.lookup(wanted)
        if principal is None or not hmac.compare_digest(stored, wanted):
            return ANONYMOUS
        return principal

    def lookup(self, wanted: str) -> tuple[str, Principal | None]:
        if wanted in self.configured:
            return wanted, self.configured[wanted]
        cached = self.cache.get(wanted)
        if cached is not None:
            return cached
        row = self.db.conn.execute(
            "SELECT sha256, name, agents, revoked FROM api_keys WHERE sha256 = ?", (wanted,)
        ).fetchone()
        found: tuple[str, Principal | None] = ("", None)
        if row is not None:
            found = (row[0], Principal(row[1], tuple(json.loads(row[2])), bool(row[3])))
        self.cache[wanted] = found
        return found


def create_key(db: sqlite_utils.Database, name: str, agents: list[str]) -> tuple[str, str]:
    """Store a new key; returns (the key, its digest). The key itself is never stored."""
    if db.conn.execute("SELECT 1 FROM api_keys WHERE name = ?", (name,)).fetchone():
        raise ValueError(f"a key named {name!r} exists already")
    key = generate_key()
    db.table("api_keys").insert(
        {"sha256": digest(key), "name": name, "agents": json.dumps(agents), "revoked": 0, "created_at": time.time()}
    )
    return key, digest(key)


def revoke_key(db: sqlite_utils.Database, name: str) -> int:
    return db.conn.execute("UPDATE api_keys SET revoked = 1 WHERE name = ?", (name,)).rowcount


def list_keys(db: sqlite_utils.Database) -> list[dict]:
    rows = db.conn.execute(
        "SELECT name, sha256, agents, revoked, created_at FROM api_keys ORDER BY created_at"
    ).fetchall()
    return [
        {"name": r[0], "sha256": r[1], "agents": json.loads(r[2]), "revoked": bool(r[3]), "created_at": r[4]}
        for r in rows
    ]
