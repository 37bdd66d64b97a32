"""Payment-channel helpers for tests against the development facilitator.

Everything a payer or a server would do to a ``batch-settlement`` channel, done with the x402
package's own code: its client scheme (``BatchSettlementEvmScheme`` on an ``x402ClientSync``,
reading the chain through ``EthAccountSignerWithRPC`` on the facilitator's ``/rpc``) builds
deposits, its ``sign_voucher`` signs vouchers, its server-side builders shape the claim, settle
and refund payloads the facilitator is sent.
"""

from __future__ import annotations

from typing import Any

import httpx
from eth_account import Account
from x402 import x402ClientSync
from x402.mechanisms.evm.batch_settlement.abi import BATCH_SETTLEMENT_ABI
from x402.mechanisms.evm.batch_settlement.authorizer_signer import (
    LocalAuthorizerSigner,
    sign_claim_batch,
    sign_refund,
)
from x402.mechanisms.evm.batch_settlement.client.scheme import BatchSettlementEvmScheme
from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher
from x402.mechanisms.evm.batch_settlement.constants import BATCH_SETTLEMENT_ADDRESS
from x402.mechanisms.evm.batch_settlement.facilitator.utils import to_contract_channel_config
from x402.mechanisms.evm.batch_settlement.server.channel_manager_common import (
    build_claim_payment_payload,
    build_payment_requirements,
    build_settle_payment_payload,
)
from x402.mechanisms.evm.batch_settlement.types import ChannelConfig, VoucherClaim
from x402.mechanisms.evm.multicall import encode_contract_call
from x402.mechanisms.evm.signers import EthAccountSignerWithRPC
from x402.schemas import PaymentPayload, PaymentRequired, PaymentRequirements

from devnet.chain import DEV_CHAIN_ID, DEV_NETWORK
from tests.support.dev_facilitator_helpers import PAY_TO, USDC_BASE_SEPOLIA
from tests.support.paid import decode_header

__all__ = [
    "BATCH_SETTLEMENT_ADDRESS",
    "WITHDRAW_DELAY",
    "ChannelClient",
    "VoucherClaimable",
    "channel_offer",
    "claim_request",
    "contract_config",
    "refund_request",
    "rpc",
    "settle_request",
    "signed_transaction",
]

WITHDRAW_DELAY = 900


def channel_offer(receiver_authorizer: str, amount: int = 1000, **extra: Any) -> dict[str, Any]:
    """A ``batch-settlement`` PaymentRequirements with the binding's ``extra``."""
    return {
        "scheme": "batch-settlement",
        "network": DEV_NETWORK,
        "asset": USDC_BASE_SEPOLIA,
        "amount": str(amount),
        "payTo": PAY_TO,
        "maxTimeoutSeconds": 300,
        "extra": {
            "name": "USDC",
            "version": "2",
            "receiverAuthorizer": receiver_authorizer,
            "withdrawDelay": WITHDRAW_DELAY,
            **extra,
        },
    }


class ChannelClient:
    """One payer: the package's client scheme over the dev chain's ``/rpc``."""

    def __init__(self, facilitator_url: str, key: str) -> None:
        self.key = key
        self.account = Account.from_key(key)
        self.address = self.account.address
        self.signer = EthAccountSignerWithRPC(self.account, rpc_url=facilitator_url + "/rpc")
        self.scheme = BatchSettlementEvmScheme(self.signer)
        self.client = x402ClientSync()
        self.client.register("eip155:*", self.scheme)

    def payment(self, offer: dict[str, Any]) -> dict[str, Any]:
        """The PaymentPayload the client builds for ``offer`` (a deposit while it has no channel)."""
        required = PaymentRequired.model_validate(
            {"x402Version": 2, "resource": {"url": "http://127.0.0.1/a2a"}, "accepts": [offer]}
        )
        payload = self.client.create_payment_payload(required)
        return payload.model_dump(mode="json", by_alias=True, exclude_none=True)

    def channel(self, payment: dict[str, Any]) -> tuple[ChannelConfig, str]:
        inner = payment["payload"]
        return ChannelConfig.from_dict(inner["channelConfig"]), inner["voucher"]["channelId"]

    def voucher(self, channel_id: str, cumulative: int) -> VoucherClaimable:
        fields = sign_voucher(self.signer, channel_id, cumulative, DEV_NETWORK)
        return VoucherClaimable(cumulative, fields.signature)

    def voucher_payment(self, offer: dict[str, Any], config: ChannelConfig, channel_id: str, cumulative: int) -> dict:
        fields = sign_voucher(self.signer, channel_id, cumulative, DEV_NETWORK)
        return {
            "x402Version": 2,
            "accepted": offer,
            "payload": {"type": "voucher", "channelConfig": config.to_dict(), "voucher": fields.to_dict()},
        }

    def channels_view(self, channel_id: str) -> list[int]:
        """``channels(channelId)`` through web3 on ``/rpc``, as the client's recovery reads it."""
        return list(self.signer.read_contract(BATCH_SETTLEMENT_ADDRESS, BATCH_SETTLEMENT_ABI, "channels", channel_id))


