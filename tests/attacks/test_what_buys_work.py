"""What buys work: only bytes the gate understands, in a window long enough to collect.

Attacks against a real gate process: one Permit2 signature wrapped with decoy
EIP-3009 authorizations (against a facilitator that verifies Permit2 the way the x402
package does), tokens whose window closes before the work can be settled, a
facilitator 400 for a malformed payload, and a retry of a settled request after its
token expired.
"""

from __future__ import annotations

import copy
import time

import httpx
import pytest

from devnet.payer import encode_header, sign_payment
from gate.config import parse_config
from server.config import ConfigError
from tests.support.gate_process import free_port
from tests.support.paid import PAY_TO, PaidView, Payer, decode_header, decoy_authorization, paid_config, send_body


@pytest.fixture
def paid(shared_paid: PaidView) -> PaidView:
    """The shared paid gate; each test counts only its own payer's work (PaidView)."""
    return shared_paid


def price_of(gate_url: str, agent: str = "paid") -> dict:
    response = httpx.post(f"{gate_url}/a2a/{agent}", json=send_body("price?"))
    assert response.status_code == 402
    return decode_header(response.headers["PAYMENT-REQUIRED"])


@pytest.fixture
def permit2_gate(tmp_path, start_gate, write_config):
    from tests.support.permit2_facilitator import create_permit2_facilitator_app
    from tests.support.serve import serve_app

    with serve_app(create_permit2_facilitator_app(str(tmp_path / "ledger.db"))) as facilitator:
        port = free_port()
        gate = start_gate(write_config(paid_config(f"http://127.0.0.1:{port}", facilitator)), port=port)
        yield gate, facilitator


def test_one_permit2_signature_wrapped_n_times_buys_nothing(permit2_gate):
    gate, facilitator = permit2_gate
    payer = Payer()
    offer = price_of(gate.url)
    offer["accepts"][0]["extra"]["assetTransferMethod"] = "permit2"
    signed = sign_payment(offer, payer.key)  # ONE Permit2 signature
    assert set(signed["payload"]) == {"permit2Authorization", "signature"}
    # the facilitator takes this signature: the x402 scheme verifies permit2Authorization
    check = httpx.post(
        f"{facilitator}/verify",
        json={"x402Version": 2, "paymentPayload": signed, "paymentRequirements": price_of(gate.url)["accepts"][0]},
    )
    assert check.json()["isValid"] is True, check.text

    answers = []
    for i in range(5):  # N wrappers, each with a fresh decoy EIP-3009 authorization
        wrapped = copy.deepcopy(signed)
        wrapped["payload"]["authorization"] = decoy_authorization(payer)
        answers.append(
            httpx.post(
                f"{gate.url}/a2a/paid",
                json=send_body(f"work {i}"),
                headers={"PAYMENT-SIGNATURE": encode_header(wrapped)},
                timeout=30,
            )
        )
    delivered = [
        a
        for a in answers
        if a.status_code == 200 and a.json().get("result", {}).get("status", {}).get("state") == "completed"
    ]
    counts = httpx.get(f"{facilitator}/dev/counts").json()
    assert delivered == [], f"{len(delivered)} deliveries for one signature; facilitator: {counts}"
    assert [(a.status_code, a.json()["error"]) for a in answers] == [(403, "unsupported_payload")] * 5
    assert counts["verify"] == 1 and counts["settle"] == 0  # only the sanity check above reached it
    # the bare Permit2 payload is refused the same way: the gate cannot claim what it does not read
    bare = httpx.post(
        f"{gate.url}/a2a/paid", json=send_body("bare"), headers={"PAYMENT-SIGNATURE": encode_header(signed)}
    )
    assert (bare.status_code, bare.json()["error"]) == (403, "unsupported_payload")


def short_token(gate_url: str, payer: Payer, agent: str, seconds: int) -> dict:
    """A real token signed for a window of `seconds` (the x402 client signs validBefore = now + maxTimeoutSeconds)."""
    offer = price_of(gate_url, agent)
    offer["accepts"][0]["maxTimeoutSeconds"] = seconds
    return sign_payment(offer, payer.key)


