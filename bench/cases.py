"""The benchmark cases: which servers, which requests, which comparisons.

a. principal `message/send` on the echo agent: a2a-gate (API key) vs the a2a-sdk 1.x
   server vs a bare Starlette echo (the floor); also a2a-gate with `--workers 2`.
b. anonymous refusals: a2a-gate's 402 (priced agent, no token) and its 429 (per-IP
   limit 1/min), each vs the bare echo.
c. paid `message/send` (verify, execute, settle) through one development facilitator
   in dev-trusting mode shared by every compared server: a2a-gate vs the x402
   package's own ASGI payment middleware; plus a2a-gate against a real-crypto
   facilitator. Every request carries its own token, signed before the window.
d. limiter memory: many distinct client addresses through `X-Forwarded-For` from a
   trusted proxy; the server's RSS before and after.
e. PostgreSQL: case a's principal send and case c's paid send (same facilitator) with the
   store on PostgreSQL and the limiters on Redis, one replica, then two behind nginx; each
   configuration in a schema of its own. Besides the load: round trips per request, counted
   inside each replica (`bench/roundtrips.py`), and what the backends waited on
   (`bench/postgres.py`).
f. voucher-paid `message/send` (x402 batch-settlement): every worker pays from a channel of
   its own, opened by the x402 package's client before the window, one voucher after
   another; beside the API-key path of the same run. Then the same on PostgreSQL, two
   replicas behind nginx, with its round trips per voucher counted as in case e.

Each case returns `Row`s (one per server measured) and `Target`s (a goal and whether
the measurement met it); `bench.__main__` prints them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import load, postgres, profile, servers
from bench.servers import AMOUNT, ASSET, NETWORK, PAY_TO, ServerProcess

MIB = 1024 * 1024


@dataclass
class Params:
    duration: float = 3.0  # measured window per server, seconds
    warmup: float = 1.0  # warm-up per server, seconds
    concurrency: int = 32  # closed-loop workers (one keep-alive connection each)
    addresses: int = 100_000  # case d
    paid_tokens: int = 1000  # case c, per server on the trusting facilitator (the real-crypto run signs a third)
    sign_processes: int = os.cpu_count() or 1
    gate_src: Path = servers.REPO  # the tree whose server/ and gate/ are benchmarked
    postgres_url: str = postgres.DEFAULT_URL  # case e: each configuration makes (and drops) a schema there
    redis_url: str = postgres.DEFAULT_REDIS_URL  # case e: the replicas' shared limiters
    stack: str = servers.STACKS[0]  # every server's loop and HTTP parser (servers.use_stack)
    against: Any = None  # a bench.reference.Reference: another commit's gate, measured beside this one
    profile: bool = False  # sample each a2a-gate server with py-spy: where its CPU per request goes (bench/profile.py)


@dataclass(frozen=True)
class Build:
    """One gate to measure: this tree's, or (`--against`) another commit's in its own venv."""

    suffix: str  # of the row key and label: "" or "@<short commit>"
    src: Path
    python: str
    short: str = ""  # how a ratio names its rows
    module: str = "gate.cli"  # the tree's `a2a-gate` command module


def builds(params: Params) -> list[Build]:
    """This tree's gate, then the reference commit's when one is given."""
    out = [Build("", params.gate_src, sys.executable)]
    ref = params.against
    if ref is not None:
        out.append(Build(f"@{ref.short}", ref.src, str(ref.python), ref.short, ref.module))
    return out


@dataclass
class Row:
    case: str
    key: str  # a short id, used by targets and the JSON output
    server: str
    result: load.Result
    peak_rss: int  # bytes, whole process tree
    server_cpu: float  # server CPU seconds / window seconds (1.0 = one core)
    reference: list[str] = field(default_factory=list)  # keys of the rows this one is compared with
    note: str = ""
    other_cpu: float = 0.0  # CPU used by processes outside this measurement, in cores (noise)
    also_cpu: dict[str, float] = field(default_factory=dict)  # the other measured processes' CPU, in cores
    extra: dict[str, Any] = field(default_factory=dict)  # what a case measures besides (PostgreSQL: round trips)
    short: str = ""  # how a ratio names this row ("SQLite"); default: the server's first word
    # --profile: (bucket, share, ms per request), and each bucket's hottest frames with their shares
    breakdown: list[tuple[str, float, float]] = field(default_factory=list)
    hottest: dict[str, list[tuple[str, float]]] = field(default_factory=dict)

    @property
    def cpu_ms_per_request(self) -> float:
        """Server CPU per answer: what a request costs the server, whatever bounds the rate."""
        return self.server_cpu / self.result.rps * 1000 if self.result.rps else 0.0


@dataclass
class Target:
    case: str
    text: str
    measured: float
    goal: float
    unit: str = "×"  # × (a ratio) or MiB

    @property
    def met(self) -> bool:
        return self.measured <= self.goal if self.unit == "MiB" else self.measured >= self.goal

    def line(self) -> str:
        """The summary's line: met or missed, and the figure measured (a near miss not printed as the goal)."""
        digits = 2 if f"{self.measured:.2f}" != f"{self.goal:.2f}" else 4
        measured = f"{self.measured:.1f} MiB" if self.unit == "MiB" else f"{self.measured:.{digits}f}×"
        return f"  [{'met' if self.met else 'MISSED':>6}]  {self.case}  {self.text}: measured {measured}"


