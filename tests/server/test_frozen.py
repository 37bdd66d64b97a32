"""`evolve` copies a frozen dataclass with some fields changed exactly as `dataclasses.replace` does."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.frozen import evolve


@dataclass(frozen=True)
class Snapshot:
    name: str
    amount: int
    config: dict[str, Any]
    seen_at: float = 0.0
    tags: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Normalised:
    """One whose `__post_init__` derives a field: a copy must run it again."""

    address: str
    lowered: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "lowered", self.address.lower())


@dataclass(frozen=True, slots=True)
class Slotted:
    name: str
    amount: int


values = {
    "name": st.text(max_size=8),
    "amount": st.integers(),
    "config": st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    "seen_at": st.floats(allow_nan=False),
    "tags": st.lists(st.text(max_size=3), max_size=3),
}
snapshots = st.builds(Snapshot, **values)
changes = st.fixed_dictionaries({}, optional=values)


@given(snapshots, changes)
def test_a_copy_is_replaces_copy_and_the_original_stands(original: Snapshot, changed: dict[str, Any]) -> None:
    before = dataclasses.astuple(original)
    copy = evolve(original, **changed)
    assert type(copy) is Snapshot and copy == dataclasses.replace(original, **changed)
    assert dataclasses.astuple(original) == before
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.amount = 1  # type: ignore[misc]


def test_a_name_that_is_no_field_is_refused_as_replace_refuses_it() -> None:
    with pytest.raises(TypeError):
        evolve(Snapshot("a", 1, {}), amount=2, amont=3)


def test_a_post_init_runs_again_and_slots_are_copied() -> None:
    assert evolve(Normalised("0xABC"), address="0xDEF").lowered == "0xdef"
    assert evolve(Slotted("a", 1), amount=2) == Slotted("a", 2)
