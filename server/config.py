"""Configuration: a TOML file read into plain dataclasses.

Every problem is reported with its key path (``agents.echo.price.amount``) so an
operator can fix a file from the message alone; `load_config` raises one
`ConfigError` carrying all of them rather than stopping at the first.
"""

from __future__ import annotations

import inspect
import ipaddress
import math
import os
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from server import callables

EVM_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
CAIP2_NETWORK = re.compile(r"^[-a-z0-9]{3,8}:[-_a-zA-Z0-9]{1,32}$")
AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
BACKENDS = ("echo", "upstream", "python", "a2a-sdk")


class ConfigError(Exception):
    """A configuration that cannot run; `problems` holds one line per fault."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Price:
    scheme: str
    network: str
    asset: str
    amount: str
    pay_to: str
    max_timeout_seconds: int = 300
    extra: dict[str, Any] = field(default_factory=dict)
    description: str = ""


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
    price: Price | None = None
    skills: tuple[Skill, ...] = ()
    url: str = ""  # upstream: the remote agent's JSON-RPC endpoint
    upstream_auth_env: str = ""  # upstream: env var holding the operator's credential
    timeout_seconds: float = 30.0
    poll_interval_seconds: float = 0.5
    deadline_seconds: float = 120.0
    callable: str = ""  # python: "package.module:function"
    executor: str = ""  # a2a-sdk: "package.module:Class" (an AgentExecutor) or a factory returning one
    allowed_payers: tuple[str, ...] | None = None
    per_agent_per_minute: int | None = None
    streaming: bool = True
    on_settle_failure: str = "deliver"  # "withhold": settle before the answer leaves


SETTLE_FAILURE_POLICIES = ("deliver", "withhold")


@dataclass(frozen=True)
class FacilitatorConfig:
    url: str = ""
    timeout_seconds: float = 10.0
    max_in_flight: int = 32
    max_wait_seconds: float = 2.0
    connections: int = 8  # kept-alive HTTP connections; more calls than this queue for one
    auth_header_env: str = ""  # env var holding e.g. "Bearer abc"; never in the file
    auth: str = ""  # "package.module:callable" minting headers per call ({"verify": {...}, "settle": {...}})
    breaker_failures: int = 5  # consecutive failures that open the circuit breaker
    breaker_cooldown_seconds: float = 30.0  # how long it stays open before one probe
    settle_attempts: int = 4
    settle_backoff_seconds: float = 0.5
    settle_margin_seconds: float = 6.0  # time a facilitator wants left on a token to settle it (x402's: 6 s)
    settle_passes: int = 6  # reconciler passes for owed work before the chain is asked
    settle_max_delay_seconds: float = 3600.0  # the longest backoff between two passes

    @property
    def settle_budget_seconds(self) -> float:
        """The longest the in-request settle can take: every attempt, its wait for a slot and the backoffs."""
        backoffs = 1.5 * sum(
            self.settle_backoff_seconds * 2**i for i in range(self.settle_attempts - 1)
        )  # jittered up to +50%
        return self.settle_attempts * (self.timeout_seconds + self.max_wait_seconds) + backoffs


@dataclass(frozen=True)
class NetworkConfig:
    """A chain the gate may ask directly (settlement ground truth, DESIGN section 6)."""

    rpc_url: str = ""
    timeout_seconds: float = 10.0


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
    per_ip_per_minute: int = 30
    per_agent_per_minute: int = 120
    limiter_max_entries: int = 100_000
    ipv6_prefix: int = 64  # an IPv6 caller is its network of this many bits (one household)
    limiter_redis_url: str = ""  # set: the limiters' buckets are shared by every replica through Redis
    limiter_redis_prefix: str = "a2a-gate:limits:"
    limiter_redis_timeout_seconds: float = 0.5  # past this a check is answered by the replica's own buckets
    trusted_proxies: tuple[str, ...] = ()
    facilitator: FacilitatorConfig = FacilitatorConfig()
    http: HttpConfig = HttpConfig()
    streams: StreamConfig = StreamConfig()
    agents: dict[str, AgentConfig] = field(default_factory=dict)
    keys: tuple[ApiKey, ...] = ()
    reconcile_interval_seconds: float = 30.0
    claim_lease_seconds: float = 30.0  # an owner renews its claims' leases; a lapsed one is an orphan
    networks: dict[str, NetworkConfig] = field(default_factory=dict)
    # in-band requests awaiting payment: the original message kept (bytes), and how many per caller
    in_band_max_message_bytes: int = 8192
    in_band_pending_per_ip: int = 5
    source: str = "<embedded defaults>"
    warnings: tuple[str, ...] = ()  # problems that do not stop the server (shown by check-config)

    def agent(self, name: str) -> AgentConfig | None:
        return self.agents.get(name)


DEMO_PRICE = Price(
    scheme="exact",
    network="eip155:84532",  # Base Sepolia, a test network
    asset="0x036CbD53842c5426634e7929541eC2318f3dCF7e",  # USDC on Base Sepolia
    amount="1000",  # 0.001 USDC (6 decimals)
    pay_to="0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
    extra={"name": "USDC", "version": "2"},
)


def is_database_url(database: str) -> bool:
    """A PostgreSQL URL (replicas sharing one store), not a SQLite path."""
    return database.startswith(("postgresql://", "postgres://"))


def default_settings(database: str = "a2a-gate.db") -> Settings:
    """The embedded defaults: a free echo agent (API keys) and a priced one (x402), one SQLite file.

    Without a facilitator the priced agent answers 501; `serve --dev-facilitator`
    starts the development facilitator so the paid flow runs offline.
    """
    skill = Skill(id="echo", name="Echo", description="Repeats the input text.")
    echo = AgentConfig(name="echo", description="Echoes the text it is sent.", skills=(skill,))
    paid = AgentConfig(
        name="paid-echo",
        description="Echoes the text it is sent, for 0.001 test USDC.",
        skills=(skill,),
        price=DEMO_PRICE,
    )
    return Settings(database=database, agents={"echo": echo, "paid-echo": paid})


def load_config(path: str | os.PathLike[str]) -> Settings:
    """Read and validate a TOML file; relative database paths resolve beside it."""
    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError([f"{file}: no such file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{file}: cannot read: {exc}"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{file}: not valid TOML: {exc}"]) from None
    return parse_config(raw, base_dir=file.resolve().parent, source=str(file))


def parse_config(raw: dict[str, Any], *, base_dir: Path, source: str = "<dict>") -> Settings:
    reader = _Reader()
    settings = reader.settings(raw, base_dir, source)
    if reader.problems:
        raise ConfigError([f"{source}: {p}" for p in reader.problems])
    return settings


class _Reader:
    """Walks the raw TOML tree, collecting every problem with its key path."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.base_dir: Path | None = None  # the configuration file's directory: its modules import

    def problem(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(f"{path}: {message}")

    def unknown(self, table: dict[str, Any], known: set[str], path: str) -> None:
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
            "limits",
            "proxy",
            "facilitator",
            "agents",
            "keys",
            "reconcile_interval_seconds",
            "http",
            "streams",
            "claim_lease_seconds",
            "networks",
            "in_band",
        }
        self.unknown(raw, known, "")
        defaults = Settings()
        public_url = self.get(raw, "public_url", str, defaults.public_url, "public_url")
        if public_url:
            public_url = self.http_url(public_url, "public_url")
        database = self.get(raw, "database", str, defaults.database, "database")
        if not is_database_url(database) and database != ":memory:" and not os.path.isabs(database):
            database = str(base_dir / database)

        limits = self.table(raw, "limits", "limits")
        self.unknown(
            limits,
            {
                "per_ip_per_minute",
                "per_agent_per_minute",
                "max_entries",
                "ipv6_prefix",
                "redis_url",
                "redis_prefix",
                "redis_timeout_seconds",
            },
            "limits",
        )
        ipv6_prefix = self.get(limits, "ipv6_prefix", int, defaults.ipv6_prefix, "limits.ipv6_prefix")
        if not 16 <= ipv6_prefix <= 128:
            self.problem("limits.ipv6_prefix", f"must be a prefix length from 16 to 128, got {ipv6_prefix}")
            ipv6_prefix = defaults.ipv6_prefix
        proxy = self.table(raw, "proxy", "proxy")
        self.unknown(proxy, {"trusted"}, "proxy")
        in_band = self.table(raw, "in_band", "in_band")
        self.unknown(in_band, {"max_message_bytes", "pending_per_ip"}, "in_band")
        trusted = self.get(proxy, "trusted", list, [], "proxy.trusted")
        for i, item in enumerate(trusted):
            if not isinstance(item, str) or not item:
                self.problem(f"proxy.trusted[{i}]", "must be an address or network string")

        agents_raw = self.table(raw, "agents", "agents")
        agents = {name: self.agent(name, body) for name, body in agents_raw.items()}
        default_agent = self.get(raw, "default_agent", str, next(iter(agents), ""), "default_agent")
        if default_agent and default_agent not in agents:
            self.problem("default_agent", f"names no configured agent: {default_agent!r}")

        keys_raw = self.get(raw, "keys", list, [], "keys")
        keys = tuple(k for i, body in enumerate(keys_raw) if (k := self.key(i, body, agents)) is not None)

        facilitator = self.facilitator(self.table(raw, "facilitator", "facilitator"))
        if facilitator.url == "" and any(a.price for a in agents.values()):
            self.warn("facilitator.url", "missing: priced agents answer 501 until a facilitator is set")

        agents = {
            name: self.fit_payment_window(agent, agents_raw.get(name), facilitator) for name, agent in agents.items()
        }
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
            per_ip_per_minute=self.positive(
                limits, "per_ip_per_minute", defaults.per_ip_per_minute, "limits.per_ip_per_minute"
            ),
            per_agent_per_minute=self.positive(
                limits, "per_agent_per_minute", defaults.per_agent_per_minute, "limits.per_agent_per_minute"
            ),
            limiter_max_entries=self.positive(
                limits, "max_entries", defaults.limiter_max_entries, "limits.max_entries"
            ),
            ipv6_prefix=ipv6_prefix,
            limiter_redis_url=self.redis_url(limits),
            limiter_redis_prefix=self.get(
                limits, "redis_prefix", str, defaults.limiter_redis_prefix, "limits.redis_prefix"
            ),
            limiter_redis_timeout_seconds=self.positive(
                limits,
                "redis_timeout_seconds",
                defaults.limiter_redis_timeout_seconds,
                "limits.redis_timeout_seconds",
                float,
            ),
            trusted_proxies=tuple(t for t in trusted if isinstance(t, str)),
            facilitator=facilitator,
            http=self.http(self.table(raw, "http", "http")),
            streams=self.streams(self.table(raw, "streams", "streams")),
            agents=agents,
            keys=keys,
            reconcile_interval_seconds=self.positive(
                raw,
                "reconcile_interval_seconds",
                defaults.reconcile_interval_seconds,
                "reconcile_interval_seconds",
                float,
            ),
            claim_lease_seconds=self.positive(
                raw, "claim_lease_seconds", defaults.claim_lease_seconds, "claim_lease_seconds", float
            ),
            networks=self.networks(self.table(raw, "networks", "networks")),
            in_band_max_message_bytes=self.positive(
                in_band, "max_message_bytes", defaults.in_band_max_message_bytes, "in_band.max_message_bytes"
            ),
            in_band_pending_per_ip=self.positive(
                in_band, "pending_per_ip", defaults.in_band_pending_per_ip, "in_band.pending_per_ip"
            ),
            source=source,
            warnings=tuple(f"{source}: {w}" for w in self.warnings),
        )

    def redis_url(self, limits: dict[str, Any]) -> str:
        value = self.get(limits, "redis_url", str, "", "limits.redis_url")
        if value and urlsplit(value).scheme not in ("redis", "rediss", "unix"):
            self.problem("limits.redis_url", "must be a redis://, rediss:// or unix:// URL")
            return ""
        return value

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

    def facilitator(self, raw: dict[str, Any]) -> FacilitatorConfig:
        path = "facilitator"
        self.unknown(
            raw,
            {
                "url",
                "timeout_seconds",
                "max_in_flight",
                "max_wait_seconds",
                "connections",
                "auth_header_env",
                "settle_attempts",
                "settle_backoff_seconds",
                "settle_margin_seconds",
                "auth",
                "breaker_failures",
                "breaker_cooldown_seconds",
                "settle_passes",
                "settle_max_delay_seconds",
            },
            path,
        )
        d = FacilitatorConfig()
        url = self.get(raw, "url", str, "", f"{path}.url")
        if url:
            url = self.http_url(url, f"{path}.url")
        return FacilitatorConfig(
            url=url,
            timeout_seconds=self.positive(raw, "timeout_seconds", d.timeout_seconds, f"{path}.timeout_seconds", float),
            max_in_flight=self.positive(raw, "max_in_flight", d.max_in_flight, f"{path}.max_in_flight"),
            max_wait_seconds=self.positive(
                raw, "max_wait_seconds", d.max_wait_seconds, f"{path}.max_wait_seconds", float
            ),
            connections=self.positive(raw, "connections", d.connections, f"{path}.connections"),
            auth_header_env=self.get(raw, "auth_header_env", str, "", f"{path}.auth_header_env"),
            auth=self.callable_name(raw, "auth", f"{path}.auth"),
            breaker_failures=self.positive(raw, "breaker_failures", d.breaker_failures, f"{path}.breaker_failures"),
            breaker_cooldown_seconds=self.positive(
                raw, "breaker_cooldown_seconds", d.breaker_cooldown_seconds, f"{path}.breaker_cooldown_seconds", float
            ),
            settle_attempts=self.positive(raw, "settle_attempts", d.settle_attempts, f"{path}.settle_attempts"),
            settle_backoff_seconds=self.positive(
                raw, "settle_backoff_seconds", d.settle_backoff_seconds, f"{path}.settle_backoff_seconds", float
            ),
            settle_margin_seconds=self.positive(
                raw, "settle_margin_seconds", d.settle_margin_seconds, f"{path}.settle_margin_seconds", float
            ),
            settle_passes=self.positive(raw, "settle_passes", d.settle_passes, f"{path}.settle_passes"),
            settle_max_delay_seconds=self.positive(
                raw, "settle_max_delay_seconds", d.settle_max_delay_seconds, f"{path}.settle_max_delay_seconds", float
            ),
        )

    def fit_payment_window(self, agent: AgentConfig, raw: Any, facilitator: FacilitatorConfig) -> AgentConfig:
        """A priced agent's maxTimeoutSeconds covers its payment window plus a client's time to sign and send.

        Unset, it grows to fit; set too short, it is a problem: every honest token would
        be refused as `payment_window_too_short`.
        """
        if agent.price is None:
            return agent
        window = payment_window_seconds(agent, facilitator)
        needed = math.ceil(window) + SIGNING_ALLOWANCE_SECONDS
        if agent.price.max_timeout_seconds >= needed:
            return agent
        if isinstance(raw, dict) and isinstance(raw.get("price"), dict) and "max_timeout_seconds" in raw["price"]:
            self.problem(
                f"agents.{agent.name}.price.max_timeout_seconds",
                f"{agent.price.max_timeout_seconds} s cannot collect a payment: this agent needs {window:g} s"
                f" (deadline_seconds {agent.deadline_seconds:g} + facilitator settle retries"
                f" {facilitator.settle_budget_seconds:g} + settle_margin_seconds {facilitator.settle_margin_seconds:g})"
                f" plus {SIGNING_ALLOWANCE_SECONDS} s for the client; use at least {needed} or shorten those",
            )
            return agent
        return replace(agent, price=replace(agent.price, max_timeout_seconds=needed))

    def callable_name(self, raw: dict[str, Any], key: str, path: str) -> str:
        target = self.get(raw, key, str, "", path)
        if target and not re.match(r"^[\w.]+:[\w.]+$", target):
            self.problem(path, f"must be 'package.module:callable', got {target!r}")
        return target

    def networks(self, raw: dict[str, Any]) -> dict[str, NetworkConfig]:
        networks = {}
        for name, body in raw.items():
            path = f'networks."{name}"'
            if not CAIP2_NETWORK.match(name):
                self.problem(path, "must be a CAIP-2 network such as 'eip155:8453'")
            if not isinstance(body, dict):
                self.problem(path, "must be a table")
                continue
            self.unknown(body, {"rpc_url", "timeout_seconds"}, path)
            rpc_url = self.get(body, "rpc_url", str, "", f"{path}.rpc_url")
            if rpc_url:
                rpc_url = self.http_url(rpc_url, f"{path}.rpc_url")
            networks[name] = NetworkConfig(
                rpc_url=rpc_url,
                timeout_seconds=self.positive(body, "timeout_seconds", 10.0, f"{path}.timeout_seconds", float),
            )
        return networks

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
            "price",
            "skills",
            "url",
            "upstream_auth_env",
            "timeout_seconds",
            "poll_interval_seconds",
            "deadline_seconds",
            "callable",
            "executor",
            "allowed_payers",
            "per_agent_per_minute",
            "streaming",
            "on_settle_failure",
        }
        self.unknown(raw, known, path)
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
        payers = raw.get("allowed_payers")
        allowed: tuple[str, ...] | None = None
        if payers is not None:
            if not isinstance(payers, list):
                self.problem(f"{path}.allowed_payers", "must be a list of addresses")
            else:
                for i, p in enumerate(payers):
                    if not isinstance(p, str) or not EVM_ADDRESS.match(p):
                        self.problem(f"{path}.allowed_payers[{i}]", "must be a 0x address (40 hex digits)")
                allowed = tuple(p.lower() for p in payers if isinstance(p, str))
        skills_raw = self.get(raw, "skills", list, [], f"{path}.skills")
        price_raw = raw.get("price")
        price = None if price_raw is None else self.price(price_raw, f"{path}.price")
        per_agent = raw.get("per_agent_per_minute")
        return AgentConfig(
            name=name,
            description=self.get(raw, "description", str, "", f"{path}.description"),
            backend=backend,
            exposed=self.get(raw, "exposed", bool, True, f"{path}.exposed"),
            price=price,
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
            allowed_payers=allowed,
            per_agent_per_minute=None
            if per_agent is None
            else self.positive(raw, "per_agent_per_minute", None, f"{path}.per_agent_per_minute"),
            streaming=self.get(raw, "streaming", bool, True, f"{path}.streaming"),
            on_settle_failure=self.settle_failure_policy(raw, path),
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

    def settle_failure_policy(self, raw: dict[str, Any], path: str) -> str:
        policy = self.get(raw, "on_settle_failure", str, "deliver", f"{path}.on_settle_failure")
        if policy not in SETTLE_FAILURE_POLICIES:
            self.problem(
                f"{path}.on_settle_failure", f"must be one of {', '.join(SETTLE_FAILURE_POLICIES)}, got {policy!r}"
            )
            return "deliver"
        return policy

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

    def price(self, raw: Any, path: str) -> Price | None:
        if not isinstance(raw, dict):
            self.problem(
                path,
                "must be a table with network, asset, amount (atomic units) and pay_to, e.g."
                ' price = { network = "eip155:84532", asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e",'
                ' amount = "2000", pay_to = "0x<your address>" } (0.002 USDC on Base Sepolia)',
            )
            return None
        self.unknown(
            raw, {"scheme", "network", "asset", "amount", "pay_to", "max_timeout_seconds", "extra", "description"}, path
        )
        scheme = self.get(raw, "scheme", str, "exact", f"{path}.scheme")
        if scheme != "exact":
            self.problem(f"{path}.scheme", f"only 'exact' is supported, got {scheme!r}")
        network = self.get(raw, "network", str, "", f"{path}.network")
        if not CAIP2_NETWORK.match(network):
            self.problem(f"{path}.network", f"must be a CAIP-2 network such as 'eip155:84532', got {network!r}")
        asset = self.get(raw, "asset", str, "", f"{path}.asset")
        if not EVM_ADDRESS.match(asset):
            self.problem(f"{path}.asset", f"must be a 0x token address (40 hex digits), got {asset!r}")
        pay_to = self.get(raw, "pay_to", str, "", f"{path}.pay_to")
        if not EVM_ADDRESS.match(pay_to):
            self.problem(f"{path}.pay_to", f"must be a 0x address (40 hex digits), got {pay_to!r}")
        amount = raw.get("amount")
        if isinstance(amount, int) and not isinstance(amount, bool):
            amount = str(amount)
        if (
            not isinstance(amount, str)
            or not (amount.isascii() and amount.isdigit())
            or int(amount) <= 0
            or len(amount) > 78
        ):
            self.problem(f"{path}.amount", f"must be a positive whole number of atomic units, got {amount!r}")
            amount = "0"
        extra = self.asset_extra(raw, network, asset, f"{path}.extra")
        return Price(
            scheme=scheme,
            network=network,
            asset=asset,
            amount=str(int(amount)),
            pay_to=pay_to,
            max_timeout_seconds=self.positive(raw, "max_timeout_seconds", 300, f"{path}.max_timeout_seconds"),
            extra=extra,
            description=self.get(raw, "description", str, "", f"{path}.description"),
        )

    def asset_extra(self, raw: dict[str, Any], network: str, asset: str, path: str) -> dict[str, Any]:
        """The asset's EIP-712 domain (`name`, `version`): a client cannot sign a payment without it.

        Known USDC deployments bring their own; any other asset needs an `extra` table.
        """
        extra = self.get(raw, "extra", dict, None, path)
        if extra is None:
            extra = default_asset_extra(network, asset)
            if not extra and EVM_ADDRESS.match(asset) and CAIP2_NETWORK.match(network):
                self.problem(
                    path,
                    f"required for asset {asset} on {network} (no known EIP-712 domain): the token's name and"
                    ' version, e.g. extra = { name = "USD Coin", version = "2" }',
                )
            return extra
        for key in ("name", "version"):
            if not isinstance(extra.get(key), str) or not extra[key]:
                self.problem(f"{path}.{key}", "required: the token's EIP-712 domain name and version, as strings")
        return extra

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


SIGNING_ALLOWANCE_SECONDS = 30  # inside maxTimeoutSeconds: a client's time to sign a token and send it


def payment_window_seconds(agent: AgentConfig, facilitator: FacilitatorConfig) -> float:
    """How long a token must stay valid for this agent's work to be delivered and then collected:
    its execution deadline, the settle retry budget and the facilitator's settle margin."""
    return agent.deadline_seconds + facilitator.settle_budget_seconds + facilitator.settle_margin_seconds


# EIP-712 domain of well-known USDC deployments, so a price needs no `extra` table.
KNOWN_ASSETS: dict[tuple[str, str], dict[str, str]] = {
    ("eip155:84532", "0x036cbd53842c5426634e7929541ec2318f3dcf7e"): {"name": "USDC", "version": "2"},
    ("eip155:8453", "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913"): {"name": "USD Coin", "version": "2"},
}


def default_asset_extra(network: str, asset: str) -> dict[str, Any]:
    return dict(KNOWN_ASSETS.get((network, asset.lower()), {}))
