"""The in-memory limits a replica answers from (alone, or while Redis is away): per-IP, then
per-agent, and a caller the first refuses spends nothing of the second."""

from __future__ import annotations

from gate.limiter import AgentLimiters, CallerLimiter, Limits


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_caller_refused_per_ip_spends_nothing_of_the_agents_bucket() -> None:
    clock = Clock()
    limits = Limits(CallerLimiter(2, clock=clock), AgentLimiters(3, {}))
    answers = [limits.take("198.51.100.7", "paid") for _ in range(6)]
    assert answers[:2] == [None, None]
    assert [a and a[0] for a in answers[2:]] == ["ip"] * 4
    assert all(a is not None and 0 < a[1] <= 30.0 for a in answers[2:])  # 2 a minute: a token every 30 s
    # the agent has one token left of three, whatever the flood did
    assert limits.take("198.51.100.8", "paid") is None
    refused = limits.take("198.51.100.9", "paid")
    assert refused is not None and refused[0] == "agent" and 0 < refused[1] <= 20.0  # 3 a minute
    clock.now += 30.0  # the first caller's bucket has a token again; the agent's, per its own clock
    assert limits.take("198.51.100.7", "other") is None
