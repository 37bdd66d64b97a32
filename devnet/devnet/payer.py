"""Sign x402 payments the way a real buyer does, for tests, benchmarks and the CLI.

The signing itself is the x402 package's client (``x402ClientSync`` with the
exact-EVM client schemes, its ``upto`` client scheme and an eth-account key), so a
payment produced here is byte-for-byte what a real x402 buyer would send.

A payer can also spend its own authorization without the facilitator, as on a real
chain: give it up (``sign_cancel_authorization``) or sign the same nonce over to
someone else (``sign_transfer_authorization``). The simulated chain takes both at
``/dev/chain/...`` (``devnet.facilitator``). Permit2 nonces are spent by transactions
sent to ``eth_sendRawTransaction`` at ``/rpc``: the payer's own
``invalidateUnorderedNonces`` (``invalidate_permit2_nonce``), or anyone's call of x402's
exact Permit2 proxy with the payer's signature (``settle_exact_permit2``).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from eth_abi import encode as abi_encode
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils import keccak, to_checksum_address
from x402 import x402ClientSync
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.upto import UptoEvmClientScheme
from x402.schemas import PaymentRequired, PaymentRequiredV1

from devnet.chain import DEV_CHAIN_ID, DEV_NETWORK, default_tokens
from devnet.permit2 import EXACT_PROXY, PERMIT2

__all__ = [
    "encode_header",
    "invalidate_permit2_nonce",
    "new_private_key",
    "settle_exact_permit2",
    "sign_cancel_authorization",
    "sign_payment",
    "sign_payment_v1",
    "sign_transaction",
    "sign_transfer_authorization",
]


def _client(private_key: str) -> x402ClientSync:
    client = x402ClientSync()
    register_exact_evm_client(client, Account.from_key(private_key))
    client.register("eip155:*", UptoEvmClientScheme(Account.from_key(private_key)))
    # A test payer must be able to sign what it is asked to sign, including
    # offers a careful wallet would refuse (unknown assets, large amounts);
    # the client's default spend controls would silently filter those out.
    client.set_spend_controls(False)
    return client


def sign_payment(payment_required: dict[str, Any], private_key: str, *, accept_index: int = 0) -> dict[str, Any]:
    """Sign ``accepts[accept_index]`` of a v2 PaymentRequired; return the PaymentPayload.

    Both documents are camelCase dicts, as they travel in the
    ``PAYMENT-REQUIRED`` and ``PAYMENT-SIGNATURE`` headers.
    """
    accepts = payment_required.get("accepts") or []
    if not 0 <= accept_index < len(accepts):
        raise IndexError(f"accept_index {accept_index} out of range ({len(accepts)} offers)")
    # Offer the client just the chosen requirement so its selector cannot pick another.
    offer = {**payment_required, "accepts": [accepts[accept_index]]}
    chosen = PaymentRequired.model_validate(offer)
    payload = _client(private_key).create_payment_payload(chosen)
    return payload.model_dump(mode="json", by_alias=True, exclude_none=True)


def sign_payment_v1(requirements_v1: dict[str, Any], private_key: str) -> dict[str, Any]:
    """Sign one v1 PaymentRequirements (``maxAmountRequired``, network ``base-sepolia``...)."""
    required = PaymentRequiredV1.model_validate({"x402Version": 1, "accepts": [requirements_v1]})
    payload = _client(private_key).create_payment_payload(required)
    return payload.model_dump(mode="json", by_alias=True, exclude_none=True)


def encode_header(payload: dict[str, Any]) -> str:
    """Standard base64 of the compact JSON: the ``PAYMENT-SIGNATURE`` header value."""
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def new_private_key() -> str:
    """A fresh throwaway key, 0x-prefixed hex."""
    return "0x" + bytes(Account.create().key).hex()


def _domain(asset: str, network: str) -> dict[str, Any]:
    """The token's EIP-712 domain, as the simulated chain plays it."""
    token = default_tokens(network)[to_checksum_address(asset)]
    return {"name": token.name, "version": token.version, "chainId": DEV_CHAIN_ID, "verifyingContract": asset}


def _sign(
    private_key: str, domain: dict[str, Any], primary: str, fields: list[dict[str, str]], message: dict[str, Any]
) -> str:
    signable = encode_typed_data(domain_data=domain, message_types={primary: fields}, message_data=message)
    return "0x" + bytes(Account.sign_message(signable, private_key).signature).hex()


