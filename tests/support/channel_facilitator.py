"""A facilitator for `batch-settlement` over an in-memory settlement contract, for the gate's channel tests.

It answers the standard facilitator HTTP API for channel payloads the way the binding's
facilitator does: a voucher's signature is checked by the x402 package's own
`verify_batch_settlement_voucher_typed_data` and its channel id by `compute_channel_id`; a
deposit (verify, then settle) adds to the channel's balance; a claim raises its total claimed
to the vouchers' maxima (never above the balance); a settle sweeps claimed funds to the
receiver. `calls` counts every call, so a test can show vouchers verified without it, and
`channels` is the contract's state (`channels(bytes32)`: balance, total claimed).
"""

from __future__ import annotations

import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from x402.mechanisms.evm.batch_settlement.facilitator.utils import verify_batch_settlement_voucher_typed_data
from x402.mechanisms.evm.batch_settlement.types import ChannelConfig
from x402.mechanisms.evm.batch_settlement.utils import compute_channel_id

RECEIVER_AUTHORIZER = "0x" + "a5" * 20
CHAIN_ID = 84532


@dataclass
class OnChain:
    balance: int = 0
    total_claimed: int = 0
    swept: int = 0


@dataclass
class ChannelChain:
    channels: dict[str, OnChain] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    receivers: Counter[str] = field(default_factory=Counter)  # swept to each receiver
    claim_transactions: list[dict[str, Any]] = field(default_factory=list)
    refuse_claims: bool = False  # a test's switch: every claim refused, as a contract that reverts

    def state(self, channel_id: str) -> dict[str, Any]:
        c = self.channels.get(channel_id.lower(), OnChain())
        return {
            "channelId": channel_id,
            "balance": str(c.balance),
            "totalClaimed": str(c.total_claimed),
            "withdrawRequestedAt": 0,
            "refundNonce": "0",
        }


def _check(chain: ChannelChain, inner: dict[str, Any], requirements: dict[str, Any]) -> str | None:
    config = ChannelConfig.from_dict(inner["channelConfig"])
    voucher = inner["voucher"]
    if compute_channel_id(config, requirements["network"]).lower() != voucher["channelId"].lower():
        return "invalid_batch_settlement_evm_channel_id_mismatch"
    if not verify_batch_settlement_voucher_typed_data(
        None,  # type: ignore[arg-type]  -- EOA payer authorizers only
        voucher["channelId"],
        voucher["maxClaimableAmount"],
        config.payer_authorizer,
        config.payer,
        voucher["signature"],
        CHAIN_ID,
    ):
        return "invalid_batch_settlement_evm_voucher_signature"
    on_chain = chain.channels.get(voucher["channelId"].lower(), OnChain())
    balance = on_chain.balance + (int(inner["deposit"]["amount"]) if inner["type"] == "deposit" else 0)
    if int(voucher["maxClaimableAmount"]) > balance:
        return "invalid_batch_settlement_evm_cumulative_exceeds_balance"
    if int(voucher["maxClaimableAmount"]) <= on_chain.total_claimed:
        return "invalid_batch_settlement_evm_cumulative_below_claimed"
    return None


def create_app(chain: ChannelChain) -> Starlette:
    async def verify(request: Request) -> JSONResponse:
        chain.calls["verify"] += 1
        body = await request.json()
        inner, requirements = body["paymentPayload"]["payload"], body["paymentRequirements"]
        payer = inner["channelConfig"]["payer"].lower()
        problem = _check(chain, inner, requirements)
        if problem:
            return JSONResponse({"isValid": False, "invalidReason": problem, "payer": payer})
        return JSONResponse({"isValid": True, "payer": payer, "extra": chain.state(inner["voucher"]["channelId"])})

    async def settle(request: Request) -> JSONResponse:
        chain.calls["settle"] += 1
        body = await request.json()
        inner, requirements = body["paymentPayload"]["payload"], body["paymentRequirements"]
        transaction = "0x" + secrets.token_hex(32)
        network = requirements["network"]
        if inner.get("type") == "deposit":
            chain.calls["deposit"] += 1
            problem = _check(chain, inner, requirements)
            payer = inner["channelConfig"]["payer"].lower()
            if problem:
                return JSONResponse({"success": False, "errorReason": problem, "transaction": "", "network": network})
            channel = chain.channels.setdefault(inner["voucher"]["channelId"].lower(), OnChain())
            channel.balance += int(inner["deposit"]["amount"])
            state = chain.state(inner["voucher"]["channelId"])
            return JSONResponse(
                {
                    "success": True,
                    "transaction": transaction,
                    "network": network,
                    "payer": payer,
                    "extra": {"channelState": state},
                }
            )
        if inner.get("type") == "claim":
            chain.calls["claim"] += 1
            if chain.refuse_claims:
                return JSONResponse(
                    {"success": False, "errorReason": "invalid_batch_settlement_evm_claim_simulation_failed"}
                )
            for entry in inner["claims"]:
                config = ChannelConfig.from_dict(entry["voucher"]["channel"])
                channel_id = compute_channel_id(config, network).lower()
                cap = int(entry["voucher"]["maxClaimableAmount"])
                if not verify_batch_settlement_voucher_typed_data(
                    None,  # type: ignore[arg-type]
                    channel_id,
                    str(cap),
                    config.payer_authorizer,
                    config.payer,
                    entry["signature"],
                    CHAIN_ID,
                ):
                    return JSONResponse(
                        {"success": False, "errorReason": "invalid_batch_settlement_evm_voucher_signature"}
                    )
                on_chain = chain.channels.setdefault(channel_id, OnChain())
                total = int(entry["totalClaimed"])
                if total > cap or total > on_chain.balance or total < on_chain.total_claimed:
                    return JSONResponse({"success": False, "errorReason": "invalid_batch_settlement_evm_claim_payload"})
                chain.claim_transactions.append(
                    {"channel": channel_id, "added": total - on_chain.total_claimed, "receiver": config.receiver}
                )
                on_chain.total_claimed = total
            return JSONResponse({"success": True, "transaction": transaction, "network": network, "payer": ""})
        if inner.get("type") == "settle":
            chain.calls["sweep"] += 1
            receiver = inner["receiver"].lower()
            for entry in chain.claim_transactions:
                if entry["receiver"].lower() == receiver and not entry.get("swept"):
                    chain.receivers[receiver] += entry["added"]
                    entry["swept"] = True
            return JSONResponse({"success": True, "transaction": transaction, "network": network, "payer": ""})
        return JSONResponse({"success": False, "errorReason": "invalid_batch_settlement_evm_unknown_settle_action"})

    async def supported(request: Request) -> JSONResponse:
        kind = {
            "x402Version": 2,
            "scheme": "batch-settlement",
            "network": "eip155:84532",
            "extra": {"receiverAuthorizer": RECEIVER_AUTHORIZER},
        }
        return JSONResponse({"kinds": [kind], "extensions": [], "signers": {}})

    return Starlette(
        routes=[
            Route("/verify", verify, methods=["POST"]),
            Route("/settle", settle, methods=["POST"]),
            Route("/supported", supported, methods=["GET"]),
        ]
    )
