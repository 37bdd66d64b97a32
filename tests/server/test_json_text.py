"""server/json_text.py: whatever it writes reads back (with the standard library) as the value it was given."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from server import json_text

# what a stored task can hold: JSON a client sent (big integers, lone surrogates included) and what we add
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()


def documents(leaves: st.SearchStrategy) -> st.SearchStrategy:
    """JSON-shaped values (lists, string-keyed dicts) with these leaves."""
    return st.recursive(
        leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20
    )


values = documents(scalars)


@given(values)
def test_what_is_written_reads_back_the_same(value):
    assert json.loads(json_text.dumps(value)) == value
    assert json.loads(json_text.encode(value)) == value


def test_what_orjson_refuses_is_written_by_the_standard_library():
    for value in ({"amount": 2**70}, ["\ud800 lone"], {1: "a non-string key"}):
        text = json_text.dumps(value)
        assert json.loads(text) == json.loads(json.dumps(value))
        assert json_text.encode(value).decode("ascii") == text  # ASCII escapes, compact


def test_compact_and_utf8():
    assert json_text.encode({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()
    assert json_text.encode({"x": float("nan")}) == b'{"x":null}'
