"""The gate's configuration: every payment table and per-agent payment key of the file.

The server reads its own keys and hands the gate the rest raw (`server.anonymous.PathConfig`):
the `[facilitator]`, `[networks]`, `[limits]`, `[in_band]` and `[webhooks]` tables, the claim and reconcile
intervals, and each agent's `price`, `allowed_payers`, `per_agent_per_minute`, `on_settle_failure`,
`payment_identifier`, `discovery` and `sign_in`. Problems go to the server's reader with their key paths
(``agents.echo.price.amount``), so `a2a-gate check-config` lists both halves' in one list.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gate import schemes
from gate.price import Price, UsagePrice
from gate.schemes import batch_settlement
from gate.webhooks.config import WebhooksConfig
from server import anonymous
from server.config import AgentConfig, ConfigError, Reader, Settings, callable_name, key, keys_of, optional_http_url
from server.config import default_settings as server_defaults

EVM_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
DECIMAL = re.compile(r"^(0|[1-9][0-9]*)(\.[0-9]+)?$")
CAIP2_NETWORK = re.compile(r"^[-a-z0-9]{3,8}:[-_a-zA-Z0-9]{1,32}$")
SETTLE_FAILURE_POLICIES = ("deliver", "withhold")
PAYMENT_IDENTIFIER_POLICIES = ("optional", "required")  # an agent's `payment_identifier`
PRICE_KEYS = frozenset(
    {
        "scheme",
        "asset_transfer_method",
        "network",
        "asset",
        "amount",
        "pay_to",
        "max_timeout_seconds",
        "extra",
        "description",
        "accepts",
        "receiver_authorizer",
        "withdraw_delay_seconds",
        "min_deposit",
    }
)
USAGE_PRICE_KEYS = frozenset({"ceiling", "facilitator_address", "usage"})  # beside PRICE_KEYS, for `upto`
USAGE_KEYS = frozenset({"unit", "unit_price", "fixed", "callable"})
USAGE_SCHEMES = frozenset({"upto"})  # schemes whose price is a ceiling and a usage rule
# The development facilitator's settling address (devnet.chain.FACILITATOR_ADDRESS, which the gate
# may not import): the example's usage-priced agent names it as its upto price's facilitator_address.
DEV_FACILITATOR_ADDRESS = "0xFB0b6D1F8B44CAeaC383d5AC8C0b374BB08E2619"
DEV_NETWORK = "eip155:84532"  # the network the development chain stands for (devnet.chain.DEV_NETWORK)
CHANNEL_KEYS = ("receiver_authorizer", "withdraw_delay_seconds", "min_deposit")  # batch-settlement's own
SIGNING_ALLOWANCE_SECONDS = 30  # inside maxTimeoutSeconds: a client's time to sign a token and send it

# EIP-712 domain of well-known USDC deployments, so a price needs no `extra` table.
KNOWN_ASSETS: dict[tuple[str, str], dict[str, str]] = {
    ("eip155:84532", "0x036cbd53842c5426634e7929541ec2318f3dcf7e"): {"name": "USDC", "version": "2"},
    ("eip155:8453", "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913"): {"name": "USD Coin", "version": "2"},
}


# How the keys that are not read plainly are read (`server.config.Key`): each is called with the
# reader, the value, the key's path and the fields read before it (with the reading's context).


def _ipv6_prefix(r: Reader, prefix: int, path: str, _: Mapping[str, Any]) -> int:
    if not 16 <= prefix <= 128:
        r.problem(path, f"must be a prefix length from 16 to 128, got {prefix}")
        return LimitsConfig.ipv6_prefix
    return prefix


def _redis_url(r: Reader, url: str, path: str, _: Mapping[str, Any]) -> str:
    if url and urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        r.problem(path, "must be a redis://, rediss:// or unix:// URL")
        return ""
    return url


def _unwatched(r: Reader, accept: bool, path: str, _: Mapping[str, Any]) -> bool:
    if accept:
        r.warn(
            path,
            "payment channels on a network without [networks] rpc_url are not watched for withdrawals:"
            " only the claim schedule stands between a payer's withdrawal and its charged vouchers",
        )
    return accept


def _refund_after(r: Reader, seconds: float, path: str, _: Mapping[str, Any]) -> float:
    if seconds < 0:
        r.problem(path, "must be 0 (never) or a number of seconds")
        return ChannelsConfig.refund_after_seconds
    return seconds


def _claim_at_amount(r: Reader, amount: Any, path: str, _: Mapping[str, Any]) -> int:
    """A whole number of atomic units: a TOML integer, or a string of digits (larger than an integer holds)."""
    if amount is None:
        return ChannelsConfig.claim_at_amount
    if isinstance(amount, str) and amount.isascii() and amount.isdigit():
        amount = int(amount)
    if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0:
        r.problem(path, f"must be a whole number of atomic units, got {amount!r}")
        return ChannelsConfig.claim_at_amount
    return amount


def _networks(r: Reader, raw: Any, path: str, _: Mapping[str, Any]) -> dict[str, NetworkConfig]:
    networks = {}
    for name, body in r.as_table(raw, path).items():
        where = f'{path}."{name}"'
        if not CAIP2_NETWORK.match(name):
            r.problem(where, "must be a CAIP-2 network such as 'eip155:8453'")
        if not isinstance(body, dict):
            r.problem(where, "must be a table")
            continue
        networks[name] = r.section(NetworkConfig, body, where)
    return networks


def _agents(r: Reader, _: Any, path: str, gate: Mapping[str, Any]) -> dict[str, AgentPayment]:
    """Each agent's payment keys (kept raw by the server in `AgentConfig.sections`)."""
    settings: Settings = gate["settings"]
    facilitator: FacilitatorConfig = gate["facilitator"]
    agents = {
        name: r.section(AgentPayment, agent.sections, f"agents.{name}", name=name, context={**gate, "agent": agent})
        for name, agent in settings.agents.items()
    }
    if facilitator.url == "" and any(a.price for a in agents.values()):
        r.warn("facilitator.url", "missing: priced agents answer 501 until a facilitator is set")
    return agents


