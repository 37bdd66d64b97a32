"""The server's configuration: a TOML file read into plain dataclasses.

Every problem is reported with its key path (``agents.echo.timeout_seconds``) so an
operator can fix a file from the message alone; `load_config` raises one
`ConfigError` carrying all of them rather than stopping at the first.

The server reads its own keys only. The tables and per-agent keys an anonymous path
declares it reads (`server.anonymous.PathConfig`) are kept raw in `Settings.sections`
and `AgentConfig.sections`, for that path's own reader (a `Reader` like the server's,
so its problems join the same list); any other key is a problem.

Each key is written once, as a field of the dataclass it fills: its name is the key, its type
what the file may hold, its default the default. What differs (a TOML name, a check, a default
that depends on another key) is the field's `key(...)` metadata, and `Reader.section` walks the
fields, in their order, for the allowed keys, the reading and the problems naming each key.
"""

from __future__ import annotations

import inspect
import ipaddress
import os
import re
import tomllib
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from server import callables

T = TypeVar("T")
AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
BACKENDS = ("echo", "upstream", "python", "a2a-sdk")
CALLABLE = re.compile(r"^[\w.]+:[\w.]+$")  # "package.module:name"


def trusted_proxy_problem(value: str) -> str:
    """Why `value` cannot name a trusted proxy (`[proxy] trusted`, `serve --trusted-proxy`); empty if it can.

    An IP address or a CIDR network, nothing else: the forwarded headers are believed when the
    peer's address is one of these, so a host name ("nginx", "localhost") never matches, and every
    caller would be the proxy's address (one rate-limit bucket for all). A network is written as
    uvicorn reads it (no host bits set: "10.0.0.0/24", not "10.0.0.5/24", which it keeps as a
    literal matching nothing). "*" (uvicorn's "trust every peer") is refused: any client could then
    name its own address."""
    if value == "*":
        return "must be an IP address or a CIDR network: '*' would let any client name its own address"
    try:
        if "/" in value:
            ipaddress.ip_network(value)
        else:
            ipaddress.ip_address(value)
    except ValueError as exc:
        kind = "a CIDR network" if "/" in value else "an IP address"
        why = str(exc).removeprefix(f"{value!r} ").removeprefix(f"{value} ")
        return (
            f"must be an IP address or a CIDR network (a host name never matches a peer): {value!r} is not {kind}"
            + (f" ({why})" if "/" in value else "")
        )
    return ""


