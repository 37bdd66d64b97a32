"""Settlement ground truth: ask the chain whether an EIP-3009 authorization was used.

When the facilitator cannot tell us (timeouts, an outage, "nonce already used" after
an attempt whose answer we never heard), the token contract can: its
`authorizationState(authorizer, nonce)` says whether the authorization was spent, and
its `AuthorizationUsed(authorizer, nonce)` event names the transaction that spent it.
Both are read over plain Ethereum JSON-RPC (`eth_call`, `eth_getLogs`) from the
endpoint configured for the payment's network.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

import httpx

from server.config import NetworkConfig

# The ABI needs no library for two fixed shapes (the production install carries none):
# keccak("authorizationState(address,bytes32)")[:4] and keccak("AuthorizationUsed(address,bytes32)").
AUTHORIZATION_STATE = "0xe94a0102"
AUTHORIZATION_USED_TOPIC = "0x98de503528ee59b575ef0c0a2576a82497bfc029a5685b209e9ec333479b10a5"
ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
WORD = re.compile(r"^0x[0-9a-fA-F]{64}$")


def address_word(address: str) -> str:
    """An address as one 32-byte ABI word (also its indexed-topic form), without 0x."""
    return "00" * 12 + address.lower().removeprefix("0x")


class ChainUnavailable(Exception):
    """The chain could not be asked (no endpoint, transport, malformed answer)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class AuthorizationFacts:
    used: bool
    transaction: str = ""  # the transaction that used it, when its log was found


@dataclass(frozen=True)
class Authorization:
    """The EIP-3009 authorization a payment carries, as the chain knows it."""

    network: str
    asset: str  # 0x address, lowercase
    authorizer: str  # 0x address, lowercase
    nonce: str  # 0x + 64 hex digits, lowercase
    valid_before: int

    @classmethod
    def of(cls, payload: dict[str, Any], requirements: dict[str, Any], network: str) -> Authorization | None:
        """The authorization of an EIP-3009 payload; None for any other shape."""
        inner = payload.get("payload")
        auth = inner.get("authorization") if isinstance(inner, dict) else None
        if not isinstance(auth, dict):
            return None
        asset, authorizer, nonce = requirements.get("asset"), auth.get("from"), auth.get("nonce")
        if not (isinstance(asset, str) and isinstance(authorizer, str) and isinstance(nonce, str)):
            return None
        if not (ADDRESS.match(asset) and ADDRESS.match(authorizer) and WORD.match(nonce)):
            return None
        try:
            valid_before = int(auth["validBefore"])
        except (KeyError, ValueError, TypeError):
            return None
        return cls(
            network=network,
            asset=asset.lower(),
            authorizer=authorizer.lower(),
            nonce=nonce.lower(),
            valid_before=valid_before,
        )


class Chain:
    """JSON-RPC clients for the networks that have an `rpc_url`."""

    def __init__(self, networks: dict[str, NetworkConfig]) -> None:
        self.networks = {name: config for name, config in networks.items() if config.rpc_url}
        self.clients: dict[str, httpx.AsyncClient] = {}
        self.ids = itertools.count(1)

    def knows(self, network: str) -> bool:
        return network in self.networks

    async def facts(self, authorization: Authorization) -> AuthorizationFacts:
        used = await self._authorization_state(authorization)
        if not used:
            return AuthorizationFacts(used=False)
        try:  # the state is the ground truth; the log only names the transaction (providers cap log ranges)
            transaction = await self._used_in(authorization)
        except ChainUnavailable:
            transaction = ""
        return AuthorizationFacts(used=True, transaction=transaction)

    async def _authorization_state(self, a: Authorization) -> bool:
        data = AUTHORIZATION_STATE + address_word(a.authorizer) + a.nonce.removeprefix("0x")
        result = await self._rpc(a.network, "eth_call", [{"to": a.asset, "data": data}, "latest"])
        if not isinstance(result, str) or not WORD.match(result):
            raise ChainUnavailable("malformed_eth_call_answer")
        return int(result, 16) != 0

    async def _used_in(self, a: Authorization) -> str:
        topics = [AUTHORIZATION_USED_TOPIC, "0x" + address_word(a.authorizer), a.nonce]
        logs = await self._rpc(
            a.network,
            "eth_getLogs",
            [{"address": a.asset, "fromBlock": "earliest", "toBlock": "latest", "topics": topics}],
        )
        if not isinstance(logs, list):
            raise ChainUnavailable("malformed_eth_getLogs_answer")
        for log in logs:
            if isinstance(log, dict) and isinstance(log.get("transactionHash"), str):
                return log["transactionHash"][:130]
        return ""

    async def _rpc(self, network: str, method: str, params: list[Any]) -> Any:
        config = self.networks.get(network)
        if config is None:
            raise ChainUnavailable("no_rpc_url")
        client = self.clients.get(network)
        if client is None:
            client = self.clients[network] = httpx.AsyncClient(timeout=config.timeout_seconds)
        body = {"jsonrpc": "2.0", "id": next(self.ids), "method": method, "params": params}
        try:
            response = await client.post(config.rpc_url, json=body)
            doc = response.json()
        except httpx.TimeoutException:
            raise ChainUnavailable("timeout") from None
        except (httpx.HTTPError, ValueError) as exc:
            raise ChainUnavailable(type(exc).__name__) from None
        if response.status_code != 200 or not isinstance(doc, dict) or "result" not in doc:
            raise ChainUnavailable(f"rpc_error_http_{response.status_code}")
        return doc["result"]

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()