def _allowed_payers(r: Reader, payers: Any, path: str, _: Mapping[str, Any]) -> tuple[str, ...] | None:
    if payers is None:
        return None
    if not isinstance(payers, list):
        r.problem(path, "must be a list of addresses")
        return None
    for i, p in enumerate(payers):
        if not isinstance(p, str) or not EVM_ADDRESS.match(p):
            r.problem(f"{path}[{i}]", "must be a 0x address (40 hex digits)")
    return tuple(p.lower() for p in payers if isinstance(p, str))


def _price(r: Reader, raw: Any, path: str, agent: Mapping[str, Any]) -> Price | None:
    return None if raw is None else _GateReader(r).agent_price(agent["agent"], raw, path, agent["facilitator"])


@dataclass(frozen=True)
class AgentPayment:
    """What one agent asks of an anonymous caller: its price (None: keys only) and payment rules."""

    # read (and their problems listed) in this order
    name: str = key(in_file=False)  # the agent's
    allowed_payers: tuple[str, ...] | None = key(None, read=_allowed_payers)
    price: Price | None = key(None, read=_price)
    # "withhold": settle before the answer leaves
    on_settle_failure: str = key("deliver", choices=SETTLE_FAILURE_POLICIES)
    # "required": a payment must carry an x402 payment identifier (gate/payment_ids.py)
    payment_identifier: str = key("optional", choices=PAYMENT_IDENTIFIER_POLICIES)
    # true: its 402 declares x402's `bazaar` extension, so a facilitator that catalogs what it settles
    # lists the agent publicly (gate/bazaar.py); off by default: a listing is the operator's choice,
    # and the declaration adds a kilobyte and more to every 402 and to every payment clients send
    discovery: bool = False
    # true: each 402 carries a sign-in challenge of its own (x402 `sign-in-with-x`), so a payer reads its
    # tasks by signing in with its wallet (gate/sign_in.py) instead of showing a spendable payment;
    # false: a smaller 402 (about 1.2 KB less, no nonce made per answer), and a payment proves the payer
    sign_in: bool = True
    per_agent_per_minute: int | None = None


@dataclass(frozen=True)
class FacilitatorConfig:
    url: str = key("", check=optional_http_url)
    timeout_seconds: float = 10.0
    max_in_flight: int = 32
    max_wait_seconds: float = 2.0
    connections: int = 8  # kept-alive HTTP connections; more calls than this queue for one
    auth_header_env: str = ""  # env var holding e.g. "Bearer abc"; never in the file
    # "package.module:callable" minting headers per call ({"verify": {...}, "settle": {...}})
    auth: str = key("", check=callable_name)
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

    rpc_url: str = key("", check=optional_http_url)
    timeout_seconds: float = 10.0


