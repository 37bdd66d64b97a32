"""Sign-in across replicas on one PostgreSQL: a challenge one replica issued signs its wallet in at
another (the nonce is keyed from the sealing key they share), and once spent at one it signs
nobody in at any (the spent nonce is in the shared store)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from eth_account import Account
from x402.extensions.sign_in_with_x import create_siwx_payload, encode_siwx_header

from tests.support import replicas as support
from tests.support.gate_process import GateProcess
from tests.support.paid import Payer, decode_header, send_body
from tests.support.replicas import PUBLIC_URL, post

replicas = support.replicas  # the fixture, bound by assignment (see tests/support/dev_facilitator_helpers.py)
NOT_FOUND = b'{"jsonrpc":"2.0","id":7,"error":{"code":-32001,"message":"Task not found"}}'


def signed_in_at(gate: GateProcess, key: str) -> dict[str, str]:
    """The challenge of `gate`'s 402, signed by `key` with the package's client, for the public door."""
    response = httpx.post(f"{gate.url}/a2a/paid", json=send_body("price?"))
    declared = decode_header(response.headers["PAYMENT-REQUIRED"])["extensions"]["sign-in-with-x"]
    info: dict[str, Any] = {**declared["info"], **declared["supportedChains"][0]}
    payload = asyncio.run(create_siwx_payload(info, Account.from_key(key), f"{PUBLIC_URL}/a2a/paid"))
    return {"SIGN-IN-WITH-X": encode_siwx_header(payload)}


def test_a_nonce_issued_by_one_replica_signs_in_at_another_once(replicas) -> None:
    a = replicas.start("a", lease=5, reconcile=3600)
    b = replicas.start("b", lease=5, reconcile=3600)
    owner = Payer()
    task = post(a, "paid", send_body("mine"), owner.header_for(a.url)).json()["result"]
    get = {"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"id": task["id"]}}

    from_a = signed_in_at(a, owner.key)
    assert post(b, "paid", get, from_a).json()["result"]["id"] == task["id"]
    assert post(a, "paid", get, from_a).content == NOT_FOUND  # spent at B: refused at A
    assert post(b, "paid", get, from_a).content == NOT_FOUND  # and at B again

    from_b = signed_in_at(b, owner.key)
    assert post(a, "paid", get, from_b).json()["result"]["id"] == task["id"]
    assert replicas.rows("SELECT COUNT(*) FROM sign_in_nonces") == [(2,)]
