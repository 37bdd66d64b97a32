"""Agent cards: how a client discovers an agent, its skills and its price.

One card serves both dialects: `supportedInterfaces` for A2A v1.0 clients and the
v0.3 `url` / `preferredTransport` / `protocolVersion` fields for older ones. URLs come
from the configured public base URL, never from the request's Host header.

Every card declares its authentication, an operator-issued API key sent as a bearer
token, in both shapes (v0.3 `securitySchemes` + `security`, v1.0 `securitySchemes` +
`securityRequirements`), so client interceptors know to attach the key. The extensions
an agent supports are given by whoever builds on the server (the payment gate).
"""

from __future__ import annotations

from typing import Any

from server.config import AgentConfig

VERSION = "0.1.0"
SECURITY_SCHEME = "apiKey"
BEARER_DESCRIPTION = "An operator-issued API key, sent as `Authorization: Bearer <key>`."


def agent_url(public_url: str, agent: str) -> str:
    return f"{public_url}/a2a/{agent}"


def security(anonymous_allowed: bool) -> dict[str, Any]:
    """The bearer key in both card shapes; an anonymous caller (one who pays) is an empty alternative."""
    scheme = {
        "type": "http",
        "scheme": "bearer",
        "description": BEARER_DESCRIPTION,  # v0.3 (OpenAPI)
        "httpAuthSecurityScheme": {"scheme": "Bearer", "description": BEARER_DESCRIPTION},  # v1.0
    }
    v03: list[dict[str, Any]] = [{SECURITY_SCHEME: []}]
    v10: list[dict[str, Any]] = [{"schemes": {SECURITY_SCHEME: {"list": []}}}]
    if anonymous_allowed:
        v03.append({})
        v10.append({})
    return {"securitySchemes": {SECURITY_SCHEME: scheme}, "security": v03, "securityRequirements": v10}


def agent_card(agent: AgentConfig, public_url: str, extensions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    url = agent_url(public_url, agent.name)
    capabilities: dict[str, Any] = {
        "streaming": agent.streaming,
        "pushNotifications": False,
    }
    if extensions:
        capabilities["extensions"] = extensions
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
        **security(anonymous_allowed=bool(extensions)),  # the anonymous path declares how it serves
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


INDEX_PATHS = ("/", "/a2a", "/a2a/")


def card_url(public_url: str, agent: str) -> str:
    return f"{agent_url(public_url, agent)}/.well-known/agent-card.json"


def index_entry(card: dict[str, Any], public_url: str) -> dict[str, Any]:
    """One agent in the index: where its card and endpoint are, what it does, and the extensions its
    card declares, those with the same parameters given once with all their URIs (the gate declares
    one payment extension under each URI a client may know it by)."""
    grouped: dict[str, dict[str, Any]] = {}
    for extension in card["capabilities"].get("extensions", []):
        key = repr((extension.get("required", False), extension.get("params")))
        entry = grouped.setdefault(
            key, {"uris": [], "required": extension.get("required", False), "params": extension.get("params")}
        )
        entry["uris"].append(extension["uri"])
    return {
        "name": card["name"],
        "description": card["description"],
        "url": card["url"],
        "card": card_url(public_url, card["name"]),
        "streaming": card["capabilities"]["streaming"],
        "skills": [{"id": s["id"], "name": s["name"]} for s in card["skills"]],
        "extensions": list(grouped.values()),
    }
