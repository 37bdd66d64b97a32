"""Token buckets shared by every replica, in Redis, with each replica's own as the fallback.

With `[limits] redis_url` set, a request's check is ONE call of a Lua script (EVALSHA of a
registered script) for both limiters: for the caller's bucket, then the agent's, read it, refill
it from Redis's own clock, spend a token or compute the wait, write it back and set its expiry,
atomically, stopping at the first that refuses (a caller refused spends nothing of the agent's).
The semantics are those of the in-memory `gate.limiter.Limits` (burst = the per-minute rate,
Retry-After from the bucket), so a replica's answers do not change with where the buckets live,
and a request costs one Redis round trip, not one per limiter. A bucket expires once it would
be full again, so Redis holds only callers seen lately. (The two keys of a call must live on one
server: a single Redis, or a primary with its replicas; a Redis Cluster would refuse the call.)

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
from gate.limiter import MAX_KEY_CHARS, Limits, caller_key
from gate.metrics import GateMetrics

logger = logging.getLogger("a2a_gate.gate")

# KEYS: the buckets, in order; ARGV: each one's capacity (= per-minute rate) and tokens per
# millisecond, in pairs. Spends a token from each in turn and stops at the first that has none:
# returns {0, 0} when every one had a token, else {its position from 1, the milliseconds until it has one}.
TAKE_SCRIPT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
for i, key in ipairs(KEYS) do
  local capacity = tonumber(ARGV[2 * i - 1])
  local per_ms = tonumber(ARGV[2 * i])
  local bucket = redis.call('HMGET', key, 'tokens', 'at')
  local tokens = tonumber(bucket[1]) or capacity
  local at = tonumber(bucket[2]) or now
  tokens = math.min(capacity, tokens + math.max(0, now - at) * per_ms)
  local wait = 0
  if tokens >= 1 then
    tokens = tokens - 1
  else
    wait = math.ceil((1 - tokens) / per_ms)
  end
  redis.call('HSET', key, 'tokens', tostring(tokens), 'at', now)
  redis.call('PEXPIRE', key, math.ceil((capacity - tokens) / per_ms) + 1000)
  if wait > 0 then
    return {i, wait}
  end
end
return {0, 0}
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

    async def take(self, buckets: list[tuple[str, int]]) -> tuple[int, float] | None:
        """A token from each bucket (its key, its per-minute rate) in turn, stopping at the first
        that has none: (0, 0.0) when every one had one, else (its position from 1, the seconds to
        wait). None: Redis is not answering, ask the local buckets."""
        if not self.shared:
            self.probe_when_due()
            return None
        keys = [self.prefix + key for key, _ in buckets]
        rates = [rate for _, per_minute in buckets for rate in (per_minute, per_minute / 60_000)]
        try:
            async with asyncio.timeout(self.timeout):
                refused, wait_ms = await self.script(keys=keys, args=rates)
        except (RedisError, OSError, TimeoutError) as exc:
            self.lost(exc)
            return None
        return int(refused), int(wait_ms) / 1000

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


class SharedLimits:
    """The per-IP and per-agent limits over the shared buckets, one script call for both; this
    process's own `Limits` behind them."""

    KINDS = ("ip", "agent")  # a refusal's position in a call, from 1

    def __init__(self, buckets: SharedBuckets, local: Limits) -> None:
        self.buckets = buckets
        self.local = local

    async def check(self, client: str, agent: str) -> tuple[str, float] | None:
        taken = await self.buckets.take(
            [
                (f"ip:{caller_key(client, self.local.ip.ipv6_prefix)}", int(self.local.ip.capacity)),
                (f"agent:{bounded_name(agent)}", self.local.agents.per_minute(agent)),
            ]
        )
        if taken is None:
            return self.local.take(client, agent)
        refused, wait = taken
        return None if refused == 0 else (self.KINDS[refused - 1], wait)


def bounded_name(name: str) -> str:
    """An agent name as a key part: a long one (any path a caller sends) becomes its digest."""
    return name if len(name) <= MAX_KEY_CHARS else hashlib.sha256(name.encode()).hexdigest()


def shared_limiters(limits: LimitsConfig, local: Limits, metrics: GateMetrics) -> tuple[SharedBuckets, SharedLimits]:
    """The per-IP and per-agent limits over Redis (`[limits] redis_url`), `local` behind them."""
    buckets = SharedBuckets(limits.redis_url, limits.redis_prefix, limits.redis_timeout_seconds, metrics)
    return buckets, SharedLimits(buckets, local)
