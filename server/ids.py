"""Random bytes for the ids the server mints (tasks, contexts, messages, requests), read from the
operating system's CSPRNG in blocks.

`os.urandom` gives up the GIL on every call (getrandom may block before the kernel's pool is
ready), and a thread waiting for it (the SQLite store's writer or checkpointer) then takes the
event loop's turn: six ids a request were six chances to wait out another thread. A block of
4 KiB serves 256 ids of 16 bytes per call. A forked child starts with a block of its own.
"""

from __future__ import annotations

import os

BLOCK = 4096

_block = b""
_at = 0


def random_bytes(n: int) -> bytes:
    """`n` (at most BLOCK) bytes of `os.urandom`, each byte handed out once."""
    global _block, _at
    if _at + n > len(_block):
        _block, _at = os.urandom(BLOCK), 0
    start, _at = _at, _at + n
    return _block[start:_at]


def _forget() -> None:
    global _block, _at
    _block, _at = b"", 0


os.register_at_fork(after_in_child=_forget)  # never the parent's bytes twice
