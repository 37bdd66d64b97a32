"""Task calls (get, cancel, subscribe, list) run from ONE table for principals and payers.

The free path and the paid path each wrote their own dispatch of the task calls, and they
drifted: the payer's resubscription never named the caller's address, so no anonymous stream
counted against `[streams] max_per_client` at all (only principals' did). A real gate behind a
trusted proxy: each payer's streams count against its own address, and only its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx

from devnet.payer import encode_header
from tests.support.gate_helpers import rpc_body
from tests.support.gate_process import free_port
from tests.support.paid import Payer, paid_config, send_body

CAPS = '\n[streams]\nmax_per_client = 1\n\n[proxy]\ntrusted = ["127.0.0.1"]\n'
V1 = {"A2A-Version": "1.0"}


def paid_task(gate_url: str, payer: Payer, address: str) -> tuple[str, dict[str, str]]:
    """A running paid task of `payer`'s (non-blocking), and the headers that prove it is theirs."""
    proof = {"PAYMENT-SIGNATURE": encode_header(payer.token_for(gate_url, "paid-slow")), "X-Forwarded-For": address}
    answer = httpx.post(
        f"{gate_url}/a2a/paid-slow", json=send_body("sleep 20", blocking=False), headers=proof, timeout=10
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["result"]["id"], proof


@contextlib.contextmanager
def stream(client: httpx.Client, gate_url: str, task_id: str, headers: dict[str, str]) -> Iterator[str]:
    """A SubscribeToTask stream held open: "open", or the JSON-RPC error code answered instead."""
    body = rpc_body("SubscribeToTask", {"id": task_id}, call_id="s")
    with client.stream("POST", f"{gate_url}/a2a/paid-slow", json=body, headers={**headers, **V1}) as response:
        if response.headers["content-type"].startswith("text/event-stream"):
            yield "open"
        else:
            response.read()
            metadata = response.json()["error"]["data"][0]["metadata"]  # v1.0: a google.rpc.ErrorInfo
            yield f"{metadata['code']}:{metadata['scope']}"


def test_each_payers_streams_count_against_its_own_address(tmp_path, facilitator, start_gate, write_config):
    port = free_port()
    gate = start_gate(write_config(paid_config(f"http://127.0.0.1:{port}", facilitator) + CAPS), port=port)
    first, first_proof = paid_task(gate.url, Payer(), "10.0.0.1")
    second, second_proof = paid_task(gate.url, Payer(), "10.0.0.2")
    with httpx.Client(timeout=10) as client, stream(client, gate.url, first, first_proof) as held:
        assert held == "open"
        with stream(client, gate.url, first, first_proof) as again:
            assert again == "too_many_streams:client"  # the same address: its cap of one
        with stream(client, gate.url, second, second_proof) as other:
            assert other == "open"  # another payer at another address is not locked out
