"""A paid setup for tests: the development facilitator and a gate with priced agents.

Both are real servers on loopback: the facilitator runs the x402 package's own
exact-EVM verification over a SQLite ledger, and payments are signed by the x402
package's client with throwaway eth-account keys.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from devnet.payer import encode_header, new_private_key, sign_payment, sign_payment_v1
from tests.support.gate_helpers import swallow, wait_for
from tests.support.gate_process import GateProcess, free_port

PAY_TO = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
ASSET = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"

PAID_CONFIG = """
public_url = "{public_url}"
database = "gate.db"
reconcile_interval_seconds = {reconcile}

[limits]
per_ip_per_minute = {per_ip}
per_agent_per_minute = 100000

[facilitator]
url = "{facilitator}"
timeout_seconds = 1.5
settle_attempts = 3
settle_backoff_seconds = 0.05

[agents.echo]
description = "free echo"

[agents.paid]
description = "paid echo"
price = {{ network = "eip155:84532", asset = "{asset}", amount = "1000", pay_to = "{pay_to}" }}

[agents.paid-slow]
backend = "python"
callable = "tests.support.agents:slow"
price = {{ network = "eip155:84532", asset = "{asset}", amount = "1000", pay_to = "{pay_to}" }}

[agents.paid-broken]
backend = "python"
callable = "tests.support.agents:broken"
price = {{ network = "eip155:84532", asset = "{asset}", amount = "1000", pay_to = "{pay_to}" }}

[agents.paid-interrupting]
backend = "python"
callable = "tests.support.agents:ask_then_answer"
price = {{ network = "eip155:84532", asset = "{asset}", amount = "1000", pay_to = "{pay_to}" }}

[agents.paid-upstream-down]
backend = "upstream"
url = "http://127.0.0.1:9/"
timeout_seconds = 2
price = {{ network = "eip155:84532", asset = "{asset}", amount = "1000", pay_to = "{pay_to}" }}

[agents.vip]
description = "paid, for listed payers only"
allowed_payers = ["{allowed}"]
price = {{ network = "eip155:84532", asset = "{asset}", amount = "1000", pay_to = "{pay_to}" }}

