"""Sign-in with the wallet that paid (x402 `sign-in-with-x`): a payer reads its own tasks again
without paying again.

Each priced agent's 402 carries a challenge under `extensions["sign-in-with-x"]`, as the x402
package's resource server declares one: this door (`domain`: the host of the public base URL,
`uri`: the agent's URL), a nonce the gate issued, `issuedAt` and `expirationTime`, and the
chains whose wallets may sign (the agent's EVM networks, `eip191`). The payer signs it (the
EIP-4361 text the package's client builds) and sends the signed payload, base64 JSON, in the
`SIGN-IN-WITH-X` header of a task read: that wallet is then the payer the read is bound to.

A nonce costs nothing to issue: it is its expiry, random bytes and an HMAC over them and the
door, keyed from the sealing key every replica holds, so any replica checks what another
issued and a flood of 402s writes nothing. It is spent once: the read it signs in records it
in the shared store (`sign_in_nonces`, kept until it expires), and any later use is refused.

Signatures are checked here, without a network call: an externally owned account's EIP-191
signature of the EIP-4361 text, recovered with libsecp256k1. A smart wallet's (EIP-1271,
EIP-6492) would need the chain on every read: not taken, refused like any other failure
(docs/money.md). The wire format is the x402 package's (`x402.extensions.sign_in_with_x`); the
gate does not import the package, and tests sign in with the package's own client.
"""

from __future__ import annotations

import base64
import functools
import hmac
import json
import re
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from gate.schemes.batch_settlement import keccak, recover
from gate.sealing import SealingKeyMissing
from server.database import Database, Migration
from server.ids import random_bytes

SIGN_IN_WITH_X = "sign-in-with-x"  # the 402 extension's key
HEADER = "sign-in-with-x"  # where the signed payload travels (HTTP header names are case-insensitive)
CHALLENGE_SECONDS = 300  # how long a challenge may be signed and used: the package's own default age
NONCE_LABEL = b"a2a-gate sign-in nonce v1"
STATEMENT = "Sign in to read the tasks you paid for."
MAX_HEADER = 8192  # a signed payload is well under 2 KB
NONCE = re.compile(r"[0-9a-f]{58}")
ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
SKEW_SECONDS = 60  # a replica whose clock is a little behind the issuing one's still takes its challenge

# the payload's JSON Schema, as the package's `build_siwx_schema` declares it
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "domain": {"type": "string"},
        "address": {"type": "string"},
        "statement": {"type": "string"},
        "uri": {"type": "string", "format": "uri"},
        "version": {"type": "string"},
        "chainId": {"type": "string"},
        "type": {"type": "string"},
        "nonce": {"type": "string"},
        "issuedAt": {"type": "string", "format": "date-time"},
        "expirationTime": {"type": "string", "format": "date-time"},
        "notBefore": {"type": "string", "format": "date-time"},
        "requestId": {"type": "string"},
        "resources": {"type": "array", "items": {"type": "string", "format": "uri"}},
        "signature": {"type": "string"},
    },
    "required": ["domain", "address", "uri", "version", "chainId", "type", "nonce", "issuedAt", "signature"],
}
REQUIRED = tuple(SCHEMA["required"])
LATER_LINES = (("expirationTime", "Expiration Time"), ("notBefore", "Not Before"), ("requestId", "Request ID"))
OPTIONAL = ("statement", "expirationTime", "notBefore", "requestId", "signatureScheme")

MIGRATIONS = (
    Migration(
        (
            "CREATE TABLE IF NOT EXISTS sign_in_nonces (nonce TEXT PRIMARY KEY, expires_at BIGINT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS idx_sign_in_nonces_expiry ON sign_in_nonces (expires_at)",
        )
    ),
)


