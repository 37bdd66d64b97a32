"""The metered flow (`upto`): the payer authorizes a ceiling; the delivered work's priced usage is settled.

Verified like an authorization; at the delivery the usage the agent reported is priced
(gate/usage_price.py), capped at the ceiling, and sealed onto the claim with the delivery, so
whoever settles it later collects that amount and no other. A delivery priced at 0 is charged
nothing: no settle call.
"""

from __future__ import annotations

from gate.flows.authorization import AuthorizationFlow
from gate.flows.base import FACILITATOR, NOTHING
from gate.payment import Payment


class MeteredFlow(AuthorizationFlow):
    """An authorization of a ceiling, settled for the priced usage of the work delivered."""

    name = "metered"

    def settles_by(self, payment: Payment) -> str:
        return NOTHING if payment.metered and payment.amount == "0" else FACILITATOR