@dataclass
class MemoryResult:
    addresses: int
    seconds: float
    rss_before: int
    rss_after: int
    peak_rss: int
    statuses: dict[int, int]
    errors: int
    client_cpu: float

    @property
    def growth(self) -> int:
        return self.rss_after - self.rss_before


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all processes, all cores)."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


class Bench:
    """Shared state of one benchmark run: parameters, a work directory, measured rows."""

    def __init__(self, params: Params, workdir: Path, log=print) -> None:
        self.params = params
        self.workdir = workdir
        self.log = log
        self.rows: dict[str, Row] = {}
        self.targets: list[Target] = []
        self.memory: MemoryResult | None = None
        self.notes: list[str] = []
        self._pool: ProcessPoolExecutor | None = None
        self._trusting: ServerProcess | None = None
        self._count = 0

    # -- helpers ---------------------------------------------------------

    def path(self, name: str) -> Path:
        self._count += 1
        folder = self.workdir / f"{self._count:02d}-{name}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing

            self._pool = ProcessPoolExecutor(
                self.params.sign_processes, mp_context=multiprocessing.get_context("spawn")
            )
        return self._pool

    def trusting_facilitator(self) -> ServerProcess:
        """One dev-trusting facilitator for the whole run (every paid server shares it)."""
        if self._trusting is None:
            folder = self.path("facilitator-trusting")
            self._trusting = servers.facilitator(
                folder / "ledger.db", folder / "log.txt", trust_signatures=True
            ).start()
        return self._trusting

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._trusting is not None:
            self._trusting.stop()
            self._trusting = None

    def measure(
        self,
        case: str,
        key: str,
        server: ServerProcess,
        spec: load.Spec,
        label: str,
        reference: list[str] | None = None,
        note: str = "",
        also: list[Any] = (),
        probes: list[Any] = (),
    ) -> Row:
        """Drive `server` with `spec` and record a row (server CPU sampled over the window).

        `server` and each of `also` have a `label` and `cpu_seconds()` (a process, a group of
        them); `probes` have `start()` and `stop()`, called as the window opens and closes.
        """
        self.log(f"  {case}: {label} ...")
        marks: list[list[float]] = []
        sampler = self.sampler(key, server)
        probes = [*probes, sampler] if sampler is not None else probes

        def sample() -> None:
            marks.append([server.cpu_seconds(), *(p.cpu_seconds() for p in also), busy_seconds()])

        def opened() -> None:
            sample()
            for probe in probes:
                probe.start()

        def closed() -> None:
            sample()
            for probe in probes:
                probe.stop()

        result = load.run_load(spec, on_window_start=opened, on_window_end=closed)
        seconds = result.seconds or 1.0
        cpu = (
            [(b - a) / seconds for a, b in zip(marks[0], marks[1], strict=True)]
            if len(marks) == 2
            else [0.0] * (2 + len(also))
        )
        machine = cpu.pop()  # the whole machine's busy cores; the rest is ours or someone else's
        other = max(0.0, machine - sum(cpu) - result.client_cpu)
        for proc, used in zip(also, cpu[1:], strict=True):
            note = (note + "; " if note else "") + f"{proc.label} CPU {used:.0%}"
        also_cpu = {proc.label: used for proc, used in zip(also, cpu[1:], strict=True)}
        row = Row(case, key, label, result, server.peak_rss(), cpu[0], reference or [], note, other, also_cpu)
        self.rows[key] = row
        if sampler is not None:
            sampled = sampler.breakdown()
            row.breakdown = sampled.per_request(row.cpu_ms_per_request)
            row.hottest = {name: sampled.hottest(name) for name, _, _ in row.breakdown}
        if result.ok_fraction < 0.95:
            self.notes.append(f"{label}: only {result.ok_fraction:.0%} of answers as expected; e.g. {result.sample}")
        self.log(
            f"    {result.rps:,.0f} req/s, p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms, "
            f"ok {result.ok_fraction:.0%}, server CPU {cpu[0]:.0%}, client CPU {result.client_cpu:.0%}, "
            f"other CPU {other:.0%}"
        )
        return row

    def sampler(self, key: str, server: Any) -> profile.Sampler | None:
        """With --profile, a py-spy probe on a gate that runs as one process (its stacks beside its log)."""
        process = getattr(server, "process", None)
        if not self.params.profile or not server.label.startswith("a2a-gate") or process is None:
            return None
        return profile.Sampler(process.pid, Path(server.log).with_name(f"profile-{key}.txt"))

    def spec(self, port: int, requests: list[bytes], **kw: Any) -> load.Spec:
        p = self.params
        return load.Spec(
            port=port,
            source=load.Source("cycle", requests),
            concurrency=p.concurrency,
            duration=p.duration,
            warmup=p.warmup,
            **kw,
        )

    def ratio(self, key: str, ref: str) -> float:
        a, b = self.rows.get(key), self.rows.get(ref)
        return a.result.rps / b.result.rps if a and b and b.result.rps else 0.0

    def target(self, case: str, text: str, key: str, ref: str, goal: float) -> None:
        if key in self.rows and ref in self.rows:
            self.targets.append(Target(case, text, self.ratio(key, ref), goal))

    # -- the reference rows ------------------------------------------------

    def bare(self) -> Row:
        """The bare Starlette echo, measured once per run and used as the floor by a and b."""
        if "bare" not in self.rows:
            folder = self.path("bare")
            with servers.reference("bare", folder / "log.txt") as server:
                self.measure(
                    "a",
                    "bare",
                    server,
                    self.spec(server.port, send_requests(server.port, "/a2a/echo"), expect_marker=b'"result"'),
                    "bare Starlette echo (floor)",
                )
        return self.rows["bare"]


