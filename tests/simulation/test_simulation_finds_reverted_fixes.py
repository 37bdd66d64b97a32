"""The money simulation earns its place: with any one of its fixes reverted, it fails.

Each case below puts back, in memory, what the code did before one fix (a "mutant"), runs
the state machine of `tests/simulation/test_money_simulation.py` on SQLite, and asserts that it finds
the violation, by the invariant that names it:

| reverted fix | what the code did before | the rule that finds it |
|---|---|---|
| fencing | claim writes named only the token digest; a lost renewal went unnoticed | one delivery per signature, charged only when delivered |
| one clock | leases judged by the replica's own clock | a live claim taken over before its lease ran out by the database's clock |
| evidence | a spent nonce counted as paid | settled means a transfer to payTo |
| settle budget | a replay re-drove a settle whenever the claim was owed | a replay of an owed claim settled before it was due |
| sealing key | a replica with another key started | every running replica holds the database's sealing key |
| one write | the writes sent with a claim's update (the delivered task, its log row) applied even when it missed | one delivery per signature |
| channel charge at delivery | a voucher charged its channel when it reserved it | a channel charges only delivered increments |
| canonical voucher signatures (finding 1) | a voucher's signer recovered from a high-s twin or v as 0/1 | a charged voucher is one the contract takes |
| claim batch isolation (finding 1) | a receiver's claims were one batch, failed whole for one refused row | one refused claim row never stops another channel's claim |
| every channel paged (finding 2) | the claim job and the withdrawal watch read 100 channels by latest charge | a claim pass brings every channel's claimed total to its charged total |
| first unclaimed charge (finding 2) | a channel was due by the age of its latest charge | a scheduled pass claims every channel whose first unclaimed charge is due |
| ceiling ends the work (finding 3) | every part of a usage-priced stream was delivered, its charge capped | no chunk is delivered past the one whose usage reached the ceiling |
| async pricing awaited (finding 4) | an `async def` pricing callable was not awaited: every delivery charged 0 | an upto charge is the priced usage of the delivered work |

The exact-path mutants run the world without the payment channel (`MoneyWorld`: its rules would
spread the same search budget thinner); the channel mutants run `MoneyWorldWithChannels`, the
operator's (findings 1 and 2 of the adversarial-payer round) `OperatorMoneyWorld` and the usage
mutants (findings 3 and 4) `UptoMoneyWorld`. (A
reservation ignored is not in this list: one payer's vouchers cannot race in the simulation; the
replica tests race two vouchers on one base, `tests/gate/flows/channel/test_channels_replicas.py`. Nor is check-config's
claim obligation put back: the simulation shows it in two steps, an operator with no rpc_url and
claims after 3600 s, then a withdrawal, but its search does not reach that pair within a budget
this test can spend.)
"""

from __future__ import annotations

import inspect
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from coincurve import PublicKey
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from gate import chain as gate_chain
from gate import claims as gate_claims
from gate import sealing
from gate.facilitator import Unavailable
from gate.flows.base import SettledWrite
from gate.flows.channel import flow as channel_flow
from gate.flows.channel import jobs as channel_jobs
from gate.flows.channel import store as gate_channels
from gate.flows.channel import vouchers
from gate.flows.metered import flow as metered
from gate.price import UsagePrice
from gate.schemes import batch_settlement
from tests.simulation import test_money_simulation as simulation
from tests.support import money_world