@dataclass(frozen=True)
class LimitsConfig:
    """The anonymous path's token buckets (`[limits]`)."""

    # read (and their problems listed) in this order
    ipv6_prefix: int = key(64, positive=False, check=_ipv6_prefix)  # an IPv6 caller is its network of this many bits
    redis_url: str = key("", check=_redis_url)  # set: the buckets are shared by every replica through Redis
    per_ip_per_minute: int = 30
    per_agent_per_minute: int = 120
    max_entries: int = 100_000
    redis_prefix: str = "a2a-gate:limits:"
    redis_timeout_seconds: float = 0.5  # past this a check is answered by the replica's own buckets


@dataclass(frozen=True)
class InBandConfig:
    """In-band requests awaiting payment (`[in_band]`): the original message kept, and how many per caller."""

    max_message_bytes: int = 8192
    pending_per_ip: int = 5


@dataclass(frozen=True)
class OfferReceiptConfig:
    """`[offer_receipt]`: the form of the signed offers and receipts (gate/offer_receipt.py), made
    with the operator's key (`[signing]`); without a key nothing is signed and this is unused."""

    format: str = key("jws", choices=("jws", "eip712"))  # eip712 needs a secp256k1 key


@dataclass(frozen=True)
class ChannelsConfig:
    """When the gate collects payment channels (`[channels]`, gate/channel_jobs.py).

    The defaults fit the shortest withdraw delay a channel may have (900 s): see
    `claim_deadline_seconds`."""

    # read (and their problems listed) in this order
    # channel offers on a network without [networks] rpc_url: a payer's withdrawal goes unseen (opt-out, warned)
    accept_unwatched_withdrawals: bool = key(False, check=_unwatched)
    # a channel unused this long is refunded (0: never)
    refund_after_seconds: float = key(7 * 86400.0, positive=False, check=_refund_after)
    # claim a channel once this much (atomic units) is charged and unclaimed
    claim_at_amount: int = key(1_000_000, read=_claim_at_amount)
    claim_interval_seconds: float = 60.0  # how often a claim pass runs
    claim_after_seconds: float = 300.0  # or once its oldest unclaimed charge is this old


@dataclass(frozen=True)
class GateConfig:
    # read (and their problems listed) in this order: an agent's payment window needs the facilitator's
    facilitator: FacilitatorConfig = FacilitatorConfig()
    # each agent's own keys, beside the server's in [agents.NAME] (`AgentPayment`)
    agents: dict[str, AgentPayment] = key(factory=dict, in_file=False, read=_agents)
    networks: dict[str, NetworkConfig] = key(factory=dict, read=_networks)
    limits: LimitsConfig = LimitsConfig()
    channels: ChannelsConfig = ChannelsConfig()
    in_band: InBandConfig = InBandConfig()
    offer_receipt: OfferReceiptConfig = OfferReceiptConfig()
    webhooks: WebhooksConfig = WebhooksConfig()  # endpoints told of payments (gate/webhooks/)
    reconcile_interval_seconds: float = 30.0
    claim_lease_seconds: float = 30.0  # an owner renews its claims' leases; a lapsed one is an orphan

    def agent(self, name: str) -> AgentPayment:
        return self.agents.get(name) or AgentPayment(name)

    def price(self, name: str) -> Price | None:
        return self.agent(name).price


DEMO_PRICE = Price(
    scheme="exact",
    network="eip155:84532",  # Base Sepolia, a test network
    asset="0x036CbD53842c5426634e7929541eC2318f3dCF7e",  # USDC on Base Sepolia
    amount="1000",  # 0.001 USDC (6 decimals)
    pay_to="0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
    extra={"name": "USDC", "version": "2"},
)
# The usage-priced demo: the echo, 10 atomic units (0.00001 USDC) per character it answers with,
# at most 0.05 USDC; settled by the development facilitator.
DEMO_METERED_PRICE = replace(
    DEMO_PRICE,
    scheme="upto",
    asset_transfer_method="permit2",
    amount="50000",
    extra={**DEMO_PRICE.extra, "facilitatorAddress": DEV_FACILITATOR_ADDRESS},
    usage=UsagePrice(unit="characters", unit_price=Fraction(10)),
)
METERED_DESCRIPTION = "Echoes the text it is sent, for 0.00001 test USDC per character (at most 0.05)."


