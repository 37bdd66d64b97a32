"""The shipped example configuration (config/a2a-gate.example.toml) as the tests on the development
network serve it, `a2a-gate serve --dev-facilitator PORT`: a copy whose facilitator and chain are
on that port and whose database is in the test's directory, with what a test changes as arguments.
"""

from __future__ import annotations

from pathlib import Path

SHIPPED = Path(__file__).parents[2] / "config" / "a2a-gate.example.toml"
WATCHED_RPC = 'rpc_url = "http://127.0.0.1:8402/rpc"'  # the development chain, as shipped


def shipped_config(
    tmp_path: Path,
    facilitator_port: int,
    *,
    watched: bool | None = None,
    per_minute: int | None = None,
    facilitator_timeout: int | None = None,
    claim_interval: int | None = None,
    channels: str | None = None,
) -> str:
    """The shipped example's text, its facilitator.url and rpc_url on `facilitator_port` (the port
    `--dev-facilitator` serves on; 8402 as shipped) and its database in `tmp_path`.

    `watched`: True asserts that the file watches the development chain (its rpc_url), False
    asserts so and drops that line; `per_minute`: both anonymous limits; `facilitator_timeout`:
    [facilitator] timeout_seconds; `claim_interval`: [channels] claim_interval_seconds;
    `channels`: the [channels] table's keys, in place of the shipped ones.
    """
    text = SHIPPED.read_text()
    if watched is not None:
        assert WATCHED_RPC in text, "the shipped example watches the development chain"
        if not watched:
            text = text.replace(WATCHED_RPC, "")
    text = text.replace("127.0.0.1:8402", f"127.0.0.1:{facilitator_port}")
    text = text.replace('database = "a2a-gate.db"', f'database = "{tmp_path / "gate.db"}"')
    if per_minute is not None:
        text = text.replace("per_ip_per_minute = 300", f"per_ip_per_minute = {per_minute}")
        text = text.replace("per_agent_per_minute = 1200", f"per_agent_per_minute = {per_minute}")
    if facilitator_timeout is not None:
        timeout = f"timeout_seconds = {facilitator_timeout}\nmax_in_flight"
        text = text.replace("timeout_seconds = 10\nmax_in_flight", timeout)
    if claim_interval is not None:
        text = text.replace("claim_interval_seconds = 15", f"claim_interval_seconds = {claim_interval}", 1)
    if channels is not None:
        start = text.index("[channels]")
        end = text.index("\n[", start + 1)
        text = text[:start] + "[channels]\n" + channels + "\n" + text[end:]
    return text
