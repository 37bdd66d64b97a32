"""docs/architecture.md's map holds one row per module of `server/` and `gate/`, and every test
file a row names is there: a module added, moved or renamed (or a test file) shows up here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
MAP = (ROOT / "docs" / "architecture.md").read_text()
ROWS = dict(re.findall(r"^\| `((?:server|gate)/[\w/]+\.py)` \|[^|]*\| (.*) \|$", MAP, re.M))


def modules() -> set[str]:
    found = {p.relative_to(ROOT).as_posix() for package in ("server", "gate") for p in (ROOT / package).rglob("*.py")}
    return {m for m in found if not (m.endswith("__init__.py") and not (ROOT / m).read_text().strip())}


def test_every_module_has_a_row_and_every_row_a_module() -> None:
    assert sorted(modules() - ROWS.keys()) == [], "modules without a row in docs/architecture.md"
    assert sorted(ROWS.keys() - modules()) == [], "rows for modules that are not there"


def test_every_test_file_a_row_names_is_there() -> None:
    named = {path for where in ROWS.values() for path in re.findall(r"`(tests/[\w/]+?)/?`", where)}
    assert named, "the rows name their tests"
    assert sorted(p for p in named if not (ROOT / p).exists() and not (ROOT / f"{p}.py").exists()) == []
