"""A small closed-loop HTTP/1.1 load generator, run in its own process.

N workers each hold one keep-alive connection to 127.0.0.1 and send the next request
as soon as the previous answer is read (closed loop). Requests are pre-built bytes
written straight to an asyncio stream, and answers are framed by Content-Length (or
chunked), so the client spends as little CPU per request as Python allows.

The run has a warm-up, then a measured window. Only answers that complete inside the
window count toward req/s and latency. The client's own CPU use over the window is
reported, so a saturated client (at or near one full core) is visible in the results.

Where requests come from (`Source`):
- `cycle`: a list of requests reused round-robin (the same call, many times);
- `once`: a list of requests each sent exactly once (paid calls: one token each); the
  window ends early when the list runs out;
- `xff`: one request per distinct client address in `X-Forwarded-For`, generated on
  the fly, `count` of them (no warm-up: every address is new);
- `lanes`: one list of requests per worker, each sent once and in order (a payment channel's
  vouchers: each is for the total its predecessor left charged).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from dataclasses import dataclass, field
from typing import Any

HOST = "127.0.0.1"  # the only host this generator ever talks to


def build_request(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """One complete HTTP/1.1 POST, ready to write to a socket."""
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {HOST}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def xff_address(i: int) -> str:
    """The i-th distinct client address (up to 16.7 million): 10.x.y.z."""
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


@dataclass
class Source:
    kind: str  # cycle | once | xff
    requests: list[bytes] = field(default_factory=list)
    head: bytes = b""  # xff: request up to the header value
    tail: bytes = b""  # xff: the rest (end of headers and body)
    count: int = 0  # xff: how many addresses
    position: int = 0
    lanes: list[list[bytes]] = field(default_factory=list)  # lanes: worker i sends lanes[i], in order
    lane_positions: dict[int, int] = field(default_factory=dict)

    def next(self, worker: int = 0) -> bytes | None:
        if self.kind == "lanes":
            lane = self.lanes[worker % len(self.lanes)]
            j = self.lane_positions.get(worker, 0)
            self.lane_positions[worker] = j + 1
            return lane[j] if j < len(lane) and worker < len(self.lanes) else None
        i = self.position
        self.position += 1
        if self.kind == "cycle":
            return self.requests[i % len(self.requests)]
        if self.kind == "once":
            return self.requests[i] if i < len(self.requests) else None
        if self.kind == "xff":
            return self.head + xff_address(i).encode() + self.tail if i < self.count else None
        raise ValueError(self.kind)


@dataclass
class Spec:
    port: int
    source: Source
    concurrency: int = 32
    duration: float = 5.0  # measured window (an upper bound for `once` and `xff`)
    warmup: float = 1.0  # seconds of warm-up before the window
    warmup_requests: int | None = None  # or end the warm-up after this many answers
    expect_status: int = 200
    expect_marker: bytes = b""  # an answer counts as ok only if its body or (lower-case) head holds this


@dataclass
class Result:
    requests: int  # answers completed inside the window
    seconds: float  # length of the window
    rps: float
    p50_ms: float
    p99_ms: float
    ok: int  # of `requests`, answers with the expected status (and marker)
    statuses: dict[int, int]
    errors: int  # connection failures, over the whole run
    client_cpu: float  # client CPU seconds / window seconds (1.0 = one full core)
    exhausted: bool  # a `once`/`xff` source ran out before the window's time was up
    sample: str  # one unexpected answer, for diagnosis

    @property
    def ok_fraction(self) -> float:
        return self.ok / self.requests if self.requests else 0.0


class HttpError(Exception):
    pass


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes]:
    """(status, lower-cased head, body) of one answer."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    at = lower.find(b"\r\ncontent-length:")
    if at >= 0:
        end = lower.index(b"\r\n", at + 2)
        return status, lower, await reader.readexactly(int(lower[at + 17 : end]))
    if b"\r\ntransfer-encoding: chunked" in lower:
        chunks = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return status, lower, b"".join(chunks)
            chunks.append(chunk[:-2])
    if status in (204, 304) or 100 <= status < 200:
        return status, lower, b""
    raise HttpError("answer without Content-Length")


