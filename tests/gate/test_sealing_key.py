"""A sealing key that differs from the one the database was sealed with stops a replica at start.

Replica A delivers a paid request during a settle outage and leaves it owed, its payload
sealed with the fleet's key; A stops. Replica B comes up on the same PostgreSQL schema with
another A2A_GATE_SEALING_KEY (a mistyped secret, a stale deployment). B must refuse to
start, with one line on stderr naming the sealing key and no traceback, rather than take
the owed claim, fail to unseal it and hold it `settling` for ever; `a2a-gate reconcile`
with the wrong key refuses the same way. With the right key, the owed claim is collected.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support import replicas as support
from tests.support.gate_helpers import REPO
from tests.support.gate_process import free_port
from tests.support.paid import Payer, send_body
from tests.support.replicas import new_sealing_key, post

replicas = support.replicas  # the fixture, bound by assignment (see tests/support/dev_facilitator_helpers.py)

LEASE = 2.0
OWED_FOR_LONG = "settle_passes = 100\n"  # A's outage passes never reach the chain question


def refusal(stderr: str) -> str:
    """'one line naming the sealing key', or what stderr says instead (its last lines)."""
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("warning:")]
    if len(lines) == 1 and re.search(r"sealing.?key", lines[0], re.I) and "Traceback" not in stderr:
        return "one line naming the sealing key"
    return " | ".join(lines[-3:]) or "(nothing)"


def serve_until_it_refuses_or_serves(config: Path, env: dict[str, str], home: Path) -> tuple[str, str]:
    """Start `a2a-gate serve`; ("refused", stderr) if it exits non-zero, ("serving", stderr) once it
    answers (after giving its reconciler time to act)."""
    port = free_port()
    stderr_path = home / "serve.stderr"
    command = [sys.executable, "-m", "gate.cli", "serve", "--config", str(config), "--port", str(port)]
    with open(home / "serve.stdout", "wb") as out, open(stderr_path, "wb") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, env={**os.environ, **env}, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if process.poll() is not None:  # a refusal is a failure exit
                return "refused" if process.returncode else "exited 0", stderr_path.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        time.sleep(3 * LEASE)  # long enough for its reconciler to take the owed claim
        return "serving", stderr_path.read_text()
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(15)


def reconcile(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gate.cli", "reconcile", "--config", str(config)]
    return subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **env}, cwd=REPO, timeout=60, check=False
    )


def test_a_replica_with_another_sealing_key_refuses_to_start_and_the_owed_claim_is_collected_with_the_right_one(
    replicas,
) -> None:
    a = replicas.start("a", lease=LEASE, reconcile=0.5, facilitator_extra=OWED_FOR_LONG)
    replicas.faults(settle="http500")
    owed = post(a, "paid", send_body("owed"), Payer().header_for(a.url)).json()["result"]
    assert owed["metadata"]["x402.payment.status"] == "payment-verified", owed  # delivered, owed
    a.stop()
    replicas.faults()  # the facilitator is back: whoever can unseal the payment can collect it
    # owed; or `settling` if A's stop cut a reconciler pass short (then owed again once its lease lapses)
    claim = "SELECT state, owner_instance, lease_until FROM claims"
    [left_by_a] = replicas.rows(claim)
    assert left_by_a[0] in ("settle_failed", "settling"), left_by_a

    wrong = {"A2A_GATE_SEALING_KEY": new_sealing_key()}
    b_config = replicas.config("b", lease=LEASE, reconcile=0.5, facilitator_extra=OWED_FOR_LONG)
    b, b_stderr = serve_until_it_refuses_or_serves(b_config, wrong, b_config.parent)
    b_took_the_claim = replicas.rows(claim) != [left_by_a]
    wrong_reconcile = reconcile(b_config, wrong)
    right_reconcile = reconcile(a.config, {"A2A_GATE_SEALING_KEY": replicas.sealing_key})

    observed = {
        "replica_b": b,
        "replica_b_stderr": refusal(b_stderr),
        "b_took_the_claim": b_took_the_claim,
        "reconcile_with_the_wrong_key": "refused" if wrong_reconcile.returncode != 0 else "ran",
        "its_stderr": refusal(wrong_reconcile.stderr),
        "claim": replicas.claim_states(),
        "transfers": len(replicas.ledger()["settlements"]),
    }
    assert observed == {
        "replica_b": "refused",
        "replica_b_stderr": "one line naming the sealing key",
        "b_took_the_claim": False,
        "reconcile_with_the_wrong_key": "refused",
        "its_stderr": "one line naming the sealing key",
        "claim": ["settled"],
        "transfers": 1,
    }, (
        f"observed {observed}; B {b}; reconcile with the right key: {right_reconcile.stdout!r} {right_reconcile.stderr[-300:]!r}"
    )
