"""Token buckets shared by every replica, in Redis, with each replica's own as the fallback.

With `[limits] redis_url` set, a check is ONE call of a Lua script (EVALSHA of a
registered script): read the bucket, refill it from Redis's own clock, spend a token
or compute the wait, write it back and set its expiry, atomically. The semantics are
those of the in-memory `gate.limiter.Limiter` (burst = the per-minute rate, Retry-After
from the bucket), so a replica's answers do not change with where the bucket lives. A
bucket expires once it would be full again, so Redis holds only callers seen lately.

Redis not answering within the timeout (down at start, gone mid-run) is never an
error to the caller: the replica answers from its own in-memory buckets, logs the
transition once and counts it, and probes Redis with a growing backoff (never a
connection attempt per request) until it answers again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gate.config import LimitsConfig
from gate.limiter import MAX_KEY_CHARS, AgentLimiters, CallerLimiter, caller_key
from gate.metrics import GateMetrics

logger = logging.getLogger("a2a_gate.gate")

# KEYS[1]: the bucket; ARGV[1]: capacity (= per-minute rate); ARGV[2]: tokens per millisecond.
# Returns 0 when a token was spent, else the milliseconds until one is there.
TAKE_SCRIPT = """
local capacity = tonumber(ARGV[1])
local per_ms = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local bucket = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(bucket[1]) or capacity
local at = tonumber(bucket[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - at) * per_ms)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = math.ceil((1 - tokens) / per_ms)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil((capacity - tokens) / per_ms) + 1000)
return wait
"""

MAX_CONNECTIONS = 50  # to Redis, per process
FIRST_PROBE_SECONDS = 0.5
LAST_PROBE_SECONDS = 10.0


class SharedBuckets:
    """The Redis connection the limiters share, and whether Redis is answering."""

    def __init__(
        self, url: str, prefix: str, timeout: float, metrics: GateMetrics, clock: Callable[[], float] = time.monotonic
    ) -> None:
        # a bounded pool (a flood waits for a connection, within the check's timeout, instead of
        # opening one per request); a failed check falls back at once, it is never retried
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=MAX_CONNECTIONS,
            timeout=timeout,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self.client = Redis.from_pool(pool)
        self.script = self.client.register_script(TAKE_SCRIPT)
        self.where = where(self.client)
        self.prefix = prefix
        self.timeout = timeout
        self.metrics = metrics
        self.clock = clock
        self.shared = True
        self.backoff = FIRST_PROBE_SECONDS
        self.next_probe = 0.0
        self.probe: asyncio.Task[None] | None = None
        metrics.limiter_shared.set(1)

    async def take(self, key: str, per_minute: int) -> float | None:
        """Seconds to wait (0.0: allowed) from the shared bucket, or None: ask the local one."""
        if not self.shared:
            self.probe_when_due()
            return None
        try:
            async with asyncio.timeout(self.timeout):
                wait_ms = await self.script(keys=[self.prefix + key], args=[per_minute, per_minute / 60_000])
        except (RedisError, OSError, TimeoutError) as exc:
            self.lost(exc)
            return None
        return int(wait_ms) / 1000

    def lost(self, exc: BaseException) -> None:
        if not self.shared:
            return
        self.shared = False
        self.backoff = FIRST_PROBE_SECONDS
        self.next_probe = self.clock() + self.backoff
        self.metrics.limiter_shared.set(0)
        self.metrics.limiter_fallbacks.inc()
        logger.warning(
            "Redis at %s is not answering (%s): limiters fall back to this replica's own buckets",
            self.where,
            type(exc).__name__,
        )

    def probe_when_due(self) -> None:
        if self.clock() >= self.next_probe and (self.probe is None or self.probe.done()):
            self.probe = asyncio.create_task(self.ping())

    async def ping(self) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                await self.client.connection_pool.disconnect()  # connections to a server that went away are dead
                await self.client.ping()
        except (RedisError, OSError, TimeoutError):
            self.backoff = min(self.backoff * 2, LAST_PROBE_SECONDS)
            self.next_probe = self.clock() + self.backoff
            return
        self.shared = True
        self.metrics.limiter_shared.set(1)
        logger.warning("Redis at %s answers: limiters shared through Redis again", self.where)

    async def start(self) -> None:
        """Find out at start whether Redis answers, so the first caller does not."""
        try:
            async with asyncio.timeout(self.timeout):
                await self.client.ping()
        except (RedisError, OSError, TimeoutError) as exc:
            self.lost(exc)
            return
        logger.info("limiters shared through Redis at %s", self.where)

    async def close(self) -> None:
        if self.probe is not None:
            self.probe.cancel()
        await self.client.aclose()


def where(client: Redis) -> str:
    """host:port/db of the client's server, never its password (for log lines)."""
    kwargs: dict[str, Any] = client.connection_pool.connection_kwargs
    place = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
    return f"{place}/{kwargs.get('db', 0)}"


class SharedLimiter:
    """One limiter (per-IP or per-agent) over the shared buckets, its in-memory twin behind it."""

    def __init__(
        self,
        buckets: SharedBuckets,
        local: CallerLimiter | AgentLimiters,
        kind: str,
        key_of: Callable[[str], str],
        per_minute_of: Callable[[str], int],
    ) -> None:
        self.buckets = buckets
        self.local = local
        self.kind = kind
        self.key_of = key_of
        self.per_minute_of = per_minute_of

    async def check(self, key: str) -> float:
        wait = await self.buckets.take(f"{self.kind}:{self.key_of(key)}", self.per_minute_of(key))
        return self.local.take(key) if wait is None else wait


def bounded_name(name: str) -> str:
    """An agent name as a key part: a long one (any path a caller sends) becomes its digest."""
    return name if len(name) <= MAX_KEY_CHARS else hashlib.sha256(name.encode()).hexdigest()


def shared_limiters(
    limits: LimitsConfig, ip: CallerLimiter, agents: AgentLimiters, metrics: GateMetrics
) -> tuple[SharedBuckets, SharedLimiter, SharedLimiter]:
    """The per-IP and per-agent limiters over Redis (`[limits] redis_url`)."""
    buckets = SharedBuckets(limits.redis_url, limits.redis_prefix, limits.redis_timeout_seconds, metrics)
    per_ip = limits.per_ip_per_minute
    return (
        buckets,
        SharedLimiter(buckets, ip, "ip", lambda a: caller_key(a, limits.ipv6_prefix), lambda _: per_ip),
        SharedLimiter(buckets, agents, "agent", bounded_name, agents.per_minute),
    )
