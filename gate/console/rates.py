"""Request rates for the console: answers per second over the last minute, by outcome.

Read from the counter /metrics serves (`a2a_gate_requests_total`), sampled when the console asks and
never on a request's path: the rate is the counter's growth since the oldest sample of the window
(the first one is taken at start). With `--workers N` each worker counts its own requests, so a
console reached through one worker shows that worker's rates.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

COUNTER = "a2a_gate_requests"  # the server's request counter (server/metrics.py)
WINDOW_SECONDS = 60.0
MAX_SAMPLES = 240  # bounded whatever the console's polling


class RequestRates:
    def __init__(
        self, registry: CollectorRegistry, window: float = WINDOW_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.registry, self.window, self.clock = registry, window, clock
        self.samples: deque[tuple[float, Counter[str]]] = deque(maxlen=MAX_SAMPLES)
        self.samples.append((clock(), self.totals()))

    def totals(self) -> Counter[str]:
        """Answers so far by outcome, and per caller kind (`caller:anonymous`, `caller:key`)."""
        totals: Counter[str] = Counter()
        for metric in self.registry.collect():
            if metric.name != COUNTER:
                continue
            for sample in metric.samples:
                if sample.name == COUNTER + "_total":
                    totals[sample.labels["outcome"]] += int(sample.value)
                    totals["caller:" + sample.labels["caller"]] += int(sample.value)
        return totals

    def read(self) -> dict[str, Any]:
        now, totals = self.clock(), self.totals()
        while len(self.samples) > 1 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()
        since, base = self.samples[0]
        self.samples.append((now, totals))
        span = now - since
        per_second = {name: round((n - base[name]) / span, 3) for name, n in sorted(totals.items())} if span > 0 else {}
        return {"window_seconds": round(span, 1), "per_second": per_second, "totals": dict(sorted(totals.items()))}
