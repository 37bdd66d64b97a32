"""Every configuration key is read off its dataclass field (`server.config.Key`): the keys a table
accepts, the problems naming each key, the values kept. The plain numbers are walked from the
fields themselves, so a key added as a field is held to the same rules without a line here; the
keys with a check of their own are each held to it below."""

from __future__ import annotations

import tomllib
from dataclasses import MISSING
from pathlib import Path
from typing import Any

import pytest

from gate.config import (
    SECTIONS,
    AgentPayment,
    ChannelsConfig,
    FacilitatorConfig,
    GateConfig,
    InBandConfig,
    LimitsConfig,
    NetworkConfig,
    OfferReceiptConfig,
    parse_config,
)
from gate.webhooks.config import Endpoint, WebhooksConfig
from server.config import (
    NUMBERS,
    AgentConfig,
    ApiKey,
    ConfigError,
    HttpConfig,
    ProxyConfig,
    Settings,
    SigningConfig,
    Skill,
    StreamConfig,
    TracingConfig,
    keys_of,
    specs,
)

FACILITATOR = '[facilitator]\nurl = "http://127.0.0.1:9"\n'
AGENTS = "[agents.echo]\n"
BASE = f"{FACILITATOR}\n{AGENTS}"
DIGEST = "ab" * 32
ENDPOINT = 'name = "books"\nurl = "http://127.0.0.1:9/"\nevents = ["payment.settled"]\nsecret_env = "X"\n'
# (the dataclass, the table it is read from as a TOML header, the key path of its keys, lines it needs)
TABLES: list[tuple[type, str, str, str]] = [
    (Settings, "", "", ""),
    (HttpConfig, "[http]", "http", ""),
    (StreamConfig, "[streams]", "streams", ""),
    (ProxyConfig, "[proxy]", "proxy", ""),
    (TracingConfig, "[tracing]", "tracing", ""),
    (SigningConfig, "[signing]", "signing", ""),
    (AgentConfig, "[agents.x]", "agents.x", ""),
    (AgentPayment, "[agents.x]", "agents.x", ""),
    (Skill, "[[agents.x.skills]]", "agents.x.skills[0]", 'id = "s"\n'),
    (ApiKey, "[[keys]]", "keys[0]", f'sha256 = "{DIGEST}"\n'),
    (GateConfig, "", "", ""),
    (FacilitatorConfig, "[facilitator]", "facilitator", 'url = "http://127.0.0.1:9"\n'),
    (NetworkConfig, '[networks."eip155:1"]', 'networks."eip155:1"', ""),
    (LimitsConfig, "[limits]", "limits", ""),
    (InBandConfig, "[in_band]", "in_band", ""),
    (ChannelsConfig, "[channels]", "channels", ""),
    (OfferReceiptConfig, "[offer_receipt]", "offer_receipt", ""),
    (WebhooksConfig, "[webhooks]", "webhooks", ""),
    (Endpoint, "[[webhooks.endpoints]]", "webhooks.endpoints[0]", ENDPOINT),
]
# What each table accepted before its keys were read off the fields: a key dropped from a table,
# or one added that the file may not hold, shows here.
ACCEPTED = {
    Settings: "public_url database default_agent max_body_bytes task_retention_days task_deadline_seconds"
    " housekeeping_interval_seconds proxy agents keys http streams tracing signing",
    HttpConfig: "head_timeout_seconds body_timeout_seconds keep_alive_seconds max_head_bytes drain_seconds"
    " metrics_listen metrics_token_env implementation loop",
    StreamConfig: "max_per_task max_per_owner max_per_client",
    ProxyConfig: "trusted",
    TracingConfig: "enabled service_name endpoint",
    SigningConfig: "key_file key_env",
    OfferReceiptConfig: "format",
    AgentConfig: "description backend exposed skills url upstream_auth_env timeout_seconds poll_interval_seconds"
    " deadline_seconds callable executor streaming",
    AgentPayment: "price allowed_payers per_agent_per_minute on_settle_failure payment_identifier discovery sign_in",
    Skill: "id name description tags examples",
    ApiKey: "name sha256 agents revoked",
    GateConfig: "limits facilitator networks in_band channels webhooks reconcile_interval_seconds claim_lease_seconds"
    " offer_receipt",
    FacilitatorConfig: "url timeout_seconds max_in_flight max_wait_seconds connections auth_header_env"
    " settle_attempts settle_backoff_seconds settle_margin_seconds auth breaker_failures breaker_cooldown_seconds"
    " settle_passes settle_max_delay_seconds",
    NetworkConfig: "rpc_url timeout_seconds",
    LimitsConfig: "per_ip_per_minute per_agent_per_minute max_entries ipv6_prefix redis_url redis_prefix"
    " redis_timeout_seconds",
    InBandConfig: "max_message_bytes pending_per_ip",
    ChannelsConfig: "claim_interval_seconds claim_at_amount claim_after_seconds refund_after_seconds"
    " accept_unwatched_withdrawals",
    WebhooksConfig: "endpoints timeout_seconds lease_seconds max_in_flight max_backlog max_attempts backoff_seconds"
    " max_backoff_seconds poll_interval_seconds",
    Endpoint: "name url events secret_env",
}


