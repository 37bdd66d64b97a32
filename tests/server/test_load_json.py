"""`server.jsonrpc.load_json` reads every body as the standard library alone reads it, or refuses it alike.

orjson reads first; a body it refuses, or one with a run of 19 digits, is the standard library's.
Compared by `repr`, which tells 1 from 1.0 and 0.0 from -0.0.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from server.jsonrpc import load_json, load_json_stdlib
from tests.server.test_json_text import documents, scalars

# what a client can send: tests/server/test_json_text.py's values, with integers near and past 64 bits more often
values = documents(scalars | st.integers(min_value=-(2**70), max_value=2**70))


def outcome(read: Any, body: bytes) -> str:
    try:
        return repr(read(body))
    except (ValueError, RecursionError) as exc:  # what parse_call turns into a parse error
        return f"refused ({type(exc).__name__})"


def same(body: bytes) -> None:
    fast, plain = outcome(load_json, body), outcome(load_json_stdlib, body)
    assert fast == plain or (fast.startswith("refused") and plain.startswith("refused")), (body, fast, plain)


@given(values, st.booleans(), st.sampled_from(["utf-8", "utf-16", "utf-32"]))
@example({"x": -(2**63) - 1}, True, "utf-8")  # below int64, 19 digits: orjson would read a float
@example({"x": 2**64}, True, "utf-8")  # past uint64, 20 digits: the same
@example({"x": 2**64 - 1, "y": -(2**63)}, True, "utf-8")  # the last integers orjson reads exactly
@example({"x": 1e308, "y": -0.0, "z": 5e-324}, True, "utf-8")
@example({"x": "\ud800"}, True, "utf-8")  # an escaped lone surrogate
def test_a_json_body_reads_as_the_standard_library_reads_it(value: Any, ascii_only: bool, encoding: str) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    same(text.encode(encoding, "surrogatepass"))
    same(("\ufeff" + text).encode("utf-8", "surrogatepass"))  # with a byte-order mark


@given(st.binary(max_size=200))
@example(b'{"a":1e400}')
@example(b'{"a":NaN}')
@example(b'{"a":"\x01"}')
@example(b'{"\xed\xa0\x80":1}')  # a surrogate in raw UTF-8 bytes
@example(b"[" * 2000 + b"]" * 2000)
def test_any_bytes_read_or_refused_alike(body: bytes) -> None:
    same(body)


@given(values, st.integers(min_value=0, max_value=400), st.binary(min_size=1, max_size=4))
def test_a_spliced_body_reads_or_is_refused_alike(value: Any, at: int, spliced: bytes) -> None:
    text = json.dumps(value).encode()
    at = at % (len(text) + 1)
    same(text[:at] + spliced + text[at:])
