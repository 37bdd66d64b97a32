"""Payment tokens: finding one in a request, and the checks that need no facilitator.

Where to look, in order (DESIGN 4.5): the message metadata
``x402.payment.payload``, then the ``PAYMENT-SIGNATURE`` header (x402 v2), then the
legacy ``X-PAYMENT`` header (v1). ``Authorization`` is never a token source.

Parsing is total: any value, of any content, is a `Token` or "no token here"
(`None`), never an exception. A token is kept in a normal form (whole-number floats,
which a protobuf Struct makes of every integer, are integers), so its digest and
its claim do not depend on how a client's JSON library spelled it.

The local checks then read every key of the signed payload, by the scheme the agent's
price names (`gate/schemes/`): an EIP-3009 payload is exactly ``{signature,
authorization}``, with exactly the six authorization fields, in canonical spellings.
Anything else is refused before it can reach the facilitator (see the README's
"Payment tokens").
"""

from __future__ import annotations

import binascii
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson
import pybase64
from starlette.datastructures import Headers

from gate import schemes
from gate.payment_required import CAIP2_FOR_V1, V1_NETWORKS, requirement, requirement_v1
from gate.price import Price
from gate.schemes import exact_eip3009
from gate.schemes.base import Rejection, Scheme
from server.headers import header as http_header

__all__ = ["Rejection", "Token", "check", "check_payload", "check_window", "extract", "nonce_key", "offer_of"]

METADATA_KEY = "x402.payment.payload"
MAX_TOKEN_BYTES = 16_384
MAX_DEPTH = 16  # a real token nests 4 deep; nothing legitimate comes near this
MAX_BRACKETS = 1000  # any recursion limit copes with this; a library may raise Python's far above the C stack
MAX_INTEGER = 2**53  # beyond this a JSON number is not exact everywhere: x402 sends big numbers as strings

# The keys of each part of a token. Anything else in the signed payload is refused.
V2_KEYS = frozenset({"x402Version", "payload", "accepted", "resource", "extensions"})
V1_KEYS = frozenset({"x402Version", "scheme", "network", "payload"})
ACCEPTED_KEYS = frozenset({"scheme", "network", "asset", "amount", "payTo", "maxTimeoutSeconds", "extra"})


class NotAToken(Exception):
    """Raised inside parsing only; the public functions turn it into `None`."""


@dataclass(frozen=True)
class Token:
    """A payment payload that has the shape of one; nothing about it is verified yet."""

    payload: dict[str, Any]  # the normal form: what is digested, claimed and sent to the facilitator
    version: int  # x402Version: 1 or 2
    source: str  # metadata | PAYMENT-SIGNATURE | X-PAYMENT
    canonical: str = field(default="", repr=False, compare=False)  # its canonical JSON, once built

    @cached_property  # claims, logs and sealing all ask; the canonical JSON is built once
    def digest(self) -> str:
        """Identity of the token for claims and logs; the token itself is never stored."""
        return hashlib.sha256((self.canonical or canonical_json(self.payload)).encode()).hexdigest()

    @property
    def authorization(self) -> dict[str, Any]:
        inner = self.payload.get("payload")
        auth = inner.get("authorization") if isinstance(inner, dict) else None
        return auth if isinstance(auth, dict) else {}

    @property
    def network(self) -> str:
        if self.version == 2:
            return str(self.payload["accepted"].get("network", ""))
        return CAIP2_FOR_V1.get(str(self.payload.get("network", "")), str(self.payload.get("network", "")))


def extract(metadata: Any, headers: Headers) -> Token | None:
    """The request's token, metadata first; None when there is no well-formed one."""
    if isinstance(metadata, dict):
        token = from_object(metadata.get(METADATA_KEY), "metadata")
        if token is not None:
            return token
    for header in ("payment-signature", "x-payment"):
        token = from_header(http_header(headers, header), header.upper())
        if token is not None:
            return token
    return None


def from_header(value: Any, source: str) -> Token | None:
    """A base64 JSON header value (standard alphabet, padded, as x402 sends it)."""
    if not isinstance(value, str) or not value or len(value) > MAX_TOKEN_BYTES:
        return None
    try:
        raw = pybase64.b64decode(value.strip(), validate=True)
        brackets = raw.count(b"[") + raw.count(b"{")
        if brackets > MAX_BRACKETS:  # before the parser can recurse that deep
            return None
        document = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))  # as json.loads
    except (binascii.Error, ValueError, RecursionError, NotAToken):  # UnicodeDecodeError is a ValueError
        return None
    if raw.isascii() and b"\\u" not in raw and (brackets <= MAX_DEPTH or nests_within(document, MAX_DEPTH)):
        # in normal form already: its numbers were read as `normalise` writes them, its keys are
        # text, it nests no deeper than `normalise` allows (it has no more brackets than that, or
        # its containers were counted: a payment carrying a 402's extensions back has dozens), and
        # no string can hold a lone surrogate (neither raw bytes outside ASCII nor a \u escape),
        # which is all `normalise` would check
        return _token(document, source)
    return from_object(document, source)


