"""The server's configuration: a TOML file read into plain dataclasses.

Every problem is reported with its key path (``agents.echo.timeout_seconds``) so an
operator can fix a file from the message alone; `load_config` raises one
`ConfigError` carrying all of them rather than stopping at the first.

The server reads its own keys only. The tables and per-agent keys an anonymous path
declares it reads (`server.anonymous.PathConfig`) are kept raw in `Settings.sections`
and `AgentConfig.sections`, for that path's own reader (a `Reader` like the server's,
so its problems join the same list); any other key is a problem.
"""

from __future__ import annotations

import inspect
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from server import callables

AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
BACKENDS = ("echo", "upstream", "python", "a2a-sdk")


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


@dataclass(frozen=True)
class Skill:
    id: str
    name: str
    description: str = ""
    tags: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()


@dataclass(frozen=True)
class AgentConfig:
    name: str
    description: str = ""
    backend: str = "echo"
    exposed: bool = True
    skills: tuple[Skill, ...] = ()
    url: str = ""  # upstream: the remote agent's JSON-RPC endpoint
    upstream_auth_env: str = ""  # upstream: env var holding the operator's credential
    timeout_seconds: float = 30.0
    poll_interval_seconds: float = 0.5
    deadline_seconds: float = 120.0
    callable: str = ""  # python: "package.module:function"
    executor: str = ""  # a2a-sdk: "package.module:Class" (an AgentExecutor) or a factory returning one
    streaming: bool = True
    sections: dict[str, Any] = field(default_factory=dict)  # the anonymous path's keys, raw


@dataclass(frozen=True)
class HttpConfig:
    """How long a client may take to send a request, and to stay idle (see server/deadlines.py)."""

    head_timeout_seconds: float = 10.0  # request line and headers, from the request's first byte
    body_timeout_seconds: float = 30.0  # the whole body, from the end of the headers
    keep_alive_seconds: float = 5.0  # an idle connection between requests
    max_head_bytes: int = 16_384  # request line and headers together; a larger head is answered 400
    drain_seconds: float = 10.0  # on SIGTERM: how long requests and running work may finish
    metrics_listen: tuple[str, int] | None = None  # (ip, port): /metrics there only, not on the A2A port
    metrics_token_env: str = ""  # env var holding the bearer token /metrics asks for; never in the file
    implementation: str = "auto"  # uvicorn's HTTP parser: h11, httptools, or auto (httptools when installed)
    loop: str = "auto"  # the event loop: asyncio, uvloop, or auto (uvloop when installed)


@dataclass(frozen=True)
class StreamConfig:
    """How many resubscription streams may be open at once in one process (see server/streams.py)."""

    max_per_task: int = 500  # streams following one task
    max_per_owner: int = 100  # streams of one key, or of one payer
    max_per_client: int = 100  # streams from one client address (an IPv4 address, an IPv6 /64)


@dataclass(frozen=True)
class ApiKey:
    """A key declared in the file by its SHA-256 digest (see `a2a-gate keys create`)."""

    name: str
    sha256: str
    agents: tuple[str, ...]
    revoked: bool = False


