"""A payer reads its own paid tasks by signing in with the wallet that paid (x402 `sign-in-with-x`).

A real `a2a-gate serve` in front of the development facilitator; the payer pays with the x402
package's client and signs the 402's challenge with the package's SIWx client helpers and the
same eth-account wallet. Everything that is not that wallet, signed in once, answers what a
stranger gets: the byte-identical -32001 (ListTasks: the empty page).
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx
import pytest
from eth_account import Account
from x402.extensions.sign_in_with_x import SIWxExtension, create_siwx_payload, encode_siwx_header

from tests.support.paid import PaidSetup, PaidView, Payer, decode_header, send_body, start_paid

NOT_FOUND = b'{"jsonrpc":"2.0","id":7,"error":{"code":-32001,"message":"Task not found"}}'


@pytest.fixture
def paid(shared_paid: PaidView) -> PaidView:
    return shared_paid


def challenge(gate_url: str, agent: str = "paid") -> tuple[dict[str, Any], str]:
    """The `sign-in-with-x` entry of the agent's 402, and the URL the 402 answered at."""
    url = f"{gate_url}/a2a/{agent}"
    response = httpx.post(url, json=send_body("price?"))
    assert response.status_code == 402
    document = decode_header(response.headers["PAYMENT-REQUIRED"])
    assert (
        response.json()["payment_required"]["extensions"]["sign-in-with-x"]["info"]["nonce"]
        == (document["extensions"]["sign-in-with-x"]["info"]["nonce"])
    )
    return document["extensions"]["sign-in-with-x"], url


def sign_in(gate_url: str, key: str, agent: str = "paid") -> dict[str, str]:
    """The package's client: the 402's challenge, completed with the chain it offers, signed by `key`."""
    declared, url = challenge(gate_url, agent)
    SIWxExtension.model_validate(declared)
    chain = declared["supportedChains"][0]
    payload = asyncio.run(create_siwx_payload({**declared["info"], **chain}, Account.from_key(key), url))
    return {"SIGN-IN-WITH-X": encode_siwx_header(payload)}


def get_body(task_id: str, method: str = "tasks/get") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"id": task_id}}


def test_the_wallet_that_paid_reads_its_task_after_signing_in_and_no_one_else_does(paid):
    owner, stranger = Payer(), Payer()
    task = paid.post("paid", send_body("mine"), owner.header_for(paid.gate.url)).json()["result"]
    settled = len(paid.ledger()["settlements"])

    mine = paid.post("paid", get_body(task["id"]), sign_in(paid.gate.url, owner.key))
    assert mine.json()["result"]["id"] == task["id"]
    v10 = paid.post(
        "paid", get_body(task["id"], "GetTask"), {**sign_in(paid.gate.url, owner.key), "A2A-Version": "1.0"}
    )
    assert v10.json()["result"]["id"] == task["id"]
    assert len(paid.ledger()["settlements"]) == settled  # signing in charges nothing

    replayed = sign_in(paid.gate.url, owner.key)
    assert paid.post("paid", get_body(task["id"]), replayed).json()["result"]["id"] == task["id"]
    garbled = base64.b64encode(b'{"address": 1}').decode()
    answers = {
        "no proof": paid.post("paid", get_body(task["id"])),
        "another wallet": paid.post("paid", get_body(task["id"]), sign_in(paid.gate.url, stranger.key)),
        "a wallet that never paid": paid.post("paid", get_body(task["id"]), sign_in(paid.gate.url, Payer().key)),
        "a spent nonce": paid.post("paid", get_body(task["id"]), replayed),
        "another agent's challenge": paid.post("paid", get_body(task["id"]), sign_in(paid.gate.url, owner.key, "vip")),
        "not base64": paid.post("paid", get_body(task["id"]), {"SIGN-IN-WITH-X": "%%%"}),
        "not a payload": paid.post("paid", get_body(task["id"]), {"SIGN-IN-WITH-X": garbled}),
        "a field changed": paid.post("paid", get_body(task["id"]), edited(sign_in(paid.gate.url, owner.key))),
    }
    for name, response in answers.items():
        assert (response.status_code, response.content) == (200, NOT_FOUND), name


