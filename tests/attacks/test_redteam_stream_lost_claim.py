"""A stream whose claim is lost before its delivery is recorded has not streamed the answer.

The same lock as tests/attacks/test_redteam_delivery_window.py, on a paid streaming agent (not withheld)
followed with message/stream: while A's delivery write waits on the claim row, the claim lapses
and is taken over and released "not delivered". A's stream must not have carried the agent's whole
answer: the released token buys the work again, so a stream that did gives one signature two
deliveries. (A streaming agent's chunks go out as they come; here both of them went before the
delivery was recorded.)
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

from devnet.payer import encode_header
from tests.attacks.test_redteam_delivery_window import LEASE, claim_row_locked, delivery_waiting, take_over_and_release
from tests.support import replicas as support
from tests.support.gate_helpers import wait_for
from tests.support.paid import ASSET, PAY_TO, Payer, send_body
from tests.support.replicas import post

replicas = support.replicas

WRITER = f"""
[agents.paid-writer]
backend = "python"
callable = "tests.support.agents:slow_writer"
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}
"""


def test_a_stream_whose_claim_was_lost_before_delivery_did_not_carry_the_answer(replicas) -> None:
    a = replicas.start("a", lease=LEASE, reconcile=0.5, sections=WRITER)
    payer = Payer()
    headers = {"PAYMENT-SIGNATURE": encode_header(payer.token_for(a.url, "paid-writer"))}
    streamed: dict[str, Any] = {"text": ""}

    def stream_on_a() -> None:
        body = send_body("sleep 1.5", method="message/stream")
        try:
            with httpx.stream("POST", f"{a.url}/a2a/paid-writer", json=body, headers=headers, timeout=40) as response:
                for chunk in response.iter_text():
                    streamed["text"] += chunk
        except httpx.HTTPError as exc:
            streamed["error"] = type(exc).__name__

    on_a = threading.Thread(target=stream_on_a)
    on_a.start()
    wait_for(
        lambda: [(s, bool(t)) for s, t in replicas.rows("SELECT state, task_id FROM claims")] == [("running", True)]
    )
    with claim_row_locked(replicas) as conn:
        wait_for(lambda: delivery_waiting(replicas, conn), timeout=20)
        released = take_over_and_release(conn)
    on_a.join(30)
    assert not on_a.is_alive(), "A's stream never ended"
    retry = post(a, "paid-writer", send_body("sleep 1.5"), headers, timeout=30)  # the released token buys again
    wait_for(lambda: "running" not in replicas.claim_states() and "settling" not in replicas.claim_states())

    observed = {
        "released_uncharged": released,
        "stream_carried_the_whole_answer": "ALPHA" in streamed["text"] and "OMEGA" in streamed["text"],
        "retry_carried_the_answer": "OMEGA" in retry.text,
        "transfers": len(replicas.ledger()["settlements"]),
    }
    assert observed == {
        "released_uncharged": 1,
        "stream_carried_the_whole_answer": False,
        "retry_carried_the_answer": True,
        "transfers": 1,
    }, f"observed {observed}; stream {streamed['text'][-800:]}"
