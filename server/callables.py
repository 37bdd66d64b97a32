"""An operator's code named in a configuration, ``module:attribute``, imported.

A module beside the configuration file is importable without PYTHONPATH: the file's
directory is put on the import path, after everything already there, so an installed
package (or the gate's own `server` and `gate`) is never shadowed by a file that
happens to share its name.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any


class NotLoadable(Exception):
    """A ``module:attribute`` that cannot be imported; the message says why, in one line."""


def add_import_path(directory: Path) -> None:
    """Make modules in `directory` importable (a configuration file's own directory)."""
    folder = str(directory)
    if folder not in sys.path:
        sys.path.append(folder)


def load(target: str) -> Any:
    """The object `target` (``package.module:name.attr``) names, or `NotLoadable`."""
    module_name, _, attribute = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # the module itself (or its package) is missing, not something it imports
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise NotLoadable(f"cannot import {module_name}: no such module on the import path") from None
        raise NotLoadable(f"cannot import {module_name}: {_one_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 -- whatever an operator's module raises at import is reported
        raise NotLoadable(f"cannot import {module_name}: {_one_line(exc)}") from None
    owner = module_name
    for name in attribute.split("."):
        if not hasattr(obj, name):
            raise NotLoadable(f"{owner} has no attribute {name!r}")
        obj, owner = getattr(obj, name), f"{owner}.{name}"
    return obj


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
