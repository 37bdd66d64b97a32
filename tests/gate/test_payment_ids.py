"""Payment identifiers (x402 `payment-identifier`): a re-signed retry of the same request under the
same id is answered from the first payment, charged and delivered once.

A real gate in front of the development facilitator; every payment is signed by the x402 package's
own client, with the id added by the package's own helper (`append_payment_identifier_to_extensions`)
to the extensions the gate's 402 declares. What was charged is read from the development chain.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from x402.extensions.payment_identifier import (
    PAYMENT_IDENTIFIER,
    append_payment_identifier_to_extensions,
    generate_payment_id,
)

from devnet.payer import encode_header, sign_payment
from tests.support.chain_moves import transfers_to
from tests.support.paid import PAY_TO, PaidSetup, Payer, decode_header, send_body

pytestmark = pytest.mark.system


def asked(gate_url: str, agent: str = "paid") -> dict[str, Any]:
    """The gate's 402 document for `agent`."""
    response = httpx.post(f"{gate_url}/a2a/{agent}", json=send_body("price?"), timeout=10)
    assert response.status_code == 402, response.text
    return decode_header(response.headers["PAYMENT-REQUIRED"])


def signed_with_id(document: dict[str, Any], payer: Payer, payment_id: str | None) -> dict[str, Any]:
    """A fresh signature (a new nonce) for the 402 `document`, carrying `payment_id` as the x402
    client helper adds it to the extensions the server declared."""
    extensions = dict(document.get("extensions") or {})
    if payment_id is not None:
        append_payment_identifier_to_extensions(extensions, payment_id)
    return sign_payment({**document, "extensions": extensions}, payer.key)


def header(payload: dict[str, Any]) -> dict[str, str]:
    return {"PAYMENT-SIGNATURE": encode_header(payload)}


def charged(paid: PaidSetup, payer: Payer) -> list[dict[str, Any]]:
    """The transfers from `payer` to payTo on the development chain."""
    return [t for t in transfers_to(paid.facilitator_url, PAY_TO) if t["from_address"].lower() == payer.address.lower()]


def test_a_re_signed_retry_under_the_same_id_is_charged_and_delivered_once(paid: PaidSetup) -> None:
    document = asked(paid.gate.url)
    assert PAYMENT_IDENTIFIER in (document.get("extensions") or {})
    payer, payment_id = Payer(), generate_payment_id()
    first = paid.post("paid", send_body("once"), header(signed_with_id(document, payer, payment_id)))
    assert first.status_code == 200, first.text
    assert first.json()["result"]["status"]["state"] == "completed"
    again = paid.post("paid", send_body("once"), header(signed_with_id(document, payer, payment_id)))
    assert again.status_code == 200, again.text
    assert again.headers.get("X-Idempotent-Replay") == "true"
    assert again.json()["result"]["id"] == first.json()["result"]["id"]
    assert len(charged(paid, payer)) == 1
    assert paid.count_tasks("paid") == 1