def without_fencing(mp: pytest.MonkeyPatch) -> None:
    def update(self: Any, hold: Any, expected: Any, values: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
        columns = [f"{k} = ?" for k in values if k not in ("lease", "next_settle_in")]
        args = [v for k, v in values.items() if k not in ("lease", "next_settle_in")]
        if values.get("lease"):
            columns.append(f"lease_until = {self.now} + ?")
            args.append(self.lease_seconds)
        if "next_settle_in" in values:
            columns.append(f"next_settle_at = {self.now} + ?")
            args.append(values["next_settle_in"])
        return f"UPDATE claims SET {', '.join(columns)} WHERE token_digest = ?", (*args, hold.token_digest)

    def ours(self: Any, hold: Any, states: Any, *write: Any) -> tuple[str, tuple[Any, ...]]:
        return "EXISTS (SELECT 1 FROM claims WHERE token_digest = ?)", (hold.token_digest,)

    async def release(self: Any, hold: Any) -> None:
        self.held.pop(hold.token_digest, None)
        await self.db.execute("DELETE FROM claims WHERE token_digest = ? AND state = 'running'", (hold.token_digest,))

    async def renew(self: Any) -> list[Any]:
        if self.held:
            marks = ", ".join("?" for _ in self.held)
            sql = f"UPDATE claims SET lease_until = {self.now} + ? WHERE token_digest IN ({marks})"
            await self.db.execute(sql, (self.lease_seconds, *self.held))
        return []

    mp.setattr(gate_claims.Claims, "_update", update)
    mp.setattr(gate_claims.Claims, "_ours", ours)
    mp.setattr(gate_claims.Claims, "_lost", lambda self, hold, write: None)  # a write that missed went unnoticed
    mp.setattr(gate_claims.Claims, "release", release)
    mp.setattr(gate_claims.Claims, "renew", renew)


def with_each_replicas_own_clock(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(gate_claims.Claims, "now", property(lambda self: repr(float(self.local_clock()))))


def with_a_spent_nonce_as_payment(mp: pytest.MonkeyPatch) -> None:
    async def facts(self: Any, authorization: Any, pay_to: str, amount: int) -> Any:
        used = await self._authorization_state(authorization)
        return gate_chain.AuthorizationFacts(used=used, paid=used, transaction="0x" + "00" * 32)

    mp.setattr(gate_chain.Chain, "facts", facts)


def with_replays_settling_at_once(mp: pytest.MonkeyPatch) -> None:
    take_owed = gate_claims.Claims.take_owed

    async def at_once(self: Any, token_digest: str, *, due_only: bool = True) -> Any:
        return await take_owed(self, token_digest, due_only=False)

    mp.setattr(gate_claims.Claims, "take_owed", at_once)


def with_any_sealing_key(mp: pytest.MonkeyPatch) -> None:
    async def check(self: Any, db: Any) -> None:  # records the first key, never refuses another
        await db.migrate("sealing", sealing.MIGRATIONS)
        await db.execute(
            "INSERT INTO sealing (name, fingerprint) VALUES ('key', ?) ON CONFLICT DO NOTHING", (self.fingerprint,)
        )

    mp.setattr(sealing.Sealer, "check", check)


def with_unguarded_writes(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(gate_claims.Claims, "_ours", lambda self, hold, states, *write: ("1 = 1", ()))


def with_channels_charged_at_reservation(mp: pytest.MonkeyPatch) -> None:
    check_and_reserve = vouchers.check_and_reserve

    async def early(
        channels: Any, facilitator: Any, token: Any, requirements: Any, price: Any, unseal: Any, *rest: Any
    ) -> Any:
        checked = await check_and_reserve(channels, facilitator, token, requirements, price, unseal, *rest)
        if checked.kind == "reserved":
            voucher = batch_settlement.read(token.payload["payload"])
            await channels.db.execute(
                "UPDATE channels SET charged = ? WHERE channel_id = ?", (str(voucher.max_claimable), voucher.channel_id)
            )
        return checked

    mp.setattr(vouchers, "check_and_reserve", early)


def with_channels_charged_by_any_claim(mp: pytest.MonkeyPatch) -> None:
    settled_write = channel_flow.ChannelFlow.settled_write

    def unguarded(self: Any, payment: Any, answer: Any) -> Any:
        written = settled_write(self, payment, answer)
        sql, args = written.first[0](("1 = 1", ()))  # the channel charged whether or not the claim is ours
        return SettledWrite(written.receipt, written.note, (lambda ours: (sql, args),), written.provided, written.unmet)

    mp.setattr(channel_flow.ChannelFlow, "settled_write", unguarded)


def with_any_voucher_signature_form(mp: pytest.MonkeyPatch) -> None:
    """Finding 1: a voucher's signer recovered from any form ecrecover maps to it (high s, v as 0/1)."""

    def recover(digest: bytes, signature: str) -> str | None:
        raw = bytes.fromhex(signature.removeprefix("0x"))
        if len(raw) != 65:
            return None
        v = raw[64] - 27 if raw[64] >= 27 else raw[64]
        if v not in (0, 1):
            return None
        try:
            key = PublicKey.from_signature_and_message(raw[:64] + bytes([v]), digest, hasher=None)
        except ValueError:
            return None
        return batch_settlement._address_of(key.format(compressed=False)[1:])

    mp.setattr(batch_settlement, "recover", recover)


def with_claims_in_one_batch(mp: pytest.MonkeyPatch) -> None:
    """Finding 1: a receiver's claims sent as one batch, failed whole when the contract refuses a row."""

    async def claim_batch(flow: Any, network: str, asset: str, receiver: str, channels: list[Any]) -> Any:
        fence = secrets.token_hex(8)
        taken = [c for c in channels if await flow.store.take_claim(c, fence, channel_jobs.CHANNEL_JOB_LEASE_SECONDS)]
        if not taken:
            return [{"outcome": "skipped", "channels": 0, "receiver": receiver}]
        try:
            answer = await channel_jobs.send_claims(flow, network, asset, receiver, taken)
        except Unavailable as exc:
            return [await channel_jobs.claim_failed(flow, taken, fence, exc.reason, unknown=True)]
        if answer.success:
            return [await channel_jobs.claimed_rows(flow, network, asset, taken, fence, answer)]
        return [await channel_jobs.claim_failed(flow, taken, fence, answer.reason, unknown=False)]

    mp.setattr(channel_jobs, "claim_batch", claim_batch)


def with_one_page_of_channels(mp: pytest.MonkeyPatch) -> None:
    """Finding 2: the claim job and the withdrawal watch read the first 100 channels by latest charge."""

    async def unclaimed(self: Any, page_size: int = 100) -> Any:
        rows = await self.db.fetch(
            f"SELECT *, {self.now} AS now FROM channels WHERE charged != total_claimed AND sealed_voucher != ''"
            " ORDER BY charged_at LIMIT ?",
            (page_size,),
        )
        page = [c for c in (gate_channels.Channel.from_row(r) for r in rows) if c.unclaimed > 0]
        if page:
            yield page

    mp.setattr(gate_channels.Channels, "unclaimed", unclaimed)


def with_a_channel_aged_by_its_latest_charge(mp: pytest.MonkeyPatch) -> None:
    """Finding 2: a channel is due by the age of its latest charge (`charged_at`), not its first unclaimed."""

    def due(self: Any, min_amount: int, max_age_seconds: float) -> bool:
        return self.unclaimed > 0 and (
            self.unclaimed >= min_amount
            or self.now - self.charged_at >= max_age_seconds
            or self.withdraw_requested_at > 0
        )

    mp.setattr(gate_channels.Channel, "due", due)


def with_streams_past_the_ceiling(mp: pytest.MonkeyPatch) -> None:
    """Finding 3: each part of a usage-priced stream recorded and shown, its charge capped; the run goes on."""

    async def unstopped(self: Any, task: dict[str, Any], used: Any, save: Any, record: Any) -> None:
        await record(task, used, save, None)

    mp.setattr(metered.UsageMeter, "part", unstopped)


def with_pricing_callables_not_awaited(mp: pytest.MonkeyPatch) -> None:
    """Finding 4: an `async def` pricing callable called and not awaited: its coroutine is no amount."""
    priced = UsagePrice.priced

    async def unawaited(self: Any, used: Any) -> int:
        if self.function is None:
            return await priced(self, used)
        amount = self.function(dict(used))
        if inspect.iscoroutine(amount):
            amount.close()
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            raise ValueError(f"the pricing callable returned {type(amount).__name__}, not a whole amount >= 0")
        return amount

    mp.setattr(UsagePrice, "priced", unawaited)


MUTANTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "fencing": without_fencing,
    "one clock": with_each_replicas_own_clock,
    "evidence": with_a_spent_nonce_as_payment,
    "settle budget": with_replays_settling_at_once,
    "sealing key": with_any_sealing_key,
    "one write": with_unguarded_writes,
    "channel charge at delivery": with_channels_charged_at_reservation,
    "channel charge by our claim": with_channels_charged_by_any_claim,
    "canonical voucher signatures": with_any_voucher_signature_form,
    "claim batch isolation": with_claims_in_one_batch,
    "every channel paged": with_one_page_of_channels,
    "first unclaimed charge": with_a_channel_aged_by_its_latest_charge,
    "ceiling ends the work": with_streams_past_the_ceiling,
    "async pricing awaited": with_pricing_callables_not_awaited,
}
CHANNEL_MUTANTS = ("channel charge at delivery", "channel charge by our claim")
OPERATOR_MUTANTS = (
    "canonical voucher signatures",
    "claim batch isolation",
    "every channel paged",
    "first unclaimed charge",
)
USAGE_MUTANTS = ("ceiling ends the work", "async pricing awaited")
# a stale replica's agent must finish after the takeover, before its renewal notices: rarer (on the channel
# world, after a deposit and a voucher)
EXAMPLES = {
    "one write": 300,
    "channel charge by our claim": 300,
    # the operator's and the usage mutants: found well inside these (deterministic: derandomized)
    "canonical voucher signatures": 60,
    "claim batch isolation": 30,
    "every channel paged": 30,
    "first unclaimed charge": 20,
    "ceiling ends the work": 20,
    "async pricing awaited": 20,
}
# what the simulation's invariants say when they find a violation (a failure of its own
# plumbing, a hang or an error, is not a finding)
VIOLATIONS = (
    "delivered 2 times",
    "charged but not delivered",
    "charged, never delivered",
    "charged, no settled claim",
    "before its lease ran out",
    "settled without a transfer",
    "settled before it was due",
    "runs with another sealing key",
    "withheld answer shown unpaid",
    "claims never ended",
    "delivered increments",
    "no delivered voucher is for it",
    "neither charged nor written off",
    "the kept voucher is not the payer's",
    "short of the charged total",
    "whose signature the contract refuses",
    "one refused claim row stopped another channel's claim",
    "check-config accepts the operator's setting",  # (check-config's own claim obligation: not a mutant, see below)
    "left unclaimed by a scheduled pass",
    "past the one whose usage reached the ceiling",
    "usage priced",
    "charged with no voucher kept",
)


@pytest.mark.parametrize(
    "fix",
    list(MUTANTS),
)
def test_the_simulation_finds_the_reverted_fix(fix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    revert = MUTANTS[fix]
    monkeypatch.setenv("A2A_GATE_SEALING_KEY", "Vf0zQw4Jm9q8u4C7bJ9oZr2H1s0xk3L5n6p7r8t9v0w=")
    money_world.quicker(monkeypatch)
    revert(monkeypatch)
    world: type[simulation.MoneyWorld] = simulation.MoneyWorld
    if fix in CHANNEL_MUTANTS:
        world = simulation.MoneyWorldWithChannels
    elif fix in OPERATOR_MUTANTS:
        world = simulation.OperatorMoneyWorld
    elif fix in USAGE_MUTANTS:
        world = simulation.UptoMoneyWorld
    machine = type("MutantWorld", (world,), {"database": "sqlite", "workdir": tmp_path})
    for scenario_world, steps in simulation.SCENARIOS.values():  # the named scenarios first, as they are
        if world is scenario_world:  # (a subclass may configure its world otherwise: the operator world)
            try:
                simulation.run_scenario(machine, steps)
            except AssertionError as failure:
                if found_by := [m for m in VIOLATIONS if any(m in str(f) for f in flatten(failure))]:
                    print(f"{fix}: found by {found_by} in a named scenario")
                    return
    with pytest.raises(BaseException) as found:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=int(os.environ.get("MUTANT_EXAMPLES", EXAMPLES.get(fix, 60))),
                stateful_step_count=40,
                deadline=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.generate],  # finding it is the point, not the smallest case
                print_blob=False,
            ),
        )
    failures = [f for f in flatten(found.value) if isinstance(f, AssertionError)]
    found_by = [m for m in VIOLATIONS if any(m in str(f) for f in failures)]
    print(f"{fix}: found by {found_by}")
    assert found_by, [f"{type(f).__name__}: {f}" for f in flatten(found.value)]


def flatten(exc: BaseException) -> list[BaseException]:
    """Every failure inside hypothesis's groups and flaky reports."""
    out, todo = [], [exc]
    while todo:
        e = todo.pop()
        out.append(e)
        todo.extend(getattr(e, "exceptions", ()) or ())
        # an invariant's failure may be the context of an error in the teardown that followed it
        todo.extend(c for c in (e.__cause__, e.__context__) if c is not None and c not in out)
    return out