def nests_within(document: Any, limit: int) -> bool:
    """Whether no value of `document` lies deeper than `limit` (as `normalise` counts: the document
    at 0, what it holds at 1...), walking its containers level by level, never its strings."""
    level: list[Any] = [document] if isinstance(document, (dict, list)) else []
    depth = 0
    while level:
        below: list[Any] = []
        for container in level:
            held = container.values() if isinstance(container, dict) else container
            if held and depth >= limit:
                return False
            below.extend(value for value in held if isinstance(value, (dict, list)))
        level, depth = below, depth + 1
    return True


def from_object(document: Any, source: str) -> Token | None:
    """A token from an already-parsed value (message or params metadata)."""
    try:
        normal = normalise(document)
    except (NotAToken, RecursionError):
        return None
    return _token(normal, source)


def _token(normal: Any, source: str) -> Token | None:
    """A token from a value in normal form, if it has a token's shape."""
    if not isinstance(normal, dict):
        return None
    version = normal.get("x402Version")
    if version not in (1, 2) or isinstance(version, bool):
        return None
    if not isinstance(normal.get("payload"), dict):
        return None
    if version == 2:
        accepted = normal.get("accepted")
        if not isinstance(accepted, dict) or not all(
            isinstance(accepted.get(k), str) for k in ("scheme", "network", "asset", "amount", "payTo")
        ):
            return None
    elif not all(isinstance(normal.get(k), str) for k in ("scheme", "network")):
        return None
    canonical = canonical_json(normal)  # its length is the compact JSON's, and its digest's text
    if len(canonical) > MAX_TOKEN_BYTES:
        return None
    return Token(payload=normal, version=version, source=source, canonical=canonical)


def canonical_json(payload: dict[str, Any]) -> str:
    """What a token's digest hashes: sorted keys, compact, ASCII. These bytes never change: a claim
    made before an upgrade is found by the same token after it.

    They are the standard library's (`ensure_ascii`, which escapes DEL and everything past it);
    orjson writes the same bytes for a value in normal form that holds neither, twenty times faster."""
    try:
        fast = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson.JSONEncodeError: what it cannot hold, the standard library writes
        pass
    else:
        if fast.isascii() and b"\x7f" not in fast:
            return fast.decode()
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def normalise(value: Any, depth: int = 0) -> Any:
    """A copy of a JSON value in normal form, or NotAToken.

    Whole-number floats become integers (a protobuf Struct turns every integer into a
    double); non-finite, fractional and out-of-range numbers, strings that are not
    valid Unicode (lone surrogates) and anything JSON cannot hold are not a token.
    """
    if depth > MAX_DEPTH:
        raise NotAToken("too deep")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return _exact(value)
    if isinstance(value, float):
        return _whole(value)
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, list):
        return [normalise(item, depth + 1) for item in value]
    if isinstance(value, dict):
        normal = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotAToken("object key is not a string")
            normal[_text(key)] = normalise(item, depth + 1)
        return normal
    raise NotAToken("not a JSON value")


def _text(value: str) -> str:
    if len(value) > MAX_TOKEN_BYTES:
        raise NotAToken("string too long")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 byte sequence can carry it
        raise NotAToken("not valid Unicode") from None
    return value


def _exact(value: int) -> int:
    if abs(value) > MAX_INTEGER:
        raise NotAToken("integer out of range")
    return value


def _whole(value: float) -> int:
    if not math.isfinite(value) or not value.is_integer() or abs(value) > MAX_INTEGER:
        raise NotAToken("not a whole number")
    return int(value)