def edited(headers: dict[str, str]) -> dict[str, str]:
    payload = json.loads(base64.b64decode(headers["SIGN-IN-WITH-X"]))
    payload["statement"] = "Something else."
    return {"SIGN-IN-WITH-X": base64.b64encode(json.dumps(payload).encode()).decode()}


def test_a_signed_in_wallet_lists_its_own_tasks_and_another_wallet_lists_none(paid):
    owner, stranger = Payer(), Payer()
    ids = {paid.post("paid", send_body(t), owner.header_for(paid.gate.url)).json()["result"]["id"] for t in "ab"}
    paid.post("paid", send_body("theirs"), stranger.header_for(paid.gate.url))
    body = {"jsonrpc": "2.0", "id": 3, "method": "ListTasks", "params": {}}
    v10 = {"A2A-Version": "1.0"}

    listed = paid.post("paid", body, {**sign_in(paid.gate.url, owner.key), **v10}).json()["result"]
    assert {t["id"] for t in listed["tasks"]} == ids

    nobody = paid.post("paid", body, v10)
    someone_else = paid.post("paid", body, {**sign_in(paid.gate.url, Payer().key), **v10})
    assert someone_else.content == nobody.content
    assert nobody.json()["result"]["tasks"] == []


def test_a_signed_in_wallet_resubscribes_to_its_running_task(paid):
    owner = Payer()
    body = send_body("sleep 4", blocking=False)
    task = paid.post("paid-slow", body, owner.header_for(paid.gate.url, "paid-slow")).json()["result"]
    resubscribe = {"jsonrpc": "2.0", "id": "r", "method": "tasks/resubscribe", "params": {"id": task["id"]}}

    stranger = paid.post("paid-slow", resubscribe, sign_in(paid.gate.url, Payer().key, "paid-slow"))
    assert json.loads(stranger.text.split("data:", 1)[1])["error"]["code"] == -32001

    streamed = paid.post("paid-slow", resubscribe, sign_in(paid.gate.url, owner.key, "paid-slow"))
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[5:]) for line in streamed.text.splitlines() if line.startswith("data:")]
    assert events[0]["result"]["id"] == task["id"]
    assert events[-1]["result"]["status"]["state"] == "completed"


def test_a_signed_in_wallet_cancels_its_running_task(paid):
    owner = Payer()
    body = send_body("sleep 5", blocking=False)
    task = paid.post("paid-slow", body, owner.header_for(paid.gate.url, "paid-slow")).json()["result"]
    cancel = {"jsonrpc": "2.0", "id": 7, "method": "tasks/cancel", "params": {"id": task["id"]}}

    refused = paid.post("paid-slow", cancel, sign_in(paid.gate.url, Payer().key, "paid-slow"))
    assert refused.content == NOT_FOUND
    canceled = paid.post("paid-slow", cancel, sign_in(paid.gate.url, owner.key, "paid-slow"))
    assert canceled.json()["result"]["status"]["state"] == "canceled"


@pytest.fixture
def without_sign_in(tmp_path, facilitator: str, start_gate, write_config) -> PaidSetup:
    """The `paid` gate, its agent `paid` offering no sign-in (`sign_in = false`)."""
    return start_paid(tmp_path, facilitator, start_gate, write_config, paid_lines="sign_in = false")


def test_an_agent_without_sign_in_issues_no_challenge(without_sign_in):
    """`sign_in = false`: the 402 carries no challenge (a smaller answer, no nonce made for it); its
    payer proves itself with a payment, as before sign-in."""
    paid = without_sign_in
    answer = paid.post("paid", send_body("price?"))
    assert answer.status_code == 402
    assert "sign-in-with-x" not in decode_header(answer.headers["PAYMENT-REQUIRED"])["extensions"]
    assert "sign-in-with-x" not in answer.json()["payment_required"]["extensions"]
    owner = Payer()
    task = paid.post("paid", send_body("mine"), owner.header_for(paid.gate.url)).json()["result"]
    proof = owner.header_for(paid.gate.url)  # a fresh token of the same payer, verified, not charged
    assert paid.post("paid", get_body(task["id"]), proof).json()["result"]["id"] == task["id"]
