"""Agents and pricing callables for the usage-ceiling tests (``tests.support.ceiling_agents:NAME``).

The long streams write what they made to the file their message names (one line per chunk made,
then ``closed`` when their generator is closed), so a test can tell where the agent was stopped.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from server.agents import AgentReply, AgentRequest, Usage

CHUNKS = 20


def made(request: AgentRequest, line: str) -> None:
    with Path(request.text).open("a") as log:
        log.write(line + "\n")


def long_stream(size: int) -> Callable[[AgentRequest], AsyncIterator[str | Usage]]:
    """An agent of twenty chunks of `size` characters, each reported as used right after it is sent."""

    async def stream(request: AgentRequest) -> AsyncIterator[str | Usage]:
        try:
            for i in range(CHUNKS):
                made(request, f"made {i}")
                yield f"{i:04d}" + "." * (size - 4)
                yield Usage({"characters": size})
                await asyncio.sleep(0)
        finally:
            made(request, "closed")

    return stream


thousands = long_stream(1000)  # five chunks price exactly a 50,000 ceiling at 10 a character
fifteen_hundreds = long_stream(1500)  # the fourth chunk would take it past 50,000


BAD = {
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "negative": -1,
    "huge": 1e308,
    "hugeint": 10**400,  # past a float's range: math.isfinite on it raises OverflowError
    "text": "12",
}


async def reports_then_misreports(request: AgentRequest) -> AsyncIterator[str | Usage]:
    """A chunk reported well, then a chunk reported with the bad value the message names (`huge`
    twice: 1e308 + 1e308 is past the float range), then a third chunk reported well."""
    bad = BAD[request.text]
    yield "first; "
    yield Usage({"characters": 7})
    yield "second; "
    yield Usage({"characters": bad})  # type: ignore[dict-item]
    if request.text == "huge":
        yield Usage({"characters": bad})  # type: ignore[dict-item]
    yield "third; "
    yield Usage({"characters": 7})


async def answers_misreported(request: AgentRequest) -> AgentReply:
    """One answer, its usage the bad value the message names."""
    return AgentReply(parts=[{"kind": "text", "text": "an answer"}], usage={"characters": BAD[request.text]})  # type: ignore[dict-item]


async def per_character_async(usage: dict[str, int | float]) -> int:
    """10 atomic units per character, from an `async def` (awaited at each delivery)."""
    await asyncio.sleep(0)
    return 10 * int(usage.get("characters", 0))


def per_character(usage: dict[str, int | float]) -> int:
    """The same price, from a plain function."""
    return 10 * int(usage.get("characters", 0))


async def ten_until_told(request: AgentRequest) -> AsyncIterator[str | Usage]:
    """Three chunks, each reported; then waits for the file its message names before seven more."""
    for i in range(10):
        if i == 3:
            while not Path(request.text).exists():
                await asyncio.sleep(0.02)
        yield f"chunk {i}; "
        yield Usage({"characters": len(f"chunk {i}; ")})


async def ends_past_the_ceiling(request: AgentRequest) -> AsyncIterator[str | Usage | AgentReply]:
    """Three chunks of 1,500 characters, each reported (45,000 at 10 a character); then a fourth,
    whose usage comes only with the final reply (6,000 characters: 60,000, past a 50,000 ceiling)."""
    for i in range(3):
        yield f"{i:04d}" + "." * 1496
        yield Usage({"characters": 1500})
    yield "0003" + "." * 1496
    yield AgentReply(usage={"characters": 6000})