@dataclass(frozen=True)
class Settings:
    public_url: str = ""  # empty: from a trusted proxy's headers, else the server's own address
    database: str = "a2a-gate.db"
    default_agent: str = "echo"
    max_body_bytes: int = 1_048_576
    task_retention_days: float = 7.0
    task_deadline_seconds: float = 600.0
    housekeeping_interval_seconds: float = 60.0  # how often stuck tasks are failed and old ones deleted
    trusted_proxies: tuple[str, ...] = ()
    http: HttpConfig = HttpConfig()
    streams: StreamConfig = StreamConfig()
    agents: dict[str, AgentConfig] = field(default_factory=dict)
    keys: tuple[ApiKey, ...] = ()
    source: str = "<embedded defaults>"
    warnings: tuple[str, ...] = ()  # problems that do not stop the server (shown by check-config)
    sections: dict[str, Any] = field(default_factory=dict)  # the anonymous path's tables and keys, raw
    anonymous: Any = None  # what the anonymous path read of them (`server.anonymous.PathConfig.read`)


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
        value = raw.get(key, {})
        if not isinstance(value, dict):
            self.problem(path, "must be a table")
            return {}
        return value

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
        value = self.get(raw, key, kinds, default, path)
        if value is not default and not value > 0:  # `not > 0` also refuses nan
            self.problem(path, "must be greater than 0")
            return default
        return kind(value)

    def one_of(self, raw: dict[str, Any], key: str, choices: tuple[str, ...], path: str) -> str:
        """A string among `choices` (the first is the default)."""
        value = self.get(raw, key, str, choices[0], path)
        if value not in choices:
            self.problem(path, f"must be one of {', '.join(choices)}, got {value!r}")
            return choices[0]
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
        known = {
            "public_url",
            "database",
            "default_agent",
            "max_body_bytes",
            "task_retention_days",
            "task_deadline_seconds",
            "housekeeping_interval_seconds",
            "proxy",
            "agents",
            "keys",
            "http",
            "streams",
        }
        self.unknown(raw, known | self.path_keys, "")
        defaults = Settings()
        public_url = self.get(raw, "public_url", str, defaults.public_url, "public_url")
        if public_url:
            public_url = self.http_url(public_url, "public_url")
        database = self.get(raw, "database", str, defaults.database, "database")
        if not is_database_url(database) and database != ":memory:" and not os.path.isabs(database):
            database = str((state_directory(os.environ) or base_dir) / database)
        proxy = self.table(raw, "proxy", "proxy")
        self.unknown(proxy, {"trusted"}, "proxy")
        trusted = self.get(proxy, "trusted", list, [], "proxy.trusted")
        for i, item in enumerate(trusted):
            if not isinstance(item, str) or not item:
                self.problem(f"proxy.trusted[{i}]", "must be an address or network string")
            elif problem := trusted_proxy_problem(item):
                self.problem(f"proxy.trusted[{i}]", problem)

        agents_raw = self.table(raw, "agents", "agents")
        agents = {name: self.agent(name, body) for name, body in agents_raw.items()}
        default_agent = self.get(raw, "default_agent", str, next(iter(agents), ""), "default_agent")
        if default_agent and default_agent not in agents:
            self.problem("default_agent", f"names no configured agent: {default_agent!r}")

        keys_raw = self.get(raw, "keys", list, [], "keys")
        keys = tuple(k for i, body in enumerate(keys_raw) if (k := self.key(i, body, agents)) is not None)
        return Settings(
            public_url=public_url,
            database=database,
            default_agent=default_agent,
            max_body_bytes=self.positive(raw, "max_body_bytes", defaults.max_body_bytes, "max_body_bytes"),
            task_retention_days=self.positive(
                raw, "task_retention_days", defaults.task_retention_days, "task_retention_days", float
            ),
            task_deadline_seconds=self.positive(
                raw, "task_deadline_seconds", defaults.task_deadline_seconds, "task_deadline_seconds", float
            ),
            housekeeping_interval_seconds=self.positive(
                raw,
                "housekeeping_interval_seconds",
                defaults.housekeeping_interval_seconds,
                "housekeeping_interval_seconds",
                float,
            ),
            trusted_proxies=tuple(t for t in trusted if isinstance(t, str)),
            http=self.http(self.table(raw, "http", "http")),
            streams=self.streams(self.table(raw, "streams", "streams")),
            agents=agents,
            keys=keys,
            source=source,
            warnings=tuple(f"{source}: {w}" for w in self.warnings),
            sections={key: raw[key] for key in self.path_keys if key in raw},
        )

    def http(self, raw: dict[str, Any]) -> HttpConfig:
        self.unknown(
            raw,
            {
                "head_timeout_seconds",
                "body_timeout_seconds",
                "keep_alive_seconds",
                "max_head_bytes",
                "drain_seconds",
                "metrics_listen",
                "metrics_token_env",
                "implementation",
                "loop",
            },
            "http",
        )
        d = HttpConfig()
        return HttpConfig(
            head_timeout_seconds=self.positive(
                raw, "head_timeout_seconds", d.head_timeout_seconds, "http.head_timeout_seconds", float
            ),
            body_timeout_seconds=self.positive(
                raw, "body_timeout_seconds", d.body_timeout_seconds, "http.body_timeout_seconds", float
            ),
            keep_alive_seconds=self.positive(
                raw, "keep_alive_seconds", d.keep_alive_seconds, "http.keep_alive_seconds", float
            ),
            max_head_bytes=self.positive(raw, "max_head_bytes", d.max_head_bytes, "http.max_head_bytes"),
            drain_seconds=self.positive(raw, "drain_seconds", d.drain_seconds, "http.drain_seconds", float),
            metrics_listen=self.listen_address(self.get(raw, "metrics_listen", str, "", "http.metrics_listen")),
            metrics_token_env=self.get(raw, "metrics_token_env", str, "", "http.metrics_token_env"),
            implementation=self.one_of(raw, "implementation", ("auto", "h11", "httptools"), "http.implementation"),
            loop=self.one_of(raw, "loop", ("auto", "asyncio", "uvloop"), "http.loop"),
        )

    def streams(self, raw: dict[str, Any]) -> StreamConfig:
        self.unknown(raw, {"max_per_task", "max_per_owner", "max_per_client"}, "streams")
        d = StreamConfig()
        return StreamConfig(
            max_per_task=self.positive(raw, "max_per_task", d.max_per_task, "streams.max_per_task"),
            max_per_owner=self.positive(raw, "max_per_owner", d.max_per_owner, "streams.max_per_owner"),
            max_per_client=self.positive(raw, "max_per_client", d.max_per_client, "streams.max_per_client"),
        )

    def listen_address(self, value: str) -> tuple[str, int] | None:
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
            self.problem("http.metrics_listen", 'must be IP:PORT, e.g. "127.0.0.1:9464" or "[::1]:9464"')
            return None
        return str(address), number

    def callable_name(self, raw: dict[str, Any], key: str, path: str) -> str:
        target = self.get(raw, key, str, "", path)
        if target and not re.match(r"^[\w.]+:[\w.]+$", target):
            self.problem(path, f"must be 'package.module:callable', got {target!r}")
        return target

    def agent(self, name: str, raw: Any) -> AgentConfig:
        path = f"agents.{name}"
        if not AGENT_NAME.match(name):
            self.problem(path, "agent names use letters, digits, '_', '.', '-' (at most 64)")
        if not isinstance(raw, dict):
            self.problem(path, "must be a table")
            return AgentConfig(name=name)
        known = {
            "description",
            "backend",
            "exposed",
            "skills",
            "url",
            "upstream_auth_env",
            "timeout_seconds",
            "poll_interval_seconds",
            "deadline_seconds",
            "callable",
            "executor",
            "streaming",
        }
        self.unknown(raw, known | self.path_agent_keys, path)
        backend = self.get(raw, "backend", str, "echo", f"{path}.backend")
        if backend not in BACKENDS:
            self.problem(f"{path}.backend", f"must be one of {', '.join(BACKENDS)}, got {backend!r}")
        url = self.get(raw, "url", str, "", f"{path}.url")
        if backend == "upstream":
            if not url:
                self.problem(f"{path}.url", "required for an upstream agent")
            else:
                url = self.http_url(url, f"{path}.url")
        target = self.get(raw, "callable", str, "", f"{path}.callable")
        if backend == "python":
            if not re.match(r"^[\w.]+:[\w.]+$", target):
                self.problem(f"{path}.callable", "required for a python agent, as 'package.module:function'")
            elif (function := self.importable(target, f"{path}.callable")) is not None and not callable(function):
                self.problem(f"{path}.callable", f"{target} is not callable")
        executor = self.get(raw, "executor", str, "", f"{path}.executor")
        if backend == "a2a-sdk":
            self.executor(executor, f"{path}.executor")
        skills_raw = self.get(raw, "skills", list, [], f"{path}.skills")
        return AgentConfig(
            name=name,
            description=self.get(raw, "description", str, "", f"{path}.description"),
            backend=backend,
            exposed=self.get(raw, "exposed", bool, True, f"{path}.exposed"),
            skills=tuple(self.skill(s, f"{path}.skills[{i}]") for i, s in enumerate(skills_raw)),
            url=url,
            upstream_auth_env=self.get(raw, "upstream_auth_env", str, "", f"{path}.upstream_auth_env"),
            timeout_seconds=self.positive(raw, "timeout_seconds", 30.0, f"{path}.timeout_seconds", float),
            poll_interval_seconds=self.positive(
                raw, "poll_interval_seconds", 0.5, f"{path}.poll_interval_seconds", float
            ),
            deadline_seconds=self.positive(raw, "deadline_seconds", 120.0, f"{path}.deadline_seconds", float),
            callable=target,
            executor=executor,
            streaming=self.get(raw, "streaming", bool, True, f"{path}.streaming"),
            sections={key: raw[key] for key in self.path_agent_keys if key in raw},
        )

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
        if not re.match(r"^[\w.]+:[\w.]+$", target):
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
        self.unknown(raw, {"id", "name", "description", "tags", "examples"}, path)
        skill_id = self.get(raw, "id", str, "", f"{path}.id")
        if not skill_id:
            self.problem(f"{path}.id", "required")
        return Skill(
            id=skill_id,
            name=self.get(raw, "name", str, skill_id, f"{path}.name"),
            description=self.get(raw, "description", str, "", f"{path}.description"),
            tags=tuple(str(t) for t in self.get(raw, "tags", list, [], f"{path}.tags")),
            examples=tuple(str(e) for e in self.get(raw, "examples", list, [], f"{path}.examples")),
        )

    def key(self, index: int, raw: Any, agents: dict[str, AgentConfig]) -> ApiKey | None:
        path = f"keys[{index}]"
        if not isinstance(raw, dict):
            self.problem(path, "must be a table")
            return None
        self.unknown(raw, {"name", "sha256", "agents", "revoked"}, path)
        digest = self.get(raw, "sha256", str, "", f"{path}.sha256")
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            self.problem(
                f"{path}.sha256", "must be 64 lowercase hex digits (the stored form from `a2a-gate keys create`)"
            )
            return None
        names = self.get(raw, "agents", list, [], f"{path}.agents")
        for name in names:
            if not isinstance(name, str) or (name != "*" and name not in agents):
                self.problem(f"{path}.agents", f"names no configured agent: {name!r}")
        return ApiKey(
            name=self.get(raw, "name", str, f"key-{index}", f"{path}.name"),
            sha256=digest,
            agents=tuple(str(n) for n in names),
            revoked=self.get(raw, "revoked", bool, False, f"{path}.revoked"),
        )


def takes_no_arguments(function: Any) -> bool:
    """Whether `function()` is a valid call (the gate builds an executor with no arguments)."""
    try:
        inspect.signature(function).bind()
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): let the call decide
        return True
    return True
