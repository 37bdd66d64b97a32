"""Two replicas, one Redis: `per_ip_per_minute = N` admits exactly N of a burst spread over
both, the per-agent bucket likewise; Redis gone (at start or mid-run) falls back to each
replica's own buckets without one error, and sharing resumes when Redis answers again."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import paid_config, send_body

CLOSED = "http://127.0.0.1:1"  # a priced door answers 402 with a facilitator URL; nothing is called


def replica_config(
    public_url: str, redis_url: str, prefix: str, *, per_ip: int, per_agent: int = 100000, timeout: float = 3
) -> str:
    # a generous timeout by default: on a machine busy with the parallel suite a slow answer is not an outage
    text = paid_config(public_url, CLOSED, per_ip=per_ip)
    text = text.replace(
        "per_agent_per_minute = 100000",
        f'per_agent_per_minute = {per_agent}\nredis_url = "{redis_url}"\nredis_prefix = "{prefix}"\n'
        f"redis_timeout_seconds = {timeout}",
    )
    text = text.replace(
        'callable = "tests.support.agents:slow"\n',
        'callable = "tests.support.agents:slow"\nper_agent_per_minute = 2\n',
        1,
    )
    return text.replace("[facilitator]", '[proxy]\ntrusted = ["127.0.0.1"]\n\n[facilitator]', 1)


def start_replicas(tmp_path: Path, redis_url: str, prefix: str, count: int = 2, **limits: float) -> list[GateProcess]:
    """`count` gates, each in its own working directory with its own database, one Redis."""
    replicas = []
    for i in range(count):
        home = tmp_path / f"replica{i}"
        home.mkdir()
        port = free_port()
        config = home / "gate.toml"
        config.write_text(replica_config(f"http://127.0.0.1:{port}", redis_url, prefix, **limits))
        replicas.append(GateProcess(config, home / "gate.log", port=port).start())
    return replicas


def burst(replicas: list[GateProcess], count: int, client_ip: str, agent: str = "paid") -> list[int]:
    """`count` concurrent anonymous sends, round-robin over the replicas, from one client."""

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=10.0) as client:
            answers = await asyncio.gather(
                *(
                    client.post(
                        f"{replicas[i % len(replicas)].url}/a2a/{agent}",
                        json=send_body("x"),
                        headers={"X-Forwarded-For": client_ip},
                    )
                    for i in range(count)
                )
            )
        for answer in answers:
            if answer.status_code == 429:
                assert int(answer.headers["Retry-After"]) >= 1
        return [a.status_code for a in answers]

    return asyncio.run(run())


def metric(gate: GateProcess, name: str) -> float:
    text = httpx.get(f"{gate.url}/metrics", timeout=5.0).text
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def stop_all(replicas: list[GateProcess]) -> None:
    for gate in replicas:
        gate.stop()


def test_per_ip_limit_holds_across_replicas(tmp_path, redis_service):
    replicas = start_replicas(tmp_path, redis_service.url, redis_service.prefix, per_ip=5)
    try:
        codes = Counter(burst(replicas, 16, "198.51.100.7"))
        assert codes == {402: 5, 429: 11}
        # an IPv6 household is one caller on every replica: its /64 is one shared bucket
        v6 = Counter(burst(replicas[:1], 3, "2001:db8:1:2::1") + burst(replicas[1:], 8, "2001:db8:1:2::ffff"))
        assert v6 == {402: 5, 429: 6}
        keys = redis_service.key_names()
        assert f"{redis_service.prefix}ip:198.51.100.7" in keys
        assert f"{redis_service.prefix}ip:2001:db8:1:2::/64" in keys
        for key in keys:  # every bucket expires: Redis memory stays bounded
            assert 0 < redis_service.client.pttl(key) <= 61_000
        assert [metric(gate, "a2a_gate_limiter_shared") for gate in replicas] == [1.0, 1.0]
    finally:
        stop_all(replicas)


def test_per_agent_limit_holds_across_replicas(tmp_path, redis_service):
    replicas = start_replicas(tmp_path, redis_service.url, redis_service.prefix, per_ip=100000, per_agent=4)
    try:
        codes = Counter()
        for i in range(12):  # twelve different callers, one agent
            codes.update(burst(replicas[i % 2 : i % 2 + 1], 1, f"198.51.100.{i + 1}"))
        assert codes == {402: 4, 429: 8}
        assert f"{redis_service.prefix}agent:paid" in redis_service.key_names()
        # an agent's own per_agent_per_minute is shared the same way
        own = Counter()
        for i in range(6):
            own.update(burst(replicas[i % 2 : i % 2 + 1], 1, f"198.51.100.{i + 50}", agent="paid-slow"))
        assert own == {402: 2, 429: 4}
    finally:
        stop_all(replicas)


def script_calls(url: str) -> int:
    """The scripts a Redis server has run (EVALSHA, EVAL, SCRIPT LOAD), however they ended."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=2.0)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval", "script|load"))


