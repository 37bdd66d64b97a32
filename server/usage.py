"""What an agent says it used: named counts (`{"output_tokens": 812}`), plain data that names no money.

Agents report usage on their reply (`AgentReply.usage`), per chunk from a streaming agent
(`Usage`), in an upstream A2A agent's task or message metadata under `usage`, or in an
a2a-sdk executor's event metadata under the same key. The server only carries it to
whoever delivers the work (the payment gate prices it); it never reads a meaning into it.

A count is a number, finite, >= 0 and at most MAX_COUNT; so is the sum of a run's reports. A
number that is none of that (NaN, infinite, negative, past the bound, or a sum past it) is carried
as it came, never dropped or clamped: where the work is delivered it is checked (`checked`), and it
is the agent's error (`BadUsage`): the run fails, and nothing past what was delivered before is
charged. A value that is no number at all is no count and is left out (an upstream server's
metadata may hold more than counts), except in a Python agent's own report, which must be counts
and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

METADATA_KEY = "usage"  # in an upstream task's / message's / event's metadata
MAX_KEYS = 32
MAX_KEY_LENGTH = 64
MAX_COUNT = 10**15  # far past any real usage, and every whole number to it is exact as a float

Counts = dict[str, int | float]


class BadUsage(ValueError):
    """A usage report the agent got wrong: what is wrong with it, by name."""


def read(value: Any) -> Counts:
    """The numbers in `value` by name, as they came ({} when it is no mapping; what is no number is
    left out); never an exception: `checked` says whether they are counts."""
    if not isinstance(value, Mapping):
        return {}
    counts: Counts = {}
    for key, amount in list(value.items())[:MAX_KEYS]:
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
            continue
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            continue
        whole = isinstance(amount, float) and math.isfinite(amount) and amount.is_integer()
        counts[key] = int(amount) if whole else amount
    return counts


def checked(value: Any) -> Counts:
    """A report that must be counts and nothing else (None is no report): its counts, or BadUsage
    naming the first that is not one."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadUsage(f"a usage report is a mapping of names to counts, not {type(value).__name__}")
    for key, amount in value.items():
        name = repr(str(key)[:MAX_KEY_LENGTH])
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            raise BadUsage(f"{name} is {type(amount).__name__}, not a number")
        if isinstance(amount, float) and not math.isfinite(amount):
            raise BadUsage(f"{name} is {amount}")
        if amount < 0:
            raise BadUsage(f"{name} is negative ({amount})")
        if amount > MAX_COUNT:
            raise BadUsage(f"{name} is past the bound of {MAX_COUNT} ({shown(amount)})")
    return read(value)


def shown(amount: int | float) -> str:
    """A number past the bound, as a message may say it (an int past a float's range has no %g)."""
    if isinstance(amount, int) and amount.bit_length() > 64:
        return f"an integer of {amount.bit_length()} bits"
    return f"{amount:.6g}"


def from_metadata(metadata: Any) -> Counts:
    return read(metadata.get(METADATA_KEY)) if isinstance(metadata, Mapping) else {}


def added(total: Counts, more: Counts) -> Counts:
    """Two reports of one run summed key by key (a streaming agent's chunks); the sum is checked
    where the work is delivered, as each report is."""
    summed = dict(total)
    for key, amount in more.items():
        if key in summed or len(summed) < MAX_KEYS:
            summed[key] = summed.get(key, 0) + amount
    return summed
