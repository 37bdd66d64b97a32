"""The gate's background duties: claims left behind, owed settlements, leases and the clock.

On start the gate resolves the claims a crashed process left behind (`recover`), then runs
the reconciler, which settles delivered-but-unsettled work exactly once (`reconcile`).
While the process lives, the leases of the claims whose work is alive here are renewed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from gate.claims import ENDED_STATES, Claim, ClaimLost, ClaimState, Hold
from gate.parts import GateParts
from gate.sealing import SealingKeyMissing
from gate.settlement import (
    ERROR,
    STATUS,
    Collection,
    Payment,
    attach_payment_metadata,
    metadata_for,
    with_payment_metadata,
    withheld_metadata,
)
from server.database import commit_until_stored
from server.dialects import TERMINAL_STATES
from server.tasks import agent_message, set_status

logger = logging.getLogger("a2a_gate.gate")

# A wall clock this far (as a fraction of the lease) from the database's is reported.
CLOCK_SKEW_WARNING = 0.1


async def check_sealing_key(parts: GateParts) -> None:
    """Refuse (`SealingKeyMismatch`) a key other than the one the database was sealed with;
    without a key at all there is nothing to check yet (the first seal says so)."""
    try:
        sealer = parts.sealer
    except SealingKeyMissing:
        return
    await sealer.check(parts.claims.db)


async def check_clock(parts: GateParts) -> float:
    """This process's wall clock minus the database's, reported when it strays: leases use
    the database's clock, but token windows and log times use this one."""
    skew = -await parts.store.sync_clock()  # one measurement: the task store judges deadlines by it too
    parts.metrics.clock_skew.set(skew)
    if abs(skew) > max(1.0, CLOCK_SKEW_WARNING * parts.claims.lease_seconds):
        logger.warning(
            "this process's clock differs from the database's by %+.1fs: claim leases use the"
            " database's clock, token windows and log times this one's; fix its time sync",
            skew,
        )
    return skew


async def recover(parts: GateParts) -> None:
    """Resolve orphans (claims whose owner's lease ran out): undelivered work is released,
    delivered work is owed, and its settle may have been sent. Each is taken under a new
    fence first, so its previous owner, should it wake up, can write nothing to it."""
    claims, store = parts.claims, parts.store
    for claim in await claims.orphans():
        hold = await claims.take_orphan(claim)
        if hold is None:
            continue  # its owner renewed, or another process took it
        if claim.state == ClaimState.SETTLING:
            logger.warning(
                "claim for task %s (agent %s) taken over: its owner %s stopped or lost its lease while"
                " settling; its settle may have been sent, so it is owed and resolved by the reconciler",
                claim.task_id or "-",
                claim.agent,
                claim.owner_instance or "-",
            )
            with contextlib.suppress(ClaimLost):
                await claims.orphan_settling(hold)
            continue
        logger.warning(
            "claim for task %s (agent %s) released: its owner %s stopped or lost its lease before delivering;"
            " the task fails and nothing is charged (the payer may use the token again)",
            claim.task_id or "-",
            claim.agent,
            claim.owner_instance or "-",
        )

        async def write(claim: Claim = claim, hold: Hold = hold) -> None:
            await claims.release(hold)
            await parts.log.append(
                "release",
                agent=claim.agent,
                token_digest=claim.token_digest,
                payer=claim.payer,
                task_id=claim.task_id,
                error="interrupted (its owner stopped or lost its lease): not charged",
            )
            task = await store.get(claim.task_id, f"payer:{claim.payer}", claim.agent) if claim.task_id else None
            if task is not None and task["status"]["state"] not in TERMINAL_STATES:
                message = agent_message(task, "Interrupted by a server restart; nothing was charged.")
                set_status(task, "failed", message)
                await store.save(task)

        with contextlib.suppress(ClaimLost):
            await commit_until_stored(claims.db, write, "a release after a restart")


async def reconcile(parts: GateParts, *, now: bool = False) -> list[dict[str, Any]]:
    """Settle owed claims that are due (all of them with `now`), then repair tasks left
    behind their claims; returns one outcome per claim attempted."""
    claims = parts.claims
    outcomes = []
    for claim in await claims.due(now=now):
        taken = await claims.take_owed(claim.token_digest, due_only=not now)
        if taken is not None:
            outcomes.append(await settle_owed(parts, taken))
    for claim in await claims.outdated():
        hold = await claims.take_outdated(claim)
        if hold is not None:
            with contextlib.suppress(ClaimLost):
                await show_outcome(parts, claim, hold, metadata_for(claim))
    return outcomes


