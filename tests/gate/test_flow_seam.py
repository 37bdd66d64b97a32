"""The generic steps ask a payment's flow and never name one (DESIGN 6, "Payment flows").

How a payment is collected lives under gate/flows/, one home per collection model; the
pipeline, the charge, the settlement and the reconciler read the same for every scheme.
import-linter keeps them from importing a flow (pyproject.toml); this keeps its words out.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERIC = ("gate/pipeline.py", "gate/charge.py", "gate/settlement.py", "gate/reconciler.py")
FLOW_WORDS = re.compile(r"channel|voucher|usage_charge|metered", re.IGNORECASE)


def test_the_generic_steps_name_no_flow() -> None:
    found = [
        f"{name}:{number}: {line.strip()}"
        for name in GENERIC
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1)
        if FLOW_WORDS.search(line)
    ]
    assert found == []


def test_every_scheme_has_a_flow() -> None:
    from gate import flows, schemes

    assert {scheme.scheme for scheme in schemes.SCHEMES.values()} == set(flows.FLOWS)
