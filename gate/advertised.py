"""The offer parameters a facilitator advertises, for the offers that leave them to it.

Some schemes sign or settle with an address of the facilitator's own: `batch-settlement`'s
`receiverAuthorizer` (the key that countersigns the gate's claims and refunds) and `upto`'s
`facilitatorAddress` (the spender its permits name). The facilitator lists them in the `extra`
of its kinds in `GET /supported`, and a price may leave them out (`receiver_authorizer`,
`facilitator_address`): the x402 reference server fills them in the same way.

An offer that waits for one is not made until the facilitator has answered: the 402 and the
card list the agent's other offers, and an agent with no other answers 501, as a priced door
does without a facilitator. The gate asks at start, then again every reconcile interval until
nothing waits. An address the price names itself is kept, with a warning when the facilitator
advertises another (the facilitator would not sign or settle for it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gate import schemes
from gate.config import EVM_ADDRESS, AgentPayment
from gate.facilitator import FacilitatorClient, Unavailable
from gate.price import Price

logger = logging.getLogger("a2a_gate.gate")

SUPPORTED_VERSION = 2  # the kinds of x402 v2 (v1 has no such schemes)


def waiting(offer: Price) -> tuple[str, ...]:
    """The advertised keys this offer leaves to the facilitator and does not have yet."""
    return tuple(key for key in schemes.for_price(offer).advertised if key not in offer.extra)


def advertised_extra(supported: Any, scheme: str, network: str) -> dict[str, str]:
    """The non-zero addresses `/supported` lists in the `extra` of the v2 kind (scheme, network)."""
    kinds = supported.get("kinds") if isinstance(supported, dict) else None
    for kind in kinds if isinstance(kinds, list) else []:
        if not isinstance(kind, dict) or (kind.get("x402Version"), kind.get("scheme"), kind.get("network")) != (
            SUPPORTED_VERSION,
            scheme,
            network,
        ):
            continue
        extra = kind.get("extra")
        if not isinstance(extra, dict):
            return {}
        return {
            key: value
            for key, value in extra.items()
            if isinstance(key, str) and isinstance(value, str) and EVM_ADDRESS.match(value) and int(value, 16) != 0
        }
    return {}


def filled(offer: Price, supported: Any) -> Price:
    """The offer with the keys it waits for taken from `/supported` (those advertised)."""
    keys = waiting(offer)
    if not keys:
        return offer
    known = advertised_extra(supported, offer.scheme, offer.network)
    found = {key: known[key] for key in keys if key in known}
    return replace(offer, extra={**offer.extra, **found}) if found else offer


def offerable(price: Price) -> Price | None:
    """The price with only the offers that wait for nothing, first one first; None if none can be made."""
    ready = [offer for offer in price.offers if not waiting(offer)]
    if not ready:
        return None
    if len(ready) == len(price.offers):
        return price
    return Price.of(ready)


def differs(offer: Price, supported: Any) -> list[str]:
    """What the price names itself that the facilitator advertises otherwise, one line each."""
    known = advertised_extra(supported, offer.scheme, offer.network)
    return [
        f"{offer.scheme} on {offer.network}: {key} {offer.extra[key]} is not the facilitator's {known[key]}"
        for key in schemes.for_price(offer).advertised
        if key in offer.extra and key in known and str(offer.extra[key]).lower() != known[key].lower()
    ]


class Offers:
    """What each agent can be offered now: its configured terms with the advertised keys filled
    in as the facilitator lists them (`terms`), and of those the offers that wait for nothing."""

    def __init__(self, agents: dict[str, AgentPayment]) -> None:
        self.terms = dict(agents)
        self.warned: set[str] = set()  # each differing address is warned of once
        self.supported: Any = None  # the facilitator's last /supported answer learned from
        self._settle()

    def reprice(self, agents: dict[str, AgentPayment]) -> None:
        """New terms (a reload): filled in from the last `/supported` answer, as at start."""
        self.terms = dict(agents)
        if self.supported is None:
            self._settle()
        else:
            self.learn(self.supported)

    def _settle(self) -> None:
        self.ready = {
            name: replace(terms, price=offerable(terms.price) if terms.price is not None else None)
            for name, terms in self.terms.items()
        }
        # priced agents none of whose offers can be made yet: a door that cannot take payment now
        self.unavailable = frozenset(
            name for name, terms in self.ready.items() if terms.price is None and self.terms[name].price is not None
        )

    def agent(self, name: str) -> AgentPayment:
        """The agent's terms as they can be offered now: its price holds only its ready offers."""
        return self.ready.get(name) or AgentPayment(name)

    def waiting(self) -> list[Price]:
        """Every offer still waiting for the facilitator."""
        return [o for t in self.terms.values() if t.price is not None for o in t.price.offers if waiting(o)]

    def describe(self) -> str:
        """ "ok", or what the offers withheld wait for (readiness reports it; it never decides it)."""
        missing = sorted({f"{offer.scheme} {key}" for offer in self.waiting() for key in waiting(offer)})
        return "ok" if not missing else "withheld until the facilitator's /supported lists " + ", ".join(missing)

    def learn(self, supported: Any) -> bool:
        """Fill in what `/supported` advertises (a price's own address is kept: warned of if it
        differs); whether any offer changed."""
        self.supported = supported
        changed = False
        for name, terms in self.terms.items():
            if terms.price is None:
                continue
            for line in (line for offer in terms.price.offers for line in differs(offer, supported)):
                if f"{name} {line}" not in self.warned:
                    self.warned.add(f"{name} {line}")
                    logger.warning("agent %s: %s; the facilitator will not sign or settle for it", name, line)
            offers = [filled(offer, supported) for offer in terms.price.offers]
            if offers != list(terms.price.offers):
                changed = True
                self.terms[name] = replace(terms, price=Price.of(offers))
        self._settle()
        return changed


async def learn_from(offers: Offers, facilitator: FacilitatorClient) -> bool:
    """Ask the facilitator's `/supported` once and fill in what it advertises; whether an offer changed."""
    try:
        supported = await facilitator.supported()
    except Unavailable as exc:
        logger.warning(
            "the facilitator's /supported did not answer (%s): offers waiting for it are withheld", exc.reason
        )
        return False
    changed = offers.learn(supported)
    still = offers.describe()
    if still != "ok":
        logger.warning("offers %s", still)
    return changed


async def keep_learning(
    offers: Offers, facilitator: FacilitatorClient, interval: float, changed: Callable[[], None]
) -> None:
    """Ask again every `interval` seconds while an offer waits (at start the gate asked once);
    `changed` runs after each answer that changed an offer (the rendered 402s are stale)."""
    while offers.waiting():
        await asyncio.sleep(interval)
        if await learn_from(offers, facilitator):
            changed()
