"""The examples of the README and docs/paying.md, run as they stand.

Each example is a fenced block after a `<!-- file: NAME -->` line. A test takes it unchanged
but for the addresses: the README's gate listens on port 8000 and its development facilitator on
8402, the test's on free loopback ports. The TypeScript example's packages are installed once,
with the page's own `npm install` line, into `build/readme-typescript` (npm's cache beside it, in
`build/npm-cache`), and reused while that line stays the same.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import httpx
import pytest

from tests.support.gate_process import free_port, serving
from tests.support.services import in_ci

ROOT = Path(__file__).parents[2]
BLOCK = re.compile(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)```", re.DOTALL)
TYPESCRIPT_CACHE = ROOT / "build" / "readme-typescript"
NPM_CACHE = ROOT / "build" / "npm-cache"
# what the test adds to the page's packages: the compiler, to type-check the example as a reader's tsc would
TYPE_CHECKER = ("typescript@5", "@types/node@20")


def examples(page: str) -> dict[str, str]:
    """Every example of a page (`README.md`, `docs/paying.md`), by its name."""
    return dict(BLOCK.findall((ROOT / page).read_text(encoding="utf-8")))


def example(page: str, name: str) -> str:
    found = examples(page)
    assert name in found, f"{page} has no example named {name} (it has {sorted(found)})"
    return found[name]


def unavailable(reason: str) -> NoReturn:
    """A tool the example needs is missing: skip with the reason, fail where CI is set."""
    if in_ci():
        pytest.fail(f"{reason} (CI={os.environ['CI']}: the documentation's examples must run)", pytrace=False)
    pytest.skip(reason)


@dataclass
class DevGate:
    """`a2a-gate serve --dev-facilitator` on the embedded defaults, as the README's first command."""

    folder: Path  # its working directory: the database and the ledger, where the README's commands run
    port: int
    facilitator_port: int
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def facilitator(self) -> str:
        return f"http://127.0.0.1:{self.facilitator_port}"

    def localize(self, text: str) -> str:
        """The example with this gate's ports for the README's 8000 and 8402."""
        for host in ("localhost", "127.0.0.1"):
            text = text.replace(f"{host}:8000", f"{host}:{self.port}").replace(
                f"{host}:8402", f"{host}:{self.facilitator_port}"
            )
        return text

    def shell(self, script: str, *, cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """Run a script with bash, as a reader's terminal would: the virtualenv first on PATH."""
        return subprocess.run(
            ["bash", "-eu", "-o", "pipefail", "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or self.folder,
            env=self.env,
        )

    def claim_channels(self) -> str:
        """`a2a-gate channels claim` in the gate's folder: every charged voucher claimed on chain now, so
        no claim lands later, on the schedule, between a test's two readings of a balance."""
        run = self.shell(f"a2a-gate channels claim --facilitator {self.facilitator}")
        assert run.returncode == 0, f"exit {run.returncode}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}"
        assert "0 left with unclaimed charges" in run.stdout, run.stdout
        return run.stdout

    def python(self, name: str, source: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Save a Python example under its name in the gate's folder and run `python NAME`."""
        (self.folder / name).write_text(self.localize(source))
        return self.shell(f"python {name}", **kwargs)  # type: ignore[arg-type]

    def balance(self, *addresses: str) -> dict[str, int]:
        """Balances of the price's asset on the development chain (the facilitator's ledger)."""
        query = "&".join(f"address={a}" for a in addresses)
        ledger = httpx.get(f"{self.facilitator}/dev/ledger?{query}", timeout=10).json()
        return {address: int(amount) for address, amount in ledger["balances"].items()}


def reader_env() -> dict[str, str]:
    """The test's environment with this virtualenv first on PATH and no gate configuration named."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2A_GATE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    return env


@contextmanager
def dev_gate(folder: Path) -> Iterator[DevGate]:
    """The README's first command (`a2a-gate serve --dev-facilitator PORT`) on free ports, in `folder`."""
    port, facilitator_port = free_port(), free_port()
    env = reader_env()
    gate = DevGate(folder, port, facilitator_port, env)
    command = ["a2a-gate", "serve", "--port", str(port), "--dev-facilitator", str(facilitator_port)]
    with serving(command, folder / "serve.log", gate.url, cwd=folder, env=env):
        yield gate


def command_line(script: str, starts: str) -> str:
    """The one line of a shell example that starts with `starts` (`npm install`, `npx tsx`)."""
    lines = [line.strip() for line in script.splitlines() if line.strip().startswith(starts)]
    assert len(lines) == 1, f"the example has {len(lines)} lines starting with {starts!r}: {script}"
    return lines[0]


def npm_env() -> dict[str, str]:
    return {
        **reader_env(),
        "npm_config_cache": str(NPM_CACHE),
        "npm_config_fund": "false",
        "npm_config_audit": "false",
        "npm_config_update_notifier": "false",
    }


def npm_installed(folder: Path, lines: list[str], tools: tuple[str, ...] = ("node", "npm")) -> Path:
    """`folder`, where the shell `lines` (npm installs) ran once: again only when the lines change.

    Under a lock (two test workers may ask at once); reused after. An npm that cannot install (no
    registry) skips the test, or fails it where CI is set.
    """
    for tool in tools:
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed: the JavaScript packages need Node 20 and npm")
    folder.mkdir(parents=True, exist_ok=True)
    stamp = folder / "installed"
    wanted = "".join(f"{line}\n" for line in lines)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == wanted and (folder / "node_modules").is_dir():
            return folder
        shutil.rmtree(folder)
        folder.mkdir()
        # the reader's fresh folder; a package.json keeps npm from taking a parent folder for the project
        (folder / "package.json").write_text("{}\n")
        for line in lines:
            try:
                done = subprocess.run(
                    ["bash", "-eu", "-c", line],
                    capture_output=True,
                    text=True,
                    timeout=600,
                    cwd=folder,
                    env=npm_env(),
                )
            except subprocess.TimeoutExpired:
                unavailable(f"`{line}` did not finish in 600 s (no npm registry?)")
            if done.returncode != 0:
                said = [each for each in done.stderr.splitlines() if each.startswith("npm error")][:3]
                unavailable(f"`{line}` failed (no npm registry?): {' / '.join(said) or done.stderr[-800:]}")
        stamp.write_text(wanted)
    return folder


def typescript_packages(install: str) -> Path:
    """The folder holding the packages the page's `npm install` line installs (and the type checker)."""
    type_checker = f"npm install --no-save {' '.join(TYPE_CHECKER)}"
    return npm_installed(TYPESCRIPT_CACHE, [install, type_checker], ("node", "npm", "npx"))


def typescript_project(packages: Path, into: Path, name: str, source: str) -> Path:
    """A project folder as the page's reader has it: the program, its package.json, its node_modules."""
    into.mkdir(parents=True, exist_ok=True)
    shutil.copy(packages / "package.json", into / "package.json")
    (into / "node_modules").symlink_to(packages / "node_modules", target_is_directory=True)
    (into / name).write_text(source)
    return into
