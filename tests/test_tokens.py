"""Token extraction and local checks: any shape a client can send is either a token,
"no token here", or a `Rejection` — never another exception."""

from __future__ import annotations

import base64
import json
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

from gate import tokens
from devnet.payer import encode_header, new_private_key, sign_payment
from gate.pricing import payment_required
from server.config import DEMO_PRICE

RESOURCE = "http://gate.example/a2a/paid"
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=30,
)


def signed() -> dict:
    return sign_payment(payment_required(DEMO_PRICE, RESOURCE), new_private_key())


def test_metadata_wins_over_headers():
    in_metadata, in_header = signed(), signed()
    token = tokens.extract({tokens.METADATA_KEY: in_metadata}, Headers({"payment-signature": encode_header(in_header)}))
    assert token is not None and token.source == "metadata" and token.payload == in_metadata


def test_header_fallback_order_and_authorization_is_never_a_source():
    legacy, current = signed(), signed()
    headers = Headers({"x-payment": encode_header(legacy), "payment-signature": encode_header(current),
                       "authorization": f"Bearer {encode_header(signed())}"})
    assert tokens.extract(None, headers).payload == current
    assert tokens.extract({}, Headers({"x-payment": encode_header(legacy)})).source == "X-PAYMENT"
    assert tokens.extract({}, Headers({"authorization": f"Bearer {encode_header(current)}"})) is None


def test_a_real_token_passes_local_checks_and_keys_on_its_nonce():
    token = tokens.from_object(signed(), "metadata")
    assert tokens.check(token, DEMO_PRICE, RESOURCE)["amount"] == "1000"
    assert tokens.nonce_key(token, DEMO_PRICE.asset).startswith("eip155:84532|0x036cbd")


def test_expired_and_not_yet_valid_windows_are_rejected():
    token = tokens.from_object(signed(), "metadata")
    auth = token.authorization
    for now, reason in ((int(auth["validBefore"]) + 1, "payment_expired"), (int(auth["validAfter"]) - 1, "payment_not_yet_valid")):
        try:
            tokens.check(token, DEMO_PRICE, RESOURCE, now=now)
        except tokens.Rejection as exc:
            assert exc.reason == reason
        else:
            raise AssertionError(reason)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=json_values)
def test_any_json_object_is_a_token_or_not_never_an_exception(document):
    token = tokens.from_object(document, "metadata")
    if token is not None:
        try:
            tokens.check(token, DEMO_PRICE, RESOURCE, now=time.time())
        except tokens.Rejection:
            pass
        tokens.nonce_key(token, DEMO_PRICE.asset)
        assert len(token.digest) == 64


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_any_header_bytes_are_no_token_or_a_token(raw):
    for value in (raw.decode("latin-1"), base64.b64encode(raw).decode()):
        tokens.from_header(value, "PAYMENT-SIGNATURE")


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(["validAfter", "validBefore", "value", "to", "from", "nonce"]), value=json_values)
def test_mutated_authorizations_are_rejected_cleanly(field, value):
    document = signed_once()
    document = json.loads(json.dumps(document))
    document["payload"]["authorization"][field] = value
    token = tokens.from_object(json.loads(json.dumps(document, allow_nan=True)), "metadata")
    try:
        tokens.check(token, DEMO_PRICE, RESOURCE)
    except tokens.Rejection:
        pass


_SIGNED: list[dict] = []


def signed_once() -> dict:
    if not _SIGNED:
        _SIGNED.append(signed())
    return _SIGNED[0]
