"""Sealing the payment a delivered request still has to settle.

Settling after a crash needs the signed payload, and the database must never hold a
token or a signature. So the payload is kept only while a settlement is owed,
encrypted (AES-GCM, from the `cryptography` package) with a key that lives outside
the database: the environment variable A2A_GATE_SEALING_KEY, or a key file created
beside a SQLite database with owner-only permissions. Replicas on PostgreSQL must all
hold the same key (one may settle what another delivered), so there it comes from the
environment only.
"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from server.config import is_database_url

ENV_KEY = "A2A_GATE_SEALING_KEY"


class SealingKeyMissing(Exception):
    """No key every replica shares: settling another replica's owed work would be impossible."""


def load_key(database: str) -> bytes:
    env = os.environ.get(ENV_KEY)
    if env:
        return base64.urlsafe_b64decode(env)
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
                return base64.urlsafe_b64decode(text)
            time.sleep(0.02)
        raise RuntimeError(f"sealing key file {path} is empty") from None
    key = AESGCM.generate_key(bit_length=256)
    with os.fdopen(fd, "w") as f:
        f.write(base64.urlsafe_b64encode(key).decode())
    return key


class Sealer:
    def __init__(self, key: bytes) -> None:
        self.aead = AESGCM(key)

    def seal(self, document: dict[str, Any], context: str) -> str:
        nonce = os.urandom(12)
        data = json.dumps(document, separators=(",", ":")).encode()
        return base64.b64encode(nonce + self.aead.encrypt(nonce, data, context.encode())).decode()

    def unseal(self, sealed: str, context: str) -> dict[str, Any]:
        raw = base64.b64decode(sealed)
        return json.loads(self.aead.decrypt(raw[:12], raw[12:], context.encode()))
