"""Every scheme paid in-band by the x402 package's own v2 client, through a real `a2a-gate serve`.

One gate process with the development facilitator (`--dev-facilitator`, real signature checks over
the simulated chain), agents offering `exact` by EIP-3009, `exact` by Permit2, `upto` and
`batch-settlement`. The payer activates the a2a-x402 extension, reads the Task's
`x402.payment.required.v2`, signs it with `x402ClientSync` (every scheme's client registered,
unchanged) and pays on the same task, by send and by stream, in both A2A dialects; it hands the
package's client the receipt the Task carries, so a channel payer's next voucher follows its last.

The x402 JavaScript packages' client (`@x402/core`'s `x402Client` with `@x402/evm`'s client schemes,
`tests/support/x402_js_in_band.mjs`) pays the same way, from packages npm installs once into
`build/x402-js-in-band`.

Beside it: the v1 documents (402 body and in-band) list only what an x402 v1 client signs, and an
in-band refusal says what happened and names the payer its payload names.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gate.config import DEV_FACILITATOR_ADDRESS, DEV_RECEIVER_AUTHORIZER
from tests.support.four_schemes import GATE, PRICE, PRICED, UNIT_PRICE
from tests.support.gate_process import GateProcess, free_port
from tests.support.in_band import (
    ACTIVATE,
    REQUIRED_V2,
    X402InBandPayer,
    offer_v1,
    pay_in_band,
    paying_body,
    payment_metadata,
    task_of,
)
from tests.support.paid import Payer, send_body
from tests.support.x402_js import installed
from tests.support.x402_v1 import V1_PYTHON, pay_with_x402_v1

CONFIG = (
    GATE
    + f"""
[agents.permit2-first]
price = {{{{ {PRICED}, amount = "{PRICE}", accepts = [
  {{{{ asset_transfer_method = "permit2" }}}},
  {{{{ asset_transfer_method = "eip3009" }}}},
] }}}}

[agents.v2-only]
price = {{{{ {PRICED}, amount = "{PRICE}", accepts = [
  {{{{ asset_transfer_method = "permit2" }}}},
  {{{{ scheme = "batch-settlement", min_deposit = "20000" }}}},
] }}}}
"""
)
SCHEMES = {  # agent: the scheme (and transfer method) its one offer is in
    "exact": ("exact", None),
    "permit2": ("exact", "permit2"),
    "metered": ("upto", "permit2"),
    "channel": ("batch-settlement", None),
}
METHODS = ["message/send", "message/stream", "SendMessage", "SendStreamingMessage"]
JS_CLIENT = Path(__file__).parents[1] / "support" / "x402_js_in_band.mjs"
JS_PACKAGES = ("@x402/core@2", "@x402/evm@2", "viem@2")


class Devnet:
    def __init__(self, gate: GateProcess, facilitator: str) -> None:
        self.gate, self.facilitator = gate, facilitator

    def ask(self, agent: str, method: str = "message/send", headers: dict[str, str] | None = None) -> httpx.Response:
        body = send_body("how much?", method=method)
        extra = {"A2A-Version": "1.0"} if method[:1].isupper() else {}
        return httpx.post(f"{self.gate.url}/a2a/{agent}", json=body, headers={**extra, **(headers or {})}, timeout=30)


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Devnet]:
    """One gate for the module, with the development facilitator in its own process tree."""
    where = tmp_path_factory.mktemp("in-band-v2")
    port, facilitator_port = free_port(), free_port()
    config = where / "gate.toml"
    config.write_text(CONFIG.format(port=port, facilitator_port=facilitator_port))
    extra = ["--dev-facilitator", str(facilitator_port)]
    with GateProcess(config, where / "serve.log", port=port, extra_args=extra) as gate:
        yield Devnet(gate, f"http://127.0.0.1:{facilitator_port}")


def text_of(task: dict) -> str:
    return "".join(p.get("text", "") for a in task["artifacts"] for p in a["parts"])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("agent", list(SCHEMES))
def test_the_x402_v2_client_pays_every_scheme_in_band(devnet: Devnet, agent: str, method: str) -> None:
    payer = X402InBandPayer(devnet.facilitator)
    texts = [f"{agent} by {method}, turn {turn}" for turn in range(2)]  # a channel: a deposit, then a voucher
    for turn, text in enumerate(texts):
        first, final = pay_in_band(devnet.gate.url, agent, payer, text, method)
        scheme, method_of_transfer = SCHEMES[agent]
        [offer] = payment_metadata(first)[REQUIRED_V2]["accepts"]
        assert (offer["scheme"], offer["extra"].get("assetTransferMethod")) == (scheme, method_of_transfer)
        assert final["id"] == first["id"]
        assert final["status"]["state"] in ("completed", "TASK_STATE_COMPLETED"), final["status"]
        assert text_of(final) == text  # the agent ran the original message, not the payment
        metadata = final["status"]["message"]["metadata"]
        assert metadata["x402.payment.status"] == "payment-completed"
        receipt = metadata["x402.payment.receipts"][-1]
        assert receipt["success"] is True and receipt["payer"].lower() == payer.address.lower()
        if agent == "metered":  # the usage is charged, under the ceiling the payer authorized
            assert receipt["amount"] == str(UNIT_PRICE * len(text))
        if agent == "channel":  # the receipt the client followed: the channel's charged total
            assert receipt["extra"]["channelState"]["chargedCumulativeAmount"] == str(PRICE * (turn + 1))


def test_the_in_band_v2_document_is_the_402s(devnet: Devnet) -> None:
    """Every offer of the price, as the 402's PAYMENT-REQUIRED carries it (a fresh task each time)."""
    for agent in [*SCHEMES, "v2-only"]:
        answer = devnet.ask(agent, headers=ACTIVATE)
        in_band = payment_metadata(task_of(answer.json()["result"]))[REQUIRED_V2]
        plain = devnet.ask(agent).json()["payment_required"]
        # but for what each document holds its own of: the sign-in challenge's nonce and times
        assert without_own_challenge(in_band) == without_own_challenge(plain)
        assert in_band["x402Version"] == 2 and in_band["resource"]["url"] == f"{devnet.gate.url}/a2a/{agent}"
    metered = devnet.ask("metered").json()["payment_required"]["accepts"][0]
    assert metered["extra"]["facilitatorAddress"] == DEV_FACILITATOR_ADDRESS  # from the facilitator's /supported
    channel = devnet.ask("channel").json()["payment_required"]["accepts"][0]
    assert channel["extra"]["receiverAuthorizer"] == DEV_RECEIVER_AUTHORIZER


