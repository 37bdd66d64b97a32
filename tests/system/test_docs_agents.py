"""docs/agents.md says only what works: every example on it passes `check-config`, and the
upstream one serves through a real gate (the others are served by tests/server/test_python_agents.py
and tests/server/test_sdk_backend.py, from the same blocks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.docs_examples import examples, write_example
from tests.support.gate_helpers import artifact_texts, bearer, cli, create_key, result, v03_message
from tests.support.serve import serve_app
from tests.support.upstream_agents import build_upstream_app

EXAMPLES = sorted({name.partition("/")[0] for name in examples()})


def test_the_page_has_every_kind_of_agent() -> None:
    assert EXAMPLES == ["a2a-sdk", "callable", "priced", "streaming", "upstream"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_passes_check_config(tmp_path: Path, example: str) -> None:
    done = cli("check-config", str(write_example(example, tmp_path)), check=False)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_the_upstream_example_is_served(tmp_path: Path, start_gate) -> None:
    with serve_app(build_upstream_app("echo"), wait_on_exit=False) as upstream:
        config = write_example("upstream", tmp_path)
        config.write_text(config.read_text().replace("http://127.0.0.1:9001/", upstream + "/"))
        auth = bearer(create_key(config, "me"))
        gate = start_gate(config)
        task = result(f"{gate.url}/a2a/weather", "message/send", {"message": v03_message("hi")}, auth)
    assert task["status"]["state"] == "completed", task
    assert artifact_texts(task) == ["upstream echo: hi"]