class Run:
    """The state shared by the workers of one load run."""

    def __init__(self, spec: Spec, notify: Any) -> None:
        self.spec = spec
        self.notify = notify  # callable(message) toward the parent process
        self.measuring = False
        self.stopping = False
        self.t0 = 0.0
        self.t1 = 0.0
        self.latencies: list[float] = []
        self.ok = 0
        self.statuses: dict[int, int] = {}
        self.errors = 0
        self.warm_answers = 0
        self.last_done = 0.0
        self.sample = ""
        self.warm = asyncio.Event()

    def record(self, start: float, end: float, status: int, head: bytes, body: bytes) -> None:
        if not self.measuring:
            self.warm_answers += 1
            if self.spec.warmup_requests is not None and self.warm_answers >= self.spec.warmup_requests:
                self.warm.set()
            return
        if self.stopping and end > self.t1:
            return
        self.latencies.append(end - start)
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.last_done = end
        marker = self.spec.expect_marker
        if status == self.spec.expect_status and (marker in body or marker in head):
            self.ok += 1
        elif not self.sample:
            self.sample = f"{status} {body[:300]!r}"

    async def worker(self, index: int = 0) -> None:
        source = self.spec.source
        writer = None
        try:
            while not self.stopping:
                request = source.next(index)
                if request is None:
                    return
                for _attempt in range(3):
                    try:
                        if writer is None:
                            reader, writer = await asyncio.open_connection(HOST, self.spec.port)
                        start = time.perf_counter()
                        writer.write(request)
                        status, head, body = await read_response(reader)
                        self.record(start, time.perf_counter(), status, head, body)
                        break
                    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, HttpError, ValueError):
                        self.errors += 1
                        if writer is not None:
                            writer.close()
                        writer = None
                        await asyncio.sleep(0.01)
        finally:
            if writer is not None:
                writer.close()

    async def main(self) -> Result:
        spec = self.spec
        workers = [asyncio.create_task(self.worker(i)) for i in range(spec.concurrency)]
        all_done = asyncio.gather(*workers)
        # warm-up: seconds, or a number of answers, whichever comes first
        if spec.warmup > 0:
            warm = asyncio.ensure_future(self.warm.wait())
            await asyncio.wait([warm, all_done], timeout=spec.warmup, return_when=asyncio.FIRST_COMPLETED)
            warm.cancel()
        cpu0 = time.process_time()
        self.t0 = time.perf_counter()
        self.measuring = True
        self.notify(("window_start",))
        done, _ = await asyncio.wait([all_done], timeout=spec.duration)
        exhausted = bool(done)
        self.t1 = time.perf_counter() if not exhausted else max(self.last_done, self.t0 + 1e-6)
        cpu1 = time.process_time()
        self.stopping = True
        self.notify(("window_end",))
        # let in-flight requests finish (bounded), then drop the rest
        await asyncio.wait([all_done], timeout=10.0)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        seconds = self.t1 - self.t0
        lat = sorted(self.latencies)
        return Result(
            requests=len(lat),
            seconds=seconds,
            rps=len(lat) / seconds if seconds > 0 else 0.0,
            p50_ms=_percentile(lat, 0.50) * 1000,
            p99_ms=_percentile(lat, 0.99) * 1000,
            ok=self.ok,
            statuses=self.statuses,
            errors=self.errors,
            client_cpu=(cpu1 - cpu0) / seconds if seconds > 0 else 0.0,
            exhausted=exhausted,
            sample=self.sample,
        )


def _percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _child(conn: Any) -> None:
    try:
        spec = conn.recv()
        result = asyncio.run(Run(spec, conn.send).main())
        conn.send(("result", result))
    except BaseException as exc:  # noqa: BLE001 -- report anything, never leave the parent waiting
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def run_load(
    spec: Spec, on_window_start: Any = None, on_window_end: Any = None, timeout: float | None = None
) -> Result:
    """Run `spec` in a separate process; the callbacks run here as the window opens and closes
    (the caller samples the server's CPU time there)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_child, args=(child,), daemon=True)
    process.start()
    child.close()
    # the spec (maybe megabytes of pre-built requests) goes over the pipe, not in the
    # spawn arguments: those are written before the child reads anything
    parent.send(spec)
    limit = timeout if timeout is not None else spec.warmup + spec.duration + 60.0
    deadline = time.monotonic() + limit
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not parent.poll(left):
                raise TimeoutError(f"load generator gave no answer within {limit:.0f}s")
            message = parent.recv()
            if message[0] == "window_start" and on_window_start:
                on_window_start()
            elif message[0] == "window_end" and on_window_end:
                on_window_end()
            elif message[0] == "result":
                return message[1]
            elif message[0] == "error":
                raise RuntimeError(f"load generator failed: {message[1]}")
    except EOFError:
        raise RuntimeError(f"load generator died (exit code {process.exitcode})") from None
    finally:
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()
        parent.close()
