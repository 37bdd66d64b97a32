"""The previous release's gate, for the rolling-upgrade test: its tree from `git archive` and
a production install of it (`pip install <tree>`, no extras) in a venv of its own, built once
under build/previous-release/<commit>/ and reused (by the benchmark's builder, bench/reference.py,
which builds `--against` commits the same way).

`PREVIOUS_RELEASE` is the last commit deployed as a release: a new release moves it forward
(docs/operations.md, "Upgrading and rolling back").
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.reference import build
from bench.servers import REPO

PREVIOUS_RELEASE = "c2b40b81fed0d6a0281427ead60d398bcf17beab"


@dataclass(frozen=True)
class Release:
    commit: str
    python: str  # its venv's interpreter: `python -m gate.cli` runs that release's gate
    home: Path  # a directory of its own to run it from (never this checkout: -m would find ours)


def built(commit: str = PREVIOUS_RELEASE) -> Release:
    """The release, built if missing; a clone without its commit (a shallow one) skips the test."""
    import pytest

    known = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"], check=False, timeout=60)
    if known.returncode != 0:
        pytest.skip(f"the previous release {commit[:7]} is not in this clone's history (a shallow clone?)")
    home = REPO / "build" / "previous-release" / commit
    python = build(commit, home)
    (home / "run").mkdir(exist_ok=True)
    return Release(commit, str(python), home / "run")
