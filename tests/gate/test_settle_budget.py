"""An owed settlement follows its own schedule: the payer's replays do not spend it.

A facilitator settle outage of about 3 s leaves a delivered request owed. The payer
retries the same request with the same token a few times meanwhile: each retry must be
answered from the claim (`X-Idempotent-Replay`), and none may spend a settle pass the
claim's schedule did not make due; otherwise a handful of quick retries use up the whole
budget inside the outage, and a payment whose authorization is valid for minutes more
ends `needs_attention` without ever being collected. Once the facilitator is back, the
reconciler collects it: `settled`, one transfer.

A real gate process (SQLite) in front of the development facilitator.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from devnet.chain import DEV_NETWORK
from tests.support.gate_helpers import wait_for
from tests.support.gate_process import free_port
from tests.support.paid import PaidSetup, Payer, paid_config, send_body

OUTAGE_SECONDS = 3.0
REPLAYS = 6
FINAL = ("settled", "unsettled", "needs_attention")

# The schedule, without replays. One pass is `settle_attempts = 2` calls (50 ms apart). Pass 1
# is the request's own; pass k+1 is due `reconcile_interval_seconds * 2**(k-1)` after pass k,
# jittered by x0.5..x1.5 (and the reconciler wakes every interval, so a due pass runs up to
# 1 s later): pass 1 at ~0 s, pass 2 >= 0.5 s, pass 3 >= 0.5 + 1 = 1.5 s, pass 4 >= 1.5 + 2 =
# 3.5 s. A 3 s outage fails at most passes 1-3, pass 4 comes after it and settles; the chain
# is asked only when `settle_passes = 5` passes have failed, so there is room for one more.
# Pass 4 is due at the latest 1.5 + 3 + 6 (+ 3 s of late wake-ups) = 13.5 s after the request.
# With 6 replays each spending a pass, the 5th failure comes inside the outage: the chain says
# "unused, still valid", and today that is final.
SCHEDULE = """
settle_attempts = 2
settle_backoff_seconds = 0.05
settle_passes = 5
"""


def outage_gate(tmp_path: Path, facilitator: str, start_gate, write_config) -> PaidSetup:
    port = free_port()
    config = paid_config(f"http://127.0.0.1:{port}", facilitator, reconcile=1.0)
    config = config.replace("settle_attempts = 3\nsettle_backoff_seconds = 0.05\n", SCHEDULE.lstrip("\n"))
    assert "settle_passes = 5" in config
    config += f'\n[networks."{DEV_NETWORK}"]\nrpc_url = "{facilitator}/rpc"\n'
    gate = start_gate(write_config(config), port=port)
    return PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")


def owed_after_an_outage(paid: PaidSetup, headers: dict[str, str], replays: int) -> list[httpx.Response]:
    """Send during a settle outage of OUTAGE_SECONDS, replay `replays` times at once, end the outage."""
    paid.faults(settle="http500")
    began = time.monotonic()
    first = paid.post("paid", send_body("owed"), headers).json()["result"]
    assert first["metadata"]["x402.payment.status"] == "payment-verified", first  # delivered, owed
    answers = [paid.post("paid", send_body("owed"), headers) for _ in range(replays)]
    time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - began)))  # the outage lasts what it lasts
    paid.faults()
    wait_for(lambda: all(state in FINAL for state in paid.claim_states()), timeout=40)
    return answers


def test_quick_replays_during_a_settle_outage_spend_no_pass_and_the_reconciler_collects_it(
    tmp_path, facilitator, start_gate, write_config
):
    paid = outage_gate(tmp_path, facilitator, start_gate, write_config)

    answers = owed_after_an_outage(paid, Payer().header_for(paid.gate.url), REPLAYS)

    observed = {
        "claim": paid.claim_states(),
        "transfers": len(paid.ledger()["settlements"]),
        "replays_answered_from_the_claim": sum(a.headers.get("X-Idempotent-Replay") == "true" for a in answers),
        "log": [r["action"] for r in paid.payment_rows() if r["action"] != "replay"],  # for the message
    }
    assert {k: v for k, v in observed.items() if k != "log"} == {
        "claim": ["settled"],
        "transfers": 1,
        "replays_answered_from_the_claim": REPLAYS,
    }, f"observed {observed}"


def test_the_same_outage_without_replays_is_collected_by_the_reconciler(
    tmp_path, facilitator, start_gate, write_config
):
    """The control: the schedule above, alone, collects the payment after the outage."""
    paid = outage_gate(tmp_path, facilitator, start_gate, write_config)

    owed_after_an_outage(paid, Payer().header_for(paid.gate.url), replays=0)

    assert paid.claim_states() == ["settled"]
    assert len(paid.ledger()["settlements"]) == 1
