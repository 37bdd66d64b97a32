"""The paid path end to end: gate and development facilitator as real servers.

Tokens are signed by the x402 package's client; charges are counted in the
facilitator's ledger and the gate's payment log, from the moment each test began.
"""

from __future__ import annotations

import base64
import json

import httpx
import pytest

from devnet.payer import encode_header
from tests.support.paid import PaidView, Payer, decode_header, send_body


@pytest.fixture
def paid(shared_paid: PaidView) -> PaidView:
    """The shared paid gate and facilitator; each test counts only its own payer's work (PaidView)."""
    return shared_paid


def test_no_token_is_a_402_naming_this_door(paid):
    response = paid.post("paid", send_body("hello"))
    assert response.status_code == 402
    document = decode_header(response.headers["PAYMENT-REQUIRED"])
    body = response.json()
    assert {k: body[k] for k in ("detail", "payment_required")} == {
        "detail": "Payment required",
        "payment_required": document,
    }
    # x402 v1 clients read the top level: the same price with v1 network names
    [v1] = body["accepts"]
    assert (body["x402Version"], body["error"]) == (1, "Payment required to use this agent")
    assert (v1["network"], v1["maxAmountRequired"], v1["resource"]) == (
        "base-sepolia",
        "1000",
        document["resource"]["url"],
    )
    assert document["x402Version"] == 2
    assert document["resource"]["url"] == f"{paid.gate.url}/a2a/paid"
    [offer] = document["accepts"]
    assert (offer["scheme"], offer["network"], offer["amount"]) == ("exact", "eip155:84532", "1000")
    assert paid.ledger()["verify_calls"] == 0


def test_paid_send_delivers_then_settles_once(paid):
    payer = Payer()
    response = paid.post("paid", send_body("hello"), payer.header_for(paid.gate.url))
    assert response.status_code == 200
    task = response.json()["result"]
    assert task["status"]["state"] == "completed"
    assert task["artifacts"][0]["parts"] == [{"kind": "text", "text": "hello"}]
    metadata = task["status"]["message"]["metadata"]
    assert metadata["x402.payment.status"] == "payment-completed"
    [receipt] = metadata["x402.payment.receipts"]
    assert receipt["success"] is True and receipt["payer"].lower() == payer.address.lower()
    assert task["metadata"] == metadata
    assert decode_header(response.headers["PAYMENT-RESPONSE"]) == receipt
    ledger = paid.ledger()
    assert len(ledger["settlements"]) == 1
    assert ledger["settlements"][0]["from_address"].lower() == payer.address.lower()
    assert [r["action"] for r in paid.payment_rows()] == ["verify", "settle"]


def test_token_in_message_metadata_is_used_first(paid):
    payer = Payer()
    token = payer.token_for(paid.gate.url)
    other = Payer().header_for(paid.gate.url)  # a second, valid token in the header
    response = paid.post("paid", send_body("meta", metadata={"x402.payment.payload": token}), other)
    assert response.status_code == 200
    receipt = response.json()["result"]["metadata"]["x402.payment.receipts"][0]
    assert receipt["payer"].lower() == payer.address.lower()
    assert len(paid.ledger()["settlements"]) == 1


