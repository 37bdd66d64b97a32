"""Request counts by day (server/request_counts.py)."""

from __future__ import annotations

ADDRESS = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
USDC = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"


def test_request_counts_name_each_answer_by_its_own_utc_day(monkeypatch) -> None:
    """The day's name is formatted once a day; an answer after midnight (or a clock set back)
    still counts on its own day."""
    import time as time_module

    from server import request_counts

    counts = request_counts.RequestCounts(db=None)  # type: ignore[arg-type]  # counting touches no store
    midnight = 1_796_083_200.0  # 2026-12-01T00:00:00Z
    for at, outcome in ((midnight - 1, "paid"), (midnight, "paid"), (midnight + 5, "limited"), (midnight - 2, "paid")):
        monkeypatch.setattr(time_module, "time", lambda at=at: at)
        counts.count("echo", outcome)
    counts.count("echo", "ok")  # not a counted outcome
    assert dict(counts.pending) == {
        ("2026-11-30", "echo", "paid"): 2,
        ("2026-12-01", "echo", "paid"): 1,
        ("2026-12-01", "echo", "limited"): 1,
    }
