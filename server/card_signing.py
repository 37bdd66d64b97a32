"""Signed agent cards (A2A `AgentCard.signatures`): a card a client can hold the operator to.

The A2A specification's form: a JWS with a detached payload, the payload being the card's JSON
canonicalized by RFC 8785 (JCS) with `signatures` left out. Each signature is `{protected,
signature}`: the protected header (base64url; `alg`, `kid`, `typ: JOSE`) and the signature
(base64url) of the compact serialization, whose middle part a verifier rebuilds from the card.

Every card the server serves is built here from its configuration, an upstream agent's too: a
card the gate fronts is the gate's own rewrite of it (its URL, its security, its price), so
whatever the upstream signed no longer holds and the operator's key signs what is served.
"""

from __future__ import annotations

from typing import Any

import rfc8785
from cachetools import LRUCache

from server.signing_key import SigningKey


def canonical(card: dict[str, Any]) -> bytes:
    """What a card's signature covers: the card without `signatures`, canonical (RFC 8785)."""
    return rfc8785.dumps({k: v for k, v in card.items() if k != "signatures"})


def signed(card: dict[str, Any], key: SigningKey | None) -> dict[str, Any]:
    """The card with the operator's signature (replacing any it held); the card itself without a key."""
    if key is None:
        return card
    protected, _, signature = key.jws(canonical(card), typ="JOSE").split(".")
    return {**card, "signatures": [{"protected": protected, "signature": signature}]}


class CardSigner:
    """Signs the cards the server serves, each distinct card once: an ECDSA signature differs at
    each signing, and a card's ETag is its body's, so the same card keeps the same signature (and
    its clients' caches hold) until what it says changes."""

    def __init__(self, key: SigningKey | None, maxsize: int = 1024) -> None:
        self.key = key
        self.done: LRUCache[bytes, dict[str, Any]] = LRUCache(maxsize=maxsize)

    def __call__(self, card: dict[str, Any]) -> dict[str, Any]:
        if self.key is None:
            return card
        payload = canonical(card)
        done = self.done.get(payload)
        if done is None:
            done = self.done[payload] = signed(card, self.key)
        return done
