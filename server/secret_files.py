"""Secrets from files: an operator need not put a secret in the process's plain environment.

Every secret the gate reads comes from an environment variable it names (the sealing key,
`PGPASSWORD`, the metrics token, a facilitator's or an upstream's credential). Two file forms
stand in for any such variable, so a secret can live in a file only its service may read:

- `NAME_FILE=/path`: the file's text is NAME's value (the convention Docker's official images
  and compose `secrets:` use: compose mounts a secret at /run/secrets/<name>);
- systemd credentials: a file called NAME in `$CREDENTIALS_DIRECTORY` (`LoadCredential=NAME:/path`
  in the unit), readable by this service alone, never in its environment block.

A variable that is set wins over both. One trailing newline is dropped (editors add one).
`load` copies the file forms into this process's environment once, at start, so every reader
(libpq's PGPASSWORD included) and every worker started after it sees one value.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

FILE_SUFFIX = "_FILE"
CREDENTIALS = "CREDENTIALS_DIRECTORY"


class SecretFileError(Exception):
    """A file that stands for a secret cannot be read: the message names the variable, never the value."""


def load(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Set each variable a `NAME_FILE` or a systemd credential stands for; the names set."""
    env = os.environ if environ is None else environ
    found: dict[str, Path] = {}
    credentials = env.get(CREDENTIALS)
    if credentials and Path(credentials).is_dir():
        found.update({p.name: p for p in sorted(Path(credentials).iterdir()) if p.is_file()})
    for key, value in list(env.items()):
        if key.endswith(FILE_SUFFIX) and len(key) > len(FILE_SUFFIX) and value:
            found[key.removesuffix(FILE_SUFFIX)] = Path(value)
    loaded = []
    for name, path in found.items():
        if env.get(name):
            continue
        env[name] = _read(name, path)
        loaded.append(name)
    return sorted(loaded)


def _read(name: str, path: Path) -> str:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SecretFileError(f"{name}{FILE_SUFFIX}: {path} cannot be read ({reason})") from None
    return text.removesuffix("\n").removesuffix("\r")