@functools.lru_cache(maxsize=8)  # one string a second, for every 402 of that second
def timestamp(seconds: int) -> str:
    """RFC 3339 UTC, as EIP-4361 writes its times."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SignIn:
    """Issues challenges for a door and signs a payer in from a signed one, spending its nonce."""

    def __init__(
        self,
        db: Database,
        keys: Callable[[], list[bytes]],
        seconds: int = CHALLENGE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.load_keys = keys  # the nonce keys, the first issuing (from the sealing key ring): loaded on first use
        self.seconds = seconds
        self.clock = clock

    @functools.cached_property
    def keys(self) -> list[bytes]:
        return self.load_keys()

    async def create_tables(self) -> None:
        await self.db.migrate("sign_in", MIGRATIONS)

    def mac(self, key: bytes, resource: str, expiry: str, rand: str) -> str:
        return hmac.digest(key, f"{resource}\n{expiry}\n{rand}".encode(), "sha256")[:16].hex()

    def nonce(self, resource: str, expiry: int) -> str:
        """Hex only (EIP-4361 nonces are alphanumeric): expiry, 8 random bytes, the HMAC."""
        stamp, rand = f"{expiry:010x}", random_bytes(8).hex()
        return stamp + rand + self.mac(self.keys[0], resource, stamp, rand)

    def issued(self, nonce: str, resource: str) -> int | None:
        """The expiry of a nonce this gate issued for `resource` (any replica), or None."""
        if not NONCE.fullmatch(nonce):
            return None
        if not self.ready():
            return None
        stamp, rand, mac = nonce[:10], nonce[10:26], nonce[26:]
        if not any(hmac.compare_digest(mac, self.mac(key, resource, stamp, rand)) for key in self.keys):
            return None
        return int(stamp, 16)

    def fresh(self, resource: str, networks: Iterable[str]) -> Callable[[], dict[str, Any]] | None:
        """What makes each 402 of this door its own challenge, or None where no EVM wallet pays."""
        chains = [n for n in dict.fromkeys(networks) if n.startswith("eip155:")]
        if not chains or not self.ready():
            return None
        return lambda: self.challenge(resource, chains)

    def ready(self) -> bool:
        """Whether nonces can be issued: a process without the sealing key (only one that never
        seals, on PostgreSQL without the variable) offers no sign-in, and still answers its 402."""
        try:
            return bool(self.keys)
        except SealingKeyMissing:
            return False

    def challenge(self, resource: str, chains: list[str]) -> dict[str, Any]:
        """`{"sign-in-with-x": ...}` for a 402's `extensions`, with a nonce of its own."""
        now = int(self.clock())
        expiry = now + self.seconds
        info = {
            "domain": urlsplit(resource).netloc,
            "uri": resource,
            "version": "1",
            "statement": STATEMENT,
            "nonce": self.nonce(resource, expiry),
            "issuedAt": timestamp(now),
            "expirationTime": timestamp(expiry),
            "resources": [resource],
        }
        supported = [{"chainId": chain, "type": "eip191"} for chain in chains]
        return {SIGN_IN_WITH_X: {"info": info, "supportedChains": supported, "schema": SCHEMA}}

    async def payer(self, header: str | None, resource: str) -> str | None:
        """The wallet a `SIGN-IN-WITH-X` header signs in for `resource`, its nonce now spent; None for
        anything else: malformed, another door, expired, not ours, a bad signature, a spent nonce."""
        payload = read_payload(header)
        if payload is None:
            return None
        door = urlsplit(resource)
        if payload["uri"] != resource or payload["domain"] != door.netloc:
            return None
        expiry = self.issued(payload["nonce"], resource)
        now = self.clock()
        if expiry is None or expiry <= now or not in_time(payload, now, self.seconds):
            return None
        wallet = signer(payload)
        if wallet is None:
            return None
        spent = await self.db.execute(
            "INSERT INTO sign_in_nonces (nonce, expires_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
            (payload["nonce"], expiry),
        )
        return wallet if spent == 1 else None

    async def expire(self) -> None:
        """Forget spent nonces that expired: no challenge that old signs anyone in."""
        await self.db.execute("DELETE FROM sign_in_nonces WHERE expires_at < ?", (int(self.clock()),))


def read_payload(header: str | None) -> dict[str, Any] | None:
    """The signed payload of a `SIGN-IN-WITH-X` header (standard base64 of a JSON object), its fields
    strings on one line each; None for any other value."""
    if not header or len(header) > MAX_HEADER:
        return None
    try:
        payload = json.loads(base64.b64decode(header, validate=True))
    except (ValueError, RecursionError):  # binascii, Unicode and JSON errors are ValueErrors; deep nesting
        return None
    if not isinstance(payload, dict):
        return None
    for name in (*REQUIRED, *OPTIONAL):
        value = payload.get(name)
        if (value is None and name in OPTIONAL) or (isinstance(value, str) and "\n" not in value and "\r" not in value):
            continue
        return None
    resources = payload.get("resources")
    if resources is not None and not (
        isinstance(resources, list) and all(isinstance(r, str) and "\n" not in r for r in resources)
    ):
        return None
    # an EOA on an EVM chain: what this gate offers (no smart-wallet schemes)
    if payload["type"] != "eip191" or payload.get("signatureScheme") not in (None, "eip191"):
        return None
    if not re.fullmatch(r"eip155:[0-9]{1,20}", payload["chainId"]) or not ADDRESS.fullmatch(payload["address"]):
        return None
    return payload


def moment(text: str) -> float | None:
    """An RFC 3339 time as epoch seconds (naive: UTC), or None."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()


def in_time(payload: dict[str, Any], now: float, seconds: int) -> bool:
    """Issued at most `seconds` ago (and not later than now), not expired, not before its time."""
    issued = moment(payload["issuedAt"])
    if issued is None or not now - seconds <= issued <= now + SKEW_SECONDS:
        return False
    for name, later in (("expirationTime", True), ("notBefore", False)):
        if payload.get(name) is not None:
            when = moment(payload[name])
            if when is None or (when <= now if later else when > now):
                return False
    return True


def message(payload: dict[str, Any]) -> str:
    """The EIP-4361 text the payload's signature signs, as `siwe` (the package's client) writes it."""
    head = f"{payload['domain']} wants you to sign in with your Ethereum account:\n{payload['address']}"
    head = f"{head}\n\n{payload['statement']}" if payload.get("statement") is not None else f"{head}\n"
    lines = [
        f"URI: {payload['uri']}",
        f"Version: {payload['version']}",
        f"Chain ID: {int(payload['chainId'].removeprefix('eip155:'))}",
        f"Nonce: {payload['nonce']}",
        f"Issued At: {payload['issuedAt']}",
    ]
    for name, label in (
        ("expirationTime", "Expiration Time"),
        ("notBefore", "Not Before"),
        ("requestId", "Request ID"),
    ):
        if payload.get(name) is not None:
            lines.append(f"{label}: {payload[name]}")
    if payload.get("resources") is not None:
        lines.append("\n".join(["Resources:", *(f"- {r}" for r in payload["resources"])]))
    return f"{head}\n\n" + "\n".join(lines)


def signer(payload: dict[str, Any]) -> str | None:
    """The payload's address, lower-case as the gate names every payer, if its EIP-191 signature is
    that account's."""
    text = message(payload).encode()
    digest = keccak(b"\x19Ethereum Signed Message:\n" + str(len(text)).encode() + text)
    try:
        recovered = recover(digest, payload["signature"])
    except ValueError:  # not hex
        return None
    if recovered is None or recovered.lower() != payload["address"].lower():
        return None
    return recovered
