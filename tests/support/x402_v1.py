"""The x402 1.0 client (protocol v1), run from its own virtualenv: it pins x402<2, which cannot sit
beside the project's x402 2.x (`.ci/run` builds it; `X402_V1_PYTHON` names its interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

V1_PYTHON = Path(os.environ.get("X402_V1_PYTHON", "/tmp/x402v1-venv/bin/python"))
V1_CLIENT = Path(__file__).parent / "x402_v1_client.py"


def pay_with_x402_v1(url: str, key: str) -> dict[str, Any]:
    """What the x402 1.0 client's own request to `url`, paid with `key`, was answered: its status and body."""
    run = subprocess.run(
        [str(V1_PYTHON), str(V1_CLIENT), url, key], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert run.returncode == 0, run.stderr[-2000:]
    answer: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return answer