class VoucherClaimable:
    """A signed voucher: its cumulative ceiling and the payer's signature."""

    def __init__(self, cumulative: int, signature: str) -> None:
        self.cumulative = cumulative
        self.signature = signature

    def claim(self, config: ChannelConfig, total_claimed: int | None = None) -> VoucherClaim:
        total = self.cumulative if total_claimed is None else total_claimed
        return VoucherClaim(
            channel=config,
            max_claimable_amount=str(self.cumulative),
            signature=self.signature,
            total_claimed=str(total),
        )


def _server_requirements() -> PaymentRequirements:
    return build_payment_requirements(PAY_TO, USDC_BASE_SEPOLIA, DEV_NETWORK)


def _body(payload: PaymentPayload, requirements: PaymentRequirements) -> dict[str, Any]:
    return {
        "x402Version": 2,
        "paymentPayload": payload.model_dump(mode="json", by_alias=True, exclude_none=True),
        "paymentRequirements": requirements.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def claim_request(claims: list[VoucherClaim], authorizer_key: str | None = None) -> dict[str, Any]:
    """A ``/settle`` body for ``claimWithSignature``, signed by ``authorizer_key`` or, without one,
    left for the facilitator to sign (the channel names its receiver authorizer)."""
    requirements = _server_requirements()
    signature = None
    if authorizer_key is not None:
        signature = sign_claim_batch(LocalAuthorizerSigner(authorizer_key), claims, DEV_NETWORK)
    return _body(build_claim_payment_payload(claims, requirements, signature), requirements)


def settle_request() -> dict[str, Any]:
    requirements = _server_requirements()
    return _body(build_settle_payment_payload(requirements, PAY_TO, USDC_BASE_SEPOLIA), requirements)


def refund_request(
    config: ChannelConfig,
    channel_id: str,
    voucher: VoucherClaimable,
    amount: int,
    nonce: int,
    claims: list[VoucherClaim],
    authorizer_key: str | None = None,
) -> dict[str, Any]:
    """A ``/settle`` body for a cooperative refund as the server completes it (the binding's
    enriched refund payload), optionally signed by ``authorizer_key``."""
    inner: dict[str, Any] = {
        "type": "refund",
        "channelConfig": config.to_dict(),
        "voucher": {
            "channelId": channel_id,
            "maxClaimableAmount": str(voucher.cumulative),
            "signature": voucher.signature,
        },
        "amount": str(amount),
        "refundNonce": str(nonce),
        "claims": [c.to_dict() for c in claims],
    }
    if authorizer_key is not None:
        signer = LocalAuthorizerSigner(authorizer_key)
        inner["refundAuthorizerSignature"] = sign_refund(signer, channel_id, amount, nonce, DEV_NETWORK)
        if claims:
            inner["claimAuthorizerSignature"] = sign_claim_batch(signer, claims, DEV_NETWORK)
    requirements = _server_requirements()
    return _body(PaymentPayload(x402_version=2, payload=inner, accepted=requirements), requirements)


def signed_transaction(key: str, function_name: str, *args: Any, nonce: int = 0) -> str:
    """A payer's own signed transaction to the contract, for ``eth_sendRawTransaction``."""
    data = encode_contract_call(BATCH_SETTLEMENT_ABI, function_name, *args)
    signed = Account.from_key(key).sign_transaction(
        {
            "type": 2,
            "chainId": DEV_CHAIN_ID,
            "nonce": nonce,
            "to": BATCH_SETTLEMENT_ADDRESS,
            "value": 0,
            "data": data,
            "gas": 200_000,
            "maxFeePerGas": 10**9,
            "maxPriorityFeePerGas": 10**8,
        }
    )
    return "0x" + bytes(signed.raw_transaction).hex()


def contract_config(config: ChannelConfig) -> tuple:
    return to_contract_channel_config(config)


def rpc(http: httpx.Client, method: str, *params: Any) -> dict[str, Any]:
    response = http.post("/rpc", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)})
    assert response.status_code == 200, response.text
    return response.json()


def receipt_of(response: httpx.Response) -> dict[str, Any]:
    """The receipt a paid answer carries (`PAYMENT-RESPONSE`)."""
    return decode_header(response.headers["PAYMENT-RESPONSE"])


def assert_charged_in_turn(answers: list[httpx.Response], price: int) -> dict[str, Any]:
    """Each answer a completed Task whose receipt charges `price` on top of the one before (the
    same receipt on the Task); the last receipt."""
    receipt: dict[str, Any] = {}
    for i, answer in enumerate(answers, start=1):
        assert answer.status_code == 200, answer.text
        task = answer.json()["result"]
        assert task["status"]["state"] == "completed"
        receipt = receipt_of(answer)
        assert receipt["extra"]["chargedAmount"] == str(price)
        assert receipt["extra"]["channelState"]["chargedCumulativeAmount"] == str(i * price)
        assert task["status"]["message"]["metadata"]["x402.payment.receipts"] == [receipt]
    return receipt
