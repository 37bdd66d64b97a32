"""A request header by name, without the exception a missing one costs.

Starlette's `Headers.get` is `Mapping.get`: a missing header raises `KeyError` inside it, caught
again, a few microseconds on paths where the usual header is missing (no `Authorization` on an
anonymous request, no `A2A-Version` from a v0.3 client, no payment header before a 402). The
raw names to look for are made once per name.
"""

from __future__ import annotations

from functools import lru_cache

from starlette.datastructures import Headers


@lru_cache(maxsize=256)
def _raw(name: str) -> bytes:
    return name.lower().encode("latin-1")


@lru_cache(maxsize=64)
def _raw_names(names: tuple[str, ...]) -> tuple[bytes, ...]:
    return tuple(_raw(name) for name in names)


def header(headers: Headers, name: str) -> str | None:
    """The first value of header `name` (any case), as `headers.get(name)` answers it."""
    key = _raw(name)
    for raw_name, raw_value in headers.raw:
        if raw_name == key:
            return raw_value.decode("latin-1")
    return None


def values(headers: Headers, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """Every (name, value) of the headers in `names`, in the order `names` lists them, then as sent."""
    keys = _raw_names(names)
    found = [(raw_name, raw_value) for raw_name, raw_value in headers.raw if raw_name in keys]
    if not found:
        return []
    return [(name, v.decode("latin-1")) for name, key in zip(names, keys, strict=True) for k, v in found if k == key]
