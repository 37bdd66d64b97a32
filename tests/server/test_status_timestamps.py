"""A task status's timestamp: RFC 3339 UTC to the millisecond, whatever instant it is taken at."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from server import tasks


def at(monkeypatch: pytest.MonkeyPatch, nanoseconds: int) -> str:
    monkeypatch.setattr(tasks.time, "time_ns", lambda: nanoseconds)
    return tasks.now_iso()


def reference(nanoseconds: int) -> str:
    moment = datetime.fromtimestamp(nanoseconds // 1_000_000 / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@pytest.mark.parametrize(
    "instants",
    [
        # within one second, then the next: the second's text is not kept past it
        [1_796_597_617_000_000_000, 1_796_597_617_005_999_999, 1_796_597_617_999_000_000, 1_796_597_618_000_000_001],
        # back in time (a clock stepped back) and far ahead: each formatted as itself
        [1_796_597_617_123_456_789, 1_796_597_016_042_000_000, 4_102_444_799_999_999_999],
        # the epoch, and a leap day
        [0, 1_709_164_800_007_000_000],
    ],
)
def test_timestamps_read_as_datetime_formats_them(monkeypatch: pytest.MonkeyPatch, instants: list[int]) -> None:
    for nanoseconds in instants:
        assert at(monkeypatch, nanoseconds) == reference(nanoseconds)


def test_milliseconds_are_three_digits_and_the_zone_is_z(monkeypatch: pytest.MonkeyPatch) -> None:
    assert at(monkeypatch, 1_796_597_617_007_000_000) == "2026-12-06T22:53:37.007Z"
