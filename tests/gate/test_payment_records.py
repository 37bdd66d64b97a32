"""Payment records: what each state of the log and the claims reads as, on both engines, and the
`payments records` / `payments export` commands' refusals of a filter they cannot take."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from gate import payment_exports as exports
from gate.claims import Claim, ClaimState
from gate.payment_log import PaymentLog
from gate.payment_records import Filters, PaymentRecords, channel_note, derive, refund_record
from server.engines import open_database
from tests.support.gate_helpers import cli

ASSET, NETWORK, PAYER = "0x036cbd53842c5426634e7929541ec2318f3dcf7e", "eip155:84532", "0x" + "ab" * 20
CHANNEL = "0x" + "c1" * 32


def row(action: str, at: float, digest: str = "d1", **fields: Any) -> dict[str, Any]:
    base = dict(
        id=int(at * 10),
        at=at,
        action=action,
        agent="paid",
        task_id="",
        token_digest=digest,
        payer=PAYER,
        amount="1000",
        authorized="1000",
        network=NETWORK,
        asset=ASSET,
        scheme="exact",
        transaction="",
        error="",
    )
    base["authorized"] = fields.get("amount", "1000")  # as the log writes it: authorized or amount
    return {**base, **fields}


def claim(state: ClaimState, error: str = "") -> Claim:
    return Claim("d1", "", "r", "paid", state, "t1", PAYER, "", last_error=error)


def test_a_settled_payment_has_its_transaction_and_every_time() -> None:
    record = derive([row("verify", 1.0), row("settle", 2.0, task_id="t1", transaction="0xfeed")])
    assert (record.state, record.amount, record.collected, record.transaction) == ("settled", "1000", "1000", "0xfeed")
    assert (record.verified_at, record.delivered_at, record.settled_at, record.task_id) == (1.0, 2.0, 2.0, "t1")
    assert record.error == "" and record.reasons == ()


def test_an_owed_payment_names_its_failures_and_becomes_settled_when_a_pass_lands() -> None:
    rows = [row("verify", 1.0), row("settle_failed", 2.0, error="settle_unavailable: timeout")]
    owed = derive(rows)
    assert (owed.state, owed.collected, owed.settle_failures, owed.error) == (
        "owed",
        "0",
        1,
        "settle_unavailable: timeout",
    )
    paid = derive([*rows, row("settle", 9.0, transaction="0x1")])
    assert (paid.state, paid.delivered_at, paid.settled_at, paid.reasons) == (
        "settled",
        2.0,
        9.0,
        ("settle_unavailable: timeout",),
    )


@pytest.mark.parametrize(
    ("action", "state"),
    [("write_off", "written_off"), ("needs_attention", "needs_attention"), ("no_charge", "no_charge")],
)
def test_a_terminal_outcome_is_the_state_with_its_reason(action: str, state: str) -> None:
    amount = "0" if action == "no_charge" else "1000"
    record = derive([row("verify", 1.0, amount="50000"), row(action, 2.0, amount=amount, error=f"why {action}")])
    assert (record.state, record.error, record.amount, record.collected) == (state, f"why {action}", amount, "0")
    assert record.authorized == "50000"


def test_an_upto_charge_is_the_settled_amount_beside_the_ceiling_authorized() -> None:
    rows = [
        row("verify", 1.0, amount="50000", scheme="upto"),
        row("settle", 2.0, amount="130", authorized="50000", scheme="upto"),
    ]
    record = derive(rows)
    assert (record.scheme, record.amount, record.authorized, record.collected) == ("upto", "130", "50000", "130")


def test_a_released_payment_charged_nothing_and_a_retry_that_paid_is_settled() -> None:
    released = [row("verify", 1.0), row("release", 2.0, error="task failed: not charged")]
    assert (derive(released).state, derive(released).amount, derive(released).delivered_at) == ("released", "0", None)
    retried = derive([*released, row("verify", 3.0), row("settle", 4.0, transaction="0x2")])
    assert (retried.state, retried.verified_at, retried.transaction) == ("settled", 1.0, "0x2")


def test_a_refused_token_is_rejected_with_its_reason_and_a_later_refusal_never_unsettles() -> None:
    rejected = derive([row("reject", 1.0, payer="", error="payment_expired")])
    assert (rejected.state, rejected.error, rejected.amount, rejected.verified_at) == (
        "rejected",
        "payment_expired",
        "0",
        None,
    )
    reused = derive([row("verify", 1.0), row("settle", 2.0), row("reject", 3.0, error="payment_already_used")])
    assert (reused.state, reused.reasons) == ("settled", ("payment_already_used",))


def test_a_live_claim_says_where_the_payment_stands_now() -> None:
    rows = [row("verify", 1.0)]
    assert derive(rows, claim(ClaimState.RUNNING)).state == "verified"
    assert derive(rows, claim(ClaimState.SETTLING)).state == "delivered"
    # re-opened by an operator: no row says so, the claim does
    attention = [*rows, row("needs_attention", 2.0, error="no rpc_url")]
    reopened = derive(attention, claim(ClaimState.SETTLE_FAILED, "reopened"))
    assert (reopened.state, reopened.error) == ("owed", "reopened")


def voucher(at: float, total: int, digest: str = "v1") -> list[dict[str, Any]]:
    note = f"channel {CHANNEL[:18]} charged to {total}"
    return [
        row("verify", at, digest, scheme="batch-settlement"),
        row("settle", at + 0.1, digest, scheme="batch-settlement", error=note),
    ]


def channel_row(action: str, at: float, note: str, transaction: str = "") -> dict[str, Any]:
    return row(action, at, "latest", agent="", scheme="batch-settlement", transaction=transaction, error=note)


def test_a_voucher_is_charged_until_its_channels_claim_covers_it() -> None:
    charged = derive(voucher(1.0, 3000), channel_rows=[])
    assert (charged.state, charged.channel, charged.collected, charged.transaction) == (
        "charged",
        CHANNEL[:18],
        "0",
        "",
    )
    short = channel_row("channel_claim", 2.0, f"channel {CHANNEL[:18]} claimed to 2000", "0xaa")
    other = channel_row("channel_claim", 3.0, f"channel 0x{'d2' * 8} claimed to 9000", "0xbb")
    assert derive(voucher(1.0, 3000), channel_rows=[short, other]).state == "charged"
    covering = channel_row("channel_claim", 4.0, f"channel {CHANNEL[:18]} claimed to 3000", "0xcc")
    claimed = derive(voucher(1.0, 3000), channel_rows=[covering, short])
    assert (claimed.state, claimed.transaction, claimed.settled_at, claimed.collected) == (
        "settled",
        "0xcc",
        4.0,
        "1000",
    )


def test_a_vouchers_claim_that_fails_or_is_refused_is_on_its_record() -> None:
    failed = channel_row("channel_claim_failed", 2.0, "settle_unavailable: timeout")
    assert derive(voucher(1.0, 1000), channel_rows=[failed]).state == "charged"  # no channel named: not this one
    failed = channel_row("channel_claim_failed", 2.0, f"refused, set aside: channel {CHANNEL[:18]}: balance")
    refused = channel_row("needs_attention", 2.1, f"channel {CHANNEL[:18]}: the contract refuses its claim (x)")
    record = derive(voucher(1.0, 1000), channel_rows=[failed, refused])
    assert (record.state, record.settle_failures) == ("needs_attention", 1)
    assert record.reasons == (failed["error"], refused["error"])
    retried = channel_row("channel_claim", 5.0, f"channel {CHANNEL[:18]} claimed to 1000", "0xdd")
    assert derive(voucher(1.0, 1000), channel_rows=[failed, refused, retried]).state == "settled"


def test_a_channel_refund_is_a_record_of_its_own() -> None:
    note = f"channel {CHANNEL[:18]} refunded; claimed to 3000"
    refund = refund_record(channel_row("channel_refund", 7.0, note, "0xee") | {"amount": "7000", "id": 70})
    assert (refund.payment_id, refund.state, refund.amount, refund.collected, refund.channel) == (
        "refund-70",
        "refunded",
        "7000",
        "0",
        CHANNEL[:18],
    )
    # its claim on the way settles the vouchers it covered
    assert (
        derive(voucher(1.0, 3000), channel_rows=[channel_row("channel_refund", 7.0, note, "0xee")]).state == "settled"
    )


def test_the_channel_notes_are_read_as_the_flow_writes_them() -> None:
    assert channel_note(f"channel {CHANNEL[:18]} charged to 12000") == (CHANNEL[:18], "charged", 12000)
    assert channel_note(f"confirmed on chain: channel {CHANNEL[:18]} claimed to 5") == (CHANNEL[:18], "claimed", 5)
    assert channel_note("settle_unavailable: timeout") is None


async def fill(db_location: str) -> list[Any]:
    """A log of every kind of payment in one database; its records, oldest first and newest first."""
    db = open_database(db_location)
    await db.open()
    try:
        log = PaymentLog(db)
        await log.create_tables()
        from gate.claims import Claims

        await Claims(db).create_tables()
        fields = dict(agent="paid", network=NETWORK, asset=ASSET, scheme="exact")
        for action, digest, extra in [
            ("reject", "r1", {"error": "payment_expired"}),
            ("verify", "s1", {"payer": PAYER, "amount": "1000"}),
            ("settle", "s1", {"payer": PAYER, "amount": "1000", "transaction": "0x51", "task_id": "t1"}),
            ("verify", "o1", {"payer": PAYER, "amount": "1000"}),
            ("settle_failed", "o1", {"payer": PAYER, "amount": "1000", "error": "settle_unavailable: timeout"}),
            ("verify", "u1", {"payer": "0x" + "cd" * 20, "amount": "50000"}),
            ("no_charge", "u1", {"payer": "0x" + "cd" * 20, "amount": "0", "authorized": "50000"}),
        ]:
            await log.append(action, token_digest=digest, **{**fields, **extra})
            await asyncio.sleep(0.002)  # distinct times
        records = PaymentRecords(db)
        oldest = [r async for r in records.read(Filters())]
        newest = [r async for r in records.read(Filters(), newest_first=True)]
        owed = [r async for r in records.read(Filters(state="owed"))]
        mine = [r async for r in records.read(Filters(payer=PAYER.upper().replace("0X", "0x")))]
        since = oldest[2].started_at
        later = [r async for r in records.read(Filters(since=since, until=oldest[3].started_at))]
        text = "".join(
            [
                c
                async for c in exports.encoded(
                    exports.record_rows(records.read(Filters())), exports.RECORD_COLUMNS, "csv"
                )
            ]
        )
        return [oldest, newest, owed, mine, later, text]
    finally:
        await db.close()


def test_records_read_alike_from_sqlite_and_postgresql(tmp_path: Path, postgres_schema: Any) -> None:
    found = {}
    for engine, location in (("sqlite", str(tmp_path / "gate.db")), ("postgresql", postgres_schema.store_url())):
        oldest, newest, owed, mine, later, text = asyncio.run(fill(location))
        assert [r.payment_id for r in oldest] == ["r1", "s1", "o1", "u1"], engine
        assert [r.state for r in oldest] == ["rejected", "settled", "owed", "no_charge"], engine
        assert [r.payment_id for r in newest] == ["u1", "o1", "s1", "r1"], engine
        assert [r.payment_id for r in owed] == ["o1"] and [r.payment_id for r in mine] == ["s1", "o1"], engine
        assert [r.payment_id for r in later] == ["o1"], engine  # begun in [since, until)
        lines = list(csv.DictReader(io.StringIO(text)))
        assert list(lines[0]) == list(exports.RECORD_COLUMNS), engine
        assert [(x["state"], x["amount"], x["collected"], x["transaction"]) for x in lines][1] == (
            "settled",
            "1000",
            "1000",
            "0x51",
        )
        found[engine] = [(r.payment_id, r.state, r.amount, r.authorized, r.transaction) for r in oldest]
    assert found["sqlite"] == found["postgresql"]


def test_the_json_export_is_an_array_of_objects_in_column_order() -> None:
    async def encode() -> str:
        rows = exports.each([{"a": "1", "b": 2}, {"a": "x\ny", "b": 0}])
        return "".join([chunk async for chunk in exports.encoded(rows, ("a", "b"), "json")])

    text = asyncio.run(encode())
    assert json.loads(text) == [{"a": "1", "b": 2}, {"a": "x\ny", "b": 0}]
    assert list(json.loads(text)[0]) == ["a", "b"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["records", "--state", "paid"], "--state 'paid': not a record state"),
        (["records", "--since", "yesterday"], "--since 'yesterday': not a date"),
        (["export", "--format", "xml"], "--format 'xml': one of csv, json"),
        (["export", "--since", "2026-12-02", "--until", "2026-12-01"], "is not after --since"),
        (["export", "--what", "summary", "--state", "owed"], "--state filters records"),
        (["export", "--until", "2026-13-45"], "--until '2026-13-45': not a date"),
    ],
)
def test_a_bad_filter_is_one_line_and_exit_2(tmp_path: Path, args: list[str], said: str) -> None:
    done = cli("payments", *args, "--database", str(tmp_path / "gate.db"), check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and said in done.stderr
    assert "Traceback" not in done.stderr