class ConfigError(Exception):
    """A configuration that cannot run; `problems` holds one line per fault."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


# A key's check or its own reading: (reader, its value, the key's path, the fields read before it
# with the reading's context) -> the value kept; problems go to the reader, each with the key's path
Check = Callable[["Reader", Any, str, Mapping[str, Any]], Any]
KEY = "a2a_gate.key"  # the field metadata entry holding its `Key`


@dataclass(frozen=True)
class Key:
    """How a configuration field is read from its table (`Reader.section`): the field is the key
    (its name, its default), and this says only what differs.

    The field's type says what the file may hold: `str`, `bool`, `int` (a TOML integer), `float`
    (an integer or a float, kept as a float), `tuple[str, ...]` (an array, its items as strings),
    a dataclass (a table, read the same way). A number must be greater than 0 unless `positive`
    is False. A value of the wrong type, or refused, is a problem naming the key, and the default
    stands in for it.
    """

    toml: str = ""  # its name in the file, when it is not the field's
    kinds: tuple[type, ...] = ()  # the TOML types it takes, when the field's type does not say
    positive: bool = True  # a number must be greater than 0
    choices: tuple[str, ...] = ()  # the strings it may be (the first is the default)
    default_from: Callable[[Mapping[str, Any]], Any] | None = None  # a default from the fields read before
    check: Check | None = None  # what the value must also be, and what is kept of it (after its type)
    read: Check | None = None  # the key read its own way, from its raw value in the file (None: absent)
    in_file: bool = True  # False: not a key of its table; filled by the reader (with `read`, from elsewhere)


def key(default: Any = MISSING, *, factory: Any = MISSING, **how: Any) -> Any:
    """A configuration field: its default (or `factory`) and how it is read, if not plainly (`Key`)."""
    metadata = {KEY: Key(**how)}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# What the file may hold for a field of each type (its first is named when it holds another)
KINDS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "bool": (bool,),
    "int": (int,),
    "int | None": (int,),
    "float": (int, float),
    "tuple[str, ...]": (list,),
}
NUMBERS = frozenset({"int", "int | None", "float"})


def typed(annotation: str, value: Any) -> Any:
    """A value read from the file as its field holds it."""
    if value is None:
        return None
    if annotation == "float":
        return float(value)
    if annotation in ("int", "int | None"):
        return int(value)
    if annotation == "tuple[str, ...]":
        return tuple(str(item) for item in value)
    return value


def specs(cls: type) -> tuple[tuple[Field[Any], Key], ...]:
    """Each field of the configuration dataclass `cls`, with how it is read; a field the reader
    could not read is a `TypeError` here (found by the tests, not by an operator)."""
    found = []
    for f in fields(cls):
        spec = f.metadata.get(KEY, Key())
        nested = is_dataclass(f.default)
        if spec.read is None and spec.in_file and not nested and not spec.kinds and f.type not in KINDS:
            raise TypeError(f"{cls.__name__}.{f.name}: a {f.type} is read with a `read` or its `kinds`")
        if spec.choices and f.default != spec.choices[0]:
            raise TypeError(f"{cls.__name__}.{f.name}: the default must be the first choice")
        found.append((f, spec))
    return tuple(found)


def keys_of(cls: type) -> frozenset[str]:
    """The keys of a table read into `cls`: anything else in it is an unknown key."""
    return frozenset(spec.toml or f.name for f, spec in specs(cls) if spec.in_file)


class Dropped(Exception):
    """A check refusing the whole table it is in (an API key without a usable digest)."""


def optional_http_url(r: Reader, url: str, path: str, _: Mapping[str, Any]) -> str:
    """An http(s) URL, or empty for none."""
    return r.http_url(url, path) if url else url


def callable_name(r: Reader, target: str, path: str, _: Mapping[str, Any]) -> str:
    """'package.module:callable', or empty for none (imported by whoever calls it)."""
    if target and not CALLABLE.match(target):
        r.problem(path, f"must be 'package.module:callable', got {target!r}")
    return target


def _database(r: Reader, database: str, path: str, _: Mapping[str, Any]) -> str:
    """A relative SQLite path resolves beside the configuration, or in systemd's state directory."""
    if not is_database_url(database) and database != ":memory:" and not os.path.isabs(database):
        database = str((state_directory(os.environ) or r.base_dir or Path()) / database)
    return database


def _trusted_proxies(r: Reader, value: Any, path: str, _: Mapping[str, Any]) -> tuple[str, ...]:
    return r.section(ProxyConfig, r.as_table(value, path), path).trusted


def _trusted_items(r: Reader, trusted: list[Any], path: str, _: Mapping[str, Any]) -> tuple[str, ...]:
    for i, item in enumerate(trusted):
        if not isinstance(item, str) or not item:
            r.problem(f"{path}[{i}]", "must be an address or network string")
        elif problem := trusted_proxy_problem(item):
            r.problem(f"{path}[{i}]", problem)
    return tuple(t for t in trusted if isinstance(t, str))


def _agents(r: Reader, value: Any, path: str, _: Mapping[str, Any]) -> dict[str, AgentConfig]:
    return {name: r.agent(name, body) for name, body in r.as_table(value, path).items()}


def _default_agent(r: Reader, name: str, path: str, settings: Mapping[str, Any]) -> str:
    if name and name not in settings["agents"]:
        r.problem(path, f"names no configured agent: {name!r}")
    return name


def _keys(r: Reader, listed: list[Any], path: str, settings: Mapping[str, Any]) -> tuple[ApiKey, ...]:
    return tuple(k for i, body in enumerate(listed) if (k := r.key(i, body, settings["agents"])) is not None)


def _upstream_url(r: Reader, url: str, path: str, agent: Mapping[str, Any]) -> str:
    if agent["backend"] == "upstream":
        if not url:
            r.problem(path, "required for an upstream agent")
        else:
            url = r.http_url(url, path)
    return url


def _python_callable(r: Reader, target: str, path: str, agent: Mapping[str, Any]) -> str:
    if agent["backend"] == "python":
        if not CALLABLE.match(target):
            r.problem(path, "required for a python agent, as 'package.module:function'")
        elif (function := r.importable(target, path)) is not None and not callable(function):
            r.problem(path, f"{target} is not callable")
    return target


