"""Agent cards: how a client discovers an agent, its skills and its price.

One card serves both dialects: `supportedInterfaces` for A2A v1.0 clients and the
v0.3 `url` / `preferredTransport` / `protocolVersion` fields for older ones. URLs come
from the configured public base URL, never from the request's Host header.
"""

from __future__ import annotations

from typing import Any

from server.config import AgentConfig, Price

X402_EXTENSION_URI = "https://github.com/google-agentic-commerce/a2a-x402/blob/main/spec/v0.2"
X402_EXTENSION_URI_V01 = "https://github.com/google-a2a/a2a-x402/v0.1"
X402_EXTENSIONS = (X402_EXTENSION_URI, X402_EXTENSION_URI_V01)
VERSION = "0.1.0"


def agent_url(public_url: str, agent: str) -> str:
    return f"{public_url}/a2a/{agent}"


def requirement(price: Price, resource: str) -> dict[str, Any]:
    """The x402 v2 PaymentRequirements an agent advertises."""
    return {
        "scheme": price.scheme,
        "network": price.network,
        "asset": price.asset,
        "amount": price.amount,
        "payTo": price.pay_to,
        "maxTimeoutSeconds": price.max_timeout_seconds,
        "extra": dict(price.extra),
    }


def agent_card(agent: AgentConfig, public_url: str) -> dict[str, Any]:
    url = agent_url(public_url, agent.name)
    capabilities: dict[str, Any] = {
        "streaming": agent.streaming,
        "pushNotifications": False,
    }
    if agent.price is not None:
        capabilities["extensions"] = [
            {
                "uri": X402_EXTENSION_URI,
                "description": "Pay per request with x402; without a payment the agent answers HTTP 402.",
                "required": False,
                "params": {"x402Version": 2, "accepts": [requirement(agent.price, url)]},
            }
        ]
    return {
        "name": agent.name,
        "description": agent.description or agent.name,
        "version": VERSION,
        "url": url,
        "preferredTransport": "JSONRPC",
        "protocolVersion": "0.3.0",
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        ],
        "capabilities": capabilities,
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": [
            {
                "id": s.id,
                "name": s.name,
                "description": s.description or s.name,
                "tags": list(s.tags),
                "examples": list(s.examples),
            }
            for s in agent.skills
        ],
    }
