"""Sealing the payment a delivered request still has to settle.

Settling after a crash needs the signed payload, and the database must never hold a
token or a signature. So the payload is kept only while a settlement is owed,
encrypted (AES-GCM, from the `cryptography` package) with a key that lives outside
the database: the environment variable A2A_GATE_SEALING_KEY, or a key file created
beside a SQLite database with owner-only permissions. Replicas on PostgreSQL must all
hold the same key (one may settle what another delivered), so there it comes from the
environment only.

The database records a fingerprint of the key it was first sealed with (an HMAC of a
fixed label, which says nothing of the key), and a process holding another key refuses
to start: it could take owed claims and never unseal them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from server import json_text
from server.config import is_database_url
from server.database import Database, Migration
from server.ids import random_bytes

ENV_KEY = "A2A_GATE_SEALING_KEY"


FINGERPRINT_LABEL = b"a2a-gate sealing key fingerprint v1"
MIGRATIONS = (
    Migration(
        sqlite=("CREATE TABLE IF NOT EXISTS sealing (name TEXT PRIMARY KEY, fingerprint TEXT NOT NULL)",),
        postgresql=("CREATE TABLE IF NOT EXISTS sealing (name TEXT PRIMARY KEY, fingerprint TEXT NOT NULL)",),
    ),
)


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


def load_key(database: str) -> bytes:
    env = os.environ.get(ENV_KEY)
    if env:
        return decode_key(env, ENV_KEY)
    if is_database_url(database):
        raise SealingKeyMissing(
            f"a PostgreSQL database needs {ENV_KEY} (the same on every replica); make one with:"
            " python -c 'import os, base64; print(base64.urlsafe_b64encode(os.urandom(32)).decode())'"
        )
    if database == ":memory:":
        return AESGCM.generate_key(bit_length=256)
    path = Path(database + ".sealing-key")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):  # another worker may have created it a moment ago
            text = path.read_text().strip()
            if text:
                return decode_key(text, f"sealing key file {path}")
            time.sleep(0.02)
        raise RuntimeError(f"sealing key file {path} is empty") from None
    key = AESGCM.generate_key(bit_length=256)
    with os.fdopen(fd, "w") as f:
        f.write(base64.urlsafe_b64encode(key).decode())
    return key


class Sealer:
    def __init__(self, key: bytes) -> None:
        self.aead = AESGCM(key)
        self.fingerprint = hmac.new(key, FINGERPRINT_LABEL, hashlib.sha256).hexdigest()[:16]

    async def check(self, db: Database) -> None:
        """Record this key's fingerprint if the database has none; refuse if it has another."""
        await db.migrate("sealing", MIGRATIONS)
        await db.execute(
            "INSERT INTO sealing (name, fingerprint) VALUES ('key', ?) ON CONFLICT DO NOTHING", (self.fingerprint,)
        )
        recorded = await db.fetchval("SELECT fingerprint FROM sealing WHERE name = 'key'")
        if recorded != self.fingerprint:
            raise SealingKeyMismatch(
                f"this sealing key (fingerprint {self.fingerprint}) is not the one the database was sealed with"
                f" (fingerprint {recorded}): set {ENV_KEY} to the key the other replicas use"
            )

    def seal(self, document: dict[str, Any], context: str) -> str:
        nonce = random_bytes(12)  # from the OS CSPRNG, each byte handed out once (server/ids.py)
        data = json_text.encode(document)
        return base64.b64encode(nonce + self.aead.encrypt(nonce, data, context.encode())).decode()

    def unseal(self, sealed: str, context: str) -> dict[str, Any]:
        raw = base64.b64decode(sealed)
        return json.loads(self.aead.decrypt(raw[:12], raw[12:], context.encode()))
