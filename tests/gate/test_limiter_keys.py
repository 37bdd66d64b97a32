"""The per-IP limiter keys on a household, not on an address: IPv4 by address, IPv6 by
its network prefix (default /64), IPv4-mapped IPv6 as the IPv4 address it carries.

A home connection owns 2^64 IPv6 addresses; keyed by the full address, one caller
rotating through them gets a fresh bucket per request, drains the per-agent bucket
and locks every other caller out.
"""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.support.gate_process import free_port
from tests.support.paid import paid_config, send_body

PER_IP = 3
PER_AGENT = 40  # fewer than the rotated addresses below: keyed per address, they would drain it


def limited_config(public_url: str, facilitator: str, *, trusted: str = "", extra_limits: str = "") -> str:
    text = paid_config(public_url, facilitator, per_ip=PER_IP)
    text = text.replace("per_agent_per_minute = 100000", f"per_agent_per_minute = {PER_AGENT}{extra_limits}", 1)
    if trusted:
        text = text.replace("[agents.echo]", f'[proxy]\ntrusted = ["{trusted}"]\n\n[agents.echo]', 1)
    return text


def forwarded_for(gate_url: str, address: str) -> int:
    return httpx.post(f"{gate_url}/a2a/paid", json=send_body("x"), headers={"X-Forwarded-For": address}).status_code


@pytest.fixture
def behind_proxy(facilitator, start_gate, write_config):
    """A gate that believes X-Forwarded-For from 127.0.0.1 (the test plays the proxy)."""
    port = free_port()
    return start_gate(
        write_config(limited_config(f"http://127.0.0.1:{port}", facilitator, trusted="127.0.0.1")), port=port
    )


def test_rotated_ipv6_addresses_of_one_network_are_one_caller(behind_proxy):
    rotated = [forwarded_for(behind_proxy.url, f"2001:db8:1:2:{i:x}:{i * 7:x}::{i + 1:x}") for i in range(60)]
    unrelated = forwarded_for(behind_proxy.url, "198.51.100.20")
    assert rotated == [402] * PER_IP + [429] * (60 - PER_IP), f"{rotated.count(402)} of 60 got through"
    # the per-agent bucket was not drained: unrelated callers are unaffected
    assert unrelated == 402
    assert forwarded_for(behind_proxy.url, "2001:db8:1:3::1") == 402  # the next /64 is another household


def test_ipv4_mapped_ipv6_is_the_ipv4_caller(behind_proxy):
    assert [forwarded_for(behind_proxy.url, "198.51.100.30") for _ in range(PER_IP)] == [402] * PER_IP
    assert forwarded_for(behind_proxy.url, "::ffff:198.51.100.30") == 429
    # mapped addresses are not one big IPv6 network: another IPv4 caller, mapped, is its own bucket
    assert forwarded_for(behind_proxy.url, "::ffff:198.51.100.31") == 402


def test_ipv6_prefix_is_configurable(facilitator, start_gate, write_config):
    port = free_port()
    text = limited_config(
        f"http://127.0.0.1:{port}", facilitator, trusted="127.0.0.1", extra_limits="\nipv6_prefix = 48"
    )
    gate = start_gate(write_config(text), port=port)
    # with /48, two /64s of the same site share a bucket
    codes = [forwarded_for(gate.url, f"2001:db8:7:{i:x}::1") for i in range(PER_IP + 2)]
    assert codes == [402] * PER_IP + [429] * 2
    assert forwarded_for(gate.url, "2001:db8:8::1") == 402


def test_ipv6_prefix_out_of_range_is_a_config_error(tmp_path, facilitator, write_config):
    from tests.support.gate_helpers import cli

    config = write_config(limited_config("http://127.0.0.1:1", facilitator, extra_limits="\nipv6_prefix = 129"))
    done = cli("check-config", str(config), check=False)
    assert done.returncode == 2 and "limits.ipv6_prefix" in done.stderr


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_direct_ipv6_peer_on_loopback(facilitator, start_gate, write_config):
    """A direct IPv6 peer (no proxy) is keyed by its /64; the limit holds and answers Retry-After."""
    port = free_port()
    gate = start_gate(write_config(limited_config(f"http://[::1]:{port}", facilitator)), port=port, host="::1")
    with httpx.Client(transport=httpx.HTTPTransport(local_address="::1"), timeout=10) as client:
        codes = [client.post(f"{gate.url}/a2a/paid", json=send_body("x")).status_code for _ in range(PER_IP + 1)]
        spoofed = client.post(f"{gate.url}/a2a/paid", json=send_body("x"), headers={"X-Forwarded-For": "2001:db8::9"})
    assert codes == [402] * PER_IP + [429]
    assert spoofed.status_code == 429 and int(spoofed.headers["Retry-After"]) >= 1
    gate.stop()
    assert "client=::1" in gate.log.read_text()


@pytest.mark.parametrize(
    ("address", "prefix", "key"),
    [
        ("198.51.100.7", 64, "198.51.100.7"),
        ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 64, "2001:db8:1:2::/64"),
        ("2001:DB8:1:2::1", 56, "2001:db8:1::/56"),
        ("2001:db8::1", 128, "2001:db8::1/128"),
        ("::ffff:198.51.100.7", 64, "198.51.100.7"),
        ("fe80::1%eth0", 64, "fe80::/64"),
        ("not an address" * 20, 64, ("not an address" * 20)[:64]),
    ],
)
def test_caller_key(address, prefix, key):
    from gate.limiter import caller_key

    assert caller_key(address, prefix) == key


@pytest.mark.skipif(not has_ipv6_loopback(), reason="this machine has no IPv6 (a dual-stack listener needs it)")
def test_trusted_ipv4_proxy_on_a_dual_stack_listener(facilitator, start_gate, write_config):
    """Listening on `::` (dual stack), an IPv4 peer arrives as ::ffff:a.b.c.d; a proxy trusted
    as 127.0.0.1 must still be recognised, or every client behind it shares its bucket."""
    port = free_port()
    text = limited_config(f"http://127.0.0.1:{port}", facilitator, trusted="127.0.0.1")
    gate = start_gate(write_config(text), port=port, host="::", extra_args=["--workers", "2"])
    via_proxy = f"http://127.0.0.1:{gate.port}"
    # more than two workers' worth of one bucket: unrecognised, some worker would refuse
    codes = [forwarded_for(via_proxy, f"198.51.100.{i}") for i in range(1, 2 * PER_IP + 2)]
    assert codes == [402] * (2 * PER_IP + 1), codes
