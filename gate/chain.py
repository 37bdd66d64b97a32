"""Settlement ground truth: ask the chain whether an EIP-3009 authorization PAID us.

(Which payload carries such an authorization is its scheme's to say: `Scheme.authorization`.)

When the facilitator cannot tell us (timeouts, an outage, "nonce already used" after
an attempt whose answer we never heard), the token contract can. A spent nonce is not
yet a payment: `authorizationState(authorizer, nonce)` is also set by the payer's own
`cancelAuthorization`, or by another `transferWithAuthorization` with the same nonce (to
anyone, for any amount). So the evidence is a transfer: the `AuthorizationUsed(authorizer,
nonce)` event names the transaction that spent the nonce, and that transaction's receipt
must carry the token's `Transfer(payer, payTo, value)` with at least the price. A nonce
spent by `AuthorizationCanceled`, or by a transaction without that transfer, is a payment
that will never come. Everything is read over plain Ethereum JSON-RPC (`eth_call`,
`eth_getLogs`, `eth_getTransactionReceipt`) from the endpoint configured for the network.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import httpx

from gate.config import NetworkConfig
from gate.schemes.base import CHAIN_ADDRESS as ADDRESS
from gate.schemes.base import WORD, Authorization

# The ABI needs no library for a few fixed shapes (the production install carries none):
# keccak("authorizationState(address,bytes32)")[:4], and the keccak of the three event signatures.
AUTHORIZATION_STATE = "0xe94a0102"
AUTHORIZATION_USED_TOPIC = "0x98de503528ee59b575ef0c0a2576a82497bfc029a5685b209e9ec333479b10a5"
AUTHORIZATION_CANCELED_TOPIC = "0x1cdd46ff242716cdaa72d159d339a485b3438398348d68f09d7c8c0a59353d81"
TRANSFER_TOPIC = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
# The settlement contract of payment channels (batch-settlement): keccak("channels(bytes32)")[:4],
# keccak("pendingWithdrawals(bytes32)")[:4].
CHANNELS = "0x7a7ebd7b"
PENDING_WITHDRAWALS = "0xb7f06ebe"


def address_word(address: str) -> str:
    """An address as one 32-byte ABI word (also its indexed-topic form), without 0x."""
    return "00" * 12 + address.lower().removeprefix("0x")


def topics_of(log: dict[str, Any]) -> list[str]:
    topics = log.get("topics")
    return [str(t).lower() for t in topics] if isinstance(topics, list) else []


class ChainUnavailable(Exception):
    """The chain could not be asked (no endpoint, transport, malformed answer)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class AuthorizationFacts:
    used: bool  # the nonce is spent: by a payment to us, a cancel, or another transfer
    paid: bool = False  # the transaction that spent it moved at least the price from the payer to payTo
    transaction: str = ""  # the transaction that spent it, when one did
    detail: str = ""  # why a spent nonce is not a payment


class Chain:
    """JSON-RPC clients for the networks that have an `rpc_url`."""

    def __init__(self, networks: dict[str, NetworkConfig]) -> None:
        self.networks = {name: config for name, config in networks.items() if config.rpc_url}
        self.clients: dict[str, httpx.AsyncClient] = {}
        self.ids = itertools.count(1)

    def knows(self, network: str) -> bool:
        return network in self.networks

    async def facts(self, authorization: Authorization, pay_to: str, amount: int) -> AuthorizationFacts:
        """What the chain says of `authorization` as a payment of `amount` to `pay_to`.

        Raises `ChainUnavailable` when it cannot say (no endpoint, an outage, a spent nonce
        whose spending transaction cannot be found): that is never read as paid or unpaid."""
        if not ADDRESS.match(pay_to):
            raise ChainUnavailable("pay_to_not_an_address")
        if not await self._authorization_state(authorization):
            return AuthorizationFacts(used=False)
        transaction = await self._spent_in(authorization, AUTHORIZATION_USED_TOPIC)
        if not transaction:
            if await self._spent_in(authorization, AUTHORIZATION_CANCELED_TOPIC):
                return AuthorizationFacts(used=True, detail="authorization canceled by the payer")
            raise ChainUnavailable("nonce_spent_but_no_log_found")
        moved = await self._transferred(authorization, transaction, pay_to)
        if moved >= amount > 0:
            return AuthorizationFacts(used=True, paid=True, transaction=transaction)
        return AuthorizationFacts(
            used=True,
            transaction=transaction,
            detail=f"nonce spent by a transaction moving {moved} (of {amount}) to payTo: front-run or spent elsewhere",
        )

    async def channel(self, network: str, contract: str, channel_id: str) -> tuple[int, int, int]:
        """A payment channel as its settlement contract holds it: (balance, total claimed, the time a
        withdrawal was requested, 0 for none)."""
        state = await self._words(network, contract, CHANNELS + channel_id.removeprefix("0x"), 2)
        pending = await self._words(network, contract, PENDING_WITHDRAWALS + channel_id.removeprefix("0x"), 2)
        return state[0], state[1], pending[1]

    async def _words(self, network: str, contract: str, data: str, count: int) -> list[int]:
        result = await self._rpc(network, "eth_call", [{"to": contract, "data": data}, "latest"])
        if not isinstance(result, str) or not result.startswith("0x") or len(result) < 2 + 64 * count:
            raise ChainUnavailable("malformed_eth_call_answer")
        try:
            return [int(result[2 + 64 * i : 2 + 64 * (i + 1)], 16) for i in range(count)]
        except ValueError:
            raise ChainUnavailable("malformed_eth_call_answer") from None

    async def _authorization_state(self, a: Authorization) -> bool:
        data = AUTHORIZATION_STATE + address_word(a.authorizer) + a.nonce.removeprefix("0x")
        result = await self._rpc(a.network, "eth_call", [{"to": a.asset, "data": data}, "latest"])
        if not isinstance(result, str) or not WORD.match(result):
            raise ChainUnavailable("malformed_eth_call_answer")
        return int(result, 16) != 0

    async def _spent_in(self, a: Authorization, event_topic: str) -> str:
        """The transaction of the token's `event_topic` log for this (authorizer, nonce), or ""."""
        topics = [event_topic, "0x" + address_word(a.authorizer), a.nonce]
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

    async def _transferred(self, a: Authorization, transaction: str, pay_to: str) -> int:
        """How much THIS authorization moved from the authorizer to `pay_to` in `transaction`.

        One transaction may spend several nonces (a batch), so a transfer counts only as the
        one its nonce's `AuthorizationUsed` log announces: the token's next log, the
        `Transfer` that `transferWithAuthorization` emits right after marking the nonce used."""
        receipt = await self._rpc(a.network, "eth_getTransactionReceipt", [transaction])
        if not isinstance(receipt, dict) or not isinstance(receipt.get("logs"), list):
            raise ChainUnavailable("malformed_or_missing_receipt")
        if receipt.get("status") not in ("0x1", 1, "1"):
            return 0
        used = [AUTHORIZATION_USED_TOPIC, "0x" + address_word(a.authorizer), a.nonce]
        paid = [TRANSFER_TOPIC, "0x" + address_word(a.authorizer), "0x" + address_word(pay_to)]
        logs = [
            log for log in receipt["logs"] if isinstance(log, dict) and str(log.get("address", "")).lower() == a.asset
        ]
        for here, following in zip(logs, [*logs[1:], None], strict=True):
            if topics_of(here)[:3] != used or following is None:
                continue
            data = following.get("data")
            if topics_of(following)[:3] == paid and isinstance(data, str) and WORD.match(data):
                return int(data, 16)
            return 0
        return 0

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