def read(text: str) -> Settings:
    return parse_config(tomllib.loads(text), base_dir=Path("/etc/a2a-gate"), source="gate.toml")


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as refused:
        read(text)
    return refused.value.problems


def configuration(lines: str) -> str:
    """`lines` beside the base configuration (a facilitator and an agent), less what they set themselves."""
    base = ("" if "[facilitator]" in lines else FACILITATOR) + ("" if lines.startswith("agents =") else AGENTS)
    return f"{lines}\n{base}" if not lines.startswith("[") else f"{base}\n{lines}\n"


def with_key(header: str, needs: str, line: str) -> str:
    """The base configuration with one key set in the table `header` (the top level when empty)."""
    return configuration(f"{header}\n{needs}{line}" if header else line)


def table_of(settings: Settings, cls: type) -> Any:
    """The instance of `cls` a table of `TABLES` was read into."""
    gate = settings.anonymous
    return {
        Settings: settings,
        HttpConfig: settings.http,
        StreamConfig: settings.streams,
        TracingConfig: settings.tracing,
        SigningConfig: settings.signing,
        AgentConfig: settings.agents.get("x"),
        AgentPayment: gate.agents.get("x"),
        ApiKey: settings.keys[0] if settings.keys else None,
        GateConfig: gate,
        FacilitatorConfig: gate.facilitator,
        NetworkConfig: gate.networks.get("eip155:1"),
        LimitsConfig: gate.limits,
        InBandConfig: gate.in_band,
        ChannelsConfig: gate.channels,
        OfferReceiptConfig: gate.offer_receipt,
        WebhooksConfig: gate.webhooks,
        Endpoint: gate.webhooks.endpoints[0] if gate.webhooks.endpoints else None,
    }.get(cls)


def test_each_table_accepts_exactly_the_keys_of_its_fields() -> None:
    for cls, *_ in TABLES:
        specs(cls)  # every field is one the reader can read
        assert keys_of(cls) == frozenset(ACCEPTED[cls].split()), cls.__name__
    assert SECTIONS.keys == keys_of(GateConfig) and SECTIONS.agent_keys == keys_of(AgentPayment)


@pytest.mark.parametrize(("cls", "header", "path", "needs"), TABLES, ids=[t[0].__name__ for t in TABLES])
def test_an_unknown_key_is_refused_in_every_table(cls: type, header: str, path: str, needs: str) -> None:
    where = f"{path}.nope" if path else "nope"
    assert problems(with_key(header, needs, "nope = 1")) == [f"gate.toml: {where}: unknown key"]


PLAIN_NUMBERS = [
    (cls, header, path, needs, f.name, str(f.type))
    for cls, header, path, needs in TABLES
    for f, spec in specs(cls)
    if spec.in_file and not (spec.check or spec.read or spec.choices) and f.type in NUMBERS
]


@pytest.mark.parametrize(
    ("cls", "header", "path", "needs", "name", "annotation"),
    PLAIN_NUMBERS,
    ids=[f"{n[0].__name__}.{n[4]}" for n in PLAIN_NUMBERS],
)
def test_a_number_is_read_as_its_field_holds_it_and_refused_naming_its_key(
    cls: type, header: str, path: str, needs: str, name: str, annotation: str
) -> None:
    where = f"gate.toml: {path}.{name}" if path else f"gate.toml: {name}"
    expected = "int"  # what a problem names: the first type the key takes, for a float an integer too
    assert problems(with_key(header, needs, f"{name} = 0")) == [f"{where}: must be greater than 0"]
    assert problems(with_key(header, needs, f"{name} = -1")) == [f"{where}: must be greater than 0"]
    assert problems(with_key(header, needs, f'{name} = "7"')) == [f"{where}: must be {expected}, got str"]
    assert problems(with_key(header, needs, f"{name} = true")) == [f"{where}: must be {expected}, not a boolean"]
    if annotation == "float":
        assert problems(with_key(header, needs, f"{name} = nan")) == [f"{where}: must be greater than 0"]
        value = getattr(table_of(read(with_key(header, needs, f"{name} = 7")), cls), name)
        assert (value, type(value)) == (7.0, float)
        assert getattr(table_of(read(with_key(header, needs, f"{name} = 2.5")), cls), name) == 2.5
    else:
        assert problems(with_key(header, needs, f"{name} = 2.5")) == [f"{where}: must be int, got float"]
        assert getattr(table_of(read(with_key(header, needs, f"{name} = 7")), cls), name) == 7