# The development facilitator holds the receiver-authorizer key of its simulated settlement
# contract and signs the gate's claims with it (what a hosted facilitator's /supported lists).
DEV_RECEIVER_AUTHORIZER = "0xE40b4B07d90d26934b21e6E463a286988E28deeF"
DEMO_CHANNEL_PRICE = replace(
    DEMO_PRICE,
    alternatives=(
        replace(
            DEMO_PRICE,
            scheme="batch-settlement",
            extra={
                **DEMO_PRICE.extra,
                "receiverAuthorizer": DEV_RECEIVER_AUTHORIZER,
                "withdrawDelay": 900,
                "minDeposit": "10000",
            },
        ),
    ),
)


# As the example configuration sets them: a channel payer's hundred calls a minute get through,
# and what they charged is claimed on chain within a minute.
DEMO_LIMITS = LimitsConfig(per_ip_per_minute=300, per_agent_per_minute=1200)
DEMO_CHANNELS = ChannelsConfig(claim_interval_seconds=15.0, claim_after_seconds=30.0)


# How long a mirrored channel state is trusted for local verification, as the binding's server
# derives it: a third of the withdraw delay, from 30 s to 5 min (a payer's withdrawal request
# then still leaves the gate most of the delay to claim).
MIN_FRESH_SECONDS, MAX_FRESH_SECONDS = 30.0, 300.0


def fresh_seconds(withdraw_delay: int) -> float:
    return min(MAX_FRESH_SECONDS, max(MIN_FRESH_SECONDS, withdraw_delay / 3))


def claim_deadline_seconds(channels: ChannelsConfig, facilitator: FacilitatorConfig) -> float:
    """The longest a charged voucher increment can wait for its claim to land, by the schedule alone
    (no withdrawal seen): due `claim_after_seconds` after the charge, picked up by the next pass, one
    claim that fails (a facilitator call's timeout and wait for a slot), its first backoff (one
    interval, `channel_jobs.claim_failed`), the pass after it, and the claim sent again."""
    attempt = facilitator.timeout_seconds + facilitator.max_wait_seconds
    interval = channels.claim_interval_seconds
    return channels.claim_after_seconds + interval + attempt + interval + interval + attempt


def claim_budget_seconds(withdraw_delay: int) -> float:
    """The time a charge's claim has before its payer could withdraw it: a voucher is charged against
    a mirror at most `fresh_seconds` old, which showed no withdrawal, so none can finalize sooner than
    the withdraw delay less that age after the charge."""
    return withdraw_delay - fresh_seconds(withdraw_delay)


def channel_offers(config: GateConfig) -> list[tuple[str, Price]]:
    """Every (agent, offer) of a payment channel."""
    return [
        (agent.name, offer)
        for agent in config.agents.values()
        if agent.price is not None
        for offer in agent.price.offers
        if offer.scheme == batch_settlement.SCHEME_NAME
    ]


def claim_obligation_problems(config: GateConfig) -> list[str]:
    """Why this configuration cannot claim every charged voucher before its payer could withdraw it
    (DESIGN 6, the operator's invariants), one line per key: a channel offer on a network the gate
    cannot watch for withdrawals (no `[networks] rpc_url`, unless `[channels]
    accept_unwatched_withdrawals`), and a claim schedule that does not fit inside an offer's withdraw
    delay. Nothing without a facilitator: no channel can be opened then. `serve` and `check-config`
    refuse a configuration with any."""
    if not config.facilitator.url:
        return []
    problems: list[str] = []
    deadline = claim_deadline_seconds(config.channels, config.facilitator)
    unwatched: dict[str, str] = {}
    for agent, offer in channel_offers(config):
        if not config.networks.get(offer.network, NetworkConfig()).rpc_url:
            unwatched.setdefault(offer.network, agent)
        delay = int(offer.extra.get("withdrawDelay", batch_settlement.MIN_WITHDRAW_DELAY))
        budget = claim_budget_seconds(delay)
        if deadline > budget:
            c, f = config.channels, config.facilitator
            problems.append(
                f"channels.claim_after_seconds: the claim schedule cannot collect agents.{agent}'s channels"
                f" before a payer could withdraw: a charge waits up to {deadline:g} s for its claim"
                f" (claim_after_seconds {c.claim_after_seconds:g} + 3 x claim_interval_seconds"
                f" {c.claim_interval_seconds:g} + 2 x (facilitator timeout_seconds {f.timeout_seconds:g}"
                f" + max_wait_seconds {f.max_wait_seconds:g}): one claim failing once), but its withdraw delay"
                f" {delay} s leaves {budget:g} s (less {fresh_seconds(delay):g} s of mirrored state);"
                " shorten claim_after_seconds or claim_interval_seconds, or raise withdraw_delay_seconds"
            )
    if not config.channels.accept_unwatched_withdrawals:
        for network, agent in unwatched.items():
            problems.append(
                f'networks."{network}".rpc_url: required: agents.{agent} offers payment channels on {network},'
                " and without the chain the gate cannot see a payer's withdrawal (it could take back charged"
                " vouchers once the withdraw delay runs out); set it, or [channels] accept_unwatched_withdrawals"
                " = true to rely on the claim schedule alone"
            )
    return problems


