"""Where a server's CPU goes, per request (`python -m bench --profile`).

py-spy samples the server process over the measured window (every thread, idle ones left out),
and each sample goes to one bucket: the innermost frame that one of `BUCKETS` names. A bucket's
share of the samples times the row's server CPU per request is what that part of the work costs
one request. The raw stacks stay beside the server's log (`profile-<row>.txt`) for a flame graph.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

SAMPLES_PER_SECOND = 250

# (bucket, what a frame "function (file:line)" matches), the most specific first: a sample is
# the innermost frame's that matches any of them
BUCKETS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("SQLite WAL checkpoints (their thread)", re.compile(r"^Checkpointer\.")),
    ("SQLite statements", re.compile(r"sqlite_store\.py|sqlite3/")),
    ("PostgreSQL driver (psycopg)", re.compile(r"psycopg")),
    ("signature recovery (secp256k1, keccak)", re.compile(r"coincurve/|Crypto/Hash/|sha3|\bkeccak\b|\brecover\b")),
    ("sealing (AES-GCM)", re.compile(r"[/(]gate/sealing\.py|cryptography/|Crypto/Cipher/")),
    ("JSON", re.compile(r"[/(]json/|orjson|json_text\.py")),
    ("outbound HTTP (httpx, facilitator)", re.compile(r"httpx/|httpcore/|aiohttp/")),
    ("HTTP and ASGI (uvicorn, starlette)", re.compile(r"uvicorn/|starlette/|httptools|h11/")),
    ("the gate's steps (gate/)", re.compile(r"[/(]gate/[\w/]+\.py")),
    ("the server (server/)", re.compile(r"[/(]server/[\w/]+\.py")),
    ("event loop (asyncio, uvloop)", re.compile(r"asyncio/|uvloop")),
)
OTHER = "other"
PROCESS = re.compile(r"process \d+:")


def bucket_of(frames: list[str]) -> tuple[str, str]:
    """The bucket of one sample (its frames root first), and the frame that put it there."""
    for frame in reversed(frames):
        if PROCESS.match(frame):  # py-spy's root frame for each process it follows (its command line)
            continue
        for name, pattern in BUCKETS:
            if pattern.search(frame):
                return name, short(frame)
    return OTHER, short(frames[-1]) if frames else ""


def short(frame: str) -> str:
    """ "fn (/long/path/site-packages/pkg/mod.py:12)" as "fn (pkg/mod.py)": a function's lines
    counted together; the project's own files named from their package (gate/..., server/...)."""
    frame = re.sub(r":\d+\)$", ")", frame)
    return re.sub(r"\((?:/.*/site-packages/|/.*?/(?=(?:gate|server|devnet)/)|/.*/(?=[^/]+/[^/]+\.py))", "(", frame)


@dataclass(frozen=True)
class Breakdown:
    """Samples per (bucket, frame that put them there)."""

    frames: Counter[tuple[str, str]]

    @property
    def samples(self) -> Counter[str]:
        """Samples per bucket."""
        per_bucket: Counter[str] = Counter()
        for (name, _), n in self.frames.items():
            per_bucket[name] += n
        return per_bucket

    @property
    def total(self) -> int:
        return sum(self.frames.values())

    def per_request(self, cpu_ms_per_request: float) -> list[tuple[str, float, float]]:
        """(bucket, share of the samples, ms of CPU per request), largest first."""
        total = self.total or 1
        return [(name, n / total, n / total * cpu_ms_per_request) for name, n in self.samples.most_common()]

    def hottest(self, bucket: str, count: int = 3) -> list[tuple[str, float]]:
        """The frames that put the most samples in `bucket`, with their share of all samples."""
        total = self.total or 1
        inside = Counter({frame: n for (name, frame), n in self.frames.items() if name == bucket})
        return [(frame, n / total) for frame, n in inside.most_common(count)]

    @classmethod
    def of(cls, raw: str) -> Breakdown:
        """From py-spy's raw format: one line per distinct stack, "frame;frame;... count"."""
        frames: Counter[tuple[str, str]] = Counter()
        for line in raw.splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                frames[bucket_of(stack.split(";"))] += int(count)
        return cls(frames)


def py_spy() -> str:
    """The py-spy executable: beside this interpreter (a venv's bin/), or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("--profile samples with py-spy: pip install -e '.[bench]' -e ./devnet")
    return found


class Sampler:
    """A probe for `Bench.measure`: py-spy on `pid` from the window's start to its end."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid, self.out = pid, out
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [py_spy(), "record", "--pid", str(self.pid), "--subprocesses", "--rate", str(SAMPLES_PER_SECOND)]
        command += ["--format", "raw", "--output", str(self.out), "--nonblocking"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)  # py-spy writes what it sampled, then exits
        try:
            _, err = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, err = self.process.communicate()
        if not self.out.exists():
            raise RuntimeError(f"py-spy sampled nothing from pid {self.pid}: {err.decode(errors='replace')[-500:]}")

    def breakdown(self) -> Breakdown:
        return Breakdown.of(self.out.read_text() if self.out.exists() else "")
