"""How a payment is collected: the one small interface the pipeline, the charge and the settlement ask.

A scheme (gate/schemes/) says what a valid payload is; a flow says how its money is
collected: what is checked or reserved before the work (`verify`), what the delivery
records and how it is shown (`mode`, `meter`), how the settle is asked and recorded
(`settles_by`, `settled_write`), what the chain can say of it later (`ask_chain`), and
the jobs it runs in the background. One implementation per collection model, each in
its own module or package under gate/flows/, built with only the parts it uses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gate import schemes
from gate.claims import Along, Hold
from gate.facilitator import SettleAnswer
from gate.payment import Payment
from gate.price import Price
from gate.tokens import Token
from server.database import Statement
from server.execution import Stop
from server.usage import Counts

# How a delivered payment is settled (`Flow.settles_by`).
FACILITATOR = "facilitator"  # the facilitator settles it: a transfer on chain
HERE = "here"  # the gate's own settled write charges it (no settle call)
NOTHING = "nothing"  # nothing to collect: charged 0, no settle call


@dataclass(frozen=True)
class Verdict:
    """A flow's verify step (DESIGN 4.9): "ok" (go on, for `payer`), "refused" (`reason`), "resync"
    (the payer's state is behind: a corrective answer carrying `state`), "busy" (retryable: another
    request holds what this one needs; `code` and `message` for the answer, `reason` for the log),
    or "unavailable" (our outage, never the payer's rejection: `reason`, `retry_after`)."""

    kind: str
    payer: str = ""
    reason: str = ""
    state: dict[str, dict[str, Any]] = field(default_factory=dict)  # the corrective answer's, per scheme
    retry_after: float = 0.0
    code: str = ""
    message: str = ""


@dataclass(frozen=True)
class Reserved:
    """What a flow holds for a request, checked before its claim: `reserve` is sent with the claim's
    INSERT and applies only if the claim was just taken."""

    payer: str
    reserve: Along


@dataclass(frozen=True)
class SettledWrite:
    """How a settlement is recorded: the receipt the payer is shown, the log row's note, and a write it
    stands on (`first`, sent ahead on the condition that the claim is ours; `provided`: the condition
    that it applied, else the settlement is `unmet`, with that reason)."""

    receipt: dict[str, Any]
    note: str = ""
    first: tuple[Along, ...] = ()
    provided: Statement | None = None
    unmet: str = ""


@dataclass(frozen=True)
class ChainAnswer:
    """What the chain says of a settlement nobody could confirm: "paid" (`answer`, `transaction`, `note`),
    "unpaid" (never collectable: `reason`), "pending" (collectable until `valid_before`: owed with
    `reason` until then, written off with `expired` after), or "unknown" (`reason`: an operator's)."""

    kind: str
    reason: str = ""
    answer: dict[str, Any] = field(default_factory=dict)
    transaction: str = ""
    note: str = ""
    valid_before: int = 0
    expired: str = ""


# records a delivery (the task, what it used, the statement saving it, a charge priced already)
Record = Callable[[dict[str, Any], Counts, Statement | None, Any], Awaitable[None]]


class Meter(Protocol):
    """What one execution's delivery is charged, as its flow prices it."""

    in_parts: bool  # a streamed answer is delivered, and charged, part by part (`part`)

    async def seal(self, used: Counts, priced: Any = None) -> str:
        """The charge of the work delivered so far, sealed to be recorded with it ("": the price's)."""

    def recorded(self) -> None:
        """The record made with the last `seal` committed."""

    async def part(self, task: dict[str, Any], used: Counts, save: Statement, record: Record) -> Stop | None:
        """One part of a streamed answer, charged before `record` records it; a `Stop` ends the run."""

    async def charged(self, hold: Hold) -> Payment:
        """What the delivery recorded under `hold` settles."""


class FixedPrice:
    """A delivery charged the price: nothing priced, nothing sealed with it."""

    in_parts = False

    def __init__(self, payment: Payment) -> None:
        self.payment = payment

    async def seal(self, used: Counts, priced: Any = None) -> str:
        return ""

    def recorded(self) -> None:
        return None

    async def part(self, task: dict[str, Any], used: Counts, save: Statement, record: Record) -> Stop | None:
        raise AssertionError("a delivery at a fixed price is never delivered in parts")

    async def charged(self, hold: Hold) -> Payment:
        return self.payment


class Flow(Protocol):
    """One way a payment is collected (authorization, metered, channel)."""

    name: str

    def windowed(self, token: Token) -> bool:
        """Whether the payload's validity window must leave time to do the work and collect."""

    async def reserve_with_claim(self, token: Token, price: Price) -> Reserved | None:
        """What to reserve in the claim's own INSERT (checked before it); None: nothing, or not yet."""

    async def behind(self, token: Token, price: Price) -> Verdict | None:
        """For a token whose claim conflicts: the corrective answer when the payer's state is behind."""

    async def verify(
        self, token: Token, requirements: dict[str, Any], price: Price, reserved: Reserved | None
    ) -> Verdict:
        """Step 9 for a claimed token: verified (and reserved) before any work, or why not."""

    def meter(self, payment: Payment, price: Price) -> Meter:
        """What the delivery of `payment` (for `price`) is charged."""

    def settles_by(self, payment: Payment) -> str:
        """FACILITATOR, HERE or NOTHING: how this delivered payment is settled."""

    def settle_answer(self, result: SettleAnswer) -> dict[str, Any]:
        """The facilitator's successful settle answer, as this flow's receipt is made from it."""

    def settled_write(self, payment: Payment, answer: dict[str, Any]) -> SettledWrite:
        """How a settlement of `payment` with `answer` is recorded."""

    async def ask_chain(self, payment: Payment, heard: str) -> ChainAnswer:
        """Ground truth for a settlement nobody could confirm (`heard`: what was heard last)."""

    def count_settled(self, payment: Payment) -> None:
        """A settlement recorded: its amount counted where this flow's money is counted."""

    async def create_tables(self) -> None:
        """Create (or migrate) the tables this flow keeps its own state in."""

    def jobs(self) -> list[Coroutine[Any, Any, None]]:
        """The background jobs this flow runs while the gate serves (with a facilitator)."""

    async def read_state(self) -> None:
        """Set this flow's gauges of stored state (run before each metrics scrape)."""


DEFAULT = "exact"  # a payment of no known scheme is read as an authorization (its refusals unread)


class Flows:
    """The gate's flows, by scheme name."""

    def __init__(self, by_scheme: Mapping[str, Flow]) -> None:
        self.by_scheme = dict(by_scheme)

    def __iter__(self) -> Iterator[Flow]:
        return iter(self.by_scheme.values())

    def named(self, scheme: str) -> Flow:
        return self.by_scheme.get(scheme) or self.by_scheme[DEFAULT]

    def for_price(self, price: Price) -> Flow:
        return self.named(price.scheme)

    def for_requirements(self, requirements: dict[str, Any]) -> Flow:
        scheme = schemes.for_requirements(requirements)
        return self.named(scheme.scheme if scheme is not None else "")

    def for_payment(self, payment: Payment) -> Flow:
        return self.for_requirements(payment.requirements)
