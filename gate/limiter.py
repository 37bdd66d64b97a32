"""Token-bucket rate limiting in bounded memory.

Buckets live in a cachetools LRU cache, so a flood from a million addresses costs a
fixed amount of memory: the least recently seen addresses are forgotten, and a
forgotten address simply starts again with a full bucket.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cachetools import LRUCache


class Limiter:
    """`per_minute` requests a minute per key, with bursts up to `per_minute`."""

    def __init__(self, per_minute: int, max_entries: int = 100_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0  # tokens per second
        self.clock = clock
        self.buckets: LRUCache[str, list[float]] = LRUCache(maxsize=max_entries)

    def take(self, key: str) -> float:
        """Spend one token for `key`: 0.0 when allowed, else the seconds to wait."""
        now = self.clock()
        bucket = self.buckets.get(key)
        if bucket is None:
            self.buckets[key] = [self.capacity - 1.0, now]
            return 0.0
        tokens = min(self.capacity, bucket[0] + (now - bucket[1]) * self.rate)
        bucket[1] = now
        if tokens >= 1.0:
            bucket[0] = tokens - 1.0
            return 0.0
        bucket[0] = tokens
        return (1.0 - tokens) / self.rate


class AgentLimiters:
    """One bucket per agent, each with the agent's own limit or the default."""

    def __init__(self, default_per_minute: int, overrides: dict[str, int]) -> None:
        self.default = Limiter(default_per_minute, max_entries=10_000)
        self.own = {name: Limiter(limit, max_entries=1) for name, limit in overrides.items()}

    def take(self, agent: str) -> float:
        limiter = self.own.get(agent)
        return limiter.take(agent) if limiter is not None else self.default.take(agent)
