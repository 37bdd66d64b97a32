"""Signed offers and receipts: x402's offer-receipt extension, signed with the operator's key.

With `[signing]` configured (server/signing_key.py), every 402 document carries, under
`extensions["offer-receipt"].info.offers`, one signed offer per entry of `accepts` (what is
asked: scheme, network, asset, payTo, amount, until when), and every successful receipt
(`PAYMENT-RESPONSE`, `x402.payment.receipts`, a replay, the in-band task) carries its signed
receipt under `extensions["offer-receipt"].info.receipt`: a payer holds a statement, checkable
offline, of what was asked and what was delivered and charged.

Both forms of the extension (the `@x402/extensions` package's, which verifies them):
- `jws` (the default): a JWS compact serialization of the payload, canonical (RFC 8785), signed
  by the key's algorithm, its `kid` a `did:jwk`. A receipt's payload states the extension's fields
  (version, network, resourceUrl, payer, issuedAt, transaction) and what this gate delivered and
  charged: the task, the agent, the scheme, the asset, the amount, and an upto charge's usage.
- `eip712`: EIP-712 typed data (domain `x402 offer` / `x402 receipt`, version 1, chainId 1),
  signed by a secp256k1 key; the signature recovers the key's address. The typed data are the
  extension's fixed fields only: the task, amount and usage stay beside it, in the receipt, unsigned.

Hashing and signing EIP-712 here is keccak (safe-pysha3) and a recoverable ECDSA signature
(coincurve), as gate/schemes/batch_settlement.py checks vouchers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import coincurve
import rfc8785
from cachetools import LRUCache

from gate.payment import Payment
from gate.schemes.batch_settlement import keccak
from server.signing_key import SigningKey

OFFER_RECEIPT = "offer-receipt"
VERSION = 1
FORMATS = ("jws", "eip712")

OFFER_FIELDS = (
    ("version", "uint256"),
    ("resourceUrl", "string"),
    ("scheme", "string"),
    ("network", "string"),
    ("asset", "string"),
    ("payTo", "string"),
    ("amount", "string"),
    ("validUntil", "uint256"),
)
RECEIPT_FIELDS = (
    ("version", "uint256"),
    ("network", "string"),
    ("resourceUrl", "string"),
    ("payer", "string"),
    ("issuedAt", "uint256"),
    ("transaction", "string"),
)
DOMAIN_TYPEHASH = keccak(b"EIP712Domain(string name,string version,uint256 chainId)")


def _typehash(name: str, fields: tuple[tuple[str, str], ...]) -> bytes:
    return keccak(f"{name}({','.join(f'{t} {n}' for n, t in fields)})".encode())


def _domain(name: str) -> bytes:
    return keccak(DOMAIN_TYPEHASH + keccak(name.encode()) + keccak(b"1") + (1).to_bytes(32, "big"))


TYPED = {
    "Offer": (_typehash("Offer", OFFER_FIELDS), OFFER_FIELDS, _domain("x402 offer")),
    "Receipt": (_typehash("Receipt", RECEIPT_FIELDS), RECEIPT_FIELDS, _domain("x402 receipt")),
}


def typed_data_hash(primary: str, message: dict[str, Any]) -> bytes:
    """The EIP-712 digest of an Offer or a Receipt (the extension's domain and types)."""
    typehash, fields, domain = TYPED[primary]
    encoded = typehash + b"".join(
        int(message[n]).to_bytes(32, "big") if t == "uint256" else keccak(str(message[n]).encode()) for n, t in fields
    )
    return keccak(b"\x19\x01" + domain + keccak(encoded))


class OfferReceipts:
    """Signs the offers of a 402 and the receipts of settled requests in one of the two forms."""

    def __init__(
        self, key: SigningKey, form: str = "jws", clock: Callable[[], float] = time.time, maxsize: int = 1024
    ) -> None:
        if form not in FORMATS:
            raise ValueError(f"offer-receipt format must be one of {', '.join(FORMATS)}, got {form!r}")
        secret = key.secp256k1_secret
        if form == "eip712" and secret is None:
            raise ValueError(f"the eip712 form needs a secp256k1 key; this one signs {key.algorithm}")
        self.key, self.form, self.clock = key, form, clock
        self._secp256k1 = coincurve.PrivateKey(secret) if secret is not None else None
        # signed offers by what they sign, with when they are due for signing again
        self.signed: LRUCache[tuple[Any, ...], tuple[dict[str, Any], float]] = LRUCache(maxsize=maxsize)

    def _sign(self, primary: str, payload: dict[str, Any]) -> dict[str, Any]:
        if self.form == "jws":
            return {"format": "jws", "signature": self.key.jws(rfc8785.dumps(payload))}
        assert self._secp256k1 is not None
        signature = self._secp256k1.sign_recoverable(typed_data_hash(primary, payload), hasher=None)
        v = bytes([signature[64] + 27])
        return {"format": "eip712", "payload": payload, "signature": "0x" + (signature[:64] + v).hex()}

    def offer(self, requirement: dict[str, Any], index: int, resource_url: str) -> tuple[dict[str, Any], float]:
        """One entry of `accepts` signed, valid for its `maxTimeoutSeconds`, and when to sign it anew
        (half its validity on: a 402 served from a cache never hands out an offer about to lapse)."""
        fields = tuple(str(requirement[k]) for k in ("scheme", "network", "asset", "payTo", "amount"))
        validity = int(requirement.get("maxTimeoutSeconds") or 300)
        now = self.clock()
        cached = self.signed.get((resource_url, index, validity, *fields))
        if cached is not None and cached[1] > now:
            return cached
        scheme, network, asset, pay_to, amount = fields
        payload = {
            "version": VERSION,
            "resourceUrl": resource_url,
            "scheme": scheme,
            "network": network,
            "asset": asset,
            "payTo": pay_to,
            "amount": amount,
            "validUntil": int(now) + validity,
        }
        signed = {**self._sign("Offer", payload), "acceptIndex": index}
        done = self.signed[(resource_url, index, validity, *fields)] = (signed, now + validity / 2)
        return done

    def with_offers(self, document: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """A v2 PaymentRequired document with its offers signed (`extensions["offer-receipt"]`), and
        until when it may be served as it is."""
        url = str(document.get("resource", {}).get("url", ""))
        signed = [self.offer(requirement, i, url) for i, requirement in enumerate(document["accepts"])]
        extensions = {**document.get("extensions", {}), OFFER_RECEIPT: {"info": {"offers": [s for s, _ in signed]}}}
        return {**document, "extensions": extensions}, min((until for _, until in signed), default=float("inf"))

    def receipt(self, payment: Payment, task_id: str, receipt: dict[str, Any], resource_url: str) -> dict[str, Any]:
        """A successful receipt with its signed statement (`extensions["offer-receipt"].info.receipt`)."""
        transaction = str(receipt.get("transaction") or "")
        payload: dict[str, Any] = {
            "version": VERSION,
            "network": str(receipt.get("network") or payment.network),
            "resourceUrl": resource_url,
            "payer": str(receipt.get("payer") or payment.payer),
            "issuedAt": int(self.clock()),
        }
        if self.form == "eip712":
            payload["transaction"] = transaction
        else:
            if transaction:
                payload["transaction"] = transaction
            payload.update(
                task=task_id,
                agent=payment.agent,
                scheme=str(payment.requirements.get("scheme", "")),
                asset=payment.asset,
                amount=str(receipt.get("amount") or payment.amount),
            )
            usage = (receipt.get("extra") or {}).get("usage") if isinstance(receipt.get("extra"), dict) else None
            if usage:
                payload["usage"] = usage
        extensions = {
            **(receipt.get("extensions") or {}),
            OFFER_RECEIPT: {"info": {"receipt": self._sign("Receipt", payload)}},
        }
        return {**receipt, "extensions": extensions}
