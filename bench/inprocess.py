"""`python -m bench.inprocess`: the gate's own CPU per request, without a server or a load generator.

    python -m bench.inprocess                        # this tree: API key and voucher, 3 rounds
    python -m bench.inprocess --against 598b661      # and that commit's, rounds interleaved
    python -m bench.inprocess --requests 3000 --rounds 5 --profile
    python -m bench.inprocess --profile --profile-out /tmp/prof   # and each path's cProfile statistics
    python -m bench.inprocess --against 598b661 --instructions   # instructions, under valgrind
    python -m bench.inprocess --instructions --floor             # and what no cut of the Python takes out

Each gate's ASGI app is called directly, one request after another, in a process of its own
(`bench/inprocess_child.py`): the same requests as case f (an API-key `message/send` to the echo
agent, then vouchers of a channel opened by the x402 package's client), the CPU time of the whole
process per request. No uvicorn, no sockets, no load generator sharing the two cores: what is left
is the gate's own work (and its SQLite file), so a cut of a few percent shows where the full run's
noise hides it. `--profile` adds the Python calls per request (cProfile, a coroutine's every resume
counted), which turns the CPU up, so it is a separate round.

Each round runs every gate once, in turn (this tree, then the reference), on a fresh channel per gate
and round; the table gives each round's figures and their median.

On a shared VM even this CPU time moves by ±10% between rounds. `--instructions` counts what the CPU
executed instead (valgrind's cachegrind, without its cache simulation: `apt install valgrind`), which
barely moves from run to run: each path is run twice, after the same warm-up, with one measured request
and with one more than `--requests`, and the difference divided. Under valgrind the process runs about
40 times slower, so what runs on a timer (the SQLite checkpoint every second, the claim schedule) runs
more often per request than it would: compare trees with it, not with the CPU figures.

`--floor` (with `--instructions`, this tree) counts what no cut of the gate's Python can take out of a
request: the SQL each path runs, captured from the gate and replayed without it on a copy of its
database (`bench/sql_replay.py`: SQLite and the `sqlite3` module only, each statement held to the
outcome it had for the gate), and a voucher's reading and signature recovery alone. The key's request,
the SQL a voucher runs beyond the key's and that reading make the least a voucher can be; the summary
sets it beside what the voucher goal allows.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bench import servers
from bench.cases import Build, Target, create_key, gate_config, open_lane

CHILD = Path(__file__).with_name("inprocess_child.py")
REPLAY = Path(__file__).with_name("sql_replay.py")
PATHS = ("key", "voucher")
CACHEGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
GOAL = 0.45  # the voucher-paid rate against the API key's the goal asks for (case f's target)


@dataclass
class Gate:
    """One tree's gate, prepared: its configuration (and database) and a lane per round."""

    build: Build
    config: Path
    key: str
    lanes: list[Path] = field(default_factory=list)
    figures: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PATHS})
    calls: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"a2a-gate {self.build.suffix.lstrip('@') or 'this tree'}"


def prepare(
    build: Build, folder: Path, facilitator: str, rounds: int, per_round: int, pool: ProcessPoolExecutor
) -> Gate:
    """The gate's configuration and API key, and a channel of `per_round` vouchers for each round,
    opened through the gate served as usual (its tree, its interpreter) and stopped again."""
    folder.mkdir(parents=True)
    config, port = gate_config(folder, facilitator=facilitator)
    gate = Gate(build, config, create_key(config, build.src, build.python, build.module))
    server = servers.gate(
        config, port, folder / "log.txt", src=build.src, python=build.python, label="a2a-gate", module=build.module
    )
    with server:
        url = f"{server.url}/a2a/paid-channel"
        lanes = list(pool.map(open_lane, [url] * rounds, [per_round] * rounds))
    for i, vouchers in enumerate(lanes):
        lane = folder / f"lane-{i}.json"
        lane.write_text(json.dumps({"key": gate.key, "vouchers": vouchers}))
        gate.lanes.append(lane)
    return gate


