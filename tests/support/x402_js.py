"""The x402 JavaScript packages, installed by npm into a folder of `build/`, and a script run beside them.

Each folder is installed once per package list (`npm_installed`). No node or npm registry: skipped,
or failed where CI is set.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from tests.support.readme_examples import ROOT, npm_installed


def installed(script: Path, packages: tuple[str, ...], folder: str) -> Path:
    """`script` copied beside `packages`, which npm installed into `build/<folder>`; its new path."""
    where = npm_installed(ROOT / "build" / folder, [f"npm install --no-save {shlex.join(packages)}"])
    shutil.copy(script, where / script.name)  # resolved beside its node_modules
    return where / script.name