def test_v1_dialect_send_message_is_paid_too(paid):
    headers = {**Payer().header_for(paid.gate.url), "A2A-Version": "1.0"}
    response = paid.post("paid", send_body("v1", method="SendMessage"), headers)
    result = response.json()["result"]
    assert result["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert result["task"]["metadata"]["x402.payment.status"] == "payment-completed"


def test_same_token_same_request_replays_without_new_charge(paid):
    headers = Payer().header_for(paid.gate.url)
    first = paid.post("paid", send_body("once"), headers)
    again = paid.post("paid", send_body("once", call_id=2), headers)  # a fresh messageId, like a real retry
    assert again.status_code == 200
    assert again.headers["X-Idempotent-Replay"] == "true"
    assert again.json()["result"]["id"] == first.json()["result"]["id"]
    assert again.json()["id"] == 2
    assert len(paid.ledger()["settlements"]) == 1
    assert [r["action"] for r in paid.payment_rows()] == ["verify", "settle", "replay"]


def test_same_token_different_request_is_rejected(paid):
    headers = Payer().header_for(paid.gate.url)
    assert paid.post("paid", send_body("first"), headers).status_code == 200
    response = paid.post("paid", send_body("second"), headers)
    assert response.status_code == 403
    assert response.json() == {"detail": "Payment verification failed", "error": "payment_already_used"}
    assert paid.count_tasks("paid") == 1
    assert len(paid.ledger()["settlements"]) == 1


def test_same_authorization_in_another_wrapper_is_rejected(paid):
    token = Payer().token_for(paid.gate.url)
    assert paid.post("paid", send_body("a"), {"PAYMENT-SIGNATURE": encode_header(token)}).status_code == 200
    rewrapped = {**token, "extensions": {"anything": True}}  # another digest, the same EVM nonce
    response = paid.post("paid", send_body("b"), {"PAYMENT-SIGNATURE": encode_header(rewrapped)})
    assert response.status_code == 403
    assert response.json()["error"] == "authorization_nonce_already_used"
    assert len(paid.ledger()["settlements"]) == 1


def test_local_checks_refuse_before_the_facilitator(paid):
    token = Payer().token_for(paid.gate.url)
    cheaper = {**token, "accepted": {**token["accepted"], "amount": "1"}}
    response = paid.post("paid", send_body("x"), {"PAYMENT-SIGNATURE": encode_header(cheaper)})
    assert response.status_code == 403
    assert response.json()["error"] == "accepted_requirements_mismatch"
    other_door = paid.post("vip", send_body("x"), {"PAYMENT-SIGNATURE": encode_header(token)})
    assert other_door.status_code == 403 and other_door.json()["error"] == "resource_mismatch"
    assert paid.ledger()["verify_calls"] == 0
    assert {r["action"] for r in paid.payment_rows()} == {"reject"}


def test_invalid_signature_is_a_403_and_costs_nothing(paid):
    token = Payer().token_for(paid.gate.url)
    signature = token["payload"]["signature"]
    forged = {
        **token,
        "payload": {**token["payload"], "signature": signature[:-4] + ("0000" if signature[-4:] != "0000" else "1111")},
    }
    response = paid.post("paid", send_body("x"), {"PAYMENT-SIGNATURE": encode_header(forged)})
    assert response.status_code == 403
    assert response.json()["detail"] == "Payment verification failed"
    assert paid.count_tasks("paid") == 0
    assert paid.ledger()["settlements"] == []


def test_malformed_tokens_mean_no_token(paid):
    for value in [
        "%%%",
        base64.b64encode(b"not json").decode(),
        base64.b64encode(b"[1,2]").decode(),
        encode_header({"x402Version": True, "payload": {}}),
        "A" * 12_000,
    ]:
        response = paid.post("paid", send_body("x"), {"PAYMENT-SIGNATURE": value, "X-PAYMENT": value})
        assert response.status_code == 402, value[:20]
    bad_metadata = {"x402.payment.payload": {"x402Version": "2", "payload": "nope"}}
    assert paid.post("paid", send_body("x", metadata=bad_metadata)).status_code == 402


def test_a_bearer_payment_token_is_not_a_payment(paid):
    token = encode_header(Payer().token_for(paid.gate.url))
    response = paid.post("paid", send_body("x"), {"Authorization": f"Bearer {token}"})
    assert response.status_code == 402


def test_message_without_usable_parts_is_invalid_params_before_any_token(paid):
    body = send_body("x")
    body["params"]["message"]["parts"] = [{"kind": "text", "text": ""}, {"kind": "mystery"}]
    response = paid.post("paid", body, Payer().header_for(paid.gate.url))
    assert response.status_code == 200
    assert response.json()["error"]["code"] == -32602
    assert paid.ledger()["verify_calls"] == 0


def test_failed_work_is_not_charged_and_the_token_may_retry(paid):
    headers = Payer().header_for(paid.gate.url, "paid-broken")
    response = paid.post("paid-broken", send_body("x"), headers)
    task = response.json()["result"]
    assert task["status"]["state"] == "failed"
    assert "x402.payment.receipts" not in json.dumps(task)
    assert paid.ledger()["settle_calls"] == 0
    assert [r["action"] for r in paid.payment_rows()] == ["verify", "release"]
    retry = paid.post("paid-broken", send_body("x"), headers)  # the claim was released
    assert retry.json()["result"]["status"]["state"] == "failed"
    assert paid.ledger()["settle_calls"] == 0


def test_payer_allowlist_refuses_after_verify(paid):
    from tests.support.paid import ALLOWED_KEY

    refused = paid.post("vip", send_body("x"), Payer().header_for(paid.gate.url, "vip"))
    assert refused.status_code == 403 and refused.json()["error"] == "payer_not_allowed"
    allowed = paid.post("vip", send_body("x"), Payer(ALLOWED_KEY).header_for(paid.gate.url, "vip"))
    assert allowed.json()["result"]["status"]["state"] == "completed"
    assert len(paid.ledger()["settlements"]) == 1


def test_unknown_unexposed_and_unpriced_agents_look_the_same(paid):
    answers = {name: paid.post(name, send_body("x")) for name in ("nope", "unpaid-hidden", "echo")}
    first = answers["nope"]
    assert first.status_code == 401 and first.headers["WWW-Authenticate"] == "Bearer"
    assert first.json() == {"detail": "Not authenticated"}
    for response in answers.values():
        assert (response.status_code, response.content, response.headers["www-authenticate"]) == (
            401,
            first.content,
            "Bearer",
        )


def test_streaming_paid_send_settles_in_the_final_event(paid):
    headers = Payer().header_for(paid.gate.url)
    with httpx.stream(
        "POST", f"{paid.gate.url}/a2a/paid", json=send_body("s", method="message/stream"), headers=headers, timeout=30
    ) as response:
        events = [json.loads(line[6:])["result"] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[0]["kind"] == "task"
    final = events[-1]
    assert final["kind"] == "status-update" and final["final"] is True
    assert final["status"]["state"] == "completed"
    assert final["status"]["message"]["metadata"]["x402.payment.status"] == "payment-completed"
    assert len(paid.ledger()["settlements"]) == 1


def test_x402_httpx_hooks_pay_transparently(paid):
    """The x402 package's own httpx payment hooks: 402 -> sign -> retry -> 200."""
    import asyncio

    from eth_account import Account
    from x402 import x402Client
    from x402.http.clients.httpx import x402HttpxClient
    from x402.mechanisms.evm.exact import register_exact_evm_client

    payer = Payer()

    async def run() -> httpx.Response:
        client = x402Client()
        register_exact_evm_client(client, Account.from_key(payer.key))
        async with x402HttpxClient(client, timeout=30) as http:
            return await http.post(f"{paid.gate.url}/a2a/paid", json=send_body("hooks"))

    response = asyncio.run(run())
    assert response.status_code == 200, response.text
    assert response.json()["result"]["metadata"]["x402.payment.status"] == "payment-completed"
    assert "PAYMENT-RESPONSE" in response.headers
    assert len(paid.ledger()["settlements"]) == 1


def test_a_v1_payer_gets_its_receipt_where_x402_1_reads_it(paid):
    """An x402 v1 payer (X-PAYMENT) reads its receipt in X-PAYMENT-RESPONSE, as x402 1.0's own
    middleware sets it; PAYMENT-RESPONSE carries the same, and a replay answers both again."""
    payer = Payer()
    offer = paid.post("paid", send_body("v1 price?")).json()["accepts"][0]
    headers = {"X-PAYMENT": encode_header(payer.sign_v1(offer))}
    response = paid.post("paid", send_body("paid in v1"), headers)
    assert response.json()["result"]["metadata"]["x402.payment.status"] == "payment-completed"
    assert response.headers["X-PAYMENT-RESPONSE"] == response.headers["PAYMENT-RESPONSE"]
    assert decode_header(response.headers["X-PAYMENT-RESPONSE"])["success"] is True
    replay = paid.post("paid", send_body("paid in v1"), headers)
    assert replay.headers["X-Idempotent-Replay"] == "true"
    assert replay.headers["X-PAYMENT-RESPONSE"] == response.headers["X-PAYMENT-RESPONSE"]


def test_a_v2_payer_gets_no_legacy_receipt_header(paid):
    response = paid.post("paid", send_body("paid in v2"), Payer().header_for(paid.gate.url))
    assert "PAYMENT-RESPONSE" in response.headers and "X-PAYMENT-RESPONSE" not in response.headers