[agents.unpaid-hidden]
exposed = false
price = {{ network = "eip155:84532", asset = "{asset}", amount = "1000", pay_to = "{pay_to}" }}
"""

ALLOWED_KEY = "0x" + "11" * 32  # the one payer the `vip` agent accepts


def allowed_address() -> str:
    from eth_account import Account

    return Account.from_key(ALLOWED_KEY).address


def paid_config(
    public_url: str, facilitator: str, *, per_ip: int = 100000, reconcile: float = 3600, paid_lines: str = ""
) -> str:
    """The priced test agents; `paid_lines`: more keys of the agent `paid` (`discovery = true`)."""
    text = PAID_CONFIG.format(
        public_url=public_url,
        facilitator=facilitator,
        asset=ASSET,
        pay_to=PAY_TO,
        per_ip=per_ip,
        reconcile=reconcile,
        allowed=allowed_address(),
    )
    if paid_lines:
        text = text.replace(
            '[agents.paid]\ndescription = "paid echo"\n', f'[agents.paid]\ndescription = "paid echo"\n{paid_lines}\n'
        )
        assert paid_lines in text
    return text


def start_paid(tmp_path: Path, facilitator: str, start_gate: Any, write_config: Any, paid_lines: str = "") -> PaidSetup:
    """A gate with the priced test agents in front of `facilitator` (the `paid` fixture's)."""
    port = free_port()
    config = write_config(paid_config(f"http://127.0.0.1:{port}", facilitator, paid_lines=paid_lines))
    gate = start_gate(config, port=port)
    return PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")


def send_body(
    text: str,
    *,
    method: str = "message/send",
    metadata: dict | None = None,
    task_id: str | None = None,
    blocking: bool = True,
    call_id: Any = 1,
) -> dict[str, Any]:
    if method in ("message/send", "message/stream"):
        message: dict[str, Any] = {
            "kind": "message",
            "role": "user",
            "messageId": str(uuid.uuid4()),
            "parts": [{"kind": "text", "text": text}],
        }
        configuration = {"blocking": blocking}
    else:
        message = {"role": "ROLE_USER", "messageId": str(uuid.uuid4()), "parts": [{"text": text}]}
        configuration = {"returnImmediately": not blocking}
    if metadata:
        message["metadata"] = metadata
    if task_id:
        message["taskId"] = task_id
    return {
        "jsonrpc": "2.0",
        "id": call_id,
        "method": method,
        "params": {"message": message, "configuration": configuration},
    }


def decode_header(value: str) -> dict[str, Any]:
    return json.loads(base64.b64decode(value))


@dataclass
class Payer:
    """A throwaway wallet that signs what a gate asks for."""

    key: str = field(default_factory=new_private_key)

    @property
    def address(self) -> str:
        from eth_account import Account

        return Account.from_key(self.key).address

    def token_for(self, gate_url: str, agent: str = "paid") -> dict[str, Any]:
        """Ask the gate for its price (a 402) and sign it: a fresh token each call."""
        response = httpx.post(f"{gate_url}/a2a/{agent}", json=send_body("price?"))
        assert response.status_code == 402, response.text
        return sign_payment(decode_header(response.headers["PAYMENT-REQUIRED"]), self.key)

    def header_for(self, gate_url: str, agent: str = "paid") -> dict[str, str]:
        return {"PAYMENT-SIGNATURE": encode_header(self.token_for(gate_url, agent))}

    def sign_v1(self, requirements: dict[str, Any]) -> dict[str, Any]:
        return sign_payment_v1(requirements, self.key)


@dataclass
class PaidSetup:
    gate: GateProcess
    facilitator_url: str
    db_path: Path

    def ledger(self) -> dict[str, Any]:
        return httpx.get(f"{self.facilitator_url}/dev/ledger").json()

    def faults(self, **modes: Any) -> None:
        httpx.post(f"{self.facilitator_url}/dev/faults", json=modes).raise_for_status()

    def payment_rows(self, action: str | None = None) -> list[dict[str, Any]]:
        import sqlite3

        conn = sqlite3.connect(self.db_path)
        conn.row_factory = sqlite3.Row
        try:
            sql, args = "SELECT * FROM payments", ()
            if action:
                sql, args = sql + " WHERE action = ?", (action,)
            return [dict(r) for r in conn.execute(sql + " ORDER BY id", args)]
        finally:
            conn.close()

    def claim_states(self) -> list[str]:
        import sqlite3

        conn = sqlite3.connect(self.db_path)
        try:
            return [r[0] for r in conn.execute("SELECT state FROM claims ORDER BY created_at")]
        finally:
            conn.close()

    def pretend_owner_is_pid_1(self) -> None:
        """What a container restart looks like to a pid check: the recorded owner is pid 1, "alive"."""
        import sqlite3

        conn = sqlite3.connect(self.db_path)
        try:
            conn.execute("UPDATE claims SET owner_pid = 1")
            conn.commit()
        finally:
            conn.close()

    def send_while_settle_held(self, headers: dict[str, str], text: str = "x") -> threading.Thread:
        """A paid send whose first settle the facilitator holds for 15 s, made in the background;
        returns once its work is delivered and its settle sent (the claim is `settling`). The
        sender's call dies with the gate a test kills then: join the thread after."""
        self.faults(settle="slow:15", count=1)
        sender = threading.Thread(
            target=lambda: swallow(lambda: self.post("paid", send_body(text), headers, timeout=10)), daemon=True
        )
        sender.start()
        wait_for(lambda: self.claim_states() == ["settling"])
        return sender

    def count_tasks(self, agent: str) -> int:
        import sqlite3

        conn = sqlite3.connect(self.db_path)
        try:
            return conn.execute(
                "SELECT COUNT(*) FROM tasks WHERE agent = ? AND owner LIKE 'payer:%'", (agent,)
            ).fetchone()[0]
        finally:
            conn.close()

    def post(
        self, agent: str, body: dict[str, Any], headers: dict[str, str] | None = None, timeout: float = 30
    ) -> httpx.Response:
        return httpx.post(
            f"{self.gate.url}/a2a/{agent}", json=body, headers=versioned(body, headers or {}), timeout=timeout
        )


@dataclass
class PaidView(PaidSetup):
    """A setup shared by many tests, as one test sees it: only what happened since it began.

    The facilitator's counts and settlements, the payment log and the tasks are all cut at the
    moment the view was taken, so a test's "exactly one settlement" still means its own one.
    Each test pays with its own fresh Payer; the faults are reset when the view is taken.
    """

    settled_before: int = 0
    verify_before: int = 0
    settle_before: int = 0
    payment_id_before: int = 0
    task_rowid_before: int = 0

    @classmethod
    def since_now(cls, setup: PaidSetup) -> PaidView:
        import sqlite3

        setup.faults()
        whole = setup.ledger()
        conn = sqlite3.connect(setup.db_path)
        try:
            last_payment = conn.execute("SELECT COALESCE(MAX(id), 0) FROM payments").fetchone()[0]
            last_task = conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM tasks").fetchone()[0]
        finally:
            conn.close()
        return cls(
            gate=setup.gate,
            facilitator_url=setup.facilitator_url,
            db_path=setup.db_path,
            settled_before=len(whole["settlements"]),
            verify_before=whole["verify_calls"],
            settle_before=whole["settle_calls"],
            payment_id_before=last_payment,
            task_rowid_before=last_task,
        )

    def ledger(self) -> dict[str, Any]:
        whole = super().ledger()
        return {
            "settlements": whole["settlements"][self.settled_before :],
            "verify_calls": whole["verify_calls"] - self.verify_before,
            "settle_calls": whole["settle_calls"] - self.settle_before,
        }

    def payment_rows(self, action: str | None = None) -> list[dict[str, Any]]:
        return [r for r in super().payment_rows(action) if r["id"] > self.payment_id_before]

    def count_tasks(self, agent: str) -> int:
        import sqlite3

        conn = sqlite3.connect(self.db_path)
        try:
            return conn.execute(
                "SELECT COUNT(*) FROM tasks WHERE agent = ? AND owner LIKE 'payer:%' AND rowid > ?",
                (agent, self.task_rowid_before),
            ).fetchone()[0]
        finally:
            conn.close()


def versioned(body: dict[str, Any], headers: dict[str, str]) -> dict[str, str]:
    """A v1.0 method (`SendMessage`, ...) travels with `A2A-Version: 1.0`, as v1.0 clients send it;
    without the header a call is v0.3 and a v1.0 method answers -32009. An explicit header wins."""
    method = body.get("method") if isinstance(body, dict) else None
    if isinstance(method, str) and method[:1].isupper() and not any(k.lower() == "a2a-version" for k in headers):
        return {**headers, "A2A-Version": "1.0"}
    return headers


def start_paid_gate(
    tmp_path: Path, facilitator: str, write_config: Callable[[str], Path], *extra: str, after: str = ""
) -> tuple[PaidSetup, str]:
    """A gate on `paid_config` with a long claim lease (300 s: a claim stays "running" unless
    something releases it), `after` appended to the file and `extra` on its command line, started
    on a free port: the setup, and the configuration text it runs on."""
    port = free_port()
    text = "claim_lease_seconds = 300\n" + paid_config(f"http://127.0.0.1:{port}", facilitator) + after
    gate = GateProcess(write_config(text), tmp_path / "gate.log", port=port, extra_args=list(extra)).start()
    return PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db"), text


def make_poor_after_verify(paid: PaidSetup, ledger_path: Path, payer: Payer) -> None:
    """Once the payment is verified, the payer's funds go elsewhere: the settle will be refused."""
    from devnet.chain import DEV_NETWORK
    from devnet.ledger import DevLedger

    wait_for(lambda: bool(paid.payment_rows("verify")), timeout=10)
    ledger = DevLedger(str(ledger_path))
    ledger.set_balance(DEV_NETWORK, ASSET, payer.address, 0)
    ledger.close()


def send_refused_at_settle(
    paid: PaidSetup, agent: str, text: str, headers: dict[str, str], ledger_path: Path, payer: Payer
) -> dict[str, Any]:
    """Send `text` (a blocking send) and, once it is verified, spend the payer's funds elsewhere
    while the agent works: the answer of a request whose settle is refused."""
    answer: dict[str, Any] = {}
    sender = threading.Thread(target=lambda: answer.update(paid.post(agent, send_body(text), headers).json()))
    sender.start()
    make_poor_after_verify(paid, ledger_path, payer)
    sender.join(30)
    return answer


def decoy_authorization(payer: Payer) -> dict:
    """An EIP-3009 authorization nobody signed, with every field the gate checks right."""
    return {
        "from": payer.address,
        "to": PAY_TO,
        "value": "1000",
        "validAfter": "0",
        "validBefore": str(int(time.time()) + 300),
        "nonce": "0x" + os.urandom(32).hex(),
    }