# ---------------------------------------------------------------------------
# Requests and configurations
# ---------------------------------------------------------------------------


def send_body(i: int, text: str = "hello") -> bytes:
    """The same v0.3 `message/send` body for every server (a fresh messageId per request)."""
    message = {"kind": "message", "role": "user", "messageId": f"bench-{i}", "parts": [{"kind": "text", "text": text}]}
    return json.dumps(
        {"jsonrpc": "2.0", "id": i, "method": "message/send", "params": {"message": message}}, separators=(",", ":")
    ).encode()


def send_requests(port: int, path: str, headers: dict[str, str] | None = None, n: int = 512) -> list[bytes]:
    return [load.build_request(port, path, send_body(i), headers) for i in range(n)]


CHANNEL_AGENT = """
[agents.paid-channel]
description = "paid echo, from a payment channel"

[agents.paid-channel.price]
scheme = "batch-settlement"
network = "{network}"
asset = "{asset}"
amount = "{amount}"
pay_to = "{pay_to}"
receiver_authorizer = "{authorizer}"
min_deposit = "{deposit}"

# the voucher path is measured without the withdrawal watch (it reads the chain off the request
# path, as before the claim obligation asked for it): the run is too short for a withdrawal
[channels]
accept_unwatched_withdrawals = true
"""

GATE_CONFIG = """\
# generated by bench/cases.py
public_url = "{public_url}"
database = "{database}"

[limits]
per_ip_per_minute = {per_ip}
per_agent_per_minute = {per_agent}
{shared_limits}

[proxy]
trusted = {trusted}

[facilitator]
url = "{facilitator}"

[agents.echo]
description = "Echoes the text it is sent. Free for API keys."

[agents.paid-echo]
description = "paid echo"
price = {{ scheme = "exact", network = "{network}", asset = "{asset}", amount = "{amount}", pay_to = "{pay_to}" }}
"""
DEV_RECEIVER_AUTHORIZER = "0xE40b4B07d90d26934b21e6E463a286988E28deeF"  # the development facilitator's
# every voucher of a run without a top-up in the window (the x402 client deposits at most 5× its $1 spend cap)
CHANNEL_DEPOSIT = 5_000_000

BIG = 1_000_000_000  # a limit the benchmark never reaches
KEY_LINE = re.compile(r"key \(shown once, keep it secret\): (\S+)")


def gate_config(
    folder: Path,
    *,
    facilitator: str = "",
    per_ip: int = BIG,
    per_agent: int = BIG,
    trusted: tuple[str, ...] = (),
    port: int = 0,
    public_url: str = "",
    database: str = "gate.db",
    redis: tuple[str, str] | None = None,
    channel: bool = True,
    sign_in: bool = True,
) -> tuple[Path, int]:
    """Write a gate configuration for `port` (default: a fresh one); returns (file, port).
    `channel`: with the channel-priced agent (a reference commit before channels has none);
    `sign_in`: False turns the priced echo's sign-in challenge off (`sign_in = false`, a key a
    reference commit before it would refuse).

    Replicas share `public_url` (the proxy's), `database` (a PostgreSQL URL) and
    `redis` (URL, key prefix) for their limiters."""
    port = port or servers.free_port()
    config = folder / "a2a-gate.toml"
    shared = f'redis_url = "{redis[0]}"\nredis_prefix = "{redis[1]}"' if redis else ""
    text = (
        GATE_CONFIG
        if sign_in
        else GATE_CONFIG.replace('description = "paid echo"\n', 'description = "paid echo"\nsign_in = false\n')
    )
    config.write_text(
        (text + (CHANNEL_AGENT if channel else "")).format(
            public_url=public_url or f"http://127.0.0.1:{port}",
            database=database,
            shared_limits=shared,
            per_ip=per_ip,
            per_agent=per_agent,
            trusted=json.dumps(list(trusted)),
            # a priced agent needs a facilitator URL to answer 402 rather than 501; the 402 and
            # 429 paths never call it, so an unused loopback port is enough there
            facilitator=facilitator or f"http://127.0.0.1:{servers.free_port()}",
            network=NETWORK,
            asset=ASSET,
            amount=AMOUNT,
            pay_to=PAY_TO,
            authorizer=DEV_RECEIVER_AUTHORIZER,
            deposit=CHANNEL_DEPOSIT,
        )
    )
    return config, port


