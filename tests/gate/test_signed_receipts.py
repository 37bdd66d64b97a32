"""Signed offers and receipts, and signed cards, through a real `a2a-gate serve` (`[signing]`).

One gate per form of x402's offer-receipt extension (`jws`, `eip712`), each with the development
facilitator and an agent in each scheme: `exact` by EIP-3009, `exact` by Permit2, `upto` and
`batch-settlement`. Each is paid by the x402 package's own v2 client (unchanged) by header and
in-band; the 402's offers, the `PAYMENT-RESPONSE` receipt, its replay and the task's receipts are
handed to `@x402/extensions`' own verification, unchanged (`tests/support/x402_offer_receipt_verify.mjs`),
which accepts them, and refuses each with one byte changed. docs/money.md's Python lines verify the
same receipts; the card's signature verifies as docs/configuration.md says.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from server.signing_key import from_text
from tests.support.four_schemes import GATE, PRICE, PRICED
from tests.support.gate_process import GateProcess, free_port
from tests.support.in_band import REQUIRED_V2, X402InBandPayer, pay_in_band, payment_metadata, task_of
from tests.support.paid import decode_header, send_body
from tests.support.readme_examples import examples
from tests.support.x402_js import installed

pytestmark = pytest.mark.system

KEY = "0x" + "5e" * 32  # the operator's signing key (secp256k1: both forms)
CONFIG = (
    GATE
    + f"""
[signing]
key_file = "signing.key"

[offer_receipt]
format = "{{form}}"

