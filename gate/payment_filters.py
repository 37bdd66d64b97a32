"""Which payment records an operator asks for: the filters written as text, read and checked one way.

`a2a-gate payments records|export` and the console's API (`gate/console/`) take the same filters
(`since`, `until`, `agent`, `payer`, `state`), so both refuse the same text with the same words: a
command as one line and exit status 2, the API as a 400 with that line as its `error`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from gate.payment_exports import FORMATS
from gate.payment_records import STATES, Filters

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class BadFilter(Exception):
    """A filter that cannot be taken, with the one line that says why."""


def duration(text: str) -> float:
    """A positive number with a unit (s, m, h, d), e.g. 90d, in seconds; ValueError otherwise."""
    number, unit = text[:-1], text[-1:].lower()
    try:
        seconds = float(number) * DURATION_UNITS[unit]
    except (KeyError, ValueError):
        raise ValueError(f"{text!r} is not a duration such as 90d, 12h, 30m or 3600s") from None
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{text!r} must be a positive duration")
    return seconds


def moment(option: str, text: str | None, now: float) -> float | None:
    """`since` / `until`: a UTC date (2026-12-01), a date and time (2026-12-01T08:00:00Z, or with
    an offset), or a duration back from now (7d, 12h, 30m, 90s)."""
    if text is None or text == "":
        return None
    try:
        return now - duration(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    except (ValueError, OverflowError, OSError):
        raise BadFilter(
            f"{option} {text!r}: not a date (2026-12-01), a UTC time (2026-12-01T08:00:00Z) or a duration (7d, 12h)"
        ) from None


def record_filters(
    since: str | None,
    until: str | None,
    agent: str | None,
    payer: str | None,
    state: str | None,
    now: float,
    *,
    prefix: str = "--",
) -> Filters:
    """The records these texts name, checked (`BadFilter`); `prefix` is how the caller names an option."""
    begin, end = moment(f"{prefix}since", since, now), moment(f"{prefix}until", until, now)
    if state and state not in STATES:
        raise BadFilter(f"{prefix}state {state!r}: not a record state (one of {', '.join(STATES)})")
    if begin is not None and end is not None and end <= begin:
        raise BadFilter(f"{prefix}until {until!r} is not after {prefix}since {since!r}")
    return Filters(
        since=0.0 if begin is None else begin,
        until=float("inf") if end is None else end,
        agent=agent or "",
        payer=payer or "",
        state=state or "",
    )


def export_checked(what: str, fmt: str, filters: Filters, *, prefix: str = "--") -> None:
    """What an export is asked for, checked against its filters (`BadFilter`): the summary counts
    every state and payer, so it takes neither."""
    if what not in ("records", "summary"):
        raise BadFilter(f"{prefix}what {what!r}: one of records, summary")
    if fmt not in FORMATS:
        raise BadFilter(f"{prefix}format {fmt!r}: one of {', '.join(FORMATS)}")
    if what == "summary" and filters.state:
        raise BadFilter(f"{prefix}state filters records; the summary counts every state")
    if what == "summary" and filters.payer:
        raise BadFilter(f"{prefix}payer filters records; the summary counts every payer")
