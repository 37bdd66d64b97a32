"""The examples of docs/agents.md, as files: each fenced block after a `<!-- file: NAME -->` line.

Tests write them to a folder and serve them, so the page says only what works.
"""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).parents[2] / "docs" / "agents.md"
BLOCK = re.compile(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)```", re.DOTALL)


def examples() -> dict[str, str]:
    """Every example file of the page, by its name (`callable/gate.toml`)."""
    return dict(BLOCK.findall(DOC.read_text(encoding="utf-8")))


def write_example(folder: str, into: Path) -> Path:
    """Write the files of one example (`callable`) into `into`; returns its gate.toml."""
    found = {name: text for name, text in examples().items() if name.startswith(folder + "/")}
    assert f"{folder}/gate.toml" in found, f"docs/agents.md has no {folder}/gate.toml example"
    for name, text in found.items():
        path = into / name.removeprefix(folder + "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return into / "gate.toml"