async def reconcile_once(parts: GateParts) -> list[dict[str, Any]]:
    """`a2a-gate reconcile`: one pass over orphans and every owed claim, now, beside live servers
    (their claims' leases are renewed, so none is taken from them)."""
    await check_sealing_key(parts)
    renewing = asyncio.create_task(renew_leases(parts))
    try:
        await recover(parts)
        return await reconcile(parts, now=True)
    finally:
        renewing.cancel()


async def settle_owed(parts: GateParts, claim: Claim) -> dict[str, Any]:
    """Settle one owed claim (already taken for this process) and show the outcome on its task.

    Whatever goes wrong between taking it and recording an outcome (a key that cannot
    unseal it, a bug) puts it back: owed again, its lease released, and logged with its cause."""
    claims, hold = parts.claims, claim.hold
    summary = {"task_id": claim.task_id, "payer": claim.payer, "agent": claim.agent}
    try:
        collection = await parts.settler.settle(owed_payment(parts, claim), claim.task_id, hold, claim)
    except ClaimLost:
        return {**summary, "state": "lost", STATUS: "", ERROR: "taken over by another process"}
    except Exception as exc:  # noqa: BLE001 -- a stranded claim is worse than a logged bug
        cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        logger.error("settling owed task %s failed before an outcome (%s); it stays owed", claim.task_id, cause)
        parts.metrics.reconcile_errors.inc()
        with contextlib.suppress(ClaimLost):
            await commit_until_stored(
                claims.db,
                lambda: claims.put_back(hold, cause, parts.config.reconcile_interval_seconds),
                "an owed claim put back",
            )
        return {**summary, "state": str(ClaimState.SETTLE_FAILED), STATUS: "payment-verified", ERROR: cause}
    try:
        await show_outcome(parts, claim, hold, collection.metadata, collection)
    except Exception:
        logger.exception("showing the outcome of task %s failed; the reconciler repairs it", claim.task_id)
        claims.let_go(hold)
    return {**summary, "state": str(collection.state), **collection.metadata}


def owed_payment(parts: GateParts, claim: Claim) -> Payment:
    """The payment as it was signed and sealed; a claim sealed before the price was sealed
    with it falls back to the agent's price now."""
    sealed = parts.sealer.unseal(claim.sealed_payment, claim.token_digest)
    price = parts.config.price(claim.agent)
    return Payment.unsealed(sealed, claim, (price.amount, price.network, price.asset) if price else ("", "", ""))


async def show_outcome(
    parts: GateParts, claim: Claim, hold: Hold, metadata: dict[str, Any], collection: Collection | None = None
) -> None:
    """Bring a claim's stored task up to its recorded outcome (after a pass, a crash or a lost write)."""
    state = collection.state if collection is not None else claim.state
    store = parts.store
    task = await store.get(claim.task_id, f"payer:{claim.payer}", claim.agent)
    if task is not None:
        if claim.withheld is None:
            attach_payment_metadata(task, metadata)
        else:
            show_withheld(task, claim.withheld, metadata, paid=state == ClaimState.SETTLED)

    async def write() -> None:
        if task is not None:
            await store.save(task)
        await parts.claims.task_synced(hold, final=state in ENDED_STATES)

    await commit_until_stored(parts.claims.db, write, "a repaired task")


def show_withheld(task: dict[str, Any], withheld: dict[str, Any], metadata: dict[str, Any], *, paid: bool) -> None:
    """A withholding agent's task: the answer once paid, `failed` with no paid surface otherwise."""
    if paid:
        if not any(a.get("artifactId") == withheld["artifact"]["artifactId"] for a in task.get("artifacts") or []):
            task.setdefault("artifacts", []).append(withheld["artifact"])
        set_status(task, "completed", agent_message(task, withheld["text"], metadata))
    else:
        metadata = withheld_metadata(metadata)
        set_status(task, "failed", agent_message(task, "Payment failed: the answer is withheld.", metadata))
    task["metadata"] = with_payment_metadata(task.get("metadata"), metadata)


async def renew_leases(parts: GateParts) -> None:
    """While this process lives, the claims whose work is alive here stay its own; one found
    taken over (this process stalled past its lease) has its work stopped (`LiveDeliveries.lost`)."""
    interval = parts.claims.lease_seconds / 3
    checks = 0
    while True:
        await asyncio.sleep(interval)
        try:
            await parts.claims.renew()
            checks += 1
            if checks % 30 == 0:
                await check_clock(parts)
        except Exception:
            logger.exception("renewing claim leases failed")


async def reconcile_loop(parts: GateParts) -> None:
    interval = parts.config.reconcile_interval_seconds
    while True:
        await asyncio.sleep(min(interval, parts.claims.lease_seconds))
        try:
            await recover(parts)
            await reconcile(parts)
        except Exception:
            logger.exception("reconciler pass failed")
