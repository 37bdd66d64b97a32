"""Fault injection for the development facilitator.

Tests make the facilitator misbehave through ``POST /dev/faults``; this module
holds the validated fault configuration and hands out one mode per call. What
each mode does to an HTTP response is ``devnet.facilitator``'s business.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["DEV_FAULT_REASON", "FAULT_KINDS", "FaultInjector"]

#: Reason code used by the ``invalid`` fault.
DEV_FAULT_REASON = "dev_fault"

FAULT_KINDS = ("verify", "settle")
_SIMPLE_FAULTS = ("none", "http500", "malformed", "invalid")


@dataclass
class _Fault:
    mode: str = "none"
    remaining: int | None = None  # None: until reset


def _parse_fault_mode(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("fault mode must be a string")
    if value in _SIMPLE_FAULTS:
        return value
    for delayed in ("slow:", "late:"):  # slow: wait, then decide; late: decide, then wait to answer
        if value.startswith(delayed):
            try:
                seconds = float(value.removeprefix(delayed))
            except ValueError:
                raise ValueError(f"bad {delayed[:-1]} fault {value!r}") from None
            if not 0 <= seconds <= 600:
                raise ValueError(f"{delayed[:-1]} fault must be between 0 and 600 seconds")
            return value
    raise ValueError(f"unknown fault mode {value!r}")


class FaultInjector:
    """The faults the next verify/settle calls should suffer.

    Each POST replaces the whole configuration: a kind left out goes back to
    ``none``, so ``{}`` resets everything.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults = {kind: _Fault() for kind in FAULT_KINDS}

    def configure(self, spec: Any) -> None:
        """Validate and apply ``{"verify": MODE, "settle": MODE, "count": N}``."""
        if not isinstance(spec, dict):
            raise ValueError("fault spec must be a JSON object")
        unknown = set(spec) - {*FAULT_KINDS, "count"}
        if unknown:
            raise ValueError(f"unknown fault keys: {sorted(unknown)}")
        count = spec.get("count")
        if count is not None and (type(count) is not int or count < 0):
            raise ValueError("count must be a non-negative integer or null")
        faults = {kind: _Fault(_parse_fault_mode(spec.get(kind, "none")), count) for kind in FAULT_KINDS}
        with self._lock:
            self._faults = faults

    def take(self, kind: str) -> str:
        """Return the mode for this call of ``kind``, using up one count."""
        with self._lock:
            fault = self._faults[kind]
            if fault.mode == "none":
                return "none"
            if fault.remaining is not None:
                if fault.remaining <= 0:
                    self._faults[kind] = _Fault()
                    return "none"
                fault.remaining -= 1
            return fault.mode

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {kind: {"mode": f.mode, "remaining": f.remaining} for kind, f in self._faults.items()}