def sign_cancel_authorization(
    private_key: str, *, asset: str, nonce: str, network: str = DEV_NETWORK
) -> dict[str, str]:
    """The payer gives up an authorization (EIP-3009 ``cancelAuthorization``): its nonce is spent,
    no funds move. Returns the body of ``POST /dev/chain/cancelAuthorization``."""
    authorizer = Account.from_key(private_key).address
    fields = [{"name": "authorizer", "type": "address"}, {"name": "nonce", "type": "bytes32"}]
    message = {"authorizer": authorizer, "nonce": nonce}
    signature = _sign(private_key, _domain(asset, network), "CancelAuthorization", fields, message)
    return {"asset": asset, "authorizer": authorizer, "nonce": nonce, "signature": signature}


def sign_transfer_authorization(
    private_key: str,
    *,
    asset: str,
    to: str,
    value: int,
    nonce: str,
    valid_after: int,
    valid_before: int,
    network: str = DEV_NETWORK,
) -> dict[str, str]:
    """An EIP-3009 ``transferWithAuthorization`` signed by the payer, to be sent by anyone.
    Returns the body of ``POST /dev/chain/transferWithAuthorization``."""
    sender = Account.from_key(private_key).address
    fields = [
        {"name": "from", "type": "address"},
        {"name": "to", "type": "address"},
        {"name": "value", "type": "uint256"},
        {"name": "validAfter", "type": "uint256"},
        {"name": "validBefore", "type": "uint256"},
        {"name": "nonce", "type": "bytes32"},
    ]
    message = {
        "from": sender,
        "to": to_checksum_address(to),
        "value": int(value),
        "validAfter": int(valid_after),
        "validBefore": int(valid_before),
        "nonce": nonce,
    }
    signature = _sign(private_key, _domain(asset, network), "TransferWithAuthorization", fields, message)
    return {
        "asset": asset,
        "from": sender,
        "to": message["to"],
        "value": str(value),
        "validAfter": str(valid_after),
        "validBefore": str(valid_before),
        "nonce": nonce,
        "signature": signature,
    }


def sign_transaction(private_key: str, to: str, data: bytes) -> str:
    """An EIP-1559 transaction to ``to`` for the development chain, signed: the hex that
    ``eth_sendRawTransaction`` takes (its account nonce and gas mean nothing there)."""
    tx = {
        "type": 2,
        "chainId": DEV_CHAIN_ID,
        "nonce": 0,
        "to": to,
        "value": 0,
        "data": data,
        "gas": 200_000,
        "maxFeePerGas": 1,
        "maxPriorityFeePerGas": 1,
    }
    return "0x" + bytes(Account.sign_transaction(tx, private_key).raw_transaction).hex()


def invalidate_permit2_nonce(private_key: str, nonce: int | str) -> str:
    """The payer gives up a Permit2 authorization it signed: Permit2's
    ``invalidateUnorderedNonces(nonce >> 8, 1 << (nonce & 255))``, sent by the payer (signed raw hex)."""
    value = int(nonce)
    data = _calldata(
        "invalidateUnorderedNonces(uint256,uint256)", ["uint256", "uint256"], [value >> 8, 1 << (value & 255)]
    )
    return sign_transaction(private_key, PERMIT2, data)


def settle_exact_permit2(private_key: str, payload: dict[str, Any]) -> str:
    """x402's exact Permit2 proxy ``settle`` with a payer's signed Permit2 authorization, sent by
    whoever holds ``private_key`` (the proxy lets anyone; it pays only the witness's ``to``)."""
    auth, signature = payload["payload"]["permit2Authorization"], payload["payload"]["signature"]
    permit = ((auth["permitted"]["token"], int(auth["permitted"]["amount"])), int(auth["nonce"]), int(auth["deadline"]))
    witness = (auth["witness"]["to"], int(auth["witness"]["validAfter"]))
    types = ["((address,uint256),uint256,uint256)", "address", "(address,uint256)", "bytes"]
    args = [permit, auth["from"], witness, bytes.fromhex(signature.removeprefix("0x"))]
    return sign_transaction(private_key, EXACT_PROXY, _calldata(f"settle({','.join(types)})", types, args))


def _calldata(signature: str, types: list[str], args: list[Any]) -> bytes:
    return keccak(text=signature)[:4] + abi_encode(types, args)