def load_checked(path: str | os.PathLike[str]) -> Settings:
    """`load_config`, and what `check-config` adds: a `ConfigError` for the claim obligation's problems too."""
    settings = load_config(path)
    problems = claim_obligation_problems(of(settings))
    if problems:
        raise ConfigError([f"{settings.source}: {p}" for p in problems])
    return settings


def with_dev_chain(settings: Settings, facilitator_url: str) -> Settings:
    """`serve --dev-facilitator`: the development chain (its `/rpc`) is the development network's
    ground truth, as the development facilitator is its facilitator."""
    config = of(settings)
    network = replace(config.networks.get(DEV_NETWORK, NetworkConfig()), rpc_url=facilitator_url.rstrip("/") + "/rpc")
    networks = {**config.networks, DEV_NETWORK: network}
    return replace(settings, anonymous=replace(config, networks=networks))


class GateSections:
    """The gate's `server.anonymous.PathConfig`: which keys it owns, and how it reads them."""

    keys = keys_of(GateConfig)
    agent_keys = keys_of(AgentPayment)

    def read(self, settings: Settings, reader: Reader) -> GateConfig:
        return _GateReader(reader).config(settings)


SECTIONS = GateSections()


def parse_config(raw: dict[str, Any], *, base_dir: Path, source: str = "<dict>") -> Settings:
    """The server's settings with the gate's (`Settings.anonymous`), from one raw tree."""
    return anonymous.parse_config(raw, SECTIONS, base_dir=base_dir, source=source)


def load_config(path: str | os.PathLike[str]) -> Settings:
    return anonymous.load_config(path, SECTIONS)


def default_settings(database: str = "a2a-gate.db") -> Settings:
    """The embedded defaults: a free echo agent (API keys), a priced one (x402 `exact`) and one
    priced by usage (x402 `upto`, per character), one SQLite file.

    Without a facilitator the priced agent answers 501; `serve --dev-facilitator`
    starts the development facilitator so the paid flow runs offline.
    """
    settings = server_defaults(database)
    paid = replace(settings.agents["paid-echo"], description="Echoes the text it is sent, for 0.001 test USDC.")
    metered = replace(settings.agents["paid-metered"], description=METERED_DESCRIPTION)
    channel = replace(
        paid,
        name="paid-channel",
        description="Echoes the text it is sent, for 0.001 test USDC: per request, or from a payment channel.",
    )
    config = GateConfig(
        limits=DEMO_LIMITS,
        channels=DEMO_CHANNELS,
        agents={
            "paid-echo": AgentPayment("paid-echo", price=DEMO_PRICE),
            "paid-metered": AgentPayment("paid-metered", price=DEMO_METERED_PRICE),
            "paid-channel": AgentPayment("paid-channel", price=DEMO_CHANNEL_PRICE),
        },
    )
    agents = {**settings.agents, "paid-echo": paid, "paid-metered": metered, "paid-channel": channel}
    return replace(settings, agents=agents, anonymous=config)


def of(settings: Settings) -> GateConfig:
    """The gate's configuration in `settings`: read with them, or now from their raw sections."""
    if isinstance(settings.anonymous, GateConfig):
        return settings.anonymous
    reader = Reader(SECTIONS.keys, SECTIONS.agent_keys)
    config = SECTIONS.read(settings, reader)
    reader.raise_problems(settings.source)
    return config


def with_facilitator_url(settings: Settings, url: str) -> Settings:
    config = of(settings)
    return replace(settings, anonymous=replace(config, facilitator=replace(config.facilitator, url=url)))


