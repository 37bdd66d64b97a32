"""A request header by name, without the exception a missing one costs.

Starlette's `Headers.get` is `Mapping.get`: a missing header raises `KeyError` inside it, caught
again, a few microseconds on paths where the usual header is missing (no `Authorization` on an
anonymous request, no `A2A-Version` from a v0.3 client, no payment header before a 402).
"""

from __future__ import annotations

from starlette.datastructures import Headers


def header(headers: Headers, name: str) -> str | None:
    """The first value of header `name` (any case), as `headers.get(name)` answers it."""
    key = name.lower().encode("latin-1")
    for raw_name, raw_value in headers.raw:
        if raw_name == key:
            return raw_value.decode("latin-1")
    return None


def values(headers: Headers, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """Every (name, value) of the headers in `names`, in the order `names` lists them, then as sent."""
    keys = [name.lower().encode("latin-1") for name in names]
    found = [(raw_name, raw_value) for raw_name, raw_value in headers.raw if raw_name in keys]
    return [(name, v.decode("latin-1")) for name, key in zip(names, keys, strict=True) for k, v in found if k == key]
