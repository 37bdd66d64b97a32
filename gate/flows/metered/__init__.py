"""Usage pricing (x402 `upto`), collected: the flow (`flow`: an authorization of a ceiling, settled
for the delivered work's priced usage) and what one delivery is charged (`usage_charge`)."""

from gate.flows.metered.flow import MeteredFlow

__all__ = ["MeteredFlow"]
