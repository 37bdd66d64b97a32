"""Sign-in with the wallet that paid (gate/sign_in.py), against the x402 package's own SIWx code.

The challenge is what the package's server would declare, the payload is what the package's
client signs with an eth-account wallet, and every bad value signs nobody in: never an exception.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from x402.extensions.sign_in_with_x import (
    SIWxExtension,
    build_siwx_schema,
    create_siwx_payload,
    encode_siwx_header,
    parse_siwx_header,
    verify_siwx_signature,
)

from gate.sealing import SealingKeyMissing
from gate.sign_in import SignIn, message
from server.database import Database
from server.engines import open_database

RESOURCE = "https://gate.example/a2a/paid"
KEYS = [b"k" * 32]


async def opened(path: Path) -> Database:
    db = open_database(str(path))
    await db.open()
    return db


async def sign_in_on(db: Database, keys: list[bytes] = KEYS, clock: Any = time.time) -> SignIn:
    sign_in = SignIn(db, lambda: keys, clock=clock)
    await sign_in.create_tables()
    return sign_in


def challenge_info(sign_in: SignIn, resource: str = RESOURCE) -> dict[str, Any]:
    fresh = sign_in.fresh(resource, ["eip155:84532"])
    assert fresh is not None
    return fresh()["sign-in-with-x"]


async def signed_header(declared: dict[str, Any], account: Any, response_url: str = RESOURCE) -> str:
    """The package's client: pick the chain the 402 offers, sign the challenge, encode the header."""
    chain = declared["supportedChains"][0]
    payload = await create_siwx_payload({**declared["info"], **chain}, account, response_url)
    return encode_siwx_header(payload)


def edited(header: str, **changes: Any) -> str:
    payload = json.loads(base64.b64decode(header))
    payload.update(changes)
    return base64.b64encode(json.dumps(payload).encode()).decode()


def test_the_challenge_is_the_packages_shape_and_its_signature_is_the_packages_message(tmp_path: Path) -> None:
    async def run() -> None:
        sign_in = await sign_in_on(await opened(tmp_path / "g.db"))
        declared = challenge_info(sign_in)
        extension = SIWxExtension.model_validate(declared)  # the package's own model of the 402 entry
        assert extension.info.domain == "gate.example" and extension.info.uri == RESOURCE
        assert [c.chain_id for c in extension.supported_chains] == ["eip155:84532"]
        assert declared["schema"] == build_siwx_schema()
        assert challenge_info(sign_in)["info"]["nonce"] != declared["info"]["nonce"]  # each 402 its own
        account = Account.create()
        header = await signed_header(declared, account)
        # the package's verifier agrees with the text the gate rebuilds
        assert (await verify_siwx_signature(parse_siwx_header(header))).is_valid
        payload = json.loads(base64.b64decode(header))
        from x402.extensions.sign_in_with_x import format_siwe_message

        assert message(payload) == format_siwe_message(parse_siwx_header(header), payload["address"])
        assert await sign_in.payer(header, RESOURCE) == account.address.lower()

    asyncio.run(run())


def test_a_nonce_signs_in_once_and_an_issued_one_only(tmp_path: Path) -> None:
    async def run() -> None:
        sign_in = await sign_in_on(await opened(tmp_path / "g.db"))
        account = Account.create()
        header = await signed_header(challenge_info(sign_in), account)
        assert await sign_in.payer(header, RESOURCE) == account.address.lower()
        assert await sign_in.payer(header, RESOURCE) is None  # replayed
        # a nonce the gate never issued, signed properly: refused
        declared = challenge_info(sign_in)
        declared["info"]["nonce"] = "0" * 58
        assert await sign_in.payer(await signed_header(declared, account), RESOURCE) is None
        # another key ring (another gate) issued it
        other = await sign_in_on(await opened(tmp_path / "other.db"), keys=[b"o" * 32])
        assert await sign_in.payer(await signed_header(challenge_info(other), account), RESOURCE) is None

    asyncio.run(run())


def test_another_door_an_expired_challenge_and_a_wrong_signer_sign_nobody_in(tmp_path: Path) -> None:
    async def run() -> None:
        now = [time.time()]
        sign_in = await sign_in_on(await opened(tmp_path / "g.db"), clock=lambda: now[0])
        account, other = Account.create(), Account.create()
        # another agent's door: the nonce and the uri name it
        elsewhere = "https://gate.example/a2a/other"
        header = await signed_header(challenge_info(sign_in, elsewhere), account, elsewhere)
        assert await sign_in.payer(header, RESOURCE) is None
        # a foreign domain: the client refuses to sign it for this origin, and the gate refuses it as
        # signed for the other one
        foreign = "https://evil.example/a2a/paid"
        header = await signed_header(challenge_info(sign_in, foreign), account, foreign)
        assert await sign_in.payer(header, RESOURCE) is None
        # expired: signed in time, used too late
        header = await signed_header(challenge_info(sign_in), account)
        now[0] += 301
        assert await sign_in.payer(header, RESOURCE) is None
        now[0] -= 301
        # another wallet's signature over the same payload
        mine = await signed_header(challenge_info(sign_in), account)
        theirs = await signed_header(challenge_info(sign_in), other)
        signature = json.loads(base64.b64decode(theirs))["signature"]
        assert await sign_in.payer(edited(mine, signature=signature), RESOURCE) is None
        # a field changed after signing
        assert await sign_in.payer(edited(mine, statement="Pay me."), RESOURCE) is None
        assert await sign_in.payer(mine, RESOURCE) == account.address.lower()  # untouched, it still signs in

    asyncio.run(run())


