"""Sealing the payment a delivered request still has to settle.

Settling after a crash needs the signed payload, and the database must never hold a
token or a signature. So the payload is kept only while a settlement is owed,
encrypted (AES-GCM, from the `cryptography` package) with a key that lives outside
the database: the environment variable A2A_GATE_SEALING_KEY, or a key file created
beside a SQLite database with owner-only permissions. Replicas on PostgreSQL must all
hold the same key (one may settle what another delivered), so there it comes from the
environment only.

The variable may hold a key ring: several keys, comma-separated. The first seals; every one
unseals. That is how a key is rotated without stopping the money (docs/operations.md,
"Rotating the sealing key"): add the new key after the old one everywhere, then put it first
everywhere, re-seal what is stored (`a2a-gate sealing-key reseal`), then drop the old key.

The database records a fingerprint of each key that has sealed what it holds (an HMAC of a
fixed label, which says nothing of the key): `key`, the one everything was sealed with at the
last re-seal, and `also:<fingerprint>` for each key that has sealed since. A process whose ring
lacks any of them refuses to start: it could take owed claims and never unseal them.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pybase64
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from server import json_text
from server.config import is_database_url
from server.database import Database, Migration
from server.ids import random_bytes

ENV_KEY = "A2A_GATE_SEALING_KEY"


FINGERPRINT_LABEL = b"a2a-gate sealing key fingerprint v1"
MIGRATIONS = (Migration(("CREATE TABLE IF NOT EXISTS sealing (name TEXT PRIMARY KEY, fingerprint TEXT NOT NULL)",)),)


# Where sealed values are stored: (table, the key column that is each value's context, the column)
SEALED_COLUMNS = (("claims", "token_digest", "sealed_payment"), ("channels", "channel_id", "sealed_voucher"))


class SealingKeyMismatch(Exception):
    """This process holds another key than the one the database was sealed with."""


class SealingKeyMissing(Exception):
    """No key every replica shares: settling another replica's owed work would be impossible."""


class SealingKeyMalformed(SealingKeyMissing):
    """A key that is not a base64 AES key is as good as none; the message names where it came from."""


KEY_SIZES = (16, 24, 32)  # AES-128/192/256: what AESGCM takes (the gate makes 32-byte keys)


def decode_key(text: str, source: str) -> bytes:
    """The key `text` (urlsafe base64) holds, or SealingKeyMalformed naming `source`, never the text."""
    try:
        key = base64.b64decode(text.strip().encode("ascii"), altchars=b"-_", validate=True)
    except (ValueError, UnicodeEncodeError):
        key = b""
    if len(key) not in KEY_SIZES:
        raise SealingKeyMalformed(
            f"{source} is not a sealing key: it must be 32 random bytes (16 or 24 also do) in urlsafe base64"
        )
    return key


def decode_ring(text: str, source: str) -> list[bytes]:
    """The keys a comma-separated ring holds, in order (the first seals); each one checked."""
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise SealingKeyMalformed(f"{source} is empty")
    return [
        decode_key(part, f"{source} (key {i + 1} of {len(parts)})" if len(parts) > 1 else source)
        for i, part in enumerate(parts)
    ]


def load_key(database: str) -> list[bytes]:
    """The key ring: the variable's keys, else (SQLite) the key file beside the database, made on first use."""
    env = os.environ.get(ENV_KEY)
    if env:
        return decode_ring(env, ENV_KEY)
    if is_database_url(database):
        raise SealingKeyMissing(
            f"a PostgreSQL database needs {ENV_KEY}, the same on every replica: the key (ring) its values"
            " were sealed with, if any were (another is refused); only for a new database, make one with:"
            " python -c 'import os, base64; print(base64.urlsafe_b64encode(os.urandom(32)).decode())'"
        )
    if database == ":memory:":
        return [AESGCM.generate_key(bit_length=256)]
    path = Path(database + ".sealing-key")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):  # another worker may have created it a moment ago
            text = path.read_text().strip()
            if text:
                return decode_ring(text, f"sealing key file {path}")
            time.sleep(0.02)
        raise RuntimeError(f"sealing key file {path} is empty") from None
    key = AESGCM.generate_key(bit_length=256)
    with os.fdopen(fd, "w") as f:
        f.write(base64.urlsafe_b64encode(key).decode())
    return [key]


def fingerprint(key: bytes) -> str:
    return hmac.new(key, FINGERPRINT_LABEL, hashlib.sha256).hexdigest()[:16]


