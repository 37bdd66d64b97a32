"""Agents for tests, loaded by the `python` backend (``tests.support.agents:NAME``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from server.agents import AgentReply, AgentRequest, AgentStatus, Usage


async def slow(request: AgentRequest) -> str:
    """Takes a while, so a test can poll or cancel it: 'sleep 2' sleeps 2 seconds."""
    seconds = float(request.text.split()[-1]) if request.text.startswith("sleep") else 1.0
    await asyncio.sleep(seconds)
    return f"slept {seconds:g}"


async def ask_then_answer(request: AgentRequest) -> AgentReply:
    """Interrupts for more input on the first turn, answers on the second."""
    if len([m for m in request.history if m.get("role") == "user"]) < 2:
        return AgentReply(state="input-required", text="Which city?")
    return AgentReply(parts=[{"kind": "text", "text": f"weather in {request.text}: sunny"}])


async def broken(request: AgentRequest) -> str:
    raise RuntimeError("agent bug")


async def metadata_keys(request: AgentRequest) -> str:
    """Says which metadata keys it was shown, on the message and on the history."""
    seen = {key for message in [request.message, *request.history] for key in message.get("metadata") or {}}
    return " ".join(sorted(seen)) or "none"


async def ask_then_work(request: AgentRequest) -> AgentReply | str:
    """Interrupts for more input on the first turn; on the second it works as `slow` does ('sleep 1.5')."""
    if len([m for m in request.history if m.get("role") == "user"]) < 2:
        return AgentReply(state="input-required", text="What should I do?")
    return await slow(request)


async def writes_when_told(request: AgentRequest) -> AsyncIterator[str | AgentStatus]:
    """Streams 'first ', then waits for the file its message names to exist, then 'second'."""
    yield AgentStatus("working", "started")
    yield "first "
    signal = Path(request.text)
    while not signal.exists():
        await asyncio.sleep(0.02)
    yield "second"


async def slow_writer(request: AgentRequest) -> AsyncIterator[str | AgentStatus]:
    """Streams its answer with a pause between the chunks: 'sleep 1.5' pauses 1.5 seconds."""
    seconds = float(request.text.split()[-1]) if request.text.startswith("sleep") else 1.0
    yield AgentStatus("working", "drafting ALPHA")
    yield "ALPHA "
    await asyncio.sleep(seconds)
    yield "OMEGA"


async def streams_then_raises(request: AgentRequest) -> AsyncIterator[str]:
    """Streams part of an answer, then fails: nothing it sent was delivered."""
    yield "half an "
    raise RuntimeError("streaming agent bug")


async def streams_then_asks(request: AgentRequest) -> AsyncIterator[str | AgentStatus | AgentReply]:
    """Streams, then pauses to ask on the first turn; answers with an AgentReply on the next."""
    if len([m for m in request.history if m.get("role") == "user"]) < 2:
        yield "looking up "
        yield AgentStatus("input-required", "Which city?")
        return
    yield "forecast for "
    yield AgentReply(parts=[{"kind": "text", "text": f"{request.text}: sunny"}])


async def metered_chunks(request: AgentRequest) -> AsyncIterator[str | Usage]:
    """Five chunks, each reported as used (`chunks`, `characters`) as it is sent."""
    for i in range(5):
        chunk = f"chunk {i} of {request.text}; "
        yield chunk
        yield Usage({"chunks": 1, "characters": len(chunk)})


async def metered_cut(request: AgentRequest) -> AsyncIterator[str | Usage]:
    """Would send five chunks; its stream is cut after two (it raises): those two were delivered."""
    for i in range(5):
        if i == 2:
            raise ConnectionError("the model's stream was cut")
        chunk = f"chunk {i}; "
        yield chunk
        yield Usage({"chunks": 1, "characters": len(chunk)})


async def metered_until_told(request: AgentRequest) -> AsyncIterator[str | Usage]:
    """Two chunks, each reported; then waits for the file its message names before three more."""
    for i in range(5):
        if i == 2:
            signal = Path(request.text)
            while not signal.exists():
                await asyncio.sleep(0.02)
        chunk = f"chunk {i}; "
        yield chunk
        yield Usage({"chunks": 1, "characters": len(chunk)})


async def metered_asks(request: AgentRequest) -> AsyncIterator[str | Usage | AgentStatus]:
    """Streams a chunk and reports it, then pauses to ask; on the next turn streams and reports one more."""
    first = len([m for m in request.history if m.get("role") == "user"]) < 2
    chunk = "looking up " if first else f"forecast for {request.text}: sunny"
    yield chunk
    yield Usage({"characters": len(chunk)})
    if first:
        yield AgentStatus("input-required", "Which city?")
