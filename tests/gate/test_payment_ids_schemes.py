"""Payment identifiers for every scheme: a retry re-signed under the same id (a new Permit2 nonce, a
new upto authorization, a new channel voucher) is answered from the first payment, and the money
moves once. Real gate processes; every payment signed by the x402 package's own clients, the id
added by its own helper; what moved is read from the development chain (or, for channels, the
channel's charged total and the test contract)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from x402.extensions.payment_identifier import append_payment_identifier_to_extensions, generate_payment_id

from devnet.payer import encode_header, sign_payment
from tests.support.gate_process import free_port
from tests.support.paid import ASSET, PAY_TO, Payer, send_body
from tests.support.upto import UptoSetup, sign_upto, upto_config

pytestmark = pytest.mark.system

PERMIT2_AGENT = f"""
[agents.paid-permit2]
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}", asset_transfer_method = "permit2" }}
"""


@pytest.fixture
def devnet_gate(tmp_path: Path, start_gate, write_config) -> Iterator[UptoSetup]:
    """A gate with `upto` agents and an `exact` by Permit2 one, before the development facilitator."""
    from devnet.facilitator import create_facilitator_app
    from tests.support.serve import serve_app

    with serve_app(create_facilitator_app(str(tmp_path / "ledger.db")), wait_on_exit=False) as facilitator:
        port = free_port()
        config = write_config(upto_config(f"http://127.0.0.1:{port}", facilitator, PERMIT2_AGENT))
        yield UptoSetup(start_gate(config, port=port), facilitator, tmp_path / "gate.db")


def with_id(document: dict[str, Any], payment_id: str) -> dict[str, Any]:
    """The 402 document with `payment_id` added by the x402 helper to the extensions it declares."""
    extensions = dict(document["extensions"])
    append_payment_identifier_to_extensions(extensions, payment_id)
    return {**document, "extensions": extensions}


def post(url: str, payload: dict[str, Any], text: str) -> httpx.Response:
    return httpx.post(url, json=send_body(text), headers={"PAYMENT-SIGNATURE": encode_header(payload)}, timeout=30)


def test_upto_a_re_signed_retry_under_the_id_is_settled_once(devnet_gate: UptoSetup) -> None:
    payer, payment_id = Payer(), generate_payment_id()
    before = devnet_gate.balance(payer.address)
    document = with_id(devnet_gate.offer("paid-metered"), payment_id)
    first = post(devnet_gate.url("paid-metered"), sign_upto(document, payer.key), "metered once")
    assert first.json()["result"]["status"]["state"] == "completed", first.text
    again = post(devnet_gate.url("paid-metered"), sign_upto(document, payer.key), "metered once")
    assert again.headers.get("X-Idempotent-Replay") == "true", again.text
    assert again.json()["result"]["id"] == first.json()["result"]["id"]
    [transfer] = [t for t in devnet_gate.transfers() if t["from"].lower() == payer.address.lower()]
    assert devnet_gate.balance(payer.address) == before - transfer["amount"]
    other = post(devnet_gate.url("paid-metered"), sign_upto(document, Payer().key), "metered once")
    assert other.status_code == 409 and other.json()["error"] == "payment_identifier_conflict"


def test_exact_by_permit2_a_re_signed_retry_under_the_id_is_settled_once(devnet_gate: UptoSetup) -> None:
    payer, payment_id = Payer(), generate_payment_id()
    before = devnet_gate.balance(payer.address)
    document = with_id(devnet_gate.offer("paid-permit2"), payment_id)
    assert document["accepts"][0]["extra"]["assetTransferMethod"] == "permit2"
    signed = [sign_payment(document, payer.key) for _ in range(2)]
    assert (
        signed[0]["payload"]["permit2Authorization"]["nonce"] != signed[1]["payload"]["permit2Authorization"]["nonce"]
    )
    first = post(devnet_gate.url("paid-permit2"), signed[0], "permit2 once")
    assert first.json()["result"]["status"]["state"] == "completed", first.text
    again = post(devnet_gate.url("paid-permit2"), signed[1], "permit2 once")
    assert again.headers.get("X-Idempotent-Replay") == "true", again.text
    assert devnet_gate.balance(payer.address) == before - 1000
    assert len([s for s in devnet_gate.ledger()["permit2_settlements"] if s["from_address"] == payer.address]) == 1