def without_own_challenge(document: dict) -> dict:
    """A v2 document less the fields x402's sign-in-with-x makes anew for each one (`dynamic_info_fields`)."""
    challenge = document["extensions"]["sign-in-with-x"]
    info = {k: v for k, v in challenge["info"].items() if k not in ("nonce", "issuedAt", "expirationTime")}
    extensions = {**document["extensions"], "sign-in-with-x": {**challenge, "info": info}}
    return {**document, "extensions": extensions}


@pytest.mark.parametrize("in_band", [False, True], ids=["402", "in-band"])
def test_a_v1_document_offers_only_what_a_v1_client_signs(devnet: Devnet, in_band: bool) -> None:
    def v1(agent: str) -> list[dict]:
        answer = devnet.ask(agent, headers=ACTIVATE if in_band else None)
        document = (
            payment_metadata(task_of(answer.json()["result"]))["x402.payment.required"] if in_band else answer.json()
        )
        assert document["x402Version"] == 1
        return document["accepts"]

    assert [(a["scheme"], a["extra"].get("assetTransferMethod")) for a in v1("exact")] == [("exact", None)]
    assert [(a["scheme"], a["extra"].get("assetTransferMethod")) for a in v1("permit2-first")] == [("exact", None)]
    for agent in ("permit2", "metered", "channel", "v2-only"):  # nothing a v1 client can sign
        assert v1(agent) == [], agent


def test_a_v1_payer_pays_in_band_from_an_offer_it_can_sign(devnet: Devnet) -> None:
    """A Permit2 offer listed first no longer buys the v1 client a refusal: it signs what it is offered."""
    payer = Payer()
    task = task_of(devnet.ask("permit2-first", headers=ACTIVATE).json()["result"])
    token = payer.sign_v1(offer_v1(task))
    body = paying_body("paid", task["id"], token)
    done = task_of(
        httpx.post(f"{devnet.gate.url}/a2a/permit2-first", json=body, headers=ACTIVATE, timeout=30).json()["result"]
    )
    assert done["status"]["state"] == "completed", done["status"]
    assert done["status"]["message"]["metadata"]["x402.payment.receipts"][-1]["payer"].lower() == payer.address.lower()