def test_both_limiters_are_one_redis_command_and_a_refused_caller_spends_nothing_of_the_agent(tmp_path, own_redis):
    """A request's two limits are one script call, one round trip to Redis (not one a limiter); and
    as in one process, a caller the per-IP limit refuses never reaches the agent's bucket, so one
    caller's flood does not use up an agent for everyone else."""
    replicas = start_replicas(tmp_path, own_redis.url, "both:", per_ip=2, per_agent=7)
    try:
        for i, gate in enumerate(replicas):  # each replica loads the script once: not counted below
            assert burst([gate], 1, f"203.0.113.{i + 1}") == [402]  # 2 of the agent's 7
        before = script_calls(own_redis.url)
        flood = Counter(burst(replicas, 8, "198.51.100.7"))  # 2 pass the per-IP limit: 2 more of the 7
        assert flood == {402: 2, 429: 6}
        assert script_calls(own_redis.url) - before == 8
        others = Counter()
        for i in range(5):  # five other callers, one at a time: the agent has 3 left
            others.update(burst(replicas[i % 2 : i % 2 + 1], 1, f"198.51.100.{i + 20}"))
        assert others == {402: 3, 429: 2}
        assert script_calls(own_redis.url) - before == 13
        assert [metric(gate, "a2a_gate_limiter_shared") for gate in replicas] == [1.0, 1.0]
    finally:
        stop_all(replicas)


def test_redis_stopped_mid_run_falls_back_then_shares_again(tmp_path, own_redis):
    replicas = start_replicas(tmp_path, own_redis.url, "midrun:", per_ip=3)
    try:
        assert Counter(burst(replicas, 8, "198.51.100.10")) == {402: 3, 429: 5}

        own_redis.kill()
        # every answer still comes from a limiter: each replica's own buckets, N per replica
        for gate in replicas:
            assert Counter(burst([gate], 6, "198.51.100.11")) == {402: 3, 429: 3}
        for gate in replicas:
            assert metric(gate, "a2a_gate_limiter_shared") == 0.0
            assert metric(gate, "a2a_gate_limiter_fallbacks_total") == 1.0  # once per transition
            log = gate.log.read_text()
            assert log.count("limiters fall back to this replica's own buckets") == 1

        own_redis.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(metric(g, "a2a_gate_limiter_shared") != 1.0 for g in replicas):
            burst(replicas, 2, "198.51.100.12")  # traffic lets a due probe run; never more than one at a time
            time.sleep(0.5)
        assert [metric(gate, "a2a_gate_limiter_shared") for gate in replicas] == [1.0, 1.0]
        assert Counter(burst(replicas, 8, "198.51.100.13")) == {402: 3, 429: 5}
        for gate in replicas:
            log = gate.log.read_text()
            assert log.count("limiters shared through Redis again") == 1
            assert log.count("limiters fall back to this replica's own buckets") == 1
    finally:
        stop_all(replicas)


def test_redis_down_at_start_serves_from_own_buckets(tmp_path):
    closed = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    replicas = start_replicas(tmp_path, closed, "down:", count=1, per_ip=2)
    try:
        gate = replicas[0]
        assert Counter(burst(replicas, 5, "198.51.100.20")) == {402: 2, 429: 3}
        assert metric(gate, "a2a_gate_limiter_shared") == 0.0
        assert metric(gate, "a2a_gate_limiter_fallbacks_total") == 1.0
        log = gate.log.read_text()
        assert log.count("limiters fall back to this replica's own buckets") == 1
        assert "Traceback" not in log
    finally:
        stop_all(replicas)


class SilentServer:
    """Accepts TCP connections and never answers a byte: a hung Redis. Counts the connections."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.accepted: list[socket.socket] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stopped.is_set():
            try:
                self.accepted.append(self.listener.accept()[0])
            except TimeoutError:
                continue

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(5)
        for conn in self.accepted:
            conn.close()
        self.listener.close()


def test_hung_redis_is_bounded_by_the_timeout_and_probed_with_backoff(tmp_path):
    silent = SilentServer()
    replicas = start_replicas(tmp_path, silent.url, "hung:", count=1, per_ip=3, timeout=0.3)
    try:
        gate, codes, started = replicas[0], Counter(), time.monotonic()
        for _ in range(25):  # about 2.5 s of traffic, one request at a time
            began = time.monotonic()
            codes.update(burst(replicas, 1, "198.51.100.30"))
            assert time.monotonic() - began < 2.0  # never waits on Redis past the timeout
            time.sleep(0.1)
        elapsed = time.monotonic() - started
        assert codes == {402: 3, 429: 22}
        # the start's ping, then a probe after 0.5 s, 1 s, 2 s ...: a handful, not one per request
        print(f"{len(silent.accepted)} connections to the hung Redis in {elapsed:.1f} s of traffic")
        assert 2 <= len(silent.accepted) <= 6
        assert metric(gate, "a2a_gate_limiter_fallbacks_total") == 1.0
        assert gate.log.read_text().count("limiters fall back to this replica's own buckets") == 1
    finally:
        stop_all(replicas)
        silent.close()
