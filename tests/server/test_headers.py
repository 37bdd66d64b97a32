"""server/headers.py answers as Starlette's Headers would, without raising for a missing header."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from starlette.datastructures import Headers

from server.headers import header, values

names = st.sampled_from(["authorization", "a2a-version", "payment-signature", "x-payment", "a2a-extensions", "host"])
raw_headers = st.lists(st.tuples(names, st.text(alphabet="abcXYZ ,/:=0123456789", max_size=12)), max_size=8)


@given(raw_headers, names)
def test_a_header_is_what_headers_get_says(pairs, name):
    headers = Headers(raw=[(k.encode(), v.encode()) for k, v in pairs])
    assert header(headers, name) == headers.get(name)
    assert header(headers, name.upper()) == headers.get(name)


@given(raw_headers)
def test_values_are_in_the_order_the_names_are_given_then_as_sent(pairs):
    headers = Headers(raw=[(k.encode(), v.encode()) for k, v in pairs])
    wanted = ("A2A-Extensions", "X-Payment")
    expected = [(name, value) for name in wanted for value in headers.getlist(name)]
    assert values(headers, wanted) == expected
