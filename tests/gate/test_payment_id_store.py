"""Payment identifiers, below the HTTP layer: the id read from a payload, the 402's declaration
(the x402 package's own helpers and validation are the reference), and the claim that keeps an id
unique on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from x402.extensions.payment_identifier import (
    append_payment_identifier_to_extensions,
    declare_payment_identifier_extension,
    extract_and_validate_payment_identifier,
    generate_payment_id,
    is_payment_identifier_required,
)
from x402.schemas import PaymentPayload

from gate import payment_ids
from gate.claims import Claims
from gate.payment_required import extensions as extensions_of
from gate.payment_required import payment_required
from gate.price import Price
from server.engines import open_database
from tests.support.services import PostgresSchema

PRICE_ASSET = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"


@pytest.mark.parametrize("required", [False, True])
def test_the_declaration_is_the_one_x402_declares(required: bool) -> None:
    assert payment_ids.declaration(required) == declare_payment_identifier_extension(required)
    assert is_payment_identifier_required(payment_ids.declaration(required)) is required


def test_the_402_declares_it_and_x402s_client_helper_appends_an_id_to_it() -> None:
    price = Price(scheme="exact", network="eip155:84532", asset=PRICE_ASSET, amount="1000", pay_to="0x" + "22" * 20)
    document = payment_required(price, "http://gate/a2a/paid", extensions=extensions_of(id_required=True))
    extensions = dict(document["extensions"])
    payment_id = generate_payment_id()
    append_payment_identifier_to_extensions(extensions, payment_id)
    payload = {"x402Version": 2, "payload": {}, "accepted": document["accepts"][0], "extensions": extensions}
    assert payment_ids.of(payload) == payment_id
    found, validation = extract_and_validate_payment_identifier(PaymentPayload.model_validate(payload))
    assert found == payment_id and validation.valid


@pytest.mark.parametrize(
    "extensions",
    [None, {}, {"bazaar": {"info": {}}}, {"payment-identifier": {"info": {"required": False}}}],
)
def test_a_payload_without_an_id_carries_none(extensions: Any) -> None:
    assert payment_ids.of({"x402Version": 2, "extensions": extensions}) is None
    assert payment_ids.of({"x402Version": 2}) is None


@pytest.mark.parametrize(
    "extensions",
    [
        ["payment-identifier"],
        {"payment-identifier": "pay_0123456789abcdef"},
        {"payment-identifier": {"info": "pay_0123456789abcdef"}},
        {"payment-identifier": {"info": {"id": 12345678901234567}}},
        {"payment-identifier": {"info": {"id": "too_short"}}},
        {"payment-identifier": {"info": {"id": "x" * 129}}},
        {"payment-identifier": {"info": {"id": "pay_0123456789abcdef!"}}},
        {"payment-identifier": {"info": {"id": "pay_0123456789abcdé"}}},
        {"payment-identifier": {"info": {"id": "pay_0123456789abcdef\n"}}},
    ],
)
def test_anything_else_under_the_extension_is_invalid(extensions: Any) -> None:
    with pytest.raises(payment_ids.Invalid):
        payment_ids.of({"x402Version": 2, "extensions": extensions})


async def _claims(location: str) -> Claims:
    db = open_database(location)
    await db.open()
    claims = Claims(db)
    await claims.create_tables()
    return claims


async def _one_id_one_claim(location: str) -> None:
    claims = await _claims(location)
    payment_id = generate_payment_id()
    first = await claims.claim("a" * 64, "n1", "r1", "paid", "", payment_id=payment_id, named_payer="0xABC")
    assert first.kind == "new" and first.hold is not None
    # another token, another nonce, the same id: the first payment's claim, not a second one
    second = await claims.claim("b" * 64, "n2", "r1", "paid", "", payment_id=payment_id, named_payer="0xabc")
    assert second.kind == "identified" and second.claim is not None
    assert second.claim.token_digest == "a" * 64 and second.claim.id_payer == "0xabc"
    assert await claims.find("b" * 64) is None
    # without an id nothing changes: no index entry, no second look
    assert (await claims.claim("c" * 64, "n3", "r1", "paid", "")).kind == "new"
    assert (await claims.claim("d" * 64, "n4", "r1", "paid", "")).kind == "new"
    # a released claim lets its id go: the next payment under it is a new one
    await claims.release(first.hold)
    assert await claims.find_by_payment_id(payment_id) is None
    assert (await claims.claim("b" * 64, "n2", "r1", "paid", "", payment_id=payment_id)).kind == "new"
    await claims.db.close()


def test_one_id_is_one_claim_on_sqlite(tmp_path: Path) -> None:
    asyncio.run(_one_id_one_claim(str(tmp_path / "gate.db")))


@pytest.mark.system
def test_one_id_is_one_claim_on_postgresql(postgres_schema: PostgresSchema) -> None:
    asyncio.run(_one_id_one_claim(postgres_schema.store_url()))


@pytest.mark.system
def test_racing_claims_under_one_id_on_postgresql_take_one(postgres_schema: PostgresSchema) -> None:
    async def run() -> None:
        first, second = await _claims(postgres_schema.store_url()), await _claims(postgres_schema.store_url())
        payment_id = generate_payment_id()
        outcomes = await asyncio.gather(
            *(
                claims.claim(f"{n}" * 64, f"n{n}", "r", "paid", "", payment_id=payment_id)
                for n, claims in ((1, first), (2, second), (3, first), (4, second))
            )
        )
        assert sorted(o.kind for o in outcomes) == ["identified", "identified", "identified", "new"]
        await first.db.close()
        await second.db.close()

    asyncio.run(run())
