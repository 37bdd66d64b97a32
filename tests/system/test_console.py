"""The operator's console in a real headless Chromium, over a real `a2a-gate serve --dev-facilitator`.

The shipped example, with `[http] metrics_listen` on a port of its own and `metrics_token_env` set.
The test pays `paid-echo` with the x402 package's own client; a second payment's settle fails (the
development facilitator's fault injection) and stays owed, then is put into `needs_attention` the way
the settlement records it when the chain cannot answer (the development chain always answers, so the
test writes the claim's state and the `needs_attention` log row itself, with a fresh fence so no pass
in flight writes over it). In the browser: a wrong token sees nothing; the right one sees the paid
request in the payments table (with its story) and in the revenue chart, the owed payment and its
next retry, then the one needing attention, whose Re-open button puts it back to owed, and the
reconciler settles it. The page, every API answer and every export hold no token, signature, nonce,
API key or private key the test sent; the A2A port answers 404 for all of it. (The screenshot the docs
show is tests/system/test_console_end_to_end.py's.)
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from eth_account import Account
from x402 import x402Client
from x402.mechanisms.evm.exact import register_exact_evm_client

from tests.devnet.test_channels_devnet import Devnet
from tests.devnet.test_payment_records_devnet import pay, secrets_in
from tests.support.browser import headless_chromium
from tests.support.gate_helpers import KEY_LINE
from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import send_body
from tests.support.shipped_config import shipped_config

pytestmark = pytest.mark.system  # a real gate, its development facilitator and a browser

TOKEN_ENV = "A2A_GATE_METRICS_TOKEN"
TOKEN = "ops-token-" + os.urandom(12).hex()
API_READS = ["records", "summary", "attention", "channels", "rates"]
EXPORTS = [f"export?what={what}&format={fmt}" for what in ("records", "summary") for fmt in ("csv", "json")]


class Console:
    def __init__(self, devnet: Devnet, ops: str) -> None:
        self.devnet, self.ops = devnet, ops
        self.db = devnet.config.parent / "gate.db"

    def api(self, path: str, token: str | None = TOKEN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(f"{self.ops}/console/api/{path}", headers=headers, timeout=30)

    def faults(self, **modes: str) -> None:
        httpx.post(f"{self.devnet.facilitator}/dev/faults", json=modes).raise_for_status()

    def claims(self) -> dict[str, str]:
        with sqlite3.connect(self.db) as conn:
            return dict(conn.execute("SELECT task_id, state FROM claims").fetchall())


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    port, facilitator_port, ops_port = free_port(), free_port(), free_port()
    config = tmp_path / "gate.toml"
    text = shipped_config(tmp_path, facilitator_port)
    text = text.replace("reconcile_interval_seconds = 30", "reconcile_interval_seconds = 1")
    text = text.replace("settle_attempts = 4", "settle_attempts = 1")
    text = text.replace('# metrics_listen = "127.0.0.1:9464"', f'metrics_listen = "127.0.0.1:{ops_port}"')
    text = text.replace(f'# metrics_token_env = "{TOKEN_ENV}"', f'metrics_token_env = "{TOKEN_ENV}"')
    assert f"127.0.0.1:{ops_port}" in text and f'\nmetrics_token_env = "{TOKEN_ENV}"' in text
    config.write_text(text)
    process = GateProcess(
        config,
        tmp_path / "serve.log",
        port=port,
        extra_args=["--dev-facilitator", str(facilitator_port)],
        env={TOKEN_ENV: TOKEN},
    )
    with process:
        yield Console(Devnet(process, f"http://127.0.0.1:{facilitator_port}", config), f"http://127.0.0.1:{ops_port}")


def wait_until(what: str, check, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def to_needs_attention(console: Console, task_id: str) -> None:
    """What the settlement writes when nobody can say whether an owed payment was collected."""
    reason = "chain_unavailable: no answer from the chain for eip155:84532"
    with sqlite3.connect(console.db) as conn:
        digest = conn.execute("SELECT token_digest FROM claims WHERE task_id = ?", (task_id,)).fetchone()[0]
        conn.execute(
            "UPDATE claims SET state = 'needs_attention', last_error = ?, fence = 'set-aside-by-the-test',"
            " updated_at = ((julianday('now') - 2440587.5) * 86400.0) WHERE token_digest = ?",
            (reason, digest),
        )
        conn.row_factory = sqlite3.Row
        verify = conn.execute("SELECT * FROM payments WHERE token_digest = ? AND action = 'verify'", (digest,))
        row = {k: v for k, v in dict(verify.fetchone()).items() if k != "id"}
        row.update(action="needs_attention", error=reason, at=time.time(), task_id=task_id)
        names = ", ".join(f'"{k}"' for k in row)
        conn.execute(f"INSERT INTO payments ({names}) VALUES ({', '.join('?' for _ in row)})", list(row.values()))


def test_the_console_shows_a_paid_request_and_reopens_a_payment_needing_attention(console: Console) -> None:
    devnet = console.devnet
    created = devnet.cli("keys", "create", "ops", "--agent", "echo")
    api_key = KEY_LINE.search(created.stdout).group(1)  # type: ignore[union-attr]
    free = httpx.post(
        f"{devnet.gate.url}/a2a/echo", json=send_body("free"), headers={"Authorization": f"Bearer {api_key}"}
    )
    assert free.json()["result"]["status"]["state"] == "completed"

    sent: list[str] = []
    payer = Account.create()
    client = x402Client()
    register_exact_evm_client(client, payer)
    (paid,) = pay(devnet, "paid-echo", client, ["hello, console"], sent)
    paid_task = paid.json()["result"]["id"]
    asked = httpx.post(f"{devnet.gate.url}/a2a/paid-echo", json=send_body("no token"))
    assert asked.status_code == 402

    console.faults(settle="http500")  # the next payment is delivered, and its settle fails: owed
    (owed,) = pay(devnet, "paid-echo", client, ["hello, owed"], sent)
    owed_task = owed.json()["result"]["id"]
    wait_until("the owed claim", lambda: console.claims().get(owed_task) == "settle_failed")

    with headless_chromium() as browser:
        from playwright.sync_api import expect  # (there once the browser is: tests/support/browser.py)

        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{console.ops}/console/")
        assert page.locator("#console").is_hidden() and page.locator("#records tbody tr").count() == 0

        # a wrong token: refused, nothing shown
        page.fill("#token", "not-the-token")
        page.click("#login-form button")
        page.wait_for_selector("#login-error:has-text('The token was refused')")
        assert page.locator("#console").is_hidden()
        assert page.locator("#records tbody tr, #chart rect, #attention-table tbody tr, #tiles .tile").count() == 0
        assert paid_task not in page.content() and "paid-echo" not in page.inner_text("body")

        # the right one: the paid request in the table and the chart, its story, the owed one and its retry
        page.fill("#token", TOKEN)
        page.click("#login-form button")
        page.wait_for_selector("#console:not(.hidden)")
        page.wait_for_selector(f"#owed-table tbody tr:has-text('{owed_task[:12]}')")
        records = console.api("records").json()["records"]
        settled = next(r for r in records if r["task_id"] == paid_task)
        assert settled["state"] == "settled" and settled["amount"] == "1000"
        row = page.locator(f"#records tbody tr[data-payment-id='{settled['payment_id']}']")
        row.wait_for()
        assert "settled" in row.inner_text() and "paid-echo" in row.inner_text()
        bar = page.locator("#chart rect[data-agent='paid-echo']")
        bar.wait_for()
        assert int(bar.get_attribute("data-revenue") or 0) >= 1000
        row.click()
        story = page.locator("#story")
        story.wait_for()
        assert "verify" in story.inner_text() and "settle" in story.inner_text() and paid_task in story.inner_text()
        next_retry = page.locator(f"#owed-table tbody tr:has-text('{owed_task[:12]}') td").nth(3).inner_text()
        assert re.fullmatch(r"\d\d-\d\d \d\d:\d\d( \(in \d+ s\))?", next_retry), next_retry
        page.wait_for_selector("#rates-table tbody tr[data-outcome='paid']")

        # needing attention, re-opened from the page, then settled by the reconciler
        to_needs_attention(console, owed_task)
        button = page.locator(f"#attention-table button.reopen[data-task-id='{owed_task}']")
        button.wait_for()
        console.faults()  # the facilitator is back
        button.click()
        page.wait_for_selector("#reopen-result:has-text('Re-opened 1')")
        wait_until("the re-opened payment settled", lambda: console.claims().get(owed_task) == "settled")
        page.wait_for_selector("#attention-empty:not(.hidden)")
        page.locator("#records tbody tr:has-text('settled')").first.wait_for()
        reopened = next(r for r in console.api("records").json()["records"] if r["task_id"] == owed_task)
        assert reopened["state"] == "settled" and reopened["transaction"], reopened
        # the 402 is counted once the process writes its request counts (every 10 s)
        expect(page.locator("#tiles [data-count='402s'] b")).not_to_have_text("0", timeout=30_000)
        assert page.locator("#tiles [data-count='paid requests'] b").inner_text() == "2"
        shown = page.content()

    # nothing secret anywhere the console shows: the page, every answer, every export
    answers = [console.api(path) for path in [*API_READS, *EXPORTS]]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
    assert all(a.headers["cache-control"] == "no-store" for a in answers)
    everything = "\n".join([shown, *(a.text for a in answers)])
    secrets = [*secrets_in(sent), api_key, payer.key.hex(), payer.key.hex().removeprefix("0x"), TOKEN]
    leaked = [s[:12] for s in secrets if s and s.lower() in everything.lower()]
    assert leaked == [], f"secrets shown by the console: {leaked}"
    assert re.search(r"\b0x[0-9a-f]{130}\b", everything) is None  # no signature of any kind

    # a wrong or missing token reads nothing; the A2A port has no console at all
    for token in (None, "not-the-token", TOKEN + "x"):
        for path in [*API_READS, EXPORTS[0]]:
            refused = console.api(path, token)
            assert refused.status_code == 401 and paid_task not in refused.text, path
    for path in ["/console/", *(f"/console/api/{p}" for p in API_READS)]:
        public = httpx.get(f"{devnet.gate.url}{path}", headers={"Authorization": f"Bearer {TOKEN}"})
        assert public.status_code == 404, path
    reopen = httpx.post(
        f"{devnet.gate.url}/console/api/reopen",
        json={"task_id": owed_task},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert reopen.status_code == 404