def create_key(config: Path, src: Path = servers.REPO, python: str = sys.executable, module: str = "gate.cli") -> str:
    """`a2a-gate keys --config ... create bench --agent echo`; returns the key it prints once."""
    done = subprocess.run(
        [python, "-m", module, "keys", "--config", str(config), "create", "bench", "--agent", "echo"],
        capture_output=True,
        text=True,
        cwd=src,
        timeout=60,
        check=False,
    )
    match = KEY_LINE.search(done.stdout)
    if done.returncode != 0 or not match:
        raise RuntimeError(f"a2a-gate keys create failed:\n{done.stdout}\n{done.stderr}")
    return match.group(1)


# ---------------------------------------------------------------------------
# a. principal message/send
# ---------------------------------------------------------------------------


def against(bench: Bench, key: str) -> list[str]:
    """The row of the same path measured on the reference commit (`--against`), if any."""
    ref = bench.params.against
    return [f"{key}@{ref.short}"] if ref is not None else []


def case_a(bench: Bench) -> None:
    bench.log("case a: principal message/send on the echo agent")
    bench.bare()
    folder = bench.path("sdk")
    with servers.reference("sdk", folder / "log.txt") as server:
        bench.measure(
            "a",
            "sdk",
            server,
            bench.spec(server.port, send_requests(server.port, "/a2a/echo"), expect_marker=b'"completed"'),
            "a2a-sdk server (DefaultRequestHandler)",
        )
    runs = [("gate", 1, build) for build in builds(bench.params)] + [("gate-w2", 2, builds(bench.params)[0])]
    for base, workers, build in runs:
        key = base + build.suffix
        folder = bench.path(key)
        config, port = gate_config(folder, channel=not build.suffix)
        api_key = create_key(config, build.src, build.python, build.module)
        extra = ["--workers", "2"] if workers == 2 else []
        label = (
            "a2a-gate (API key)"
            + (" --workers 2" if workers == 2 else "")
            + (f" {build.suffix}" if build.suffix else "")
        )
        with servers.gate(
            config,
            port,
            folder / "log.txt",
            *extra,
            src=build.src,
            python=build.python,
            label=label,
            module=build.module,
        ) as server:
            requests = send_requests(port, "/a2a/echo", {"Authorization": f"Bearer {api_key}"})
            note = "peak RSS is the supervisor and both workers together" if workers == 2 else ""
            bench.measure(
                "a",
                key,
                server,
                bench.spec(port, requests, expect_marker=b'"completed"'),
                label,
                reference=["sdk", "bare"] + ([] if build.suffix or workers == 2 else against(bench, key)),
                note=note,
            ).short = build.short
    bench.target("a", "a2a-gate req/s ≥ 5× a2a-sdk server", "gate", "sdk", 5.0)
    bench.target("a", "a2a-gate req/s ≥ 75% of bare echo", "gate", "bare", 0.75)
    bench.target("a", "a2a-gate --workers 2 req/s ≥ 5× a2a-sdk server", "gate-w2", "sdk", 5.0)
    bench.target("a", "a2a-gate --workers 2 req/s ≥ 50% of bare echo", "gate-w2", "bare", 0.5)


# ---------------------------------------------------------------------------
# b. anonymous refusals
# ---------------------------------------------------------------------------


def case_b(bench: Bench) -> None:
    bench.log("case b: anonymous refusals")
    bench.bare()
    for base, status, per_ip, name, goal in (
        ("gate-402", 402, BIG, "a2a-gate 402 (priced, no token)", 0.95),
        ("gate-402-plain", 402, BIG, "a2a-gate 402, sign_in = false", 0.95),
        ("gate-429", 429, 1, "a2a-gate 429 (per-IP limit 1/min)", 1.1),
    ):
        plain = base == "gate-402-plain"
        for build in builds(bench.params):
            if plain and build.suffix:
                continue  # this tree's own switch: the reference is measured beside the 402 above
            key, label = base + build.suffix, name + (f" {build.suffix}" if build.suffix else "")
            folder = bench.path(key)
            config, port = gate_config(folder, per_ip=per_ip, channel=not build.suffix, sign_in=not plain)
            with servers.gate(
                config, port, folder / "log.txt", src=build.src, python=build.python, label=label, module=build.module
            ) as server:
                bench.measure(
                    "b",
                    key,
                    server,
                    bench.spec(port, send_requests(port, "/a2a/paid-echo"), expect_status=status),
                    label,
                    reference=["bare"] + ([] if build.suffix else against(bench, key)),
                ).short = build.short
        what = "402 without sign-in" if plain else str(status)
        bench.target("b", f"a2a-gate {what} req/s ≥ {goal:.0%} of bare echo", base, "bare", goal)


# ---------------------------------------------------------------------------
# c. paid message/send
# ---------------------------------------------------------------------------


def sign_chunk(payment_required: dict[str, Any], count: int) -> list[str]:
    """`count` fresh tokens (one throwaway key, a fresh nonce each), as PAYMENT-SIGNATURE values."""
    from devnet.payer import encode_header, new_private_key, sign_payment

    key = new_private_key()
    return [encode_header(sign_payment(payment_required, key)) for _ in range(count)]


