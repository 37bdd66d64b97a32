"""Secrets never leave their slot: no token, signature or API key in the database, the logs or an answer.

Tokens travel through every source the gate reads (PAYMENT-SIGNATURE, legacy X-PAYMENT,
message metadata on the HTTP flow, the in-band a2a-x402 flow, streams, the v1.0 dialect,
a v1.0 client's whole-number floats), through refusals, replays and task reads; then
every byte of the database file, its WAL, the server log and every answer is searched
for each token's signature, with and without `0x`.
"""

from __future__ import annotations

import copy
from typing import Any

import httpx

from devnet.payer import encode_header
from tests.support.gate_helpers import create_key
from tests.support.in_band import ACTIVATE, forge, offer_v1, paying_body, task_of
from tests.support.paid import Payer, send_body


class Secrets:
    """The secrets sent so far, and every answer the gate gave."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self.answers: list[str] = []

    def token(self, token: dict[str, Any]) -> dict[str, Any]:
        signature = token["payload"]["signature"]
        self.values.extend([encode_header(token), signature, signature.removeprefix("0x")])
        return token

    def answer(self, response: httpx.Response) -> httpx.Response:
        self.answers.append(response.text + "\n" + "\n".join(f"{k}: {v}" for k, v in response.headers.items()))
        return response


def as_struct_numbers(token: dict[str, Any]) -> dict[str, Any]:
    """The token as a protobuf Struct carries it: every number a double (x402Version 1.0)."""
    out = copy.deepcopy(token)
    out["x402Version"] = float(out["x402Version"])
    return out


def test_no_token_signature_or_key_is_kept_or_echoed(paid):
    api_key = create_key(paid.gate.config, "ops", ["echo"])
    payer = Payer()
    seen = Secrets()
    seen.values.append(api_key)

    def post(agent: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
        return seen.answer(paid.post(agent, body, headers))

    def pay_header(agent: str = "paid", **fault: str) -> None:
        token = seen.token(payer.token_for(paid.gate.url, agent))
        if fault:
            paid.faults(**fault)
        post(agent, send_body("hi"), {"PAYMENT-SIGNATURE": encode_header(token)})
        paid.faults()

    # PAYMENT-SIGNATURE: settled, settle owed, verify unavailable, failed work
    pay_header()
    pay_header(settle="http500")
    pay_header(verify="http500")
    pay_header("paid-broken")

    # in-band payment required: the v1 requirements every v1 token below is signed for
    required = task_of(post("paid", send_body("what do you cost?"), ACTIVATE).json()["result"])
    offer = offer_v1(required)

    # legacy X-PAYMENT (x402 v1)
    legacy = seen.token(payer.sign_v1(offer))
    post("paid", send_body("legacy"), {"X-PAYMENT": encode_header(legacy)})

    # metadata on the HTTP flow, v0.3 and v1.0, send and stream; then the same again (a replay)
    for method in ("message/send", "SendMessage", "message/stream", "SendStreamingMessage"):
        token = seen.token(payer.token_for(paid.gate.url))
        body = send_body(f"meta {method}", method=method, metadata={"x402.payment.payload": token})
        post("paid", body)
        post("paid", body)
    # as the v1.0 SDK client sends it: x402Version 1.0
    struct_token = seen.token(payer.token_for(paid.gate.url))
    post(
        "paid",
        send_body("struct", method="SendMessage", metadata={"x402.payment.payload": as_struct_numbers(struct_token)}),
    )
    post(
        "paid",
        send_body(
            "struct in band",
            method="SendMessage",
            metadata={"x402.payment.payload": as_struct_numbers(seen.token(payer.token_for(paid.gate.url)))},
        ),
        ACTIVATE,
    )

    # a token of no usable shape in the first in-band message (stored while payment is pending)
    odd = seen.token(payer.token_for(paid.gate.url))
    odd["x402Version"] = 7
    post("paid", send_body("odd", metadata={"x402.payment.payload": odd}), ACTIVATE)

    # the in-band flow, send and stream: pay, replay, read the task back with the token as proof
    for method in ("message/send", "message/stream", "SendStreamingMessage"):
        first = post("paid", send_body(f"in band {method}", method=method), ACTIVATE)
        task_id = (
            first.text.split('"id":"', 1)[1].split('"', 1)[0]
            if "stream" in method.lower()
            else task_of(first.json()["result"])["id"]
        )
        token = seen.token(payer.sign_v1(offer))
        paying = paying_body("Payment authorization provided", task_id, token, method=method)
        post("paid", paying, ACTIVATE)
        post("paid", paying, ACTIVATE)
        get = "GetTask" if method == "SendStreamingMessage" else "tasks/get"
        post(
            "paid",
            {
                "jsonrpc": "2.0",
                "id": 9,
                "method": get,
                "params": {"id": task_id, "metadata": {"x402.payment.payload": token}},
            },
        )

    # a refused in-band payment (forged signature) answers on the task
    refused = task_of(post("paid", send_body("forged in band"), ACTIVATE).json()["result"])
    forged = seen.token(payer.sign_v1(offer))
    forged["payload"]["signature"] = forge(forged["payload"]["signature"])
    post("paid", paying_body("pay", refused["id"], forged), ACTIVATE)

    # refusals and principals over the HTTP flow
    forged_header = seen.token(payer.token_for(paid.gate.url))
    forged_header["payload"]["signature"] = forge(forged_header["payload"]["signature"])
    post("paid", send_body("x"), {"PAYMENT-SIGNATURE": encode_header(forged_header)})
    post("paid", send_body("x"), {"Authorization": f"Bearer {encode_header(forged_header)}"})
    post(
        "echo",
        send_body("x", metadata={"x402.payment.payload": seen.token(payer.token_for(paid.gate.url))}),
        {"Authorization": f"Bearer {api_key}"},
    )
    paid.gate.stop()

    files = sorted(p for p in paid.db_path.parent.glob("gate.db*") if p.is_file())
    assert any(p.name.endswith("-wal") for p in files) or len(files) >= 1
    stored = b"".join(p.read_bytes() for p in files)
    log = paid.gate.log.read_text()
    assert "agent=paid" in log and "outcome=paid" in log  # the request log was written
    assert len(seen.values) > 40 and len(seen.answers) > 30
    for secret in seen.values:
        assert secret.encode() not in stored, "a secret reached the database"
        assert secret not in log, "a secret reached the log"
        for answer in seen.answers:
            assert secret not in answer, f"a secret was echoed: {answer[:300]}"
