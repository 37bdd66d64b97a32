"""The outcomes gate/metrics.py starts at 0 are the ones the code counts: an alert rule selects one
by name (deploy/alerts.yml), and a scrape shows the zero whatever the code does, so an outcome
renamed in the code alone would leave the rule watching a series that never moves."""

from __future__ import annotations

import re
from pathlib import Path

from gate.flows.metered import usage_charge
from gate.metrics import CHANNEL_TRANSACTIONS, SETTLE_OUTCOMES, USAGE_OUTCOMES

GATE = Path(__file__).resolve().parents[2] / "gate"


def literals(text: str) -> set[str]:
    return set(re.findall(r'"(\w+)"', text))


def test_settle_outcomes_are_the_settlements_counts():
    source = (GATE / "settlement.py").read_text()
    assert set(re.findall(r'self\._count\("(\w+)"\)', source)) == set(SETTLE_OUTCOMES)


def test_channel_transactions_are_the_channel_jobs_counts():
    source = (GATE / "flows" / "channel" / "jobs.py").read_text()
    counted = {
        (action, outcome)
        for action, rest in re.findall(r'channel_transactions\.labels\("(\w+)", ([^)]*)\)', source)
        for outcome in literals(rest)
    }
    assert counted == {(action, outcome) for action, outcomes in CHANNEL_TRANSACTIONS.items() for outcome in outcomes}


def test_usage_outcomes_are_the_metered_flows_counts():
    source = (GATE / "flows" / "metered" / "flow.py").read_text()
    counted = {value for line in re.findall(r"\boutcome = (.*)", source) for value in literals(line)}
    counted |= {usage_charge.USAGE_INVALID} if "USAGE_INVALID if" in source else set()
    assert counted == set(USAGE_OUTCOMES)
