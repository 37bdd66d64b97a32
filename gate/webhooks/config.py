"""Webhook endpoints as the operator names them (`[webhooks]`, `[[webhooks.endpoints]]`).

Each endpoint has a name (its metric label and the key of its cursor in the store), a URL, the
events it wants and the environment variable holding its signing secret (or that variable's
`_FILE`, server/secret_files.py): a secret is never in the configuration text, and a `secret` key
in the file is refused with the reason. `check-config` and `serve` read the file with the same
reader, and both check that the named variable is set (gate/cli.py `preflight`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from server.config import Reader, key

# What an endpoint may subscribe to: each event type and the payment log action it reports (None:
# not a log row: a channel's pending withdrawal, read from the channels; the daily summary).
EVENTS: dict[str, str | None] = {
    "payment.settled": "settle",
    "payment.written_off": "write_off",
    "payment.needs_attention": "needs_attention",
    "payment.refunded": "channel_refund",
    "channel.claimed": "channel_claim",
    "channel.withdrawal_at_risk": None,
    "summary.daily": None,
}
WITHDRAWAL_AT_RISK = "channel.withdrawal_at_risk"
DAILY_SUMMARY = "summary.daily"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a metric label the operator chose


def _name(r: Reader, name: str, path: str, _: Mapping[str, Any]) -> str:
    if not NAME.match(name):
        r.problem(path, "required: letters, digits, '.', '_' or '-' (at most 64), a name for its metrics and logs")
    return name


def _url(r: Reader, url: str, path: str, _: Mapping[str, Any]) -> str:
    if not url:
        r.problem(path, "required: the http(s) URL events are POSTed to")
        return url
    return r.http_url(url, path)


def _events(r: Reader, events: list[Any], path: str, _: Mapping[str, Any]) -> list[Any]:
    if not events:
        r.problem(path, f"required: a list of one or more of {', '.join(EVENTS)}")
    for i, event in enumerate(events):
        if event not in EVENTS:
            r.problem(f"{path}[{i}]", f"must be one of {', '.join(EVENTS)}, got {event!r}")
    return events


def _secret_env(r: Reader, variable: str, path: str, _: Mapping[str, Any]) -> str:
    if not variable:
        r.problem(path, "required: the environment variable holding the signing secret (or its _FILE)")
    return variable


@dataclass(frozen=True)
class Endpoint:
    """One receiver: where events go, which, and the variable its signing secret is read from."""

    # read (and their problems listed) in this order
    name: str = key("", check=_name)
    url: str = key("", check=_url)
    events: tuple[str, ...] = key((), check=_events)
    secret_env: str = key("", check=_secret_env)

    def wants(self, event_type: str) -> bool:
        return event_type in self.events

    @property
    def actions(self) -> dict[str, str]:
        """The payment log actions this endpoint wants, each with its event type."""
        return {action: event for event in self.events if (action := EVENTS.get(event))}


def _endpoints(r: Reader, raw: Any, path: str, _: Mapping[str, Any]) -> tuple[Endpoint, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        r.problem(path, "must be an array of tables ([[webhooks.endpoints]])")
        return ()
    endpoints: list[Endpoint] = []
    for i, body in enumerate(raw):
        where = f"{path}[{i}]"
        if not isinstance(body, dict):
            r.problem(where, "must be a table")
            continue
        if "secret" in body:
            r.problem(
                f"{where}.secret",
                "a secret never goes in the configuration: put it in an environment variable (or a file named"
                " by VARIABLE_FILE) and name the variable in secret_env",
            )
        endpoint = r.section(Endpoint, body, where, extra=frozenset({"secret"}))
        if endpoint.name and any(e.name == endpoint.name for e in endpoints):
            r.problem(f"{where}.name", f"{endpoint.name!r} names two endpoints")
            continue
        endpoints.append(endpoint)
    return tuple(endpoints)


def _lease(r: Reader, seconds: float, path: str, before: Mapping[str, Any]) -> float:
    timeout = before.get("timeout_seconds", WebhooksConfig.timeout_seconds)
    if seconds < 3 * timeout:
        r.problem(
            path,
            f"must be at least 3 x timeout_seconds ({3 * timeout:g}): a replica sends only while its lease"
            " outlasts the send, so no other replica sends the same event at once",
        )
        return max(WebhooksConfig.lease_seconds, 3 * timeout)
    return seconds


def _backoff_cap(r: Reader, seconds: float, path: str, before: Mapping[str, Any]) -> float:
    if seconds < before.get("backoff_seconds", WebhooksConfig.backoff_seconds):
        r.problem(path, "must be at least backoff_seconds")
    return seconds


@dataclass(frozen=True)
class WebhooksConfig:
    """`[webhooks]`: the endpoints, and how hard the gate tries each event."""

    # read (and their problems listed) in this order
    endpoints: tuple[Endpoint, ...] = key((), read=_endpoints)
    timeout_seconds: float = 5.0  # one delivery: connect, send and the answer's head
    lease_seconds: float = key(60.0, check=_lease)  # one replica delivers an endpoint's events, under this lease
    max_in_flight: int = 4  # deliveries to one endpoint at once
    max_backlog: int = 10_000  # undelivered events per endpoint; past it the oldest are given up
    max_attempts: int = 20  # tries of one event before it is given up
    backoff_seconds: float = 1.0  # the first retry's delay; doubled each failure, jittered
    max_backoff_seconds: float = key(900.0, check=_backoff_cap)  # the longest delay between two tries
    poll_interval_seconds: float = 1.0  # how often each replica looks for new events
