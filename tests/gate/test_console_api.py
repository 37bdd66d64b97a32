"""The console's JSON API in one process: its door (the operations listener and the token, never the
A2A port), its refusals (a filter it cannot take is a 400 naming it, never a 500), and the re-open
action's own checks (a JSON body, the same origin), over a SQLite file of the test's own.

The listener a request reached is the address Starlette's test client puts in the scope (`server`),
as uvicorn does: `http://127.0.0.1:9464` is the operations listener, `http://127.0.0.1:8000` the A2A port.
"""

from __future__ import annotations

import sqlite3
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gate.app import build_app
from gate.config import parse_config

TOKEN = "console-test-token-3f9a"
OPS, PUBLIC = "http://127.0.0.1:9464", "http://127.0.0.1:8000"
CONFIG = """
public_url = "http://127.0.0.1:8000"
database = "gate.db"

[http]
{http}

[agents.echo]
"""
BOTH = 'metrics_listen = "127.0.0.1:9464"\nmetrics_token_env = "CONSOLE_TEST_TOKEN"'
READS = ["records", "summary", "attention", "channels", "rates", "export"]


def client_for(tmp_path: Path, http: str, base_url: str) -> TestClient:
    settings = parse_config(tomllib.loads(CONFIG.format(http=http)), base_dir=tmp_path)
    return TestClient(build_app(settings), base_url=base_url)


@pytest.fixture
def ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("CONSOLE_TEST_TOKEN", TOKEN)
    with client_for(tmp_path, BOTH, OPS) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        yield client


def test_every_read_answers_json_with_the_token_and_nothing_is_cached(ops: TestClient) -> None:
    for path in READS:
        answer = ops.get(f"/console/api/{path}")
        assert answer.status_code == 200, (path, answer.text)
        assert answer.headers["cache-control"] == "no-store", path
    page = ops.get("/console/")
    assert page.status_code == 200 and "a2a-gate console" in page.text
    assert page.headers["cache-control"] == "no-store"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


@pytest.mark.parametrize("given", [None, "Bearer wrong-token", f"Basic {TOKEN}", TOKEN, f"Bearer {TOKEN}x"])
def test_a_wrong_or_missing_token_reads_nothing(ops: TestClient, given: str | None) -> None:
    del ops.headers["Authorization"]
    headers = {} if given is None else {"Authorization": given}
    for path in READS:
        answer = ops.get(f"/console/api/{path}", headers=headers)
        assert (answer.status_code, answer.json()) == (401, {"detail": "Not authenticated"}), path
        assert answer.headers["cache-control"] == "no-store"
    posted = ops.post("/console/api/reopen", json={"task_id": "t"}, headers=headers)
    assert posted.status_code == 401


def test_the_console_is_never_served_on_the_a2a_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONSOLE_TEST_TOKEN", TOKEN)
    with client_for(tmp_path, BOTH, PUBLIC) as public:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for path in ["/console/", "/console", *(f"/console/api/{p}" for p in READS)]:
            assert public.get(path, headers=auth).status_code == 404, path
        assert public.post("/console/api/reopen", json={"task_id": "t"}, headers=auth).status_code == 404


@pytest.mark.parametrize(
    "http",
    ['metrics_listen = "127.0.0.1:9464"', 'metrics_token_env = "CONSOLE_TEST_TOKEN"', ""],
    ids=["no-token", "no-listener", "neither"],
)
def test_without_its_listener_and_a_token_there_is_no_console(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, http: str
) -> None:
    monkeypatch.setenv("CONSOLE_TEST_TOKEN", TOKEN)
    for base in (OPS, PUBLIC):
        with client_for(tmp_path, http, base) as client:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            assert client.get("/console/", headers=auth).status_code == 404
            assert client.get("/console/api/records", headers=auth).status_code == 404


BAD = [
    ("records?state=paid", "state 'paid': not a record state"),
    ("records?since=yesterday", "since 'yesterday': not a date"),
    ("records?since=2026-12-02&until=2026-12-01", "until '2026-12-01' is not after since '2026-12-02'"),
    ("records?until=99999-01-01", "until '99999-01-01': not a date"),
    ("records?limit=0", "limit '0': a whole number from 1 to 1000"),
    ("records?limit=abc", "limit 'abc'"),
    ("records?limit=1000000", "limit '1000000'"),
    ("records?limit=-5", "limit '-5'"),
    ("records?colour=red", "unknown parameter 'colour'"),
    ("records?agent=a&agent=b", "parameter 'agent' given twice"),
    ("summary?state=settled", "unknown parameter 'state'"),
    ("summary?since=1x", "since '1x': not a date"),
    ("attention?limit=5", "unknown parameter 'limit'"),
    ("channels?limit=x", "limit 'x'"),
    ("rates?x=1", "unknown parameter 'x'"),
    ("export?format=xml", "format 'xml': one of csv, json"),
    ("export?what=everything", "what 'everything': one of records, summary"),
    ("export?what=summary&state=settled", "state filters records; the summary counts every state"),
    ("export?what=summary&payer=0xab", "payer filters records; the summary counts every payer"),
    ("export?since=2026-13-45", "since '2026-13-45': not a date"),
    ("records?since=%00%ff", "since"),
]