@pytest.mark.skipif(not V1_PYTHON.exists(), reason=f"no x402 1.0 virtualenv at {V1_PYTHON}")
def test_the_x402_v1_client_pays_the_402_of_a_price_offering_permit2_first(devnet: Devnet) -> None:
    payer = Payer()
    answer = pay_with_x402_v1(f"{devnet.gate.url}/a2a/permit2-first", payer.key)
    assert answer["status"] == 200, answer
    assert answer["body"]["result"]["status"]["state"] == "completed"


@pytest.mark.parametrize("method", ["message/send", "SendMessage"])
def test_an_unsupported_payload_in_band_says_so_and_names_its_payer(devnet: Devnet, method: str) -> None:
    """An EIP-3009 payment for the Permit2 offer: refused before the facilitator, on the Task, as
    UNSUPPORTED_PAYLOAD (not a bad signature), the receipt naming the payer it names; payable again."""
    payer = X402InBandPayer(devnet.facilitator)
    exact = task_of(devnet.ask("exact", method, ACTIVATE).json()["result"])
    eip3009 = payer.sign(exact).model_dump(mode="json", by_alias=True, exclude_none=True)
    task = task_of(devnet.ask("permit2", method, ACTIVATE).json()["result"])
    permit2_offer = payment_metadata(task)[REQUIRED_V2]
    wrong = {**eip3009, "accepted": permit2_offer["accepts"][0], "resource": permit2_offer["resource"]}
    body = paying_body("paid", task["id"], wrong, method=method)
    headers = {**ACTIVATE, **({"A2A-Version": "1.0"} if method[:1].isupper() else {})}
    refused = httpx.post(f"{devnet.gate.url}/a2a/permit2", json=body, headers=headers, timeout=30)
    failed = task_of(refused.json()["result"])
    assert failed["status"]["state"] in ("input-required", "TASK_STATE_INPUT_REQUIRED")
    metadata = payment_metadata(failed)
    assert (metadata["x402.payment.status"], metadata["x402.payment.error"]) == (
        "payment-failed",
        "UNSUPPORTED_PAYLOAD",
    )
    [receipt] = metadata["x402.payment.receipts"]
    assert receipt["errorReason"] == "unsupported_payload"
    assert receipt["payer"] == payer.address.lower()
    assert receipt["network"] == "eip155:84532"  # a v2 payment's receipt names the network as v2 does
    assert metadata[REQUIRED_V2]["accepts"]  # asked again, with both documents
    paying = paying_body(
        "paid", task["id"], payer.sign(failed).model_dump(mode="json", by_alias=True, exclude_none=True), method=method
    )
    done = task_of(
        httpx.post(f"{devnet.gate.url}/a2a/permit2", json=paying, headers=headers, timeout=30).json()["result"]
    )
    assert done["status"]["state"] in ("completed", "TASK_STATE_COMPLETED")


@pytest.fixture(scope="module")
def js_client() -> Path:
    """The JavaScript payer beside the x402 packages npm installed (`tests.support.x402_js`)."""
    return installed(JS_CLIENT, JS_PACKAGES, "x402-js-in-band")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("agent", list(SCHEMES))
def test_the_x402_javascript_client_pays_every_scheme_in_band(
    devnet: Devnet, js_client: Path, agent: str, method: str
) -> None:
    run = subprocess.run(
        ["node", str(js_client), f"{devnet.gate.url}/a2a/{agent}", devnet.facilitator, method, "2"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=js_client.parent,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    for turn, paid in enumerate(answer["turns"]):
        assert paid["id"] == paid["asked"]
        assert paid["state"] in ("completed", "TASK_STATE_COMPLETED"), paid
        assert paid["text"] == paid["sent"]  # the original message ran
        metadata = paid["metadata"]
        assert metadata["x402.payment.status"] == "payment-completed"
        receipt = metadata["x402.payment.receipts"][-1]
        assert receipt["success"] is True and receipt["payer"].lower() == answer["payer"].lower()
        if agent == "metered":
            assert receipt["amount"] == str(UNIT_PRICE * len(paid["sent"]))
        if agent == "channel":  # the second turn's voucher was built on the first's receipt
            assert receipt["extra"]["channelState"]["chargedCumulativeAmount"] == str(PRICE * (turn + 1))