def _executor(r: Reader, target: str, path: str, agent: Mapping[str, Any]) -> str:
    if agent["backend"] == "a2a-sdk":
        r.executor(target, path)
    return target


def _required(r: Reader, value: str, path: str, _: Mapping[str, Any]) -> str:
    if not value:
        r.problem(path, "required")
    return value


def _digest(r: Reader, digest: str, path: str, _: Mapping[str, Any]) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        r.problem(path, "must be 64 lowercase hex digits (the stored form from `a2a-gate keys create`)")
        raise Dropped
    return digest


def _key_agents(r: Reader, names: list[Any], path: str, key: Mapping[str, Any]) -> list[Any]:
    for name in names:
        if not isinstance(name, str) or (name != "*" and name not in key["agents"]):
            r.problem(path, f"names no configured agent: {name!r}")
    return names


@dataclass(frozen=True)
class Skill:
    id: str = key("", check=_required)
    name: str = key("", default_from=lambda skill: skill["id"])
    description: str = ""
    tags: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()


@dataclass(frozen=True)
class AgentConfig:
    # read in this order: the backend decides what url, callable and executor must be
    name: str = key(in_file=False)  # the key of its table in [agents]
    backend: str = key("echo", choices=BACKENDS)
    url: str = key("", check=_upstream_url)  # upstream: the remote agent's JSON-RPC endpoint
    callable: str = key("", check=_python_callable)  # python: "package.module:function"
    # a2a-sdk: "package.module:Class" (an AgentExecutor) or a factory returning one
    executor: str = key("", check=_executor)
    description: str = ""
    exposed: bool = True
    skills: tuple[Skill, ...] = key(
        (),
        kinds=(list,),
        check=lambda r, listed, path, _: tuple(r.skill(s, f"{path}[{i}]") for i, s in enumerate(listed)),
    )
    upstream_auth_env: str = ""  # upstream: env var holding the operator's credential
    timeout_seconds: float = 30.0
    poll_interval_seconds: float = 0.5
    deadline_seconds: float = 120.0
    streaming: bool = True
    sections: dict[str, Any] = key(factory=dict, in_file=False)  # the anonymous path's keys, raw


@dataclass(frozen=True)
class HttpConfig:
    """How long a client may take to send a request, and to stay idle (see server/deadlines.py)."""

    head_timeout_seconds: float = 10.0  # request line and headers, from the request's first byte
    body_timeout_seconds: float = 30.0  # the whole body, from the end of the headers
    keep_alive_seconds: float = 5.0  # an idle connection between requests
    max_head_bytes: int = 16_384  # request line and headers together; a larger head is answered 400
    drain_seconds: float = 10.0  # on SIGTERM: how long requests and running work may finish
    # (ip, port): /metrics there only, not on the A2A port; in the file "IP:PORT"
    metrics_listen: tuple[str, int] | None = key(
        None, kinds=(str,), check=lambda r, value, path, _: r.listen_address(value, path)
    )
    metrics_token_env: str = ""  # env var holding the bearer token /metrics asks for; never in the file
    # uvicorn's HTTP parser: h11, httptools, or auto (httptools when installed)
    implementation: str = key("auto", choices=("auto", "h11", "httptools"))
    loop: str = key("auto", choices=("auto", "asyncio", "uvloop"))  # asyncio, uvloop, or auto (uvloop when installed)


@dataclass(frozen=True)
class StreamConfig:
    """How many resubscription streams may be open at once in one process (see server/streams.py)."""

    max_per_task: int = 500  # streams following one task
    max_per_owner: int = 100  # streams of one key, or of one payer
    max_per_client: int = 100  # streams from one client address (an IPv4 address, an IPv6 /64)


@dataclass(frozen=True)
class ProxyConfig:
    """`[proxy]`: the peers whose forwarded headers are believed (`Settings.trusted_proxies`)."""

    trusted: tuple[str, ...] = key((), check=_trusted_items)


@dataclass(frozen=True)
class TracingConfig:
    """`[tracing]`: OpenTelemetry spans over OTLP/HTTP (server/tracing.py; the `otel` extra). The
    OTEL_* variables configure what the file leaves out (OTEL_EXPORTER_OTLP_ENDPOINT, headers...)."""

    enabled: bool = False
    service_name: str = ""  # empty: OTEL_SERVICE_NAME, else "a2a-gate"
    # the collector's OTLP/HTTP URL (/v1/traces appended); empty: OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT
    endpoint: str = key("", check=optional_http_url)
    exporter: Any = key(None, in_file=False)  # a span exporter given in code instead (a test's, in memory)


