"""`server.reload`: a SIGHUP that comes before the server can reload is held, then taken as one
reload the moment it can; after, SIGHUP is held again. In one process, with the real signal."""

from __future__ import annotations

import asyncio
import os
import signal

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


def test_a_sighup_before_the_server_can_reload_is_held_then_taken_as_one_reload(sighup_restored):
    hold_sighup()
    os.kill(os.getpid(), signal.SIGHUP)
    os.kill(os.getpid(), signal.SIGHUP)  # two before it can: one reload (a signal is pending once)
    assert signal.SIGHUP in signal.sigpending()
    reloads: list[str] = []

    async def serving() -> None:
        with reloading_on_sighup(lambda: reloads.append("reload")):
            await asyncio.sleep(0.05)
            assert reloads == ["reload"], "the held SIGHUP is read as soon as the server can reload"
            os.kill(os.getpid(), signal.SIGHUP)
            await asyncio.sleep(0.05)
            assert reloads == ["reload", "reload"], "one sent while serving reloads at once"
        os.kill(os.getpid(), signal.SIGHUP)  # during the shutdown: held again, no reload, no end
        await asyncio.sleep(0.05)

    asyncio.run(serving())
    assert reloads == ["reload", "reload"]
    assert signal.SIGHUP in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    assert signal.SIGHUP in signal.sigpending()
