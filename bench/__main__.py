"""`python -m bench`: run the cases and print one table.

    python -m bench                      # the short run (about two minutes)
    python -m bench --long               # durations ×5, 1,000,000 addresses in case d
    python -m bench --cases a,b --duration 10 --concurrency 64
    python -m bench --json results.json  # also write the numbers as JSON
    python -m bench --gate-src ../other-checkout   # benchmark another tree's server/ and gate/
    python -m bench --against e838e6c    # that commit's gate too, in its own venv, beside this one
    python -m bench --stacks asyncio-h11 # one stack only (default: asyncio-h11 and uvloop-httptools)
    python -m bench --cases e --postgres postgresql://postgres@127.0.0.1:5432/test --redis redis://127.0.0.1:6379/0

Every server runs in its own process on a free 127.0.0.1 port and is stopped on exit,
on Ctrl-C and on errors. The load generator runs in a separate process too. The cases
run once per stack, every server of a table on the same one: asyncio and h11, then
uvloop and httptools (uvicorn's faster stack, when installed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path

from bench import servers
from bench.cases import CASES, MIB, Bench, Params

SATURATED = 0.90  # a client using this much of a core may be the bottleneck
NOISY = 0.15  # other processes using this much of a core during a window disturb it


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = Params()
    parser = argparse.ArgumentParser(prog="python -m bench", description="Compare a2a-gate with reference servers.")
    parser.add_argument("--cases", default="a,b,c,d,e,f", help="which cases to run (default: a,b,c,d,e,f)")
    parser.add_argument("--duration", type=float, default=defaults.duration, help="measured seconds per server")
    parser.add_argument("--warmup", type=float, default=defaults.warmup, help="warm-up seconds per server")
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency, help="closed-loop workers")
    parser.add_argument(
        "--addresses",
        type=int,
        default=None,
        help=f"case d: distinct client addresses (default {defaults.addresses:,}; --long: 1,000,000)",
    )
    parser.add_argument(
        "--paid-tokens",
        type=int,
        default=None,
        help=f"case c: tokens signed per server (default {defaults.paid_tokens})",
    )
    parser.add_argument("--long", action="store_true", help="durations and token counts ×5, 1,000,000 addresses")
    parser.add_argument(
        "--gate-src",
        type=Path,
        default=servers.REPO,
        help="run a2a-gate from this tree (its server/ and gate/), e.g. a patched copy",
    )
    parser.add_argument(
        "--postgres",
        default=defaults.postgres_url,
        help="case e: PostgreSQL URL; each configuration makes a schema there and drops it; the gate's "
        "pool parameters pass through (?pool_max_size=20) "
        "(default: $A2A_GATE_TEST_POSTGRES_URL or postgresql://postgres@127.0.0.1:5432/test)",
    )
    parser.add_argument(
        "--redis",
        default=defaults.redis_url,
        help="case e: Redis URL for the replicas' limiters (default: $A2A_GATE_TEST_REDIS_URL or redis://127.0.0.1:6379/0)",
    )
    parser.add_argument(
        "--stacks",
        default=",".join(servers.STACKS),
        help=f"the stacks every server runs on, one table each (default: {','.join(servers.STACKS)})",
    )
    parser.add_argument(
        "--against",
        metavar="REF",
        help="also measure the gate of this commit (built once in its own venv, bench/reference.py) on every "
        "gate path, in the same run, and print the ratio per path",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample every a2a-gate server with py-spy over its measured window and print where its CPU per "
        "request goes (bench/profile.py; the raw stacks stay with --keep)",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (configs, logs, databases)")
    return parser.parse_args(argv)


def params_from(args: argparse.Namespace, stack: str = servers.STACKS[0], against: object = None) -> Params:
    factor = 5 if args.long else 1
    defaults = Params()
    return Params(
        stack=stack,
        against=against,
        duration=args.duration * factor,
        warmup=args.warmup,
        concurrency=args.concurrency,
        addresses=args.addresses if args.addresses is not None else (1_000_000 if args.long else defaults.addresses),
        paid_tokens=args.paid_tokens if args.paid_tokens is not None else defaults.paid_tokens * factor,
        gate_src=args.gate_src.resolve(),
        postgres_url=args.postgres,
        redis_url=args.redis,
        profile=args.profile,
    )


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    packages = ", ".join(f"{name} {version(name)}" for name in ("a2a-sdk", "x402", "starlette", "uvicorn", "fastapi"))
    return (
        f"machine: {os.cpu_count()} CPUs ({model}), Python {platform.python_version()}, {platform.system()} "
        f"{platform.release()}\npackages: {packages}"
    )


def fmt_ratio(bench: Bench, key: str) -> str:
    row = bench.rows[key]
    parts = [
        f"{bench.ratio(key, ref):.2f}× {bench.rows[ref].short or bench.rows[ref].server.split(' ')[0]}"
        for ref in row.reference
        if ref in bench.rows
    ]
    return ", ".join(parts) or "reference"


def table(bench: Bench, params: Params) -> str:
    head = (
        "case",
        "server",
        "req/s",
        "p50 ms",
        "p99 ms",
        "peak RSS MiB",
        "ok",
        "srv CPU",
        "srv ms/req",
        "cli CPU",
        "vs reference",
    )
    lines = []
    for row in bench.rows.values():
        r = row.result
        client = f"{r.client_cpu:.0%}" + ("!" if r.client_cpu >= SATURATED else "")
        lines.append(
            (
                row.case,
                row.server,
                f"{r.rps:,.0f}",
                f"{r.p50_ms:.1f}",
                f"{r.p99_ms:.1f}",
                f"{row.peak_rss / MIB:.1f}",
                f"{r.ok_fraction:.0%}",
                f"{row.server_cpu:.0%}",
                f"{row.cpu_ms_per_request:.2f}",
                client,
                fmt_ratio(bench, row.key),
            )
        )
    widths = [max(len(str(x[i])) for x in [head, *lines]) for i in range(len(head))]
    numeric = {2, 3, 4, 5, 6, 7, 8, 9}

    def render(cells: tuple) -> str:
        return "  ".join(
            str(c).rjust(w) if i in numeric else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = [render(head), render(tuple("-" * w for w in widths)), *map(render, lines)] if lines else []
    m = bench.memory
    if m is not None:
        out.append(
            f"d     a2a-gate limiter, {m.addresses:,} distinct X-Forwarded-For addresses in {m.seconds:.1f}s "
            f"({m.addresses / m.seconds if m.seconds else 0:,.0f} req/s, answers {dict(sorted(m.statuses.items()))}): "
            f"RSS before {m.rss_before / MIB:.1f} MiB, after {m.rss_after / MIB:.1f} MiB, "
            f"growth {m.growth / MIB:+.1f} MiB, peak {m.peak_rss / MIB:.1f} MiB"
        )
    out += postgres_section(bench)
    notes = [f"{row.server}: {row.note}" for row in bench.rows.values() if row.note]
    for row in bench.rows.values():
        if row.result.exhausted:
            notes.append(
                f"{row.server}: its {row.result.requests} pre-signed tokens ran out after "
                f"{row.result.seconds:.1f}s of the {params.duration:g}s window (req/s is over that time)"
            )
        if row.result.client_cpu >= SATURATED:
            notes.append(
                f"{row.server}: the client used {row.result.client_cpu:.0%} of a core; it may be the bottleneck"
            )
        if row.other_cpu >= NOISY:
            notes.append(
                f"{row.server}: other processes on the machine used {row.other_cpu:.0%} of a core during "
                f"its window; its numbers may be low"
            )
        if row.result.errors:
            notes.append(f"{row.server}: {row.result.errors} connection errors")
    if notes or bench.notes:
        out.append("")
        out += [f"note: {n}" for n in notes + bench.notes]
    if bench.targets:
        out.append("")
        out.append("targets:")
        out += [t.line() for t in bench.targets]
    return "\n".join(out)


def postgres_section(bench: Bench, least: float = 0.05) -> list[str]:
    """Case e's figures besides the load: round trips, pool waits, Redis, backends, statements."""
    rows = [row for row in bench.rows.values() if row.extra.get("replicas")]
    if not rows:
        return []
    out = [
        "",
        "PostgreSQL (case e), per answered request; round trips counted inside each replica (bench/roundtrips.py),",
        "backends sampled every 50 ms in pg_stat_activity and pg_locks (busy = running a statement; waits in the mean",
        "number of busy backends; lock waits = ungranted locks):",
    ]
    for row in rows:
        x, a = row.extra, row.extra["activity"]
        waits = ", ".join(f"{k} {v:.2f}" for k, v in list(a["waiting"].items())[:4]) or "none"
        cpu = ", ".join(f"{name} {used:.0%}" for name, used in row.also_cpu.items())
        out.append(
            f"  {row.key}: {x['round_trips_per_request']:.3f} round trips "
            f"({x['request_round_trips_per_request']:.3f} serving the request, the rest the replicas' own passes; "
            f"{x['statements_per_request']:.1f} statements, "
            f"{x['other_round_trips_per_request']:.1f} BEGIN/COMMIT/other), {x['ms_per_round_trip']:.2f} ms each "
            f"(of which PostgreSQL busy {x['server_ms_per_round_trip']:.2f}); "
            f"{x['checkouts_per_request']:.1f} pool checkouts, waited {x['pool_wait_ms_per_checkout']:.2f} ms, "
            f"held {x['held_ms_per_checkout']:.2f} ms each; Redis {x['redis_commands_per_request']:.1f} commands"
        )
        out.append(
            f"      server-wide (statistics PostgreSQL publishes about once a second: approximate): "
            f"{x['server_transactions_per_request']:.1f} transactions per request, "
            f"{x['server_wal_flushes_per_second']:,.0f} WAL flushes/s, "
            f"{x['server_transactions_per_wal_flush']:.1f} transactions per flush"
        )
        out.append(
            f"      backends open {a['backends']:.1f}, busy {a['active']:.2f} ({waits}); "
            f"lock waits {a['lock_waits']:.2f} (max {a['max_lock_waits']}) in {a['samples']} samples; "
            f"CPU: server {row.server_cpu:.0%}, {cpu}, load generator {row.result.client_cpu:.0%}, "
            f"others {row.other_cpu:.0%}"
        )
        for query, samples in a["lock_waiters"].items():
            out.append(f"      waited on a lock in {samples} samples: {query}")
        for entry in [e for e in x["statements"] if e["per_request"] >= least]:  # every statement of the path
            sql = " ".join(entry["sql"].split())
            sql = sql if len(sql) <= 90 else sql[:87] + "..."
            out.append(f"      {entry['per_request']:4.2f}× {entry['ms_each']:6.2f} ms  {sql}")
    return out