[agents.fronted]  # another A2A server's agent: the card served is the gate's rewrite, signed by the operator
backend = "upstream"
url = "http://127.0.0.1:9/"
price = {{{{ {PRICED}, amount = "{PRICE}" }}}}
"""
)
AGENTS = ("exact", "permit2", "metered", "channel")
VERIFIER = Path(__file__).parents[1] / "support" / "x402_offer_receipt_verify.mjs"
JS_PACKAGES = ("@x402/extensions@2", "@x402/core@2")
OPERATOR = from_text(KEY, "test key")


class Signed:
    def __init__(self, gate: GateProcess, facilitator: str, form: str) -> None:
        self.gate, self.facilitator, self.form = gate, facilitator, form

    def url(self, agent: str) -> str:
        return f"{self.gate.url}/a2a/{agent}"


@pytest.fixture(scope="module", params=["jws", "eip712"])
def signed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Signed]:
    where = tmp_path_factory.mktemp(f"signed-{request.param}")
    port, facilitator_port = free_port(), free_port()
    (where / "signing.key").write_text(KEY + "\n")
    config = where / "gate.toml"
    config.write_text(CONFIG.format(port=port, facilitator_port=facilitator_port, form=request.param))
    extra = ["--dev-facilitator", str(facilitator_port)]
    with GateProcess(config, where / "serve.log", port=port, extra_args=extra) as gate:
        yield Signed(gate, f"http://127.0.0.1:{facilitator_port}", request.param)
        assert KEY[2:] not in (where / "serve.log").read_text()  # the key is never logged


@pytest.fixture(scope="module")
def verifier() -> Path:
    return installed(VERIFIER, JS_PACKAGES, "x402-js-offer-receipt")


def verify(verifier: Path, **given: list[Any]) -> dict[str, Any]:
    """What `@x402/extensions` says of the given documents, headers and receipts."""
    run = subprocess.run(
        ["node", str(verifier)],
        input=json.dumps({"key": OPERATOR.public_jwk, "address": OPERATOR.address, **given}),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=verifier.parent,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def one_byte_changed(signed: dict[str, Any]) -> list[dict[str, Any]]:
    """The signed object with one byte changed: in what it signs, and in the signature itself."""

    def flip(text: str, at: int) -> str:  # another character, the same one in no case (hex ignores it)
        return text[:at] + ("0" if text[at] != "0" else "1") + text[at + 1 :]

    if signed["format"] == "jws":
        header, payload, signature = signed["signature"].split(".")
        return [
            {**signed, "signature": f"{header}.{flip(payload, 4)}.{signature}"},
            {**signed, "signature": f"{header}.{payload}.{flip(signature, 10)}"},
        ]
    payload = dict(signed["payload"])
    key = "amount" if "amount" in payload else "payer"
    payload[key] = flip(str(payload[key]), len(str(payload[key])) - 1)
    signature = signed["signature"]
    return [{**signed, "payload": payload}, {**signed, "signature": signature[:20] + flip(signature[20:], 0)}]


def receipt_of(header: str) -> dict[str, Any]:
    return decode_header(header)["extensions"]["offer-receipt"]["info"]["receipt"]


def pay_by_header(signed: Signed, agent: str, payer: X402InBandPayer) -> tuple[dict[str, Any], httpx.Response, str]:
    """A 402, paid by the x402 client: (its document, the paid answer, the payment header sent)."""
    from x402.schemas import PaymentRequired

    from devnet.payer import encode_header

    asked = httpx.post(signed.url(agent), json=send_body("price?"), timeout=30)
    assert asked.status_code == 402, asked.text
    document = decode_header(asked.headers["PAYMENT-REQUIRED"])
    assert asked.json()["payment_required"] == document  # the body's document is the header's
    payload = payer.client.create_payment_payload(PaymentRequired.model_validate(document))
    header = encode_header(payload.model_dump(mode="json", by_alias=True, exclude_none=True))
    body = send_body(f"paid for by {agent}")
    answer = httpx.post(signed.url(agent), json=body, headers={"PAYMENT-SIGNATURE": header}, timeout=60)
    assert answer.status_code == 200, answer.text
    return document, answer, header


@pytest.mark.parametrize("agent", AGENTS)
def test_every_schemes_receipt_is_signed_and_verifies_with_the_x402_package(
    signed: Signed, verifier: Path, agent: str
) -> None:
    payer = X402InBandPayer(signed.facilitator)
    document, answer, header = pay_by_header(signed, agent, payer)
    task = task_of(answer.json()["result"])
    [receipt] = task["metadata"]["x402.payment.receipts"]
    response = answer.headers["PAYMENT-RESPONSE"]
    assert decode_header(response) == receipt  # the header's receipt is the task's
    again = send_body(f"paid for by {agent}")  # the same request (a new messageId): replayed
    replay = httpx.post(signed.url(agent), json=again, headers={"PAYMENT-SIGNATURE": header}, timeout=60)
    assert replay.status_code == 200
    assert replay.headers["PAYMENT-RESPONSE"] == response  # the same signature: signed once, stored
    first, final = pay_in_band(signed.gate.url, agent, X402InBandPayer(signed.facilitator), "in band")
    in_band = final["status"]["message"]["metadata"]["x402.payment.receipts"][-1]

    checked = verify(
        verifier,
        paymentRequired=[document, payment_metadata(first)[REQUIRED_V2]],
        paymentResponses=[response, replay.headers["PAYMENT-RESPONSE"]],
        receipts=[receipt["extensions"]["offer-receipt"]["info"]["receipt"], receipt_of_task(in_band)],
    )
    assert [o["ok"] and o["matches"] for offers in checked["offers"] for o in offers] == [True, True], checked
    [offer] = checked["offers"][0]
    assert offer["payload"]["amount"] == document["accepts"][0]["amount"]
    assert offer["payload"]["resourceUrl"] == signed.url(agent)
    assert all(r["ok"] for r in checked["responses"] + checked["receipts"]), checked
    stated = checked["responses"][0]["payload"]
    assert stated["payer"].lower() == payer.address.lower() and stated["network"] == "eip155:84532"
    assert stated["resourceUrl"] == signed.url(agent)
    if signed.form == "jws":  # the statement of what was delivered and charged
        assert (stated["task"], stated["agent"]) == (task["id"], agent)
        assert (
            stated["amount"] == receipt.get("amount", str(PRICE))
            and stated["scheme"] == document["accepts"][0]["scheme"]
        )
        if agent == "metered":
            assert stated["usage"]["units"] and stated["amount"] == str(10 * len("paid for by metered"))
    if agent in ("exact", "permit2"):
        assert stated["transaction"] == receipt["transaction"] != ""

    # one byte changed: refused, each
    tampered = [t for r in (receipt_of(response), receipt_of_task(in_band)) for t in one_byte_changed(r)]
    offers = list(document["extensions"]["offer-receipt"]["info"]["offers"])
    bad_offers = [
        {**document, "extensions": {"offer-receipt": {"info": {"offers": [t]}}}} for t in one_byte_changed(offers[0])
    ]
    refused = verify(verifier, receipts=tampered, paymentRequired=bad_offers)
    assert [r["ok"] for r in refused["receipts"]] == [False] * len(tampered), refused
    assert [o["ok"] for offers in refused["offers"] for o in offers] == [False, False], refused

    # docs/money.md's Python lines agree
    namespace: dict[str, Any] = {}
    exec(examples("docs/money.md")["verify_receipt.py"], namespace)  # the page's own example
    assert namespace["verify_receipt"](response, OPERATOR.public_jwk, OPERATOR.address) == stated
    bad = base64.b64encode(
        json.dumps({**receipt, "extensions": {"offer-receipt": {"info": {"receipt": tampered[0]}}}}).encode()
    ).decode()
    with pytest.raises(Exception):  # noqa: B017 -- PyJWT's or eth-account's refusal
        namespace["verify_receipt"](bad, OPERATOR.public_jwk, OPERATOR.address)


def receipt_of_task(receipt: dict[str, Any]) -> dict[str, Any]:
    return receipt["extensions"]["offer-receipt"]["info"]["receipt"]


def test_every_card_is_signed_and_declares_the_402s_offers(signed: Signed, verifier: Path) -> None:
    namespace: dict[str, Any] = {}
    exec(examples("docs/configuration.md")["verify_card.py"], namespace)  # the page's own example
    cards = []
    for agent in (*AGENTS, "fronted"):
        card_url = f"{signed.url(agent)}/.well-known/agent-card.json"
        answer = httpx.get(card_url, timeout=30)
        again = httpx.get(card_url, headers={"If-None-Match": answer.headers["ETag"]}, timeout=30)
        assert again.status_code == 304  # the same card, the same signature: caches hold
        card = answer.json()
        namespace["verify_card"](card, OPERATOR.public_jwk)
        asked = httpx.post(signed.url(agent), json=send_body("price?"), timeout=30)
        document = decode_header(asked.headers["PAYMENT-REQUIRED"])
        for extension in card["capabilities"]["extensions"]:  # the card's price is the 402's
            assert extension["params"]["accepts"] == document["accepts"]
        cards.append(card)
    changed = {**cards[0], "description": cards[0]["description"] + "!"}
    with pytest.raises(jwt.InvalidSignatureError):
        namespace["verify_card"](changed, OPERATOR.public_jwk)
    checked = verify(verifier, cards=[*cards, changed])
    assert [c["ok"] for c in checked["cards"]] == [True] * len(cards) + [False], checked
