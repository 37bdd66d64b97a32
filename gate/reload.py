"""The payment terms a running gate takes from its configuration read again (SIGHUP).

Each agent's price, allowed payers and settle-failure rule apply from the next request on; a
request already verified keeps the offer it paid (its requirements travel with it), so nothing
drains. What the gate built its parts from at start (the facilitator, limits, networks, channel
settings, an agent's own rate limit) waits for a restart, and so do agents the file adds. An
agent the file no longer names keeps the terms it was loaded with: the server still runs it, and
a removal must never make a priced agent free. The terms taken must keep every operator
obligation `serve` checks (`claim_obligation_problems`), or the whole file is refused.
"""

from __future__ import annotations

from dataclasses import replace

from gate import config as gate_config
from gate.config import GateConfig, channel_offers
from server.config import ConfigError, Settings
from server.reload import Reloaded, changed_fields

# what of an agent's terms a reload applies now (the rest of AgentPayment waits for a restart)
TAKEN_NOW = ("price", "allowed_payers", "on_settle_failure", "payment_identifier", "discovery", "sign_in")


def reloaded_terms(running: GateConfig, settings: Settings) -> tuple[GateConfig, Reloaded]:
    """The configuration to run from now on, and what changed; `ConfigError` refuses it whole."""
    read = gate_config.of(settings)
    agents = dict(running.agents)
    applied: list[str] = []
    waiting = changed_fields(running, read, leaving={"agents"})
    for name, terms in running.agents.items():
        new = read.agents.get(name)
        if new is None:
            if terms.price is not None:
                waiting.append(f"agents.{name} (not in the file: priced as loaded until a restart)")
            continue
        taken = replace(terms, **{key: getattr(new, key) for key in TAKEN_NOW})
        if new.per_agent_per_minute != terms.per_agent_per_minute:
            waiting.append(f"agents.{name}.per_agent_per_minute")
        if taken != terms:
            applied.append(f"agents.{name}{'' if taken.price is not None else ' (now free)'}")
            agents[name] = taken
    config = replace(running, agents=agents)
    problems = gate_config.claim_obligation_problems(config)
    if channel_offers(config) and not channel_offers(running):
        problems.append(
            "a first batch-settlement offer needs a restart: the channels' claim schedule starts with the server"
        )
    if problems:
        raise ConfigError([f"{settings.source}: {p}" for p in problems])
    return config, Reloaded(applied, waiting)
