"""Agents for tests, loaded by the `python` backend (``tests.support.agents:NAME``)."""

from __future__ import annotations

import asyncio

from server.agents import AgentReply, AgentRequest


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
