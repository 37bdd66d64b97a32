"""The x402 `bazaar` discovery extension a priced agent's 402 declares.

A facilitator that catalogs resources reads it from the payment payload (the paying client
copies the 402's `extensions` into it) once a payment settles, and lists the agent with it:
how to call the door (an A2A JSON-RPC `message/send`, POSTed as JSON) and what comes back,
described from the agent's card and skills. The shape is the one the x402 package's
`declare_discovery_extension` (a JSON body) and its resource-server step (the HTTP method)
make; the gate does not import the package, and tests hold the two equal and valid against
the package's own validation.
"""

from __future__ import annotations

from typing import Any

from server.config import AgentConfig

BAZAAR = "bazaar"

# the JSON-RPC call a priced agent answers: both A2A dialects' send, the message holding parts
# (kept short: the 402's PAYMENT-REQUIRED header carries it)
INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "method": {"enum": ["message/send", "message/stream", "SendMessage", "SendStreamingMessage"]},
        "params": {"type": "object", "required": ["message"]},
    },
    "required": ["jsonrpc", "id", "method", "params"],
}


def description(agent: AgentConfig) -> str:
    """What the agent does, as its card says it: its description, then each skill's."""
    said = agent.description or agent.name
    skills = [f"{s.name}: {s.description or s.name}" for s in agent.skills]
    return f"{said} Skills: {'; '.join(skills)}." if skills else said


def extension(agent: AgentConfig) -> dict[str, Any]:
    """`{"bazaar": ...}` for the 402's `extensions`: the call's shape and the answer's, POST."""
    examples = [e for s in agent.skills for e in s.examples]
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "role": "user",
                "messageId": "1",
                "parts": [{"kind": "text", "text": examples[0] if examples else "Hello"}],
            }
        },
    }
    answer = {"jsonrpc": "2.0", "id": 1, "result": {"kind": "task", "status": {"state": "completed"}}}
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "input": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "const": "http"},
                    "method": {"type": "string", "enum": ["POST", "PUT", "PATCH"]},
                    "bodyType": {"type": "string", "enum": ["json", "form-data", "text"]},
                    "body": INPUT_SCHEMA,
                },
                "required": ["type", "method", "bodyType", "body"],
                "additionalProperties": False,
            },
            "output": {
                "type": "object",
                "properties": {
                    "type": {"type": "string"},
                    "example": {"type": "object", "description": description(agent)},
                },
                "required": ["type"],
            },
        },
        "required": ["input"],
    }
    info = {
        "input": {"type": "http", "bodyType": "json", "body": call, "method": "POST"},
        "output": {"type": "json", "example": answer},
    }
    return {BAZAAR: {"info": info, "schema": schema}}
