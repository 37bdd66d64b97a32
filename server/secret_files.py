"""Secrets from files: an operator need not put a secret in the process's plain environment.

Every secret the gate reads comes from an environment variable it names (the sealing key,
`PGPASSWORD`, the metrics token, a facilitator's or an upstream's credential). Two file forms
stand in for any such variable, so a secret can live in a file only its service may read:

- `NAME_FILE=/path`: the file's text is NAME's value (the convention Docker's official images
  and compose `secrets:` use: compose mounts a secret at /run/secrets/<name>);
- systemd credentials: a file called NAME in `$CREDENTIALS_DIRECTORY` (`LoadCredential=NAME:/path`
  in the unit), readable by this service alone, never in its environment block.

A variable that is set wins over both, and `NAME_FILE` over a credential. One trailing newline
is dropped (editors add one). Only the names the gate asks for are looked up: another
program's `*_FILE` variable is none of its business.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path

FILE_SUFFIX = "_FILE"
CREDENTIALS = "CREDENTIALS_DIRECTORY"
# read at start by every command: the sealing key, and libpq's password (it reads the variable itself)
AT_START = ("A2A_GATE_SEALING_KEY", "PGPASSWORD")


class SecretFileError(Exception):
    """A file that stands for a secret cannot be read: the message names the variable, never the value."""


def secret(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """NAME's value: the variable, else the file `NAME_FILE` names, else the credential NAME."""
    env = os.environ if environ is None else environ
    if env.get(name):
        return env[name]
    if env.get(name + FILE_SUFFIX):
        return _read(name + FILE_SUFFIX, Path(env[name + FILE_SUFFIX]))
    credentials = env.get(CREDENTIALS)
    if credentials:
        try:
            return _read(f"{CREDENTIALS}/{name}", Path(credentials) / name)
        except FileNotFoundError:
            return None
    return None


def load(names: Iterable[str] = AT_START, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Set each of `names` that only a file form holds, for readers of the variable itself (libpq,
    the workers a server starts); the names set."""
    env = os.environ if environ is None else environ
    loaded = []
    for name in names:
        if not env.get(name) and (value := secret(name, env)) is not None:
            env[name] = value
            loaded.append(name)
    return loaded


def _read(source: str, path: Path) -> str:
    try:
        text = path.read_text()
    except FileNotFoundError:
        if source.startswith(CREDENTIALS):
            raise  # no credential of that name: the variable is simply not given
        raise SecretFileError(f"{source}: {path} cannot be read (No such file or directory)") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SecretFileError(f"{source}: {path} cannot be read ({reason})") from None
    return text.removesuffix("\n").removesuffix("\r")