@pytest.mark.parametrize(
    "header",
    [
        "",
        "%%%",
        "bm90IGpzb24=",  # "not json"
        base64.b64encode(b"[]").decode(),
        base64.b64encode(b'"text"').decode(),
        base64.b64encode(b"{}").decode(),
        base64.b64encode(b"\xff\xfe").decode(),
        "A" * 9000,
        base64.b64encode(b"[" * 6000).decode(),  # nested past the JSON reader's recursion limit
        base64.b64encode(b'{"nonce": 1e999, "address": NaN}').decode(),
    ],
)
def test_malformed_headers_sign_nobody_in(tmp_path: Path, header: str) -> None:
    async def run() -> None:
        sign_in = await sign_in_on(await opened(tmp_path / "g.db"))
        assert await sign_in.payer(header, RESOURCE) is None

    asyncio.run(run())


@pytest.mark.parametrize(
    "changes",
    [
        {"nonce": 5},
        {"nonce": "é" * 58},
        {"address": "0x1234"},
        {"address": None},
        {"chainId": "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"},
        {"chainId": "eip155:"},
        {"type": "ed25519"},
        {"signatureScheme": "eip1271"},
        {"signature": "0x"},
        {"signature": "zz"},
        {"signature": "0x" + "00" * 65},
        {"issuedAt": "yesterday"},
        {"issuedAt": "2000-01-01T00:00:00Z"},
        {"expirationTime": "2000-01-01T00:00:00Z"},
        {"expirationTime": []},
        {"notBefore": "2999-01-01T00:00:00Z"},
        {"resources": "not a list"},
        {"resources": [1]},
        {"statement": "line\nURI: https://evil.example/"},
        {"uri": "https://gate.example/a2a/paid/"},
        {"domain": "gate.example:443"},
    ],
)
def test_bad_fields_sign_nobody_in(tmp_path: Path, changes: dict[str, Any]) -> None:
    async def run() -> None:
        sign_in = await sign_in_on(await opened(tmp_path / "g.db"))
        header = await signed_header(challenge_info(sign_in), Account.create())
        assert await sign_in.payer(edited(header, **changes), RESOURCE) is None

    asyncio.run(run())


def test_spent_nonces_are_forgotten_once_expired(tmp_path: Path) -> None:
    async def run() -> None:
        now = [time.time()]
        db = await opened(tmp_path / "g.db")
        sign_in = await sign_in_on(db, clock=lambda: now[0])
        assert await sign_in.payer(await signed_header(challenge_info(sign_in), Account.create()), RESOURCE)
        assert await db.fetchval("SELECT COUNT(*) FROM sign_in_nonces") == 1
        await sign_in.expire()
        assert await db.fetchval("SELECT COUNT(*) FROM sign_in_nonces") == 1  # still usable: kept
        now[0] += 301
        await sign_in.expire()
        assert await db.fetchval("SELECT COUNT(*) FROM sign_in_nonces") == 0

    asyncio.run(run())


def test_without_a_sealing_key_no_challenge_is_offered_and_none_signs_in(tmp_path: Path) -> None:
    def missing() -> list[bytes]:
        raise SealingKeyMissing("no key")

    async def run() -> None:
        db = await opened(tmp_path / "g.db")
        keyless = SignIn(db, missing)
        await keyless.create_tables()
        assert keyless.fresh(RESOURCE, ["eip155:84532"]) is None
        header = await signed_header(challenge_info(await sign_in_on(db)), Account.create())
        assert await keyless.payer(header, RESOURCE) is None

    asyncio.run(run())


def test_only_evm_networks_are_offered(tmp_path: Path) -> None:
    async def run() -> None:
        sign_in = await sign_in_on(await opened(tmp_path / "g.db"))
        assert sign_in.fresh(RESOURCE, ["solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"]) is None
        fresh = sign_in.fresh(RESOURCE, ["eip155:8453", "eip155:8453", "eip155:84532"])
        assert fresh is not None
        assert [c["chainId"] for c in fresh()["sign-in-with-x"]["supportedChains"]] == ["eip155:8453", "eip155:84532"]

    asyncio.run(run())