def price_of(server: ServerProcess, path: str) -> dict[str, Any]:
    """Ask the server for its price: the PaymentRequired document of its 402."""
    answer = httpx.post(server.url + path, content=send_body(0), headers={"content-type": "application/json"})
    if answer.status_code != 402:
        raise RuntimeError(f"{server.label}: expected 402, got {answer.status_code} {answer.text[:300]}")
    return json.loads(base64.b64decode(answer.headers["payment-required"]))


def paid_spec(bench: Bench, server: ServerProcess, path: str, tokens: int) -> tuple[load.Spec, float]:
    """Sign `tokens` tokens for this server's own 402 (before the window) and build one request per token."""
    document = price_of(server, path)
    started = time.perf_counter()
    chunk = 25
    sizes = [min(chunk, tokens - i) for i in range(0, tokens, chunk)]
    headers = [h for part in bench.pool().map(sign_chunk, [document] * len(sizes), sizes) for h in part]
    signing = time.perf_counter() - started
    requests = [
        load.build_request(server.port, path, send_body(i), {"PAYMENT-SIGNATURE": h}) for i, h in enumerate(headers)
    ]
    p = bench.params
    spec = load.Spec(
        port=server.port,
        source=load.Source("once", requests),
        concurrency=p.concurrency,
        duration=p.duration,
        warmup=p.warmup,
        warmup_requests=max(p.concurrency, tokens // 10),
        expect_status=200,
        expect_marker=b"payment-response:",
    )
    return spec, signing


def case_c(bench: Bench) -> None:
    bench.log("case c: paid message/send (verify, execute, settle)")
    p = bench.params
    trusting = bench.trusting_facilitator()
    path = "/a2a/paid-echo"

    folder = bench.path("x402-middleware")
    with servers.reference("x402", folder / "log.txt", "--facilitator", trusting.url) as server:
        spec, signing = paid_spec(bench, server, path, p.paid_tokens)
        bench.log(f"    signed {p.paid_tokens} tokens in {signing:.1f}s")
        bench.measure("c", "x402", server, spec, "x402 ASGI payment middleware (FastAPI)", also=[trusting])

    for build in builds(p):
        key, label = "gate-paid" + build.suffix, "a2a-gate paid" + (f" {build.suffix}" if build.suffix else "")
        folder = bench.path(key)
        config, port = gate_config(folder, facilitator=trusting.url, channel=not build.suffix)
        with servers.gate(
            config, port, folder / "log.txt", src=build.src, python=build.python, label=label, module=build.module
        ) as server:
            spec, signing = paid_spec(bench, server, path, p.paid_tokens)
            bench.log(f"    signed {p.paid_tokens} tokens in {signing:.1f}s")
            reference = ["x402"] + ([] if build.suffix else against(bench, key))
            bench.measure("c", key, server, spec, label, reference=reference, also=[trusting]).short = build.short
    bench.target("c", "a2a-gate paid req/s ≥ 2.5× x402 middleware", "gate-paid", "x402", 2.5)

    folder = bench.path("gate-paid-real")
    with servers.facilitator(folder / "ledger.db", folder / "facilitator-log.txt", trust_signatures=False) as real:
        config, port = gate_config(folder, facilitator=real.url)
        with servers.gate(config, port, folder / "log.txt", src=bench.params.gate_src) as server:
            tokens = max(p.concurrency * 2, p.paid_tokens // 3)
            spec, signing = paid_spec(bench, server, path, tokens)
            bench.log(f"    signed {tokens} tokens in {signing:.1f}s")
            bench.measure(
                "c",
                "gate-paid-real",
                server,
                spec,
                "a2a-gate paid, real-crypto facilitator",
                reference=["gate-paid"],
                also=[real],
            )


# ---------------------------------------------------------------------------
# d. limiter memory
# ---------------------------------------------------------------------------


def case_d(bench: Bench) -> None:
    p = bench.params
    bench.log(f"case d: limiter memory, {p.addresses:,} distinct X-Forwarded-For addresses")
    folder = bench.path("gate-limiter")
    # priced agent, anonymous callers; per-agent limit 1/min, so after each address's
    # bucket is made the answer is a cheap 429 (the per-IP limiter has run by then)
    config, port = gate_config(folder, per_ip=30, per_agent=1, trusted=("127.0.0.1",))
    with servers.gate(config, port, folder / "log.txt", src=bench.params.gate_src) as server:
        body = send_body(0)
        # warm the server up from a few addresses, then take the baseline
        warm = [load.build_request(port, "/a2a/paid-echo", body, {"X-Forwarded-For": f"192.0.2.{i}"}) for i in range(8)]
        load.run_load(
            load.Spec(
                port=port,
                source=load.Source("cycle", warm),
                concurrency=p.concurrency,
                duration=min(1.0, p.duration),
                warmup=0.0,
                expect_status=429,
            )
        )
        time.sleep(0.2)
        before = server.rss()
        head, tail = load.build_request(port, "/a2a/paid-echo", body, {"X-Forwarded-For": "\0"}).split(b"\0")
        source = load.Source("xff", head=head, tail=tail, count=p.addresses)
        spec = load.Spec(
            port=port,
            source=source,
            concurrency=p.concurrency,
            duration=max(60.0, p.addresses / 200),
            warmup=0.0,
            expect_status=429,
        )
        result = load.run_load(spec)
        time.sleep(0.2)
        after = server.rss()
        bench.memory = MemoryResult(
            p.addresses,
            result.seconds,
            before,
            after,
            server.peak_rss(),
            result.statuses,
            result.errors,
            result.client_cpu,
        )
        sent = sum(result.statuses.values())
        bench.log(f"    {sent:,} answers in {result.seconds:.1f}s; RSS {before / MIB:.1f} -> {after / MIB:.1f} MiB")
        if sent < p.addresses * 0.99:
            bench.notes.append(f"case d: only {sent:,} of {p.addresses:,} addresses answered")
    bench.targets.append(
        Target("d", f"RSS growth over {p.addresses:,} addresses ≤ 100 MiB", bench.memory.growth / MIB, 100.0, "MiB")
    )


# ---------------------------------------------------------------------------
# e. PostgreSQL: replicas
# ---------------------------------------------------------------------------

SQLITE_ROW = {"free": "gate", "paid": "gate-paid", "channel": "gate-channel"}  # the same path on SQLite, when measured
LABELS = {"free": "API key", "paid": "paid", "channel": "voucher-paid"}


def postgres_missing(bench: Bench) -> str:
    """Why case e (or case f's PostgreSQL row) cannot run here, or ""."""
    p = bench.params
    if not p.postgres_url:
        return "no PostgreSQL URL (--postgres '')"
    why = postgres.unreachable(p.postgres_url)
    why = why and f"{why} at {postgres.where(p.postgres_url)}"
    if not why:
        why = postgres.redis_unreachable(p.redis_url)
        why = why and f"{why} at {postgres.where(p.redis_url)}"
    if not why and servers.nginx_binary() is None:
        why = "nginx is not installed"
    return why or ""


def case_e(bench: Bench) -> None:
    why = postgres_missing(bench)
    if why:
        bench.notes.append(f"case e skipped: {why}")
        bench.log(f"case e skipped: {why}")
        return
    bench.log("case e: PostgreSQL, one replica and two behind nginx: principal send, paid send")
    for path in ("free", "paid"):
        for replicas in (1, 2):
            postgres_row(bench, path, replicas)


def postgres_row(bench: Bench, path: str, replicas: int) -> Row:
    """One configuration on a schema of its own: `replicas` gates on PostgreSQL and Redis
    (behind nginx when more than one), the load, and what PostgreSQL did for it."""
    p = bench.params
    key = f"pg-{path}-r{replicas}"
    where = "one replica" if replicas == 1 else f"{replicas} replicas behind nginx"
    label = f"a2a-gate on PostgreSQL, {LABELS[path]}, {where}"
    folder = bench.path(key)
    facilitator = bench.trusting_facilitator() if path != "free" else None
    sealing = base64.urlsafe_b64encode(os.urandom(32)).decode()  # one key, every replica
    with contextlib.ExitStack() as stack:
        schema = stack.enter_context(postgres.Schema(p.postgres_url, key))
        redis = postgres.RedisServer(p.redis_url, f"a2a-gate-bench:{schema.name}:")
        stack.callback(redis.close)
        ports = [servers.free_port() for _ in range(replicas)]
        front = servers.nginx(ports, folder) if replicas > 1 else None
        public_port = front.port if front else ports[0]
        gates, counted, api_key = [], [], ""
        for i, port in enumerate(ports):
            home = folder / f"replica{i}"
            home.mkdir()
            config, _ = gate_config(
                home,
                facilitator=facilitator.url if facilitator else "",
                trusted=("127.0.0.1",) if front else (),
                port=port,
                public_url=f"http://127.0.0.1:{public_port}",
                database=schema.gate_url,
                redis=(p.redis_url, redis.prefix),
            )
            if path == "free" and not api_key:
                api_key = create_key(config, p.gate_src)  # the first one creates the tables too
            stats = home / "roundtrips.json"
            gate = servers.gate(
                config,
                port,
                home / "log.txt",
                src=p.gate_src,
                env={"A2A_GATE_SEALING_KEY": sealing},
                counted=stats,
            )
            gates.append(stack.enter_context(gate))
            counted.append(stats)
        if front is not None:
            stack.enter_context(front)
        target = servers.Group(label, public_port, gates)
        if path == "free":
            requests = send_requests(public_port, "/a2a/echo", {"Authorization": f"Bearer {api_key}"})
            spec = bench.spec(public_port, requests, expect_marker=b'"completed"')
        elif path == "channel":
            spec = voucher_spec(bench, public_port, f"http://127.0.0.1:{public_port}/a2a/paid-channel")
        else:
            spec, signing = paid_spec(bench, target, "/a2a/paid-echo", p.paid_tokens)
            bench.log(f"    signed {p.paid_tokens} tokens in {signing:.1f}s")
        trips = postgres.RoundTrips([(g.process.pid, stats) for g, stats in zip(gates, counted, strict=True)])
        activity = postgres.Activity(p.postgres_url, schema.application)
        totals = postgres.ServerTotals(p.postgres_url)
        backends = postgres.Backends(p.postgres_url, schema.application)
        also = [backends, postgres.ServerRest(backends), postgres.Sampler(), redis]
        also += [front] if front else []
        also += [facilitator] if facilitator else []
        sqlite = SQLITE_ROW[path]
        reference = [ref for ref in (sqlite, f"pg-{path}-r1") if ref != key]
        if sqlite in bench.rows:
            bench.rows[sqlite].short = "SQLite"
        probes = [trips, activity, totals]
        row = bench.measure("e", key, target, spec, label, reference, also=also, probes=probes)
        row.short = "1 replica" if replicas == 1 else f"{replicas} replicas"
        row.extra = postgres_figures(row, trips.window(), activity.result, totals.window(), replicas)
        row.extra["schema"] = schema.name
        row.extra["schema_rows"] = schema.table_rows()
    return row


def postgres_figures(
    row: Row, trips: dict[str, Any], activity: postgres.ActivityResult, totals: dict[str, int], replicas: int
) -> dict[str, Any]:
    """Per answered request (as the replicas counted them, in the same window as their round trips):
    round trips, statements, the time they took; what the backends did."""
    n = max(1, trips.get("requests") or row.result.requests)
    statements = trips["statements"]
    executed = sum(e["count"] for e in statements.values())
    ranked = sorted(statements.items(), key=lambda item: -item[1]["seconds"])
    return {
        "replicas": replicas,
        "round_trips_per_request": trips["round_trips"] / n,
        # of them, made serving requests; the rest are the replicas' own passes, by the clock
        "request_round_trips_per_request": trips["request_round_trips"] / n,
        "statements_per_request": executed / n,
        "other_round_trips_per_request": (trips["round_trips"] - executed) / n,  # BEGIN, COMMIT, ROLLBACK, probes
        "ms_per_round_trip": trips["round_trip_seconds"] / trips["round_trips"] * 1000 if trips["round_trips"] else 0,
        # Little's law on the sampled backends: of each round trip, the time a backend was busy with it
        "server_ms_per_round_trip": (
            activity.active / (trips["round_trips"] / row.result.seconds) * 1000
            if trips["round_trips"] and row.result.seconds
            else 0.0
        ),
        "pool_wait_ms_per_checkout": (
            trips["checkout_seconds"] / trips["checkouts"] * 1000 if trips["checkouts"] else 0.0
        ),
        "checkouts_per_request": trips["checkouts"] / n,
        "held_ms_per_checkout": trips["held_seconds"] / trips["checkouts"] * 1000 if trips["checkouts"] else 0.0,
        "redis_commands_per_request": trips["redis_commands"] / n,
        # server-wide (every client of a shared server counts): transactions and WAL flushes
        "server_transactions_per_request": totals.get("transactions", 0) / n,
        "server_transactions_per_wal_flush": (
            totals.get("transactions", 0) / totals["wal_syncs"] if totals.get("wal_syncs") else 0.0
        ),
        "server_wal_flushes_per_second": totals.get("wal_syncs", 0) / (row.result.seconds or 1.0),
        "activity": asdict(activity),
        "statements": [
            {
                "sql": sql,
                "per_request": e["count"] / n,
                "ms_each": e["seconds"] / e["count"] * 1000,
                "ms_per_request": e["seconds"] / n * 1000,
            }
            for sql, e in ranked
        ],
    }


def open_lane(url: str, vouchers: int) -> list[str]:
    """One payer's channel: opened with a deposit through the x402 package's own client (outside
    the window), then `vouchers` cumulative vouchers signed ahead, as PAYMENT-SIGNATURE values."""
    import asyncio

    from eth_account import Account
    from x402 import x402Client
    from x402.http import x402HTTPClient
    from x402.http.clients import x402_httpx_transport
    from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme
    from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher
    from x402.mechanisms.evm.batch_settlement.types import VoucherPayload
    from x402.mechanisms.evm.batch_settlement.utils import compute_channel_id
    from x402.mechanisms.evm.signers import EthAccountSigner
    from x402.schemas import PaymentPayload, PaymentRequired

    signer = EthAccountSigner(Account.create())
    scheme = BatchSettlementEvmScheme(signer)
    client = x402Client().register(NETWORK, scheme)

    async def deposit() -> PaymentRequired:
        async with httpx.AsyncClient(transport=x402_httpx_transport(client), timeout=60) as http:
            answer = await http.post(url, content=send_body(0), headers={"content-type": "application/json"})
            if "payment-response" not in answer.headers:
                raise RuntimeError(f"the deposit was not paid: {answer.status_code} {answer.text[:300]}")
        asked = httpx.post(url, content=send_body(0), headers={"content-type": "application/json"})
        return x402HTTPClient(client).get_payment_required_response(asked.headers.get, asked.json())

    required = asyncio.run(deposit())
    offer = next(a for a in required.accepts if a.scheme == "batch-settlement")
    config = scheme.build_channel_config(offer)
    channel_id = compute_channel_id(config, NETWORK)
    headers = []
    for k in range(2, vouchers + 2):  # the deposit's voucher was for one price
        payload = VoucherPayload()
        payload.channel_config = config
        payload.voucher = sign_voucher(signer, channel_id, str(k * int(offer.amount)), NETWORK)
        document = PaymentPayload(x402_version=2, payload=payload.to_dict(), accepted=offer, resource=required.resource)
        headers.append(x402HTTPClient(client).encode_payment_signature_header(document)["PAYMENT-SIGNATURE"])
    return headers


def case_f(bench: Bench) -> None:
    """Voucher-paid `message/send` (x402 batch-settlement): each worker pays from its own channel,
    one voucher after another; the vouchers are verified by the gate itself (no facilitator call)."""
    bench.log("case f: voucher-paid message/send (payment channels), beside the API key")
    trusting = bench.trusting_facilitator()
    for build in builds(bench.params):
        try:
            vouchers_and_keys(bench, build, trusting)
        except (RuntimeError, TimeoutError) as exc:
            if not build.suffix:
                raise
            # a commit from before a configuration key this case writes (or before channels) refuses it
            why = str(exc).strip().splitlines()[-1]
            bench.notes.append(f"case f {build.suffix}: not measured, its gate did not start ({why})")
    row = bench.rows["gate-channel"]
    bench.targets.append(Target("f", "voucher-paid req/s ≥ 2000 (×2000)", row.result.rps / 2000, 1.0))
    if row.cpu_ms_per_request:  # the issue's own measure: the server's CPU per voucher, whatever bounds the rate
        text = "server CPU per voucher ≤ 0.5 ms (0.5 ms ÷ measured)"
        bench.targets.append(Target("f", text, 0.5 / row.cpu_ms_per_request, 1.0))
    bench.target("f", "voucher-paid req/s ≥ 0.45× the API key's", "gate-channel", "gate-key-f", 0.45)
    why = postgres_missing(bench)
    if why:
        bench.notes.append(f"case f on PostgreSQL skipped: {why}")
        return
    row = postgres_row(bench, "channel", 2)
    per_voucher = row.extra["request_round_trips_per_request"]  # a voucher's own, not the replicas' passes
    text = "PostgreSQL round trips per voucher (its request's), 2 replicas ≤ 3 (÷3)"
    bench.targets.append(Target("f", text, 3 / per_voucher if per_voucher else 0.0, 1.0))
    on_sqlite, on_postgres = bench.rows["gate-channel"].cpu_ms_per_request, row.cpu_ms_per_request
    if on_sqlite and on_postgres:  # the gate's CPU per voucher, its replicas' together
        text = "gate CPU per voucher on PostgreSQL, 2 replicas ≤ 1.3× on SQLite (÷1.3)"
        bench.targets.append(Target("f", text, 1.3 * on_sqlite / on_postgres, 1.0))


def vouchers_and_keys(bench: Bench, build: Build, trusting: ServerProcess) -> None:
    """One gate of `build`: API-key sends, then voucher-paid sends, on the same server."""
    folder = bench.path("gate-channel" + build.suffix)
    config, port = gate_config(folder, facilitator=trusting.url)
    api_key = create_key(config, build.src, build.python, build.module)
    gate = servers.gate(
        config, port, folder / "log.txt", src=build.src, python=build.python, label="a2a-gate", module=build.module
    )
    tag = f" {build.suffix}" if build.suffix else ""  # of each label: which commit's gate
    with gate as server:
        requests = send_requests(port, "/a2a/echo", {"Authorization": f"Bearer {api_key}"})
        bench.measure(
            "f",
            "gate-key-f" + build.suffix,
            server,
            bench.spec(port, requests, expect_marker=b'"completed"'),
            "a2a-gate (API key), same run" + tag,
        )
        bench.measure(
            "f",
            "gate-channel" + build.suffix,
            server,
            voucher_spec(bench, port, f"{server.url}/a2a/paid-channel"),
            "a2a-gate voucher-paid (batch-settlement)" + tag,
            reference=["gate-key-f" + build.suffix],
            also=[trusting],
        )


def voucher_spec(bench: Bench, port: int, url: str) -> load.Spec:
    """Every worker a channel of its own (opened at `url`), its vouchers one after another."""
    p = bench.params
    per_lane = max(50, int(1500 * (p.duration + p.warmup) / p.concurrency))
    started = time.perf_counter()
    lanes = list(bench.pool().map(open_lane, [url] * p.concurrency, [per_lane] * p.concurrency))
    took = time.perf_counter() - started
    bench.log(f"    opened {len(lanes)} channels, signed {per_lane} vouchers each in {took:.1f}s")
    path = "/" + url.split("/", 3)[3]
    source = load.Source(
        "lanes",
        lanes=[
            [load.build_request(port, path, send_body(i), {"PAYMENT-SIGNATURE": h}) for i, h in enumerate(lane)]
            for lane in lanes
        ],
    )
    return load.Spec(
        port=port,
        source=source,
        concurrency=p.concurrency,
        duration=p.duration,
        warmup=p.warmup,
        expect_status=200,
        expect_marker=b"payment-response:",
    )


CASES = {"a": case_a, "b": case_b, "c": case_c, "d": case_d, "e": case_e, "f": case_f}
