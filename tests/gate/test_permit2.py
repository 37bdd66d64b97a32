"""x402 `exact` with Permit2, through the scheme seam, against a real gate process.

The facilitator here verifies and settles Permit2 the way the x402 package's own does
(tests/support/permit2_facilitator.py). An agent priced with `asset_transfer_method =
"permit2"` offers Permit2 in its 402; a payload the x402 client signed for it is checked field
by field, claimed on (owner, Permit2 nonce), verified, delivered once and settled once; the same
signature in any other wrapping is a replay or a refusal.
"""

from __future__ import annotations

import copy
import sqlite3
import time

import httpx
import pytest

from devnet.payer import encode_header, sign_payment
from tests.support.gate_process import free_port
from tests.support.paid import ASSET, PAY_TO, Payer, decode_header, decoy_authorization, paid_config, send_body

PERMIT2_AGENT = f"""
[agents.paid-permit2]
description = "paid echo, by Permit2"
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}", asset_transfer_method = "permit2" }}
"""


@pytest.fixture
def permit2_gate(tmp_path, start_gate, write_config):
    from tests.support.permit2_facilitator import create_permit2_facilitator_app
    from tests.support.serve import serve_app

    with serve_app(create_permit2_facilitator_app(str(tmp_path / "ledger.db"))) as facilitator:
        port = free_port()
        config = write_config(paid_config(f"http://127.0.0.1:{port}", facilitator) + PERMIT2_AGENT)
        yield start_gate(config, port=port), facilitator, tmp_path / "gate.db"


def offer(gate_url: str, agent: str = "paid-permit2") -> dict:
    response = httpx.post(f"{gate_url}/a2a/{agent}", json=send_body("price?"))
    assert response.status_code == 402
    return decode_header(response.headers["PAYMENT-REQUIRED"])


def pay(gate_url: str, token: dict, text: str) -> httpx.Response:
    headers = {"PAYMENT-SIGNATURE": encode_header(token)}
    return httpx.post(f"{gate_url}/a2a/paid-permit2", json=send_body(text), headers=headers, timeout=30)


def state(answer: httpx.Response) -> str:
    return answer.json().get("result", {}).get("status", {}).get("state", "")


def rows(db, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_a_permit2_price_offers_permit2_and_an_eip3009_price_does_not(permit2_gate):
    gate, _, _ = permit2_gate
    [permit2] = offer(gate.url)["accepts"]
    assert permit2["extra"]["assetTransferMethod"] == "permit2" and permit2["scheme"] == "exact"
    [eip3009] = offer(gate.url, "paid")["accepts"]
    assert "assetTransferMethod" not in eip3009["extra"]
    card = httpx.get(f"{gate.url}/a2a/paid-permit2/.well-known/agent-card.json").json()
    [accepted] = card["capabilities"]["extensions"][0]["params"]["accepts"]
    assert accepted["extra"]["assetTransferMethod"] == "permit2"


def test_one_permit2_signature_buys_one_delivery_settled_once(permit2_gate):
    gate, facilitator, db = permit2_gate
    payer = Payer()
    signed = sign_payment(offer(gate.url), payer.key)  # the x402 client's own Permit2 signature
    assert set(signed["payload"]) == {"permit2Authorization", "signature"}

    paid = pay(gate.url, signed, "work once")
    assert paid.status_code == 200, paid.text
    assert state(paid) == "completed"
    metadata = paid.json()["result"]["status"]["message"]["metadata"]
    assert metadata["x402.payment.status"] == "payment-completed"
    assert "PAYMENT-RESPONSE" in paid.headers
    # the same token and request: the stored answer, no second settle
    again = pay(gate.url, signed, "work once")
    assert again.headers.get("X-Idempotent-Replay") == "true" and state(again) == "completed"
    # the same signature for other work, and in other wrappings: refused
    other_work = pay(gate.url, signed, "more work")
    rewrapped = {**copy.deepcopy(signed), "extensions": {}}  # another token digest, the same Permit2 nonce
    decoy = copy.deepcopy(signed)
    decoy["payload"]["authorization"] = decoy_authorization(payer)
    refusals = [pay(gate.url, token, text) for token, text in ((rewrapped, "work once"), (decoy, "decoy"))]
    answers = [(a.status_code, a.json().get("error")) for a in (other_work, *refusals)]
    assert answers == [
        (403, "payment_already_used"),
        (403, "authorization_nonce_already_used"),
        (403, "unsupported_payload"),
    ]

    counts = httpx.get(f"{facilitator}/dev/counts").json()
    assert counts["settled"] == 1 and counts["permit2_settlements"] == 1, counts
    assert counts["verify"] == 1, counts  # the refusals never reached the facilitator
    delivered = rows(db, "SELECT state FROM tasks WHERE agent = 'paid-permit2' AND owner LIKE 'payer:%'")
    assert delivered == [("completed",)]
    [(nonce_key, claim_state)] = rows(db, "SELECT nonce_key, state FROM claims WHERE agent = 'paid-permit2'")
    nonce = signed["payload"]["permit2Authorization"]["nonce"]
    assert nonce_key == f"eip155:84532|permit2|{payer.address.lower()}|{nonce}" and claim_state == "settled"
    actions = [r[0] for r in rows(db, "SELECT action FROM payments WHERE agent = 'paid-permit2' ORDER BY id")]
    assert actions.count("settle") == 1 and actions.count("verify") == 1


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda a: a.update(spender="0x" + "11" * 20), "invalid_permit2_spender"),
        (lambda a: a["witness"].update(to="0x" + "22" * 20), "recipient_mismatch"),
        (lambda a: a["permitted"].update(amount="999"), "amount_mismatch"),
        (lambda a: a["permitted"].update(token="0x" + "33" * 20), "asset_mismatch"),
        (lambda a: a["witness"].update(extra="x"), "invalid_payload"),
        (lambda a: a.update(nonce="0x01"), "invalid_payload"),
        (lambda a: a.update(deadline=str(int(time.time()) + 5)), "payment_window_too_short"),
    ],
)
def test_every_permit2_field_is_checked_before_the_facilitator(permit2_gate, change, reason):
    gate, facilitator, _ = permit2_gate
    signed = sign_payment(offer(gate.url), Payer().key)
    change(signed["payload"]["permit2Authorization"])
    answer = pay(gate.url, signed, "tampered")
    assert (answer.status_code, answer.json().get("error")) == (403, reason)
    assert httpx.get(f"{facilitator}/dev/counts").json()["verify"] == 0


def test_an_eip3009_price_still_refuses_a_permit2_payload(permit2_gate):
    gate, facilitator, _ = permit2_gate
    wanted = offer(gate.url, "paid")
    wanted["accepts"][0]["extra"]["assetTransferMethod"] = "permit2"
    signed = sign_payment(wanted, Payer().key)
    answer = httpx.post(
        f"{gate.url}/a2a/paid", json=send_body("x"), headers={"PAYMENT-SIGNATURE": encode_header(signed)}
    )
    assert (answer.status_code, answer.json()["error"]) == (403, "unsupported_payload")
    assert httpx.get(f"{facilitator}/dev/counts").json()["verify"] == 0