def child(
    gate: Gate,
    lane: Path,
    offset: int,
    warmup: int,
    measured: int,
    mode: str,
    paths: tuple[str, ...],
    wrap: list[str],
    stats: Path | None = None,
) -> tuple[dict[str, dict[str, float]], str]:
    """One run of `bench/inprocess_child.py` (under `wrap`, e.g. valgrind): each path's line, and stderr.
    Profiled, each path's cProfile statistics go to `stats` when given."""
    args = [str(gate.config), str(lane), str(offset), str(warmup), str(measured), mode, ",".join(paths)]
    args.append(str(stats) if stats else "")
    done = subprocess.run(
        [*wrap, gate.build.python, "-c", CHILD.read_text(), *args],
        cwd=gate.build.src,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or len(lines) != len(paths):
        raise RuntimeError(f"{gate.name}: the in-process run failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return {line["path"]: line for line in lines}, done.stderr


def run_round(
    gate: Gate, lane: Path, warmup: int, measured: int, mode: str, stats: Path | None = None
) -> dict[str, dict[str, float]]:
    return child(gate, lane, 0, warmup, measured, mode, PATHS, [], stats)[0]


IR = re.compile(r"I\s+refs:\s+([\d,]+)")


def counted(stderr: str, what: str) -> int:
    """The instructions valgrind counted, from its report on stderr."""
    found = IR.search(stderr)
    if found is None:
        raise RuntimeError(f"{what}: valgrind printed no instruction count:\n{stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def instructions(gate: Gate, lane: Path, warmup: int, measured: int) -> dict[str, float]:
    """Instructions per request of each path: two runs under cachegrind, the same warm-up, 1 and
    1 + `measured` requests; their difference over `measured`. The vouchers go on along the channel."""
    out, offset = {}, 0
    for path in PATHS:
        counts = []
        for n in (1, 1 + measured):
            _, stderr = child(gate, lane, offset, warmup, n, "time", (path,), CACHEGRIND)
            counts.append(counted(stderr, gate.name))
            if path == "voucher":
                offset += warmup + n
        out[path] = (counts[1] - counts[0]) / measured
    return out


@dataclass(frozen=True)
class Floor:
    """What no cut of the gate's Python can take out of a request, in instructions: each path's SQL
    alone (the voucher's also split at its reservation's commit), and the voucher's reading and
    signature recovery."""

    sql: dict[str, float]
    reservation: float  # the voucher's first transaction: the reservation, committed before the work
    delivery: float  # the rest of its SQL: the delivery's write, which charges it
    parsing: float  # the header read into a token
    reading: float  # and the voucher's signer recovered and checked

    def voucher(self, key: float) -> float:
        """The least a voucher can be: the key's request, the SQL a voucher runs beyond the key's,
        and its reading and recovery."""
        return key + self.sql["voucher"] - self.sql["key"] + self.reading


SPLIT = 9  # measured vouchers whose SQL is split at their reservation's commit (the median is shown)


def floor(gate: Gate, lane: Path, offset: int, warmup: int, measured: int, folder: Path) -> Floor:
    """Each path's SQL captured from the gate (`capture`, after `warmup` requests, `measured` more),
    then replayed without it on a copy of the database as it was before, under cachegrind, up to the
    warm-up's end and up to the last request's: the difference over `measured`. The last `SPLIT`
    vouchers' SQL replayed up to their start, their first COMMIT and their end: the reservation's
    transaction and the rest, medians. And the voucher's reading alone (`parse`), and with its
    recovery (`read`), 1 and 1 + `measured` of them, the difference divided. The capture spends the
    lane's vouchers from `offset` on; reading spends none."""
    database = gate.config.parent / "gate.db"  # `gate_config`'s
    sql: dict[str, float] = {}
    parts: list[tuple[int, int]] = []
    for path in PATHS:
        before = folder / f"{path}-before.db"
        for suffix in ("", "-wal"):
            if Path(f"{database}{suffix}").exists():
                shutil.copy(f"{database}{suffix}", f"{before}{suffix}")
        child(gate, lane, offset, warmup, measured, "capture", (path,), [], folder)
        capture = folder / f"{path}.sql.pickle"
        captured = pickle.loads(capture.read_bytes())
        ends = captured["ends"]
        counts = [replayed(gate, before, capture, upto) for upto in (captured["warm_end"], ends[-1])]
        sql[path] = (counts[1] - counts[0]) / measured
        if path == "voucher":
            offset += warmup + measured
            for start, end in list(zip([captured["warm_end"], *ends[:-1]], ends, strict=True))[-SPLIT:]:
                commit = next(i for i in range(start, end) if captured["statements"][i][1] == "COMMIT") + 1
                at = [replayed(gate, before, capture, upto) for upto in (start, commit, end)]
                parts.append((at[1] - at[0], at[2] - at[1]))
    reading = {}
    for mode in ("parse", "read"):
        counts = []
        for n in (1, 1 + measured):
            _, stderr = child(gate, lane, 0, warmup, n, mode, ("voucher",), CACHEGRIND)  # (spends none)
            counts.append(counted(stderr, gate.name))
        reading[mode] = (counts[1] - counts[0]) / measured
    reservation, delivery = (statistics.median(part) for part in zip(*parts, strict=True))
    return Floor(sql, reservation, delivery, reading["parse"], reading["read"])


def replayed(gate: Gate, before: Path, capture: Path, upto: int) -> int:
    """Instructions of `bench/sql_replay.py` replaying `capture`'s first `upto` statements on a fresh
    copy of `before`; every statement must come out as it did for the gate."""
    database = before.with_name("replaying.db")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{database}{suffix}").unlink(missing_ok=True)
        if suffix != "-shm" and Path(f"{before}{suffix}").exists():
            shutil.copy(f"{before}{suffix}", f"{database}{suffix}")
    done = subprocess.run(
        [*CACHEGRIND, gate.build.python, "-c", REPLAY.read_text(), str(database), str(capture), str(upto)],
        cwd=before.parent,  # where no `gate` can be imported: the capture holds built-in values only
        env={**os.environ, "PYTHONHASHSEED": "0"},  # as the gate's runs: the same work in both
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0 or " 0 diverged" not in done.stderr:
        raise RuntimeError(f"{gate.name}: the SQL replay did not run as the gate did:\n{done.stderr[-3000:]}")
    return counted(done.stderr, gate.name)


def table(gates: list[Gate], rounds: int, unit: str, number: str) -> list[str]:
    """Each gate's rows (a path's figure in each round, their median, the voucher's over the key's),
    then this tree's medians over the reference's."""
    out = [
        "| gate | path | "
        + " | ".join(f"round {r + 1}" for r in range(rounds))
        + f" | median {unit} | voucher ÷ key |",
        "|---|---|" + "---:|" * (rounds + 2),
    ]
    for gate in gates:
        medians = {p: statistics.median(gate.figures[p]) for p in PATHS}
        for p in PATHS:
            cells = " | ".join(number.format(v) for v in gate.figures[p])
            ratio = f"{medians['voucher'] / medians['key']:.2f}×" if p == "voucher" else ""
            calls = f" ({gate.calls[p]:.0f} calls)" if p in gate.calls else ""
            out.append(f"| {gate.name} | {p}{calls} | {cells} | {number.format(medians[p])} | {ratio} |")
    if len(gates) > 1:
        this, ref = gates
        for p in PATHS:
            against = statistics.median(this.figures[p]) / statistics.median(ref.figures[p])
            out.append(f"{p}: this tree's {unit} per request are {against:.3f}× {ref.name}'s (medians)")
    return out


def targets(gate: Gate, unit: str) -> list[str]:
    """The voucher goal as this gate's own work says it: a voucher-paid rate of at least 0.45× the API
    key's is at most 1 / 0.45 = 2.22× its work a request (the key's figure over the voucher's, medians)."""
    key, voucher = (statistics.median(gate.figures[p]) for p in PATHS)
    text = f"voucher ≥ {GOAL}× the API key's rate, in process (the key's {unit} ÷ the voucher's)"
    return ["", "targets:", Target("f", text, key / voucher, GOAL).line()]


def floor_table(gate: Gate, found: Floor) -> list[str]:
    """The floor beside the whole requests, and what it leaves the rest of a voucher under the goal."""
    key, voucher = (gate.figures[p][0] for p in PATHS)
    least, allowed = found.voucher(key), key / GOAL
    return [
        "",
        f"what no cut of the gate's Python takes out, {gate.name} (instructions a request):",
        "| | key | voucher |",
        "|---|---:|---:|",
        f"| the request, all of it | {key:,.0f} | {voucher:,.0f} |",
        f"| its SQL alone, replayed without the gate | {found.sql['key']:,.0f} | {found.sql['voucher']:,.0f} |",
        f"| … the reservation's transaction, before the work (median of {SPLIT}) | | {found.reservation:,.0f} |",
        f"| … the rest: the delivery's write, which charges it (median of {SPLIT}) | | {found.delivery:,.0f} |",
        f"| the voucher read and its signer recovered | | {found.reading:,.0f} |",
        f"| … its header read into a token (base64, JSON, its shape) | | {found.parsing:,.0f} |",
        f"| … its signer recovered and checked (EIP-712 digest, secp256k1) | | {found.reading - found.parsing:,.0f} |",
        f"| the least a voucher can be: the key's request, the SQL beyond the key's, the reading | | {least:,.0f} |",
        "",
        f"the goal (≥ {GOAL}× the key's rate) allows a voucher {allowed:,.0f} instructions ({1 / GOAL:.2f}× the key's):"
        f" {allowed - least:,.0f} left above the least for all the rest of its work,"
        f" which takes {voucher - least:,.0f} now",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inprocess", description=__doc__.split("\n")[0])
    parser.add_argument("--against", metavar="REF", help="also this commit's gate (its own venv, bench/reference.py)")
    parser.add_argument("--gate-src", type=Path, default=servers.REPO, help="this tree's server/ and gate/ from here")
    parser.add_argument("--requests", type=int, default=1500, help="measured requests per path, gate and round")
    parser.add_argument("--warmup", type=int, default=200, help="requests per path before each measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every gate once, in turn")
    parser.add_argument("--profile", action="store_true", help="one more round, under cProfile: calls per request")
    parser.add_argument(
        "--profile-out",
        type=Path,
        metavar="DIR",
        help="with --profile, write each gate's statistics to DIR/<gate>/<path>.pstats (read with pstats)",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="instructions per request instead of CPU time (valgrind); --requests is then per path and gate",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="with --instructions, this tree's floor too: each path's SQL replayed without the gate, the voucher's"
        " reading and signature alone",
    )
    args = parser.parse_args(argv)
    if args.floor and not args.instructions:
        parser.error("--floor counts instructions: give --instructions too")
    if args.instructions and shutil.which("valgrind") is None:
        print("error: --instructions needs valgrind (apt install valgrind)", file=sys.stderr)
        return 2
    builds = [Build("", args.gate_src.resolve(), sys.executable)]
    if args.against:
        from bench.reference import prepare as reference

        ref = reference(args.against, lambda msg: print(msg, file=sys.stderr, flush=True))
        builds.append(Build(f"@{ref.short}", ref.src, str(ref.python), ref.short, ref.module))
    per_round = args.warmup + args.requests
    rounds = args.rounds + (1 if args.profile else 0)
    if args.instructions:  # one channel, spent along by both runs
        per_round, rounds = 2 * (args.warmup + 1) + args.requests, 1
        if args.floor:  # and the capture's, after them
            per_round += args.warmup + args.requests
    work = Path(tempfile.mkdtemp(prefix="a2a-gate-inprocess-"))
    try:
        folder = work / "facilitator"
        folder.mkdir()
        facilitator = servers.facilitator(folder / "ledger.db", folder / "log.txt", trust_signatures=True).start()
        import multiprocessing

        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
            gates = [
                prepare(b, work / f"gate{i}", facilitator.url, rounds, per_round, pool) for i, b in enumerate(builds)
            ]
        if args.instructions:
            for gate in gates:
                per_request = instructions(gate, gate.lanes[0], args.warmup, args.requests)
                print(f"{gate.name}: " + ", ".join(f"{p} {per_request[p]:,.0f}" for p in PATHS), file=sys.stderr)
                for p in PATHS:
                    gate.figures[p].append(per_request[p])
            if args.floor:
                this = gates[0]
                spent = 2 * (args.warmup + 1) + args.requests
                (work / "floor").mkdir()
                found = floor(this, this.lanes[0], spent, args.warmup, args.requests, work / "floor")
        for r in range(0 if args.instructions else args.rounds):
            for gate in gates:
                for p, line in run_round(gate, gate.lanes[r], args.warmup, args.requests, "time").items():
                    gate.figures[p].append(line["us"])
                print(
                    f"round {r + 1}, {gate.name}: {', '.join(f'{p} {gate.figures[p][-1]:.0f} µs' for p in PATHS)}",
                    file=sys.stderr,
                )
        if args.profile:
            for gate in gates:
                stats = None
                if args.profile_out:
                    stats = args.profile_out.resolve() / (gate.build.suffix.lstrip("@") or "this-tree")
                    stats.mkdir(parents=True, exist_ok=True)
                profiled = run_round(gate, gate.lanes[-1], args.warmup, args.requests, "profile", stats)
                gate.calls = {p: line["calls"] for p, line in profiled.items()}
    finally:
        servers.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    if args.instructions:
        print(f"in process, under valgrind: instructions per request, over {args.requests} requests per path and gate")
        print("\n".join(table(gates, 1, "instructions", "{:,.0f}") + targets(gates[0], "instructions")))
        if args.floor:
            print("\n".join(floor_table(gates[0], found)))
        return 0
    print(
        f"in process: {args.requests} requests per path, gate and round after {args.warmup} of warm-up;"
        " CPU µs per request"
    )
    print("\n".join(table(gates, args.rounds, "µs", "{:.0f}") + targets(gates[0], "CPU µs")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
