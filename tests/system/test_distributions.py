"""The two distributions of this repository, built as pip builds them: the gate's (`pip install .`,
what deploy/Dockerfile installs) carries nothing of the development network, and the development
network's (`pip install ./devnet`, distribution `a2a-gate-devnet`) carries all of it.

Each wheel is built from a copy of the checkout (`pip wheel --no-deps --no-build-isolation`, with the
setuptools the `test` extra installs): setuptools keeps what an earlier build left in `build/lib` and
packs it again, so a build in the checkout itself could pass or fail on a stale file.
"""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parents[2]
DEVNET = ROOT / "devnet"
# what a checkout holds besides its sources: virtualenvs, build output, caches, databases
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache",
    ".ruff_cache", "node_modules", "*.db", "*.db-*", "*.ledger", "*.ledger-*",
)  # fmt: skip


def build_wheel(project: Path, out: Path) -> zipfile.ZipFile:
    """`pip wheel` of `project` (a folder holding a pyproject.toml) into `out`; the wheel, opened."""
    run = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out), "."],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.message_from_bytes(wheel.read(name))


def entry_points(wheel: zipfile.ZipFile) -> str:
    names = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    return wheel.read(names[0]).decode() if names else ""


def requirements(texts: list[str]) -> list[tuple[str, list[str], str, str]]:
    """Requirements in one spelling (the wheel's metadata sorts a requirement's extras)."""
    parsed = (Requirement(t) for t in texts)
    return sorted((canonicalize_name(r.name), sorted(r.extras), str(r.specifier), str(r.marker or "")) for r in parsed)


def unconditional(message: email.message.Message) -> set[str]:
    """The names of what installing the wheel installs (requirements outside any extra)."""
    return {
        name for name, _, _, marker in requirements(message.get_all("Requires-Dist") or []) if "extra" not in marker
    }


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("checkout") / "a2a-gate"
    shutil.copytree(ROOT, copy, ignore=NOT_SOURCES)
    return copy


def test_the_production_wheel_carries_no_development_network(checkout: Path, tmp_path: Path) -> None:
    wheel = build_wheel(checkout, tmp_path)
    names = wheel.namelist()
    assert any(n.startswith("gate/") for n in names) and any(n.startswith("server/") for n in names), names
    tops = sorted({n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")})
    assert tops == ["gate", "server"], tops
    assert not [n for n in names if "devnet" in n], [n for n in names if "devnet" in n]
    assert "a2a-gate-devnet" not in entry_points(wheel)
    assert "a2a-gate = gate.cli:main" in entry_points(wheel)
    message = metadata(wheel)
    assert message["Name"] == "a2a-gate"
    required = unconditional(message)
    assert not {"x402", "eth-account", "a2a-gate-devnet"} & required, required
    assert "dev" not in (message.get_all("Provides-Extra") or [])


def test_the_development_networks_wheel_carries_all_of_it(checkout: Path, tmp_path: Path) -> None:
    wheel = build_wheel(checkout / "devnet", tmp_path)
    names = set(wheel.namelist())
    sources = {str(p.relative_to(DEVNET)) for p in (DEVNET / "devnet").rglob("*.py")}
    assert sources and {"devnet/__init__.py", "devnet/__main__.py", "devnet/cli.py"} <= sources
    assert sources <= names, sorted(sources - names)
    assert not [n for n in names if n.startswith(("gate/", "server/", "tests/"))]
    assert "a2a-gate-devnet = devnet.cli:main" in entry_points(wheel)
    message = metadata(wheel)
    assert message["Name"] == "a2a-gate-devnet"
    declared = tomllib.loads((DEVNET / "pyproject.toml").read_text())["project"]["dependencies"]
    assert requirements(message.get_all("Requires-Dist") or []) == requirements(declared)
    assert {"x402", "eth-account"} <= unconditional(message)
