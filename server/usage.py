"""What an agent says it used: named counts (`{"output_tokens": 812}`), plain data that names no money.

Agents report usage on their reply (`AgentReply.usage`), per chunk from a streaming agent
(`Usage`), in an upstream A2A agent's task or message metadata under `usage`, or in an
a2a-sdk executor's event metadata under the same key. The server only carries it to
whoever delivers the work (the payment gate prices it); it never reads a meaning into it.
A report that is not a mapping of names to finite, non-negative numbers is no report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

METADATA_KEY = "usage"  # in an upstream task's / message's / event's metadata
MAX_KEYS = 32
MAX_KEY_LENGTH = 64

Counts = dict[str, int | float]


def read(value: Any) -> Counts:
    """The usage in `value`, or {} when it is not a usable report (never an exception)."""
    if not isinstance(value, Mapping):
        return {}
    counts: Counts = {}
    for key, amount in list(value.items())[:MAX_KEYS]:
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
            continue
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            continue
        if not math.isfinite(amount) or amount < 0:
            continue
        counts[key] = int(amount) if isinstance(amount, float) and amount.is_integer() else amount
    return counts


def from_metadata(metadata: Any) -> Counts:
    return read(metadata.get(METADATA_KEY)) if isinstance(metadata, Mapping) else {}


def added(total: Counts, more: Counts) -> Counts:
    """Two reports of one run summed key by key (a streaming agent's chunks)."""
    summed = dict(total)
    for key, amount in more.items():
        if key in summed or len(summed) < MAX_KEYS:
            summed[key] = summed.get(key, 0) + amount
    return summed
