"""The benchmark's stack switch, loaded by Python at start-up from PYTHONPATH (never by the product).

With ``A2A_BENCH_STACK=asyncio-h11`` uvloop and httptools cannot be imported, so uvicorn's
"auto" loop and protocol are asyncio and h11 in every server the benchmark starts, this
tree's gate, another commit's, the reference servers, and any worker process they spawn
(each inherits the environment). With ``uvloop-httptools``, or without the variable,
nothing is hidden and "auto" picks them when installed.
"""

from __future__ import annotations

import os
import sys

HIDDEN = ("uvloop", "httptools")


class HideFaster:
    """A meta path finder that refuses the faster stack's modules."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"{name} is hidden by the benchmark's asyncio-h11 stack", name=name)


if os.environ.get("A2A_BENCH_STACK") == "asyncio-h11":
    sys.meta_path.insert(0, HideFaster())  # type: ignore[arg-type]
