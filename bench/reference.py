"""Another commit's gate, for `python -m bench --against REF`: its tree and its own venv.

The tree is `git archive REF` unpacked into a cache directory keyed by the full commit
(``~/.cache/a2a-gate-bench/<sha>/src``, or ``$A2A_GATE_BENCH_CACHE``), the venv beside it
with that tree's own dependencies installed (``pip install -e src[bench]``, plus uvloop
and httptools for the faster stack). Built once, reused by every later run; nothing is
registered in the repository (no worktree to clean up).

`build` is the builder itself, for any commit, cache directory and install: the
rolling-upgrade test builds the previous release with it (tests/support/previous_release.py,
a production install with no extras). Only the gate's own distribution goes into the venv:
the development network (./devnet) the benchmark needs runs from this tree's interpreter
(bench/servers.py, `facilitator`), never from the other commit's.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.servers import REPO


@dataclass(frozen=True)
class Reference:
    commit: str  # the full hash
    short: str
    src: Path  # the tree whose server/ and gate/ run
    python: Path  # its venv's interpreter
    module: str = "gate.cli"  # its `a2a-gate` command, as `python -m` runs it


def cli_module(src: Path) -> str:
    """The module of a tree's `a2a-gate` script ([project.scripts]; it moved between commits)."""
    import tomllib

    scripts = tomllib.loads((src / "pyproject.toml").read_text()).get("project", {}).get("scripts", {})
    return scripts.get("a2a-gate", "gate.cli:main").partition(":")[0]


def cache_root() -> Path:
    return Path(os.environ.get("A2A_GATE_BENCH_CACHE") or Path.home() / ".cache" / "a2a-gate-bench")


def git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=True, timeout=120).stdout


def build(
    commit: str,
    home: Path,
    *,
    extras: str = "",
    editable: bool = False,
    also: tuple[str, ...] = (),
    log: Callable[[str], object] = lambda line: None,
) -> Path:
    """`commit`'s tree (`git archive`) in `home`/src and a venv in `home`/venv with it installed,
    built once (`home`/ready marks it done) and reused; the venv's interpreter.

    `extras`: the tree's extras to install with it ("bench"; "" for a production install);
    `editable`: `pip install -e`; `also`: more requirements for the same venv;
    `log`: told once when it builds.
    """
    src, venv = home / "src", home / "venv"
    python = venv / "bin" / "python"
    ready = home / "ready"
    if ready.exists():
        return python
    log(f"building {commit[:7]} in {home} (once) ...")
    home.mkdir(parents=True, exist_ok=True)
    if not (src / "pyproject.toml").exists():
        with tarfile.open(fileobj=io.BytesIO(git("archive", "--format=tar", commit))) as archive:
            archive.extractall(src, filter="data")
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    tree = f"{src}[{extras}]" if extras else str(src)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *(["-e"] if editable else []), tree, *also],
        check=True,
        timeout=1200,
    )
    ready.write_text(commit + "\n")
    return python


def prepare(ref: str, log: Callable[[str], object] = print) -> Reference:
    """The tree and venv of `ref` (a commit, branch or tag of this repository), built if missing."""
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}").decode().strip()
    home = cache_root() / commit
    python = build(commit, home, extras="bench", editable=True, also=("uvloop", "httptools"), log=log)
    src = home / "src"
    return Reference(commit, commit[:7], src, python, cli_module(src))