def profile_lines(bench: Bench) -> list[str]:
    """With --profile: each sampled gate's CPU per request, by where it goes (bench/profile.py)."""
    out: list[str] = []
    for row in (r for r in bench.rows.values() if r.breakdown):
        out += ["", f"where {row.server}'s CPU goes ({row.cpu_ms_per_request:.3f} ms per request):"]
        for name, share, ms in row.breakdown:
            out.append(f"  {ms:6.3f} ms  {share:4.0%}  {name}")
            if share >= 0.05:  # where a large bucket's samples come from
                out += [f"                      {part:4.0%}  {frame}" for frame, part in row.hottest.get(name, [])]
    return out


def against_lines(bench: Bench) -> list[str]:
    """With --against: this tree's gate over the reference commit's, per path."""
    ref = bench.params.against
    if ref is None:
        return []
    out = ["", f"this tree / {ref.short}, per path (req/s; server CPU per request):"]
    for key, row in bench.rows.items():
        other = bench.rows.get(f"{key}@{ref.short}")
        if other is None or not other.result.rps:
            continue
        cpu = other.cpu_ms_per_request / row.cpu_ms_per_request if row.cpu_ms_per_request else 0.0
        out.append(
            f"  {row.server}: {bench.ratio(key, f'{key}@{ref.short}'):.2f}× req/s; {cpu:.2f}× less CPU per request"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        print(f"error: unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    stacks = [s.strip() for s in args.stacks.split(",") if s.strip()]
    if not stacks or any(s not in servers.STACKS for s in stacks):
        print(f"error: --stacks takes {', '.join(servers.STACKS)}", file=sys.stderr)
        return 2
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    reference = None
    if args.against:
        from bench.reference import prepare

        reference = prepare(args.against, log)
    # SIGTERM ends the run like Ctrl-C does: through the finally below
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(tempfile.mkdtemp(prefix="a2a-gate-bench-"))
    started = time.monotonic()
    done: list[tuple[str, Bench]] = []
    try:
        for stack in stacks:
            if stack == "uvloop-httptools":
                missing = servers.stack_missing() or (reference and servers.stack_missing(str(reference.python)))
                if missing:
                    log(f"stack {stack} skipped: {missing}")
                    continue
            servers.use_stack(stack)
            params = params_from(args, stack, reference)
            bench = Bench(params, workdir / stack, log=log)
            log(f"stack {stack}:")
            done.append((stack, bench))
            try:
                for case in chosen:
                    CASES[case](bench)
            finally:
                bench.close()
                servers.stop_all()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        servers.stop_all()
        if args.keep:
            print(f"work directory kept: {workdir}", file=sys.stderr)
        else:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.monotonic() - started
    params = params_from(args)
    print(machine())
    print(
        f"run: cases {','.join(chosen)}, duration {params.duration:g}s + warm-up {params.warmup:g}s per server, "
        f"concurrency {params.concurrency}, {params.paid_tokens} paid tokens per server, "
        f"{params.addresses:,} addresses; stacks {', '.join(s for s, _ in done)}; {elapsed:.0f}s in all"
    )
    if params.gate_src != servers.REPO:
        print(f"a2a-gate from: {params.gate_src}")
    if reference is not None:
        print(f"against: {args.against} = {reference.commit} (tree {reference.src}, python {reference.python})")
    documents = {}
    for stack, bench in done:
        print()
        print(f"stack: {stack} (every server in this table)")
        print(table(bench, bench.params))
        print("\n".join(against_lines(bench)))
        print("\n".join(profile_lines(bench)))
        documents[stack] = {
            "params": asdict(bench.params),
            "rows": {
                k: {**asdict(r), "result": {**asdict(r.result), "ok_fraction": r.result.ok_fraction}}
                for k, r in bench.rows.items()
            },
            "memory": asdict(bench.memory) if bench.memory else None,
            "targets": [{**asdict(t), "met": t.met} for t in bench.targets],
            "notes": bench.notes,
        }
    if args.json:
        args.json.write_text(json.dumps(documents, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
