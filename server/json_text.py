"""Compact JSON text for what the server writes: stored tasks, answers, events.

orjson writes it (a task document in about a fifteenth of the standard library's time); what
orjson refuses and JSON can still say (an integer past 64 bits, a dict key that is not a
string, a lone surrogate a client sent) the standard library writes, with ASCII escapes. Either
way the text is compact, UTF-8, and reads back to the same values. Stored documents are read by
the standard library: orjson reads an integer past 64 bits as a float, which would change a stored
value (a request's body is orjson's only when it holds no such number: `server.jsonrpc.load_json`).
Digests are not made here: their bytes must never change (`gate.tokens`, `gate.pipeline`).
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def encode(value: Any) -> bytes:
    """`value` as compact JSON, UTF-8 (NaN and infinities as null, as orjson writes them)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # what orjson refuses: the standard library's ASCII text
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("ascii")


def dumps(value: Any) -> str:
    """`encode`, as text (for a stored document: the standard library's text, when it writes it,
    keeps a NaN as it always has)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, separators=(",", ":"))
