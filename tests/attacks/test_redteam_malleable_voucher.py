"""Red team: a payer's non-canonical voucher signature against a real gate and the development chain.

The settlement contract checks an EOA payer authorizer's voucher with OpenZeppelin's
`ECDSA.recoverCalldata`: 65 bytes, `s <= n/2`, `v` 27 or 28. A signature that ecrecover still
maps to the payer in another form (`s' = n - s` with `v` flipped; `v` given as 0/1; EIP-2098's
64-byte compact form) is refused by the contract, so a voucher the gate charged in such a form
could never be claimed, and its claim batch would revert for every channel in it.

Against `a2a-gate serve --dev-facilitator` (the shipped example configuration, the `paid-channel`
agent, the x402 package's own batch-settlement client): three honest vouchers, then the payer's
fourth voucher in each non-canonical form, each refused as a forgery is (403,
`invalid_batch_settlement_evm_voucher_signature`, no facilitator call), never delivered nor charged;
the honest fourth still pays, and `a2a-gate channels claim` collects exactly the honest total on the
development chain, whose contract refuses the same forms.
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import httpx
from eth_keys import keys
from x402.http import x402HTTPClient
from x402.http.clients import x402_httpx_transport

from gate.schemes.batch_settlement import voucher_digest
from tests.devnet.test_channels_devnet import PRICE, Devnet, charged, devnet, fresh_client
from tests.support.channels import assert_charged_in_turn
from tests.support.paid import PAY_TO, send_body

__all__ = ["devnet"]  # the fixture, imported for this module's tests

SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
INVALID_VOUCHER_SIGNATURE = "invalid_batch_settlement_evm_voucher_signature"


def malleated(signature: str) -> str:
    """The same signature's other half: `s' = n - s`, `v` flipped (ecrecover maps it to the same signer)."""
    raw = bytes.fromhex(signature.removeprefix("0x"))
    s = int.from_bytes(raw[32:64], "big")
    return "0x" + (raw[:32] + (SECP256K1_N - s).to_bytes(32, "big") + bytes([55 - raw[64]])).hex()


def v_as_bit(signature: str) -> str:
    """The same signature with `v` as 0/1, as some signing libraries give it."""
    raw = bytes.fromhex(signature.removeprefix("0x"))
    return "0x" + (raw[:64] + bytes([raw[64] - 27])).hex()


def compact(signature: str) -> str:
    """EIP-2098's 64-byte form: r, then s with v's parity in its top bit."""
    raw = bytes.fromhex(signature.removeprefix("0x"))
    vs = int.from_bytes(raw[32:64], "big") | ((raw[64] - 27) << 255)
    return "0x" + (raw[:32] + vs.to_bytes(32, "big")).hex()


def lenient_signer(digest: bytes, signature: str) -> str:
    """Who plain ecrecover says signed (any s, v as 0/1 or 27/28): the forms below are the payer's own."""
    raw = bytes.fromhex(signature.removeprefix("0x"))
    v = raw[64] - 27 if raw[64] >= 27 else raw[64]
    r, s = int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:64], "big")
    return keys.Signature(vrs=(v, r, s)).recover_public_key_from_msg_hash(digest).to_checksum_address().lower()


def tasks(devnet: Devnet) -> list[tuple[str, str]]:
    conn = sqlite3.connect(devnet.config.parent / "gate.db")
    try:
        return [(row[0], row[1]) for row in conn.execute("SELECT state, document FROM tasks")]
    finally:
        conn.close()


def test_a_non_canonical_voucher_is_refused_undelivered_uncharged_and_the_claim_collects_the_honest_total(
    devnet: Devnet,
) -> None:
    url = f"{devnet.gate.url}/a2a/paid-channel"
    client = fresh_client(devnet)
    pay_to_before = devnet.token_balance(PAY_TO)

    async def honest(count: int, text: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=x402_httpx_transport(client), timeout=30) as http:
            return [await http.post(url, json=send_body(f"{text} {i}")) for i in range(count)]

    async def fourth() -> Any:
        async with httpx.AsyncClient(timeout=30) as http:
            asked = await http.post(url, json=send_body("price?"))
        required = x402HTTPClient(client).get_payment_required_response(asked.headers.get, asked.json())
        return await client.create_payment_payload(required)

    async def send(payload: Any, signature: str, text: str) -> httpx.Response:
        forged = payload.model_copy(deep=True)
        forged.payload["voucher"]["signature"] = signature
        headers = x402HTTPClient(client).encode_payment_signature_header(forged)
        async with httpx.AsyncClient(timeout=30) as http:
            return await http.post(url, json=send_body(text), headers=headers)

    answers = asyncio.run(honest(3, "honest"))
    channel_id = assert_charged_in_turn(answers, PRICE)["extra"]["channelState"]["channelId"]
    payload = asyncio.run(fourth())
    voucher = payload.payload["voucher"]
    assert (voucher["channelId"], voucher["maxClaimableAmount"]) == (channel_id, str(4 * PRICE))
    payer = payload.payload["channelConfig"]["payerAuthorizer"].lower()
    digest = voucher_digest(channel_id, 4 * PRICE, "eip155:84532")
    honest_signature = voucher["signature"]
    assert int(honest_signature[66:130], 16) <= SECP256K1_N // 2  # the package signs low-s

    verifies_before = httpx.get(f"{devnet.facilitator}/dev/ledger").json()["verify_calls"]
    forms = {"malleated": malleated(honest_signature), "v-bit": v_as_bit(honest_signature)}
    for name, signature in forms.items():
        assert lenient_signer(digest, signature) == payer  # a signature the payer made, in another form
        answer = asyncio.run(send(payload, signature, f"non-canonical {name}"))
        assert answer.status_code == 403, (name, answer.status_code, answer.text)
        assert answer.json()["error"] == INVALID_VOUCHER_SIGNATURE, name
        assert "PAYMENT-RESPONSE" not in answer.headers
    answer = asyncio.run(send(payload, compact(honest_signature), "non-canonical compact"))
    assert answer.status_code == 403 and answer.json()["error"] == INVALID_VOUCHER_SIGNATURE, answer.text
    assert httpx.get(f"{devnet.facilitator}/dev/ledger").json()["verify_calls"] == verifies_before
    stored = tasks(devnet)
    assert len(stored) == 3 and all(state == "completed" for state, _ in stored), stored
    assert not any("non-canonical" in task for _, task in stored)  # never run, never delivered
    assert charged(devnet, channel_id) == 3 * PRICE

    # the honest fourth voucher, in the form the contract takes, still pays: the channel is not wedged
    answer = asyncio.run(send(payload, honest_signature, "honest 3"))
    assert answer.status_code == 200, answer.text
    assert charged(devnet, channel_id) == 4 * PRICE

    done = devnet.cli("channels", "claim")
    assert done.returncode == 0, done.stdout + done.stderr
    assert devnet.channel(channel_id)[1] == 4 * PRICE  # the chain's claimed total is the honest total
    assert devnet.token_balance(PAY_TO) - pay_to_before == 4 * PRICE
