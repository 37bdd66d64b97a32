"""The x402 JavaScript packages, installed by npm into a folder of `build/`, and a script run beside them.

Each folder is installed once per package list (a stamp names it), under a lock: two test workers
may ask at once. No node or npm registry: skipped, or failed where CI is set (`unavailable`).
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

from tests.support.readme_examples import ROOT, npm_env, unavailable


def installed(script: Path, packages: tuple[str, ...], folder: str) -> Path:
    """`script` copied beside `packages`, which npm installed into `build/<folder>`; its new path."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed: the JavaScript packages need Node 20 and npm")
    where = ROOT / "build" / folder
    wanted = " ".join(packages) + "\n"
    where.mkdir(parents=True, exist_ok=True)
    with open(where.parent / f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = where / "installed"
        if not (stamp.exists() and stamp.read_text() == wanted and (where / "node_modules").is_dir()):
            shutil.rmtree(where)
            where.mkdir()
            (where / "package.json").write_text("{}\n")
            try:
                done = subprocess.run(
                    ["npm", "install", "--no-save", *packages],
                    capture_output=True,
                    text=True,
                    timeout=600,
                    cwd=where,
                    env=npm_env(),
                )
            except subprocess.TimeoutExpired:
                unavailable("npm install did not finish in 600 s (no npm registry?)")
            if done.returncode != 0:
                unavailable(f"npm install failed (no npm registry?): {done.stderr[-800:]}")
            stamp.write_text(wanted)
    shutil.copy(script, where / script.name)  # resolved beside its node_modules
    return where / script.name
