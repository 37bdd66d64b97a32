"""`serve --dev-facilitator PORT` with PORT taken stops, in one line, and leaves no child behind.

What holds the port may answer `/healthz` as a facilitator would (another development
facilitator, another gate's child): serving on would use that process's ledger without a word
and report it ready, while its own child, unable to bind, is left a zombie.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.gate_process import free_port
from tests.system.test_serve_lifecycle import CONFIG, children  # the priced gate and the /proc walk those tests use


def serve(tmp_path: Path, facilitator_port: int) -> tuple[subprocess.Popen[str], int]:
    config = tmp_path / "gate.toml"
    config.write_text(CONFIG)
    port = free_port()
    command = [sys.executable, "-m", "gate.cli", "serve", "--config", str(config), "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--dev-facilitator", str(facilitator_port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    return process, port


def refused(process: subprocess.Popen[str], port: int, facilitator_port: int) -> str:
    """The serve process exits non-zero within the wait, never having served; its stderr."""
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:
        try:
            ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
        except httpx.HTTPError:
            time.sleep(0.2)
            continue
        zombies = [pid for pid in children(process.pid) if "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]]
        process.kill()
        process.wait()
        pytest.fail(f"serve runs on another process's facilitator: /readyz {ready.text}, zombie children {zombies}")
    if process.poll() is None:
        process.kill()
        process.wait()
        pytest.fail("serve neither served nor stopped within 60 s")
    _, stderr = process.communicate()
    assert process.returncode != 0, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(facilitator_port) in errors[0], stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    return errors[0]


@pytest.fixture
def linux() -> None:
    if not Path("/proc/self/task").exists():
        pytest.skip("needs Linux /proc to see the child processes")


def test_a_port_held_by_another_facilitator_is_refused(linux: None, tmp_path: Path) -> None:
    facilitator_port = free_port()
    other = subprocess.Popen(
        [sys.executable, "-m", "devnet", "facilitator", "--port", str(facilitator_port), "--db", "other.ledger"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert other.poll() is None and time.monotonic() < deadline, "the other facilitator did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{facilitator_port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        process, port = serve(tmp_path, facilitator_port)
        line = refused(process, port, facilitator_port)
        assert "in use" in line, line
        # the other facilitator is untouched
        assert other.poll() is None
        assert httpx.get(f"http://127.0.0.1:{facilitator_port}/healthz", timeout=5).status_code == 200
    finally:
        other.terminate()
        other.wait(15)


def test_a_port_held_by_anything_is_refused(linux: None, tmp_path: Path) -> None:
    """A listener that answers nothing: refused at once, not after the facilitator's own failure."""
    with socket.create_server(("127.0.0.1", 0)) as holder:
        facilitator_port = holder.getsockname()[1]
        process, port = serve(tmp_path, facilitator_port)
        line = refused(process, port, facilitator_port)
        assert "in use" in line, line