class KeyOnDemand:
    """The sealer, loaded at the first seal or unseal: `a2a-gate migrate` needs no key."""

    def __init__(self, database: str) -> None:
        self.database = database

    @functools.cached_property
    def sealer(self) -> Sealer:
        return Sealer(load_key(self.database))

    def seal(self, document: dict[str, Any], context: str) -> str:
        return self.sealer.seal(document, context)

    def unseal(self, sealed: str, context: str) -> dict[str, Any]:
        return self.sealer.unseal(sealed, context)


class Sealer:
    """Seals with the ring's first key; unseals with whichever of its keys sealed the value."""

    def __init__(self, keys: bytes | Sequence[bytes]) -> None:
        ring = [keys] if isinstance(keys, bytes) else list(keys)
        self.ring = ring
        self.aeads = [AESGCM(key) for key in ring]
        self.aead = self.aeads[0]
        self.fingerprints = [fingerprint(key) for key in ring]
        self.fingerprint = self.fingerprints[0]

    async def recorded(self, db: Database) -> dict[str, str]:
        await db.migrate("sealing", MIGRATIONS)
        return {row["name"]: row["fingerprint"] for row in await db.fetch("SELECT name, fingerprint FROM sealing")}

    async def check(self, db: Database) -> None:
        """Record the sealing key's fingerprint (the first, or one more key that seals); refuse a ring
        that lacks a key something stored may be sealed with."""
        await db.migrate("sealing", MIGRATIONS)
        await db.execute(
            "INSERT INTO sealing (name, fingerprint) VALUES ('key', ?) ON CONFLICT DO NOTHING", (self.fingerprint,)
        )
        recorded = await self.recorded(db)
        missing = sorted(set(recorded.values()) - set(self.fingerprints))
        if missing:
            held = ", ".join(self.fingerprints)
            raise SealingKeyMismatch(
                f"the database holds values sealed with the key of fingerprint {', '.join(missing)}, which this"
                f" process's {ENV_KEY} (fingerprint {held}) lacks: set it to the key ring the other replicas use"
                " (an old key leaves the ring only after `a2a-gate sealing-key reseal`)"
            )
        if recorded.get("key") != self.fingerprint:
            await db.execute(
                "INSERT INTO sealing (name, fingerprint) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (f"also:{self.fingerprint}", self.fingerprint),
            )

    def derive(self, label: bytes) -> list[bytes]:
        """A key for another use than sealing, from each key of the ring (the first is the one in
        use): every replica holds the ring, so what one makes with it another can check."""
        return [hmac.new(key, label, hashlib.sha256).digest() for key in self.ring]

    def seal(self, document: dict[str, Any], context: str) -> str:
        nonce = random_bytes(12)  # from the OS CSPRNG, each byte handed out once (server/ids.py)
        data = json_text.encode(document)
        return pybase64.b64encode(nonce + self.aead.encrypt(nonce, data, context.encode())).decode()

    def unseal(self, sealed: str, context: str) -> dict[str, Any]:
        raw = base64.b64decode(sealed)
        for aead in self.aeads[:-1]:
            try:
                return json.loads(aead.decrypt(raw[:12], raw[12:], context.encode()))
            except InvalidTag:  # sealed with another key of the ring
                continue
        return json.loads(self.aeads[-1].decrypt(raw[:12], raw[12:], context.encode()))

    async def reseal(self, db: Database) -> dict[str, int]:
        """Seal every stored value with the first key, then record it as the only key in use; the
        counts of values re-sealed per table. A value changed meanwhile (settled, a newer voucher)
        is left to its writer, who sealed it with a key of the ring; a value no key of the ring
        opens stops the re-seal, recording nothing (InvalidTag), so no key is forgotten in use."""
        await self.check(db)
        counts: dict[str, int] = {}
        for table, key_column, column in SEALED_COLUMNS:
            if not await table_exists(db, table):
                continue
            rows = await db.fetch(f"SELECT {key_column}, {column} FROM {table} WHERE {column} != ''")
            counts[table] = 0
            for row in rows:
                context, sealed = row[key_column], row[column]
                document = self.unseal(sealed, context)
                counts[table] += await db.execute(
                    f"UPDATE {table} SET {column} = ? WHERE {key_column} = ? AND {column} = ?",
                    (self.seal(document, context), context, sealed),
                )
        async with db.transaction():
            await db.execute("DELETE FROM sealing WHERE name != 'key'")
            await db.execute("UPDATE sealing SET fingerprint = ? WHERE name = 'key'", (self.fingerprint,))
        return counts


async def table_exists(db: Database, table: str) -> bool:
    """Whether the table is there: a gate that never took a channel payment has no channels table."""
    try:
        await db.fetch(f"SELECT 1 FROM {table} LIMIT 1")
    except Exception:  # noqa: BLE001 -- each engine names a missing table its own way
        return False
    return True