def _key_file(r: Reader, path: str, where: str, _: Mapping[str, Any]) -> str:
    """A relative key file resolves beside the configuration."""
    return str((r.base_dir or Path()) / path) if path and not os.path.isabs(path) else path


def _key_env(r: Reader, name: str, where: str, before: Mapping[str, Any]) -> str:
    if name and before.get("key_file"):
        r.problem(where, "give key_file or key_env, not both")
        return ""
    return name


@dataclass(frozen=True)
class SigningConfig:
    """`[signing]`: the operator's signing key (server/signing_key.py), by file or by variable, never
    its text here. With none, nothing is signed; with one, cards carry its signature (server/card_signing.py)
    and whoever builds on the server may sign with it too (the gate: its offers and receipts)."""

    key_file: str = key("", check=_key_file)  # a file holding the key (relative: beside this file)
    key_env: str = key("", check=_key_env)  # or a variable holding it (or VARIABLE_FILE, a credential)


@dataclass(frozen=True)
class ApiKey:
    """A key declared in the file by its SHA-256 digest (see `a2a-gate keys create`)."""

    # read in this order: a key without a usable digest is dropped, its other keys unread
    sha256: str = key("", check=_digest)
    agents: tuple[str, ...] = key((), check=_key_agents)
    name: str = key("", default_from=lambda key: f"key-{key['index']}")
    revoked: bool = False


@dataclass(frozen=True)
class Settings:
    # read in this order (each problem listed in it): default_agent and keys name agents
    public_url: str = key("", check=optional_http_url)  # empty: from a trusted proxy's headers, else the server's own
    database: str = key("a2a-gate.db", check=_database)
    trusted_proxies: tuple[str, ...] = key((), toml="proxy", read=_trusted_proxies)  # [proxy] trusted
    agents: dict[str, AgentConfig] = key(factory=dict, read=_agents)
    default_agent: str = key(
        "echo", default_from=lambda settings: next(iter(settings["agents"]), ""), check=_default_agent
    )
    keys: tuple[ApiKey, ...] = key((), kinds=(list,), check=_keys)
    max_body_bytes: int = 1_048_576
    task_retention_days: float = 7.0
    task_deadline_seconds: float = 600.0
    housekeeping_interval_seconds: float = 60.0  # how often stuck tasks are failed and old ones deleted
    http: HttpConfig = HttpConfig()
    streams: StreamConfig = StreamConfig()
    tracing: TracingConfig = TracingConfig()
    signing: SigningConfig = SigningConfig()
    source: str = key("<embedded defaults>", in_file=False)
    warnings: tuple[str, ...] = key((), in_file=False)  # problems that do not stop the server (shown by check-config)
    sections: dict[str, Any] = key(factory=dict, in_file=False)  # the anonymous path's tables and keys, raw
    anonymous: Any = key(None, in_file=False)  # what the anonymous path read of them (`PathConfig.read`)


def is_database_url(database: str) -> bool:
    """A PostgreSQL URL (replicas sharing one store), not a SQLite path."""
    return database.startswith(("postgresql://", "postgres://"))


def default_settings(database: str = "a2a-gate.db") -> Settings:
    """The embedded defaults: three echo agents, `echo`, `paid-echo` and `paid-metered` (the gate
    prices the last two), one SQLite file."""
    skill = Skill(id="echo", name="Echo", description="Repeats the input text.")
    agents = {
        name: AgentConfig(name=name, description="Echoes the text it is sent.", skills=(skill,))
        for name in ("echo", "paid-echo", "paid-metered")
    }
    return Settings(database=database, agents=agents)


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The raw tree of a TOML file; a file that cannot be read is one problem."""
    file = Path(path)
    try:
        return tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError([f"{file}: no such file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{file}: cannot read: {exc}"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{file}: not valid TOML: {exc}"]) from None


def state_directory(environ: Mapping[str, str]) -> Path | None:
    """The directory systemd made for this service's state (`StateDirectory=`), if it names one.

    A relative `database` resolves there rather than beside the configuration, which a hardened
    unit mounts read-only; systemd lists several directories with colons, the first is ours."""
    first = environ.get("STATE_DIRECTORY", "").split(":")[0]
    return Path(first) if first else None


def load_config(path: str | os.PathLike[str]) -> Settings:
    """Read and validate a TOML file for the server alone; relative database paths resolve beside
    it, or in the service's state directory when systemd names one."""
    return parse_config(read_toml(path), base_dir=Path(path).resolve().parent, source=str(path))


