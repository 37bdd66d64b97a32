"""Token extraction and local checks: any shape a client can send is either a token,
"no token here", or a `Rejection` — never another exception."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

from devnet.payer import encode_header, new_private_key, sign_payment
from gate import tokens
from gate.config import DEMO_PRICE
from gate.payment_required import payment_required

RESOURCE = "http://gate.example/a2a/paid"
# Strings with lone surrogates (what a JSON `\\ud800` escape decodes to), huge and
# boundary integers, non-finite and whole-number floats: every odd value a parser can hand us.
odd_text = st.text(max_size=20) | st.text(
    alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3
)
odd_numbers = (
    st.integers()
    | st.integers(min_value=2**53 - 2, max_value=2**53 + 2)
    | st.integers(min_value=10**20, max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([1.0, 2.0, -0.0, 2.5, 1e300, float("inf"), float("nan")])
)
json_values = st.recursive(
    st.none() | st.booleans() | odd_numbers | odd_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(odd_text, children, max_size=5),
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
    headers = Headers(
        {
            "x-payment": encode_header(legacy),
            "payment-signature": encode_header(current),
            "authorization": f"Bearer {encode_header(signed())}",
        }
    )
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
    for now, reason in (
        (int(auth["validBefore"]) + 1, "payment_expired"),
        (int(auth["validAfter"]) - 1, "payment_not_yet_valid"),
    ):
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
        json.dumps(token.payload, allow_nan=False).encode("utf-8")  # the normal form is plain, storable JSON


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
    if token is None:  # a value no JSON token can hold (non-finite, fractional, out of range...)
        return
    try:
        tokens.check(token, DEMO_PRICE, RESOURCE)
    except tokens.Rejection:
        pass


_SIGNED: list[dict] = []


def signed_once() -> dict:
    if not _SIGNED:
        _SIGNED.append(signed())
    return _SIGNED[0]


# JSON text a client can put in a header: constants Python's parser accepts, escapes
# that decode to lone surrogates, duplicate keys, deep nesting, huge numbers.
raw_fragments = st.sampled_from(
    [
        "Infinity",
        "-Infinity",
        "NaN",
        '"\\ud800"',
        '"\\udfff\\ud800"',
        "1e400",
        "-0",
        "1.0",
        "2.0",
        "2.5",
        "9" * 5000,
        "[" * 3000 + "]" * 3000,
        '{"a":1,"a":2}',
        "[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]",
        '"\\u0000"',
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    field=st.sampled_from(
        ["x402Version", "validAfter", "validBefore", "value", "from", "nonce", "signature", "payload"]
    ),
    fragment=raw_fragments,
    encode=st.sampled_from(["standard", "urlsafe", "unpadded", "latin-1"]),
)
def test_any_json_text_in_a_header_is_a_token_or_not(field, fragment, encode):
    text = json.dumps(signed_once(), separators=(",", ":"))
    marker = f'"{field}":'
    start = text.index(marker) + len(marker)
    end = start + len(json.dumps(_dig(signed_once(), field), separators=(",", ":")))
    raw = (text[:start] + fragment + text[end:]).encode("utf-8", "surrogatepass")
    value = {
        "standard": base64.b64encode(raw).decode(),
        "urlsafe": base64.urlsafe_b64encode(raw).decode(),
        "unpadded": base64.b64encode(raw).decode().rstrip("="),
        "latin-1": raw.decode("latin-1"),
    }[encode]
    token = tokens.from_header(value, "PAYMENT-SIGNATURE")
    if token is not None:
        assert fragment in ("1.0", "2.0", "-0", '"\\u0000"') or field == "payload"
        try:
            tokens.check(token, DEMO_PRICE, RESOURCE)
        except tokens.Rejection:
            pass
        json.dumps(token.payload, allow_nan=False).encode("utf-8")  # storable and sendable as it is


def _dig(document: dict, field: str):
    if field in document:
        return document[field]
    inner = document["payload"]
    return inner[field] if field in inner else inner["authorization"][field]


def test_a_whole_number_float_is_the_integer_and_the_same_token():
    document = signed_once()
    as_float = {**document, "x402Version": 2.0, "accepted": {**document["accepted"], "maxTimeoutSeconds": 300.0}}
    token, same = tokens.from_object(document, "metadata"), tokens.from_object(as_float, "metadata")
    assert same is not None and same.version == 2 and type(same.payload["x402Version"]) is int
    assert type(same.payload["accepted"]["maxTimeoutSeconds"]) is int
    assert same.digest == token.digest
    assert tokens.nonce_key(same, DEMO_PRICE.asset) == tokens.nonce_key(token, DEMO_PRICE.asset)
    header = base64.b64encode(json.dumps(document).replace('"x402Version": 2', '"x402Version": 2.0').encode()).decode()
    assert tokens.from_header(header, "PAYMENT-SIGNATURE").digest == token.digest
    for bad in (2.5, float("inf"), float("nan"), 2.0**60, True, "2"):
        assert tokens.from_object({**document, "x402Version": bad}, "metadata") is None, bad
    for odd in (float("inf"), float("nan"), 0.5, 10**20, "\ud800", [[[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]]):
        assert tokens.from_object({**document, "extensions": {"x": odd}}, "metadata") is None, odd


def test_every_key_of_the_signed_payload_is_checked():
    document = signed_once()
    inner, auth = document["payload"], document["payload"]["authorization"]
    permit2 = {"permit2Authorization": {"from": auth["from"], "nonce": "1"}, "signature": inner["signature"]}
    cases = {
        "unsupported_payload": [
            {**document, "payload": permit2},
            {**document, "payload": {**permit2, "authorization": auth}},  # a decoy beside a Permit2 authorization
            {**document, "payload": {"signature": inner["signature"]}},
        ],
        "invalid_payload": [
            {**document, "payload": {**inner, "extra": "x"}},
            {**document, "payload": {**inner, "authorization": {**auth, "extra": "x"}}},
            {**document, "payload": {"authorization": auth}},
            {**document, "payload": {**inner, "authorization": {k: v for k, v in auth.items() if k != "validAfter"}}},
            {**document, "payload": {**inner, "authorization": {**auth, "validBefore": "0" + auth["validBefore"]}}},
            {**document, "payload": {**inner, "authorization": {**auth, "validBefore": " " + auth["validBefore"]}}},
            {**document, "payload": {**inner, "authorization": {**auth, "validAfter": int(auth["validAfter"])}}},
            {**document, "payload": {**inner, "authorization": {**auth, "from": "not an address"}}},
            {**document, "payload": {**inner, "signature": "0x123"}},
            {**document, "surprise": True},
            {**document, "accepted": {**document["accepted"], "surprise": 1}},
        ],
    }
    for reason, documents in cases.items():
        for case in documents:
            token = tokens.from_object(case, "metadata")
            assert token is not None
            try:
                tokens.check(token, DEMO_PRICE, RESOURCE)
            except tokens.Rejection as exc:
                assert exc.reason == reason, (reason, case)
            else:
                raise AssertionError(f"accepted: {case}")


def test_a_window_too_short_to_collect_is_refused():
    token = tokens.from_object(signed_once(), "metadata")
    valid_before = int(token.authorization["validBefore"])
    tokens.check_window(token, now=valid_before - 100, min_window=100)
    try:
        tokens.check_window(token, now=valid_before - 99, min_window=100)
    except tokens.Rejection as exc:
        assert exc.reason == "payment_window_too_short"
    else:
        raise AssertionError("a 99 s window passed a 100 s minimum")


def test_brackets_inside_strings_do_not_make_a_token_too_deep():
    document = {**signed_once(), "resource": {**signed_once()["resource"], "description": "[beta] {v2} " * 40}}
    header = base64.b64encode(json.dumps(document).encode()).decode()
    assert tokens.from_header(header, "PAYMENT-SIGNATURE").payload == document


def test_every_wrapping_of_one_authorization_is_one_nonce_key():
    """v1 or v2, any spelling the checks let through: one EVM authorization is one claim."""
    document = signed_once()
    inner, auth = document["payload"], document["payload"]["authorization"]
    v1 = {"x402Version": 1, "scheme": "exact", "network": "base-sepolia", "payload": inner}
    shouting = {
        **document,
        "payload": {
            **inner,
            "authorization": {
                **auth,
                "from": auth["from"].upper().replace("0X", "0x"),
                "nonce": auth["nonce"].upper().replace("0X", "0x"),
            },
        },
    }
    keys = {tokens.nonce_key(tokens.from_object(d, "metadata"), DEMO_PRICE.asset) for d in (document, v1, shouting)}
    assert len(keys) == 1


def test_a_tokens_digest_never_changes():
    """A claim made before an upgrade must be found by the same token after it: the digest of a
    fixed payload (non-ASCII included) is pinned, built from the header and from the metadata alike."""
    import base64
    import json

    from gate import tokens

    payload = {
        "x402Version": 2,
        "accepted": {
            "scheme": "exact",
            "network": "eip155:84532",
            "asset": "0x036cbd53842c5426634e7929541ec2318f3dcf7e",
            "amount": "1000",
            "payTo": "0x" + "22" * 20,
        },
        "payload": {
            "signature": "0x" + "ab" * 65,
            "authorization": {
                "from": "0x" + "11" * 20,
                "to": "0x" + "22" * 20,
                "value": "1000",
                "validAfter": "0",
                "validBefore": "1900000000",
                "nonce": "0x" + "cd" * 32,
            },
        },
        "resource": {"url": "http://gate.test/a2a/é"},
    }
    pinned = "4745e7975c45910b420a19f8164e2aea5f6adf26fa4439b697efd69c75859c23"
    header = tokens.from_header(base64.b64encode(json.dumps(payload).encode()).decode(), "PAYMENT-SIGNATURE")
    from_metadata = tokens.from_object(payload, "metadata")
    assert header is not None and from_metadata is not None
    assert header.digest == from_metadata.digest == pinned
    assert tokens.Token(payload=payload, version=2, source="metadata").digest == pinned


def _as_text(document, ascii_only: bool) -> str:
    return json.dumps(document, allow_nan=True, ensure_ascii=ascii_only)


@settings(max_examples=400, deadline=None)
@given(
    field=st.sampled_from(["x402Version", "value", "nonce", "signature", "payload", "extra", "amount"]),
    value=json_values,
    ascii_only=st.booleans(),
)
def test_a_header_read_without_normalising_is_the_token_the_normalising_path_makes(field, value, ascii_only):
    """A header of plain ASCII JSON skips `normalise` (its numbers are read in normal form as they
    are parsed): the token, its payload and its digest are exactly those of the normalising path,
    for any value anywhere in it, or both paths say "no token"."""
    document = json.loads(json.dumps(signed_once()))
    if field in ("x402Version", "payload"):
        document[field] = value
    elif field in ("extra", "amount"):
        document["accepted"][field] = value
    else:
        document["payload"]["authorization"][field] = value
    try:
        text = _as_text(document, ascii_only)
    except (ValueError, UnicodeEncodeError):
        return
    raw = text.encode("utf-8", "surrogatepass")
    header = tokens.from_header(base64.b64encode(raw).decode(), "PAYMENT-SIGNATURE")
    try:
        parsed = json.loads(raw, object_pairs_hook=tokens._refuse_duplicates)
    except (ValueError, RecursionError, tokens.NotAToken):
        assert header is None
        return
    slow = tokens.from_object(parsed, "PAYMENT-SIGNATURE")
    assert (header is None) == (slow is None), (header, slow)
    if header is not None:
        assert header.payload == slow.payload and header.version == slow.version
        assert header.canonical == slow.canonical and header.digest == slow.digest
        assert [type(v) for v in _leaves(header.payload)] == [type(v) for v in _leaves(slow.payload)]


def _leaves(value):
    if isinstance(value, dict):
        for k in sorted(value):
            yield from _leaves(value[k])
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


ascii_text = st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=8)  # DEL and the controls too


@settings(max_examples=400, deadline=None)
@given(document=st.dictionaries(odd_text | ascii_text, json_values | ascii_text, max_size=6))
@example(document={"k\x7f": "\x7f"})
@example(document={"\x1f": ["\u00e9", '\x00\n\t\\"/']})
def test_the_canonical_json_is_the_standard_librarys_for_any_value_in_normal_form(document):
    """The digest's bytes never change: built with orjson where it writes the same, else the standard library."""
    try:
        normal = tokens.normalise(document)
    except (tokens.NotAToken, RecursionError):
        return
    expected = json.dumps(normal, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert tokens.canonical_json(normal) == expected


def nested(depth: int, wide: int) -> Any:
    """A value `depth` levels deep (the innermost a string), beside `wide` empty-ish containers at
    each level: more brackets than `tokens.MAX_DEPTH`, however shallow."""
    value: Any = "deep"
    for level in range(depth):
        siblings = {f"s{i}": [{"k": i}] for i in range(wide)}
        value = {"v": value, **siblings} if level % 2 else [value, *siblings.values()]
    return value


@settings(max_examples=200, deadline=None)
@given(depth=st.integers(min_value=0, max_value=tokens.MAX_DEPTH + 3), wide=st.integers(min_value=0, max_value=3))
def test_a_header_with_many_brackets_reads_as_the_same_token_as_its_object(depth: int, wide: int) -> None:
    """The header's fast path (a payment carrying a 402's extensions back has dozens of brackets)
    answers exactly what the full walk answers: the same token, or none when it nests too deep."""
    document = {**signed_once(), "extensions": {"x": nested(depth, wide)}}
    header = base64.b64encode(json.dumps(document).encode()).decode()
    fast, walked = tokens.from_header(header, "PAYMENT-SIGNATURE"), tokens.from_object(document, "metadata")
    if walked is None:
        assert fast is None
    else:
        assert fast is not None and (fast.payload, fast.digest) == (walked.payload, walked.digest)


def test_nests_within_counts_as_normalise_does() -> None:
    for depth in range(tokens.MAX_DEPTH + 4):
        value = nested(depth, 1)
        try:
            tokens.normalise(value)
        except tokens.NotAToken:
            normal = False
        else:
            normal = True
        assert tokens.nests_within(value, tokens.MAX_DEPTH) is normal, depth


HEADER_CHARS = "A/+-_=.~ \t\n\r\x00é" + "\u0130"  # the alphabet's edges, the urlsafe pair, padding, space, non-ASCII


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(
        st.tuples(
            st.integers(0, 10_000), st.sampled_from(["insert", "replace", "delete"]), st.sampled_from(HEADER_CHARS)
        ),
        max_size=3,
    ),
    padding=st.sampled_from(["", "=", "==", "==="]),
)
@example(edits=[], padding="")
def test_a_header_decodes_exactly_where_the_standard_librarys_strict_base64_does(edits, padding):
    """The header's base64 is read as `base64.b64decode(validate=True)` reads it (the standard alphabet,
    padded, nothing else): whatever another codec does, a header that decoder refuses is no token, and
    one it reads is the token its bytes hold."""
    value = encode_header(signed_once()).rstrip("=") + padding
    for position, how, char in edits:
        at = position % (len(value) + 1)
        if how == "insert":
            value = value[:at] + char + value[at:]
        elif how == "replace":
            value = value[:at] + char + value[at + 1 :]
        else:
            value = value[:at] + value[at + 1 :]
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except ValueError:  # binascii.Error, and a str that is not ASCII
        raw = None
    token = tokens.from_header(value, "PAYMENT-SIGNATURE")
    if raw is None:
        assert token is None
        return
    try:
        document = json.loads(raw)
    except ValueError:
        document = None
    expected = tokens.from_object(document, "PAYMENT-SIGNATURE") if document is not None else None
    if expected is None:
        assert token is None
    else:
        assert token is not None and token.payload == expected.payload and token.digest == expected.digest
