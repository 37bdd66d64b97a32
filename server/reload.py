"""SIGHUP: the configuration file read again while serving, with nothing drained.

What the anonymous path can take while serving (the payment gate: each agent's terms) it takes
from the next request on; the work in flight finishes as it began. The server's own settings
(its agents, listeners, store, limits) wait for a restart, and the log line says which. A file
that cannot be read, or that the path refuses, is refused whole: the server serves on with
what it loaded, and says why in one line. With `--workers N` the supervisor hands the signal
to each worker (`gate.processes`), so each reloads on its own, as replicas do.

A SIGHUP that comes before a process can reload (while it starts, while a worker is spawned) is
held, not fatal: `hold_sighup` blocks it first thing, every process started after inherits the
block, and `reloading_on_sighup` takes a held one as soon as it can, as one reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any

from server.config import Settings

# Settings fields that are the path's (it says what it takes of them) or say where they came from
_NOT_THE_SERVERS = frozenset({"sections", "anonymous", "source", "warnings"})


@dataclass(frozen=True)
class Reloaded:
    """What a reload applied now, and what in the file waits for a restart (key paths)."""

    applied: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)

    def line(self, source: str) -> str:
        applied = ", ".join(self.applied) or "no change taken now"
        waiting = f"; waiting for a restart: {', '.join(self.waiting)}" if self.waiting else ""
        return f"configuration reloaded from {source}: {applied}{waiting}"


def changed_fields(running: Any, read: Any, *, leaving: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """The names of the dataclass fields `read` changes from `running`, but those in `leaving`."""
    names = (f.name for f in fields(running) if f.name not in leaving)
    return [name for name in names if getattr(running, name) != getattr(read, name)]


def waiting_for_restart(running: Settings, read: Settings) -> list[str]:
    """The server's own settings `read` changes, by key path: only a restart applies them."""
    changed = changed_fields(running, read, leaving=_NOT_THE_SERVERS | {"agents"})
    for name in sorted(running.agents.keys() | read.agents.keys()):
        before, after = running.agents.get(name), read.agents.get(name)
        if before is None or after is None or _own(before) != _own(after):
            changed.append(f"agents.{name}")
    return changed


def _own(agent: Any) -> Any:
    """An agent's settings without the path's keys (its price is the path's to take)."""
    return replace(agent, sections={})


def hold_sighup() -> None:
    """Block SIGHUP in this thread, so one sent before the process can reload waits for
    `reloading_on_sighup` instead of ending it (its default action). A signal mask is inherited
    across fork and exec: every thread and process started after (uvicorn's workers) is born
    holding it, with no window before its own first instruction."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})


@contextlib.contextmanager
def reloading_on_sighup(reload: Callable[[], None]) -> Iterator[None]:
    """Call `reload` on the event loop when SIGHUP arrives, while inside; the previous handler is
    back on exit (SIGHUP ignored where it was the default action). A SIGHUP held until now
    (`hold_sighup`) is one reload, right away; on the way out SIGHUP is held again, so one during
    the shutdown ends nothing. Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    previous = signal.signal(signal.SIGHUP, lambda sig, frame: loop.call_soon_threadsafe(reload))
    held = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})  # a held one is delivered here
    try:
        yield
    finally:
        if signal.SIGHUP in held:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        # a thread started while serving does not hold it: the default action would end the process
        signal.signal(signal.SIGHUP, signal.SIG_IGN if previous == signal.SIG_DFL else previous)