def parse_config(raw: dict[str, Any], *, base_dir: Path, source: str = "<dict>") -> Settings:
    reader = Reader()
    settings = reader.settings(raw, base_dir, source)
    reader.raise_problems(source)
    return settings


class Reader:
    """Walks the raw TOML tree, collecting every problem with its key path."""

    def __init__(self, keys: frozenset[str] = frozenset(), agent_keys: frozenset[str] = frozenset()) -> None:
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.base_dir: Path | None = None  # the configuration file's directory: its modules import
        self.path_keys, self.path_agent_keys = keys, agent_keys  # left raw for the anonymous path

    def raise_problems(self, source: str) -> None:
        if self.problems:
            raise ConfigError([f"{source}: {p}" for p in self.problems])

    def problem(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(f"{path}: {message}")

    def unknown(self, table: dict[str, Any], known: set[str] | frozenset[str], path: str) -> None:
        for key in sorted(set(table) - known):
            where = f"{path}.{key}" if path else key
            self.problem(where, "unknown key")

    def table(self, raw: dict[str, Any], key: str, path: str) -> dict[str, Any]:
        return self.as_table(raw.get(key), path)

    def as_table(self, value: Any, path: str) -> dict[str, Any]:
        """A table's raw keys: none when it is absent (None), a problem when it is not a table."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problem(path, "must be a table")
            return {}
        return value

    def section(
        self,
        cls: type[T],
        raw: dict[str, Any],
        path: str,
        *,
        extra: frozenset[str] = frozenset(),
        context: Mapping[str, Any] | None = None,
        **given: Any,
    ) -> T:
        """The dataclass `cls` read from its table `raw` at `path`: its unknown keys (beside `extra`,
        kept for another reader) are problems, then each field is read in its order (`Key`), unless
        `given`. A field's check or reading sees the fields read before it and `context`."""
        self.unknown(raw, keys_of(cls) | extra, path)
        values: dict[str, Any] = dict(given)
        before = ChainMap(values, dict(context or {}))
        for f, spec in specs(cls):
            if f.name in given or (not spec.in_file and spec.read is None):
                continue
            name = spec.toml or f.name
            where = f"{path}.{name}" if path else name
            if spec.read is not None:
                values[f.name] = spec.read(self, raw.get(name) if spec.in_file else None, where, before)
            elif is_dataclass(f.default):
                values[f.name] = self.section(type(f.default), self.table(raw, name, where), where)
            else:
                values[f.name] = self.value(raw, name, f, spec, where, before)
        return cls(**values)

    def value(
        self, raw: dict[str, Any], name: str, f: Field[Any], spec: Key, path: str, before: Mapping[str, Any]
    ) -> Any:
        """One key of a table, as its field `f` holds it."""
        default = spec.default_from(before) if spec.default_from is not None else f.default
        if default is MISSING:
            default = f.default_factory() if f.default_factory is not MISSING else None
        value = self.get(raw, name, spec.kinds or KINDS[str(f.type)], default, path)
        if spec.choices and value not in spec.choices:
            self.problem(path, f"must be one of {', '.join(spec.choices)}, got {value!r}")
            value = spec.choices[0]
        elif spec.positive and f.type in NUMBERS:
            value = self.above_zero(value, default, path)
        if spec.check is not None:
            value = spec.check(self, value, path, before)
        return typed(str(f.type), value)

    def get(self, raw: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any, path: str) -> Any:
        if key not in raw:
            return default
        value = raw[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            self.problem(path, f"must be {kinds[0].__name__}, not a boolean")
            return default
        if not isinstance(value, kinds):
            self.problem(path, f"must be {kinds[0].__name__}, got {type(value).__name__}")
            return default
        return value

    def positive(self, raw: dict[str, Any], key: str, default: Any, path: str, kind: type = int) -> Any:
        kinds: tuple[type, ...] = (int,) if kind is int else (int, float)
        return kind(self.above_zero(self.get(raw, key, kinds, default, path), default, path))

    def above_zero(self, value: Any, default: Any, path: str) -> Any:
        """A number read from the file, or the default when it is not greater than 0."""
        if value is not default and not value > 0:  # `not > 0` also refuses nan
            self.problem(path, "must be greater than 0")
            return default
        return value

    def http_url(self, value: str, path: str) -> str:
        try:
            parts = urlsplit(value)
        except ValueError:  # e.g. "http://[::1"
            self.problem(path, f"must be an http(s) URL, got {value!r}")
            return value.rstrip("/")
        try:
            parts.port  # noqa: B018 -- raises for a port that is not a number in range
        except ValueError:
            parts = parts._replace(netloc="")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self.problem(path, f"must be an http(s) URL with a host, got {value!r}")
        return value.rstrip("/")

    def settings(self, raw: dict[str, Any], base_dir: Path, source: str) -> Settings:
        self.base_dir = base_dir
        settings = self.section(
            Settings,
            raw,
            "",
            extra=self.path_keys,
            source=source,
            sections={k: raw[k] for k in self.path_keys if k in raw},
        )
        return replace(settings, warnings=tuple(f"{source}: {w}" for w in self.warnings))

    def listen_address(self, value: str | None, path: str) -> tuple[str, int] | None:
        """`IP:PORT` (`[::1]:9464` for IPv6), as the listener reports it; "" is none."""
        if not value:
            return None
        host, _, port = value.rpartition(":")
        try:
            address = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
            number = int(port)
            if not 0 < number < 65536:
                raise ValueError(port)
        except ValueError:
            self.problem(path, 'must be IP:PORT, e.g. "127.0.0.1:9464" or "[::1]:9464"')
            return None
        return str(address), number

    def callable_name(self, raw: dict[str, Any], key: str, path: str) -> str:
        return callable_name(self, self.get(raw, key, str, "", path), path, {})

    def agent(self, name: str, raw: Any) -> AgentConfig:
        path = f"agents.{name}"
        if not AGENT_NAME.match(name):
            self.problem(path, "agent names use letters, digits, '_', '.', '-' (at most 64)")
        if not isinstance(raw, dict):
            self.problem(path, "must be a table")
            return AgentConfig(name=name)
        sections = {key: raw[key] for key in self.path_agent_keys if key in raw}
        return self.section(AgentConfig, raw, path, extra=self.path_agent_keys, name=name, sections=sections)

    def importable(self, target: str, path: str) -> Any:
        """The object `target` names, imported now (so `check-config` finds what `serve` would), or None."""
        if self.base_dir is not None:
            callables.add_import_path(self.base_dir)
        try:
            return callables.load(target)
        except callables.NotLoadable as exc:
            self.problem(path, str(exc))
            return None

    def executor(self, target: str, path: str) -> None:
        """An a2a-sdk agent: an `AgentExecutor` subclass, or a factory (a callable) that returns one."""
        if not CALLABLE.match(target):
            self.problem(path, "required for an a2a-sdk agent, as 'package.module:ExecutorClass'")
            return
        try:
            from a2a.server.agent_execution import AgentExecutor
        except ImportError:
            self.problem(path, "the a2a-sdk backend needs the a2a-sdk package: pip install 'a2a-gate[a2a-sdk]'")
            return
        found = self.importable(target, path)
        if found is None:
            return
        if isinstance(found, type) and not issubclass(found, AgentExecutor):
            self.problem(path, f"{target} is a class but not an a2a.server.agent_execution.AgentExecutor")
        elif not callable(found):
            self.problem(path, f"{target} is neither an AgentExecutor class nor a factory returning one")
        elif not takes_no_arguments(found):
            self.problem(path, f"{target} needs arguments: name a factory that builds the executor with them")

    def skill(self, raw: Any, path: str) -> Skill:
        if not isinstance(raw, dict):
            self.problem(path, "must be a table")
            return Skill(id="invalid", name="invalid")
        return self.section(Skill, raw, path)

    def key(self, index: int, raw: Any, agents: dict[str, AgentConfig]) -> ApiKey | None:
        path = f"keys[{index}]"
        if not isinstance(raw, dict):
            self.problem(path, "must be a table")
            return None
        try:
            return self.section(ApiKey, raw, path, context={"index": index, "agents": agents})
        except Dropped:
            return None


def takes_no_arguments(function: Any) -> bool:
    """Whether `function()` is a valid call (the gate builds an executor with no arguments)."""
    try:
        inspect.signature(function).bind()
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): let the call decide
        return True
    return True