def _refuse_constant(name: str) -> Any:
    raise NotAToken(f"{name} is not a JSON number")


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Two values for one key: which one would the facilitator read? Not a token."""
    document = dict(pairs)
    if len(document) != len(pairs):
        raise NotAToken("duplicate key")
    return document


# A header's JSON reader, made once (`json.loads` with options builds one per call): its numbers
# checked and written as `normalise` writes them, as they are read.
_DECODER = json.JSONDecoder(
    parse_constant=_refuse_constant,
    parse_float=lambda text: _whole(float(text)),
    parse_int=lambda text: _exact(int(text)),
    object_pairs_hook=_refuse_duplicates,
)


def check(
    token: Token, price: Price, resource_url: str, now: float | None = None, min_window: float = 0.0
) -> dict[str, Any]:
    """Every local check (DESIGN 4.7); returns the requirements to send the facilitator."""
    required = check_payload(token, price, resource_url)
    check_window(token, now, min_window, schemes.for_price(price))
    return required


def offer_of(token: Token, price: Price) -> Price | None:
    """The offer of `price` this token pays: its scheme's (and transfer method's), as it says it chose."""
    document = token.payload
    if token.version == 2:
        accepted = document["accepted"]
        extra = accepted.get("extra")
        method = extra.get("assetTransferMethod") if isinstance(extra, dict) else None
        named = price.offer_for(
            accepted["scheme"], method if isinstance(method, str) else schemes.DEFAULT_TRANSFER_METHOD
        )
        # a transfer method no offer names: its scheme's first offer reads the payload (and refuses it)
        return named or price.offer_for(accepted["scheme"])
    if len(price.offers) == 1:  # an x402 v1 payload names no transfer method: the one offer's
        return price
    # of several, the one of its scheme a v1 client signs (the one its v1 document listed), else the first
    of_scheme = [offer for offer in price.offers if offer.scheme == document["scheme"]]
    return next((offer for offer in of_scheme if schemes.v1_signable(offer)), of_scheme[0] if of_scheme else None)


def check_payload(token: Token, price: Price, resource_url: str) -> dict[str, Any]:
    """The checks that do not depend on the clock: what is paid, to whom, in which shape."""
    document = token.payload
    if token.version == 2:
        if not set(document) <= V2_KEYS or not set(document["accepted"]) <= ACCEPTED_KEYS:
            raise Rejection("invalid_payload")
        accepted = document["accepted"]
        wanted = requirement(price, resource_url)
        if (
            accepted["scheme"] != wanted["scheme"]
            or accepted["network"] != wanted["network"]
            or accepted["asset"].lower() != wanted["asset"].lower()
            or accepted["amount"] != wanted["amount"]
            or accepted["payTo"].lower() != wanted["payTo"].lower()
        ):
            raise Rejection("accepted_requirements_mismatch")
        resource = document.get("resource")
        if resource is not None and not isinstance(resource, dict):
            raise Rejection("invalid_payload")
        if isinstance(resource, dict) and isinstance(resource.get("url"), str) and resource["url"] != resource_url:
            raise Rejection("resource_mismatch")
        if document.get("extensions") is not None and not isinstance(document["extensions"], dict):
            raise Rejection("invalid_payload")
        required = wanted
    else:
        if not set(document) <= V1_KEYS:
            raise Rejection("invalid_payload")
        if 1 not in schemes.for_price(price).versions:  # (a payment channel's are v2 only)
            raise Rejection("unsupported_payload")
        if document["scheme"] != price.scheme or document["network"] != V1_NETWORKS.get(price.network, price.network):
            raise Rejection("accepted_requirements_mismatch")
        required = requirement_v1(price, resource_url)
    schemes.for_price(price).check(document["payload"], price)
    return required


# What `check_window` refuses with: a retry of a claimed token is answered by its claim instead.
WINDOW_REASONS = frozenset({"payment_not_yet_valid", "payment_expired", "payment_window_too_short"})


def check_window(
    token: Token, now: float | None = None, min_window: float = 0.0, scheme: Scheme = exact_eip3009.SCHEME
) -> None:
    """The time window (as `scheme` reads it) is open and leaves `min_window` seconds to do the work and collect."""
    valid_after, valid_before = scheme.window(_inner(token))
    now = time.time() if now is None else now
    if valid_after > now:
        raise Rejection("payment_not_yet_valid")
    if valid_before <= now:
        raise Rejection("payment_expired")
    if valid_before - now < min_window:
        raise Rejection("payment_window_too_short")


def nonce_key(token: Token, asset: str, scheme: Scheme = exact_eip3009.SCHEME) -> str:
    """The nonce the token spends, as `scheme` names it: one signature pays once, whatever wraps it."""
    return scheme.nonce_key(_inner(token), token.network, asset)


def named_payer(token: Token) -> str:
    """The payer the token's payload names, whatever its scheme (unverified; "" when it names none)."""
    return schemes.named_payer(_inner(token))


def _inner(token: Token) -> dict[str, Any]:
    inner = token.payload.get("payload")
    return inner if isinstance(inner, dict) else {}
