"""A circuit breaker for the facilitator: stop waiting on a facilitator that is down.

After `threshold` consecutive failures to get an answer, the breaker opens: verify
calls are refused at once (`verify_unavailable`, with the seconds left to wait) instead
of each paying a full timeout. When the cool-down ends it is half-open: one call goes
through as a probe; its answer closes the breaker, its failure opens it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

CLOSED, HALF_OPEN, OPEN = "closed", "half_open", "open"
STATE_VALUES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}  # the metric's encoding


class CircuitBreaker:
    def __init__(self, threshold: int, cooldown: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.clock = clock
        self.failures = 0
        self.opened_at: float | None = None
        self.probing = False

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return CLOSED
        return OPEN if self.clock() - self.opened_at < self.cooldown else HALF_OPEN

    def retry_after(self) -> float:
        """Seconds until a call may go through: 0 when one may go now."""
        if self.opened_at is None:
            return 0.0
        left = self.cooldown - (self.clock() - self.opened_at)
        if left > 0:
            return left
        return self.cooldown if self.probing else 0.0  # a probe is out: wait for its verdict

    def allow(self) -> bool:
        """May a call go through now? In half-open state, only one probe at a time."""
        state = self.state
        if state == CLOSED:
            return True
        if state == OPEN or self.probing:
            return False
        self.probing = True
        return True

    def succeeded(self) -> None:
        self.failures = 0
        self.opened_at = None
        self.probing = False

    def abandoned(self) -> None:
        """A call that got no verdict either way (our own busy gate, a cancellation): free the probe."""
        self.probing = False

    def failed(self) -> None:
        self.failures += 1
        if self.probing or self.failures >= self.threshold:
            self.opened_at = self.clock()
        self.probing = False
