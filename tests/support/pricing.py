"""Usage pricing callables for tests (``usage = { callable = "tests.support.pricing:NAME" }``)."""

from __future__ import annotations


def per_chunk(usage: dict[str, int | float]) -> int:
    """100 atomic units per chunk, plus 1 per character."""
    return 100 * int(usage.get("chunks", 0)) + int(usage.get("characters", 0))


def raises(usage: dict[str, int | float]) -> int:
    raise RuntimeError("pricing bug")


def not_a_number(usage: dict[str, int | float]) -> str:
    return "12"