@pytest.mark.parametrize(("query", "said"), BAD, ids=[q for q, _ in BAD])
def test_a_filter_the_api_cannot_take_is_a_400_naming_it(ops: TestClient, query: str, said: str) -> None:
    answer = ops.get(f"/console/api/{query}")
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert said in answer.json()["error"]


def needs_attention(db: Path, task_id: str, sealed: str = "sealed-payload") -> None:
    now = time.time()
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO claims (token_digest, nonce_key, request_digest, agent, state, task_id, payer,"
            " created_at, updated_at, sealed_payment, last_error) VALUES (?, '', 'r', 'echo', 'needs_attention',"
            " ?, '0xab', ?, ?, ?, 'no rpc_url for eip155:84532')",
            (f"digest-{task_id}", task_id, now, now, sealed),
        )


def claim_state(db: Path, task_id: str) -> str:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT state FROM claims WHERE task_id = ?", (task_id,)).fetchone()[0]


def test_reopen_puts_a_payment_needing_attention_back_to_owed(ops: TestClient, tmp_path: Path) -> None:
    needs_attention(tmp_path / "gate.db", "task-1")
    queue = ops.get("/console/api/attention").json()
    assert [(c["task_id"], c["reopenable"]) for c in queue["needs_attention"]] == [("task-1", True)]
    answer = ops.post("/console/api/reopen", json={"task_id": "task-1"})
    assert (answer.status_code, answer.json()) == (200, {"reopened": 1})
    assert answer.headers["cache-control"] == "no-store"
    assert claim_state(tmp_path / "gate.db", "task-1") == "settle_failed"
    queue = ops.get("/console/api/attention").json()
    assert queue["needs_attention"] == [] and [c["task_id"] for c in queue["owed"]] == ["task-1"]
    assert queue["owed"][0]["next_retry_at"].endswith("Z")
    again = ops.post("/console/api/reopen", json={"task_id": "task-1"})
    assert again.status_code == 404 and again.json()["reopened"] == 0


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Content-Type": "text/plain"}, 403),  # what a cross-site form can send without a preflight
        ({"Content-Type": "application/x-www-form-urlencoded"}, 403),
        ({"Content-Type": "application/json", "Origin": "https://evil.example"}, 403),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "same-site"}, 403),
        ({"Content-Type": "application/json", "Origin": OPS, "Sec-Fetch-Site": "same-origin"}, 200),
    ],
)
def test_reopen_refuses_what_another_site_could_send(
    ops: TestClient, tmp_path: Path, headers: dict[str, str], status: int
) -> None:
    needs_attention(tmp_path / "gate.db", "task-2")
    answer = ops.post("/console/api/reopen", content=b'{"task_id": "task-2"}', headers=headers)
    assert answer.status_code == status, answer.text
    assert claim_state(tmp_path / "gate.db", "task-2") == ("settle_failed" if status == 200 else "needs_attention")


@pytest.mark.parametrize(
    "body", [b"", b"not json", b"[]", b'{"task_id": 5}', b'{"task_id": ""}', b'{"other": "x"}', b"[" * 100000]
)
def test_reopen_takes_one_task_id_or_says_what_it_takes(ops: TestClient, body: bytes) -> None:
    answer = ops.post("/console/api/reopen", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]


def test_reopen_is_a_post_only(ops: TestClient) -> None:
    assert ops.get("/console/api/reopen").status_code == 405
    assert ops.post("/console/api/records").status_code == 405


def log_rows(db: Path, *rows: dict[str, object]) -> None:
    with sqlite3.connect(db) as conn:
        for row in rows:
            names = ", ".join(f'"{k}"' for k in row)
            conn.execute(f"INSERT INTO payments ({names}) VALUES ({', '.join('?' for _ in row)})", list(row.values()))


def payment(action: str, at: float, **fields: object) -> dict[str, object]:
    base = {"at": at, "action": action, "agent": "echo", "task_id": "task-9", "token_digest": "digest-9",
            "payer": "0xab", "amount": "1000", "authorized": "1000", "network": "eip155:84532",
            "asset": "0xasset", "scheme": "exact", "transaction": "", "error": ""}  # fmt: skip
    return {**base, **fields}