def test_a_key_absent_from_the_file_is_its_fields_default() -> None:
    settings = read(BASE + "\n[agents.x]\n[[agents.x.skills]]\nid = 's'\n[[keys]]\n" + f'sha256 = "{DIGEST}"\n')
    written = {"skills", "sha256", "url"}  # set above (the facilitator's url by the base)
    for cls in (HttpConfig, StreamConfig, AgentConfig, ApiKey, FacilitatorConfig, LimitsConfig, InBandConfig):
        table = table_of(settings, cls)
        for f, spec in specs(cls):
            if spec.in_file and spec.read is None and spec.default_from is None and f.name not in written:
                default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
                assert getattr(table, f.name) == default, f"{cls.__name__}.{f.name}"
    assert settings.agents["x"].skills[0] == Skill(id="s", name="s")  # a skill's name defaults to its id
    assert settings.keys[0].name == "key-0" and settings.default_agent == "echo"  # the first agent


# (the configuration's lines beside the base, the one problem it has)
CHECKED = [
    ('public_url = "ftp://x"', "public_url: must be an http(s) URL with a host, got 'ftp://x'"),
    ('default_agent = "nobody"', "default_agent: names no configured agent: 'nobody'"),
    ('[proxy]\ntrusted = ["nginx"]', "proxy.trusted[0]: must be an IP address or a CIDR network"),
    ("[proxy]\ntrusted = [1]", "proxy.trusted[0]: must be an address or network string"),
    ("proxy = 1", "proxy: must be a table"),
    ("agents = 1", "agents: must be a table"),
    ("keys = 1", "keys: must be list, got int"),
    (
        '[http]\nmetrics_listen = "nowhere"',
        'http.metrics_listen: must be IP:PORT, e.g. "127.0.0.1:9464" or "[::1]:9464"',
    ),
    ('[http]\nloop = "trio"', "http.loop: must be one of auto, asyncio, uvloop, got 'trio'"),
    ('[http]\nimplementation = "x"', "http.implementation: must be one of auto, h11, httptools, got 'x'"),
    ("http = 1", "http: must be a table"),
    ('[agents.x]\nbackend = "nope"', "agents.x.backend: must be one of echo, upstream, python, a2a-sdk, got 'nope'"),
    ('[agents.x]\nbackend = "upstream"', "agents.x.url: required for an upstream agent"),
    ('[agents.x]\nbackend = "upstream"\nurl = "x"', "agents.x.url: must be an http(s) URL with a host, got 'x'"),
    ('[agents.x]\nbackend = "python"', "agents.x.callable: required for a python agent, as 'package.module:function'"),
    ("[agents.x]\nskills = [1]", "agents.x.skills[0]: must be a table"),
    ("[agents.x]\n[[agents.x.skills]]\nname = 'n'", "agents.x.skills[0].id: required"),
    ('[agents.x]\non_settle_failure = "z"', "agents.x.on_settle_failure: must be one of deliver, withhold, got 'z'"),
    ("[agents.x]\npayment_identifier = true", "agents.x.payment_identifier: must be str, not a boolean"),
    ('[agents.x]\ndiscovery = "yes"', "agents.x.discovery: must be bool, got str"),
    ("[agents.x]\nsign_in = 1", "agents.x.sign_in: must be bool, got int"),
    (
        '[agents.x]\npayment_identifier = "always"',
        "agents.x.payment_identifier: must be one of optional, required, got 'always'",
    ),
    ("[agents.x]\nallowed_payers = 1", "agents.x.allowed_payers: must be a list of addresses"),
    ('[agents.x]\nallowed_payers = ["0x1"]', "agents.x.allowed_payers[0]: must be a 0x address (40 hex digits)"),
    ('[agents.x]\nper_agent_per_minute = "7"', "agents.x.per_agent_per_minute: must be int, got str"),
    ('[[keys]]\nsha256 = "no"\nagents = ["nobody"]\nrevoked = 1', "keys[0].sha256: must be 64 lowercase hex digits"),
    (f'[[keys]]\nsha256 = "{DIGEST}"\nagents = ["nobody"]', "keys[0].agents: names no configured agent: 'nobody'"),
    ("[[keys]]\n", "keys[0].sha256: must be 64 lowercase hex digits"),
    ('[facilitator]\nurl = "x"', "facilitator.url: must be an http(s) URL with a host, got 'x'"),
    ('[facilitator]\nurl = "http://f"\nauth = "x"', "facilitator.auth: must be 'package.module:callable', got 'x'"),
    ('[networks.base]\nrpc_url = "http://n"', "networks.\"base\": must be a CAIP-2 network such as 'eip155:8453'"),
    (
        '[networks."eip155:1"]\nrpc_url = "x"',
        "networks.\"eip155:1\".rpc_url: must be an http(s) URL with a host, got 'x'",
    ),
    ('[networks]\n"eip155:1" = 1', 'networks."eip155:1": must be a table'),
    ("[limits]\nipv6_prefix = 8", "limits.ipv6_prefix: must be a prefix length from 16 to 128, got 8"),
    ("[limits]\nipv6_prefix = 129", "limits.ipv6_prefix: must be a prefix length from 16 to 128, got 129"),
    ('[limits]\nredis_url = "http://r"', "limits.redis_url: must be a redis://, rediss:// or unix:// URL"),
    (
        "[channels]\nrefund_after_seconds = -1",
        "channels.refund_after_seconds: must be 0 (never) or a number of seconds",
    ),
    ("[channels]\nclaim_at_amount = -1", "channels.claim_at_amount: must be a whole number of atomic units, got -1"),
    (
        '[channels]\nclaim_at_amount = "1e3"',
        "channels.claim_at_amount: must be a whole number of atomic units, got '1e3'",
    ),
]