def payment_window_seconds(deadline_seconds: float, facilitator: FacilitatorConfig) -> float:
    """How long a token must stay valid for an agent's work to be delivered and then collected:
    its execution deadline, the settle retry budget and the facilitator's settle margin."""
    return deadline_seconds + facilitator.settle_budget_seconds + facilitator.settle_margin_seconds


def default_asset_extra(network: str, asset: str) -> dict[str, Any]:
    return dict(KNOWN_ASSETS.get((network, asset.lower()), {}))


class _GateReader:
    """Reads the gate's raw sections with the server's reader (one list of problems, key paths kept)."""

    def __init__(self, reader: Reader) -> None:
        self.r = reader

    def config(self, settings: Settings) -> GateConfig:
        return self.r.section(GateConfig, settings.sections, "", context={"settings": settings})

    def agent_price(self, agent: AgentConfig, raw: Any, path: str, facilitator: FacilitatorConfig) -> Price | None:
        """An agent's price, each offer's payment window fitted to the agent and the facilitator."""
        price = self.offers(raw, path)
        if price is not None:
            price = Price.of([self.fit_payment_window(agent, offer, raw, facilitator) for offer in price.offers])
        return price

    def fit_payment_window(self, agent: AgentConfig, price: Price, raw: Any, facilitator: FacilitatorConfig) -> Price:
        """A priced agent's maxTimeoutSeconds covers its payment window plus a client's time to sign and send.

        Unset, it grows to fit; set too short, it is a problem: every honest token would
        be refused as `payment_window_too_short`.
        """
        window = payment_window_seconds(agent.deadline_seconds, facilitator)
        needed = math.ceil(window) + SIGNING_ALLOWANCE_SECONDS
        if price.max_timeout_seconds >= needed:
            return price
        if isinstance(raw, dict) and "max_timeout_seconds" in raw:
            self.r.problem(
                f"agents.{agent.name}.price.max_timeout_seconds",
                f"{price.max_timeout_seconds} s cannot collect a payment: this agent needs {window:g} s"
                f" (deadline_seconds {agent.deadline_seconds:g} + facilitator settle retries"
                f" {facilitator.settle_budget_seconds:g} + settle_margin_seconds {facilitator.settle_margin_seconds:g})"
                f" plus {SIGNING_ALLOWANCE_SECONDS} s for the client; use at least {needed} or shorten those",
            )
            return price
        return replace(price, max_timeout_seconds=needed)

    def offers(self, raw: Any, path: str) -> Price | None:
        """A price, in one scheme or several: `accepts = [{ scheme = "exact" }, { scheme = "batch-settlement" }]`
        lists offers that share the table's other keys (each may override them); the first is the primary."""
        accepts = raw.get("accepts") if isinstance(raw, dict) else None
        if accepts is None:
            return self.price(raw, path)
        if not isinstance(accepts, list) or not accepts or not all(isinstance(a, dict) for a in accepts):
            self.r.problem(f"{path}.accepts", 'must be a list of tables, e.g. [{ scheme = "exact" }]')
            return None
        shared = {k: v for k, v in raw.items() if k != "accepts"}
        offers = [self.price({**shared, **entry}, f"{path}.accepts[{i}]") for i, entry in enumerate(accepts)]
        if any(offer is None for offer in offers):
            return None
        listed = [offer for offer in offers if offer is not None]
        kinds = [(o.scheme, o.asset_transfer_method) for o in listed]
        if len(set(kinds)) != len(kinds):
            self.r.problem(f"{path}.accepts", "lists one scheme (and transfer method) twice")
        return Price.of(listed)

    def price(self, raw: Any, path: str) -> Price | None:
        r = self.r
        if not isinstance(raw, dict):
            r.problem(
                path,
                "must be a table with network, asset, amount (atomic units) and pay_to, e.g."
                ' price = { network = "eip155:84532", asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e",'
                ' amount = "2000", pay_to = "0x<your address>" } (0.002 USDC on Base Sepolia)',
            )
            return None
        scheme = r.get(raw, "scheme", str, "exact", f"{path}.scheme")
        metered = scheme in USAGE_SCHEMES
        r.unknown(raw, (PRICE_KEYS - {"amount"}) | USAGE_PRICE_KEYS if metered else PRICE_KEYS, path)
        method = r.get(
            raw,
            "asset_transfer_method",
            str,
            "permit2" if metered else schemes.DEFAULT_TRANSFER_METHOD,
            f"{path}.asset_transfer_method",
        )
        if not any(name == scheme for name, _ in schemes.SCHEMES):
            known = ", ".join(sorted({name for name, _ in schemes.SCHEMES}))
            r.problem(f"{path}.scheme", f"must be one of {known}, got {scheme!r}")
        elif schemes.named(scheme, method) is None:
            known = ", ".join(sorted(m for name, m in schemes.SCHEMES if name == scheme))
            r.problem(f"{path}.asset_transfer_method", f"must be one of {known} for {scheme!r}, got {method!r}")
        network = r.get(raw, "network", str, "", f"{path}.network")
        if not CAIP2_NETWORK.match(network):
            r.problem(f"{path}.network", f"must be a CAIP-2 network such as 'eip155:84532', got {network!r}")
        asset = r.get(raw, "asset", str, "", f"{path}.asset")
        if not EVM_ADDRESS.match(asset):
            r.problem(f"{path}.asset", f"must be a 0x token address (40 hex digits), got {asset!r}")
        pay_to = r.get(raw, "pay_to", str, "", f"{path}.pay_to")
        if not EVM_ADDRESS.match(pay_to):
            r.problem(f"{path}.pay_to", f"must be a 0x address (40 hex digits), got {pay_to!r}")
        amount_key = "ceiling" if metered else "amount"
        amount = self.atomic(raw.get(amount_key), f"{path}.{amount_key}", positive=True)
        extra = self.asset_extra(raw, network, asset, f"{path}.extra")
        usage = None
        if metered:
            usage = self.usage_price(raw.get("usage"), f"{path}.usage")
            facilitator = r.get(raw, "facilitator_address", str, "", f"{path}.facilitator_address")
            if facilitator and not EVM_ADDRESS.match(facilitator):
                r.problem(
                    f"{path}.facilitator_address",
                    "the address your facilitator settles from (its /supported kind's"
                    f" extra.facilitatorAddress; the development facilitator's is {DEV_FACILITATOR_ADDRESS}),"
                    f" or left out to take the one the facilitator advertises, got {facilitator!r}",
                )
            if facilitator:  # left out: the facilitator's advertised one, read at start (gate/advertised.py)
                extra = {**extra, "facilitatorAddress": facilitator}
        if isinstance(raw.get("accepts"), list):
            r.problem(f"{path}.accepts", "an offer cannot list offers of its own")
        if scheme == batch_settlement.SCHEME_NAME:
            extra = {**extra, **self.channel_extra(raw, int(amount), path)}
        else:
            for key in CHANNEL_KEYS:
                if key in raw:
                    r.problem(f"{path}.{key}", f"only for scheme {batch_settlement.SCHEME_NAME!r}")
        return Price(
            scheme=scheme,
            network=network,
            asset=asset,
            amount=str(int(amount)),
            pay_to=pay_to,
            max_timeout_seconds=r.positive(raw, "max_timeout_seconds", 300, f"{path}.max_timeout_seconds"),
            extra=extra,
            description=r.get(raw, "description", str, "", f"{path}.description"),
            asset_transfer_method=method,
            usage=usage,
        )

    def atomic(self, value: Any, path: str, *, positive: bool) -> str:
        """A whole number of atomic units (a TOML integer or a decimal string), or a problem and "0"."""
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if (
            not isinstance(value, str)
            or not (value.isascii() and value.isdigit())
            or (positive and int(value) <= 0)
            or len(value) > 78
        ):
            kind = "positive" if positive else "non-negative"
            self.r.problem(path, f"must be a {kind} whole number of atomic units, got {value!r}")
            return "0"
        return str(int(value))

    def usage_price(self, raw: Any, path: str) -> UsagePrice | None:
        """`{ unit, unit_price, fixed }` (fixed + unit_price per unit of the named usage) or `{ callable }`."""
        r = self.r
        if not isinstance(raw, dict):
            r.problem(
                path,
                "required for upto: how the charge follows the usage the agent reports, e.g."
                ' usage = { unit = "characters", unit_price = "10", fixed = "0" } (atomic units),'
                ' or usage = { callable = "mypackage.pricing:price" } (usage mapping -> atomic units)',
            )
            return None
        r.unknown(raw, USAGE_KEYS, path)
        if "callable" in raw:
            if set(raw) - {"callable"}:
                r.problem(path, "a callable price takes no unit, unit_price or fixed: the callable says it all")
            target = r.callable_name(raw, "callable", f"{path}.callable")
            if not target:
                r.problem(f"{path}.callable", "must name a 'package.module:function'")
                return None
            function = r.importable(target, f"{path}.callable")
            if function is not None and not callable(function):
                r.problem(f"{path}.callable", f"{target} is not callable")
                function = None
            return UsagePrice(callable=target, function=function)
        unit = r.get(raw, "unit", str, "", f"{path}.unit")
        if not unit or len(unit) > 64:
            r.problem(f"{path}.unit", f"required: the usage count charged per unit (e.g. 'characters'), got {unit!r}")
        unit_price = self.unit_price(raw.get("unit_price"), f"{path}.unit_price")
        fixed = int(self.atomic(raw.get("fixed", "0"), f"{path}.fixed", positive=False))
        return UsagePrice(fixed=fixed, unit=unit, unit_price=unit_price)

    def unit_price(self, value: Any, path: str) -> Fraction:
        """Atomic units per unit: a whole number, or a decimal string for a fraction of one ("0.25")."""
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str) and DECIMAL.match(value) and len(value) <= 78:
            return Fraction(value)
        self.r.problem(
            path, f'must be a non-negative number of atomic units per unit, as a string ("0.25"), got {value!r}'
        )
        return Fraction(0)

    def channel_extra(self, raw: dict[str, Any], amount: int, path: str) -> dict[str, Any]:
        """A channel offer's parameters, as the binding's `extra` names them: who authorizes the
        gate's claims and refunds, how long a payer waits to withdraw alone, the smallest deposit."""
        r = self.r
        authorizer = r.get(raw, "receiver_authorizer", str, "", f"{path}.receiver_authorizer")
        if authorizer and (not EVM_ADDRESS.match(authorizer) or int(authorizer, 16) == 0):
            r.problem(
                f"{path}.receiver_authorizer",
                "the non-zero address that signs the gate's claims and refunds (the facilitator's, when it"
                " holds that key), or left out to take the `receiverAuthorizer` the facilitator's /supported lists",
            )
        delay = r.get(
            raw, "withdraw_delay_seconds", int, batch_settlement.MIN_WITHDRAW_DELAY, f"{path}.withdraw_delay_seconds"
        )
        if not batch_settlement.MIN_WITHDRAW_DELAY <= delay <= batch_settlement.MAX_WITHDRAW_DELAY:
            r.problem(
                f"{path}.withdraw_delay_seconds",
                f"must be from {batch_settlement.MIN_WITHDRAW_DELAY} to {batch_settlement.MAX_WITHDRAW_DELAY}"
                " (the contract's bounds)",
            )
        minimum = raw.get("min_deposit", str(amount * batch_settlement.MIN_DEPOSIT_MULTIPLIER))
        if isinstance(minimum, int) and not isinstance(minimum, bool):
            minimum = str(minimum)
        if not isinstance(minimum, str) or not (minimum.isascii() and minimum.isdigit()) or int(minimum) < amount:
            r.problem(f"{path}.min_deposit", f"must be a whole number of atomic units, at least the amount ({amount})")
            minimum = str(amount)
        # left out, the authorizer is the facilitator's advertised one, read at start (gate/advertised.py)
        return {
            **({"receiverAuthorizer": authorizer} if authorizer else {}),
            "withdrawDelay": delay,
            "minDeposit": str(int(minimum)),
        }

    def asset_extra(self, raw: dict[str, Any], network: str, asset: str, path: str) -> dict[str, Any]:
        """The asset's EIP-712 domain (`name`, `version`): a client cannot sign a payment without it.

        Known USDC deployments bring their own; any other asset needs an `extra` table.
        """
        r = self.r
        extra = r.get(raw, "extra", dict, None, path)
        if extra is None:
            extra = default_asset_extra(network, asset)
            if not extra and EVM_ADDRESS.match(asset) and CAIP2_NETWORK.match(network):
                r.problem(
                    path,
                    f"required for asset {asset} on {network} (no known EIP-712 domain): the token's name and"
                    ' version, e.g. extra = { name = "USD Coin", version = "2" }',
                )
            return extra
        for name in ("name", "version"):
            if not isinstance(extra.get(name), str) or not extra[name]:
                r.problem(f"{path}.{name}", "required: the token's EIP-712 domain name and version, as strings")
        return extra