def test_records_and_their_stories_and_the_summary_read_the_log(ops: TestClient, tmp_path: Path) -> None:
    now = time.time()
    log_rows(
        tmp_path / "gate.db",
        payment("verify", now - 3),
        payment("settle_failed", now - 2, error="settle_unavailable: timeout"),
        payment("settle", now - 1, transaction="0xfeed"),
    )
    (record,) = ops.get("/console/api/records", params={"agent": "echo", "since": "1h"}).json()["records"]
    assert (record["state"], record["amount"], record["transaction"], record["task_id"]) == (
        "settled", "1000", "0xfeed", "task-9"
    )  # fmt: skip
    assert [s["action"] for s in record["story"]] == ["verify", "settle_failed", "settle"]
    assert (
        record["story"][1]["error"] == "settle_unavailable: timeout" and record["story"][2]["transaction"] == "0xfeed"
    )
    assert ops.get("/console/api/records", params={"state": "owed"}).json()["records"] == []
    assert ops.get("/console/api/records", params={"agent": "other"}).json()["records"] == []
    (row,) = ops.get("/console/api/summary").json()["rows"]
    assert (row["agent"], row["revenue"], row["settled"], row["settle_failures"]) == ("echo", "1000", 1, 1)
    csv_text = ops.get("/console/api/export", params={"format": "csv"}).text
    assert csv_text.splitlines()[0].startswith("payment_id,state,agent") and "0xfeed" in csv_text


def test_channels_holding_unclaimed_charges_say_their_oldest_charge_and_the_withdrawal(
    ops: TestClient, tmp_path: Path
) -> None:
    now = time.time()
    with sqlite3.connect(tmp_path / "gate.db") as conn:
        for channel, charged, claimed, withdraw in (
            ("0x" + "c1" * 32, 5000, 2000, int(now) - 100),
            ("0x" + "c2" * 32, 10, 10, 0),
        ):
            conn.execute(
                "INSERT INTO channels (channel_id, network, asset, payer, receiver, config, balance, total_claimed,"
                " withdraw_requested_at, charged, voucher_max, sealed_voucher, first_charged_at, created_at, updated_at)"
                " VALUES (?, 'eip155:84532', '0xasset', '0xab', '0xcd', ?, '9000', ?, ?, ?, ?, 'sealed', ?, ?, ?)",
                (channel, '{"withdrawDelay": 900}', str(claimed), withdraw, str(charged), str(charged), now - 60, now, now),
            )  # fmt: skip
    body = ops.get("/console/api/channels").json()
    (shown,) = body["channels"]  # the second has nothing unclaimed
    assert (shown["channel"], shown["unclaimed"], shown["state"], body["count"]) == (
        "0x" + "c1" * 32,
        "3000",
        "withdrawing",
        1,
    )
    assert 55 <= shown["oldest_unclaimed_age_seconds"] <= 120
    assert 700 <= shown["withdrawal_finalizable_in_seconds"] <= 800  # requested 100 s ago, 900 s of delay


def test_request_rates_are_the_request_counters_growth_over_the_last_minute(ops: TestClient) -> None:
    from gate.console.rates import RequestRates

    services = ops.app.state.services  # type: ignore[attr-defined]
    clock = [1000.0]
    rates = RequestRates(services.metrics.registry, clock=lambda: clock[0])
    for _ in range(30):
        services.metrics.count_request("echo", "anonymous", "payment_required")
    clock[0] += 10
    first = rates.read()
    assert first["per_second"]["payment_required"] == 3.0 and first["totals"]["payment_required"] == 30
    assert first["per_second"]["caller:anonymous"] == 3.0
    clock[0] += 120  # the window moves on: nothing new since
    rates.read()
    clock[0] += 10
    assert rates.read()["per_second"]["payment_required"] == 0.0
    assert "payment_required" in ops.get("/console/api/rates").json()["totals"]


@pytest.mark.parametrize(
    ("listen", "token_env"), [(None, "CONSOLE_TEST_TOKEN"), (("127.0.0.1", 9464), None), (None, None)]
)
def test_the_door_itself_refuses_a_console_without_its_listener_and_token(
    monkeypatch: pytest.MonkeyPatch, listen: tuple[str, int] | None, token_env: str | None
) -> None:
    """MetricsAccess on its own (the server also mounts no console then): each guard holds alone."""
    from dataclasses import replace

    from server.config import HttpConfig
    from server.metrics import MetricsAccess

    monkeypatch.setenv("CONSOLE_TEST_TOKEN", TOKEN)
    door = MetricsAccess(lambda *a: None, replace(HttpConfig(), metrics_listen=listen, metrics_token_env=token_env))  # type: ignore[arg-type]
    for path in ("/console/", "/console/api/records"):
        scope = {"type": "http", "path": path, "server": ("127.0.0.1", 9464),
                 "headers": [(b"authorization", f"Bearer {TOKEN}".encode())]}  # fmt: skip
        refusal = door.refusal(scope)
        assert refusal is not None and refusal.status_code == 404, path