@pytest.mark.parametrize(("lines", "problem"), CHECKED, ids=[c[1].split(":")[0] for c in CHECKED])
def test_a_key_with_a_check_of_its_own_is_refused_by_it(lines: str, problem: str) -> None:
    found = problems(configuration(lines))
    assert len(found) == 1 and found[0].startswith(f"gate.toml: {problem}"), found


def test_the_checked_keys_keep_what_they_read() -> None:
    settings = read(
        'public_url = "https://gate.example/"\ndatabase = "state/gate.db"\n'
        + BASE
        + '\n[proxy]\ntrusted = ["10.0.0.0/8"]\n[http]\nmetrics_listen = "[::1]:9464"\nloop = "asyncio"\n'
        '[agents.x]\nbackend = "upstream"\nurl = "http://up/"\nallowed_payers = ["0x' + "AB" * 20 + '"]\n'
        'on_settle_failure = "withhold"\nper_agent_per_minute = 5\npayment_identifier = "required"\n'
        "discovery = true\nsign_in = false\n"
        '[limits]\nipv6_prefix = 48\nredis_url = "rediss://r"\n'
        '[channels]\nrefund_after_seconds = 0\nclaim_at_amount = "340282366920938463463374607431768211455"\n'
    )
    gate = settings.anonymous
    assert settings.public_url == "https://gate.example"  # an URL without its trailing slash
    assert settings.database == "/etc/a2a-gate/state/gate.db"  # beside the configuration
    assert settings.trusted_proxies == ("10.0.0.0/8",)
    assert settings.http.metrics_listen == ("::1", 9464) and settings.http.loop == "asyncio"
    assert settings.agents["x"].url == "http://up"
    payment = gate.agents["x"]
    assert payment.allowed_payers == ("0x" + "ab" * 20,) and payment.on_settle_failure == "withhold"
    assert payment.per_agent_per_minute == 5 and payment.payment_identifier == "required" and payment.discovery
    assert not payment.sign_in
    assert (gate.limits.ipv6_prefix, gate.limits.redis_url) == (48, "rediss://r")
    assert gate.channels.refund_after_seconds == 0.0 and gate.channels.claim_at_amount == 2**128 - 1


def test_accepting_unwatched_withdrawals_is_a_warning_not_a_problem() -> None:
    settings = read(BASE + "\n[channels]\naccept_unwatched_withdrawals = true\n")
    assert settings.anonymous.channels.accept_unwatched_withdrawals is True
    assert [w.split(": ")[1] for w in settings.warnings] == ["channels.accept_unwatched_withdrawals"]


def test_a_field_the_reader_cannot_read_is_found_before_any_file_is() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Odd:
        when: complex = 0j

    with pytest.raises(TypeError, match=r"Odd\.when"):
        specs(Odd)