@pytest.mark.parametrize(("agent", "text"), [("paid", "hello"), ("paid-slow", "sleep 2")])
def test_a_window_too_short_to_collect_is_refused_before_any_work(paid, agent, text):
    payer = Payer()
    token = short_token(paid.gate.url, payer, agent, 7)
    answer = paid.post(agent, send_body(text), {"PAYMENT-SIGNATURE": encode_header(token)})
    ledger = paid.ledger()
    assert (answer.status_code, answer.json().get("error")) == (403, "payment_window_too_short"), (answer.text, ledger)
    assert ledger["verify_calls"] == 0 and paid.count_tasks(agent) == 0
    assert [r["error"] for r in paid.payment_rows("reject")] == ["payment_window_too_short"]
    # the price says how long a token must live, and an honest client's token is long enough
    offered = price_of(paid.gate.url, agent)["accepts"][0]["maxTimeoutSeconds"]
    assert offered >= 120 + 6
    honest = paid.post(agent, send_body(text), payer.header_for(paid.gate.url, agent))
    assert honest.json()["result"]["metadata"]["x402.payment.status"] == "payment-completed"


def test_max_timeout_seconds_covers_the_payment_window(tmp_path):
    price = '{ network = "eip155:84532", asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e", amount = "1", pay_to = "%s"%s }'

    def agents(deadline: float, max_timeout: str = "") -> dict:
        import tomllib

        text = f"[agents.a]\ndeadline_seconds = {deadline}\nprice = {price % (PAY_TO, max_timeout)}\n"
        return tomllib.loads(text)

    grown = parse_config(agents(900), base_dir=tmp_path).anonymous.price("a")
    assert grown.max_timeout_seconds >= 900 + 6 + 30  # deadline + settle margin + the client's time
    assert parse_config(agents(60), base_dir=tmp_path).anonymous.price("a").max_timeout_seconds == 300
    with pytest.raises(ConfigError, match=r"agents\.a\.price\.max_timeout_seconds"):
        parse_config(agents(900, ", max_timeout_seconds = 300"), base_dir=tmp_path)


FACILITATOR_400_RESOURCE = {"url": None, "mimeType": 12}  # the facilitator's schema wants strings


def test_a_facilitator_400_for_a_malformed_payload_is_the_payers_problem(paid):
    token = Payer().token_for(paid.gate.url)
    token["resource"] = {**FACILITATOR_400_RESOURCE, "url": token["resource"]["url"]}
    direct = httpx.post(
        f"{paid.facilitator_url}/verify",
        json={"x402Version": 2, "paymentPayload": token, "paymentRequirements": token["accepted"]},
    )
    assert direct.status_code == 400  # the development facilitator's answer to a malformed payload
    answer = paid.post("paid", send_body("x"), {"PAYMENT-SIGNATURE": encode_header(token)})
    assert (answer.status_code, answer.json()) == (
        403,
        {"detail": "Payment verification failed", "error": "invalid_payload"},
    )
    assert paid.count_tasks("paid") == 0
    # our outage stays ours
    paid.faults(verify="http500")
    down = paid.post("paid", send_body("x"), Payer().header_for(paid.gate.url))
    assert down.json()["error"]["data"]["code"] == "verify_unavailable"


SHORT_CONFIG = """
public_url = "{public_url}"
database = "gate.db"

[facilitator]
url = "{facilitator}"
timeout_seconds = 0.5
max_wait_seconds = 0.5
settle_attempts = 1
settle_margin_seconds = 6

[agents.quick]
deadline_seconds = 1
price = {{ network = "eip155:84532", asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e", amount = "1000", pay_to = "{pay_to}", max_timeout_seconds = 40 }}
"""


def test_a_retry_of_a_settled_request_is_a_replay_after_its_token_expired(
    tmp_path, facilitator, start_gate, write_config
):
    port = free_port()
    gate = start_gate(
        write_config(
            SHORT_CONFIG.format(public_url=f"http://127.0.0.1:{port}", facilitator=facilitator, pay_to=PAY_TO)
        ),
        port=port,
    )
    token = short_token(gate.url, Payer(), "quick", 10)  # a window of 8 s is needed here: 1 + 1 + 6
    body = send_body("once")
    first = httpx.post(
        f"{gate.url}/a2a/quick", json=body, headers={"PAYMENT-SIGNATURE": encode_header(token)}, timeout=10
    )
    assert first.json()["result"]["metadata"]["x402.payment.status"] == "payment-completed", first.text
    expires = int(token["payload"]["authorization"]["validBefore"])
    time.sleep(max(0.0, expires - time.time()) + 1.1)
    retry = httpx.post(
        f"{gate.url}/a2a/quick", json=body, headers={"PAYMENT-SIGNATURE": encode_header(token)}, timeout=10
    )
    assert retry.status_code == 200 and retry.headers.get("X-Idempotent-Replay") == "true", retry.text
    assert retry.json()["result"]["id"] == first.json()["result"]["id"]
    assert len(httpx.get(f"{facilitator}/dev/ledger").json()["settlements"]) == 1
