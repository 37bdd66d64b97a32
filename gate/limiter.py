"""Token-bucket rate limiting in bounded memory.

Buckets live in a cachetools LRU cache, so a flood from a million addresses costs a
fixed amount of memory: the least recently seen addresses are forgotten, and a
forgotten address simply starts again with a full bucket.

The per-IP limiter keys on a caller, not on an address: an IPv4 address, or the IPv6
network around an address (a home connection is handed a whole /64, 2^64 addresses to
rotate through). An IPv4-mapped IPv6 address (``::ffff:198.51.100.7``, what a dual-stack
listener reports for an IPv4 peer) is the IPv4 caller it carries.
"""

from __future__ import annotations

import functools
import ipaddress
import time
from collections.abc import Callable
from typing import Protocol

from cachetools import LRUCache


class RateLimits(Protocol):
    """What the pipeline asks of its limiters, once a request: None when the caller and the agent
    may both pass, else which one refused ("ip" or "agent") and the seconds to wait."""

    async def check(self, client: str, agent: str) -> tuple[str, float] | None: ...


class Limiter:
    """`per_minute` requests a minute per key, with bursts up to `per_minute`."""

    def __init__(
        self, per_minute: int, max_entries: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
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

    def per_minute(self, agent: str) -> int:
        return int((self.own.get(agent) or self.default).capacity)


MAX_KEY_CHARS = 64  # a forwarded value that is not an address still gets a bucket, of bounded size


@functools.lru_cache(maxsize=4096)  # the addresses seen lately: parsing one costs more than the bucket
def caller_key(address: str, ipv6_prefix: int = 64) -> str:
    """The bucket key for a client address (already resolved through trusted proxies)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:  # not an address (a unix socket peer, "-", a proxy's odd value)
        return address[:MAX_KEY_CHARS]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        network = int(ip) >> (128 - ipv6_prefix) << (128 - ipv6_prefix)  # drops a zone id too
        return f"{ipaddress.IPv6Address(network)}/{ipv6_prefix}"
    return str(ip)


class CallerLimiter(Limiter):
    """The per-IP limiter: one bucket per IPv4 address or IPv6 network (see `caller_key`)."""

    def __init__(
        self,
        per_minute: int,
        max_entries: int = 100_000,
        ipv6_prefix: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(per_minute, max_entries, clock)
        self.ipv6_prefix = ipv6_prefix

    def take(self, key: str) -> float:
        return super().take(caller_key(key, self.ipv6_prefix))


class Limits:
    """The per-IP limiter, then the per-agent one, in this process's memory. A caller the first
    refuses spends nothing of the agent's bucket: one caller's flood cannot use up an agent."""

    def __init__(self, ip: CallerLimiter, agents: AgentLimiters) -> None:
        self.ip = ip
        self.agents = agents

    def take(self, client: str, agent: str) -> tuple[str, float] | None:
        wait = self.ip.take(client)
        if wait:
            return "ip", wait
        wait = self.agents.take(agent)
        return ("agent", wait) if wait else None

    async def check(self, client: str, agent: str) -> tuple[str, float] | None:
        return self.take(client, agent)
