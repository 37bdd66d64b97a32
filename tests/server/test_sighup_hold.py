"""`server.reload`: a SIGHUP that comes before the server can reload is held, then taken as one
reload the moment it can; after, SIGHUP is held again. In one process, with the real signal, sent
to the main thread: the test process has other threads (pytest-xdist's), and a signal sent to the
process goes to whichever thread does not hold it."""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest

from server.reload import hold_sighup, reloading_on_sighup


@pytest.fixture
def sighup_restored():
    """The test's own mask and handler back afterwards, whatever it held (pytest runs on)."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    handler = signal.getsignal(signal.SIGHUP)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a stray one, if a check below fails, ends nothing
    yield
    if signal.SIGHUP not in mask:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        signal.sigtimedwait([signal.SIGHUP], 0)  # drop a pending one before unblocking
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    signal.signal(signal.SIGHUP, handler)


def sighup() -> None:
    """SIGHUP to this (the main) thread, as the kernel gives a process's signal to a thread holding none."""
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGHUP)


def test_a_sighup_before_the_server_can_reload_is_held_then_taken_as_one_reload(sighup_restored):
    hold_sighup()
    sighup()
    sighup()  # two before it can: one reload (a signal is pending once)
    assert signal.SIGHUP in signal.sigpending()
    reloads: list[str] = []

    async def serving() -> None:
        with reloading_on_sighup(lambda: reloads.append("reload")):
            await asyncio.sleep(0.05)
            assert reloads == ["reload"], "the held SIGHUP is read as soon as the server can reload"
            sighup()
            await asyncio.sleep(0.05)
            assert reloads == ["reload", "reload"], "one sent while serving reloads at once"
        sighup()  # during the shutdown: held again, no reload, no end
        await asyncio.sleep(0.05)

    asyncio.run(serving())
    assert reloads == ["reload", "reload"]
    assert signal.SIGHUP in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    assert signal.SIGHUP in signal.sigpending()
