"""Behind a real nginx: the limiter keys on the real client, spoofing is ignored, and
public URLs come from the trusted proxy only."""

from __future__ import annotations

import httpx
import pytest

from tests.support.gate_process import free_port
from tests.support.nginx import nginx_in_front
from tests.support.paid import decode_header, paid_config, send_body


def client_from(address: str) -> httpx.Client:
    """A client whose connections come from another loopback address (a different 'machine')."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=10)


@pytest.fixture
def proxied(tmp_path, facilitator, start_gate, write_config):
    port = free_port()
    text = paid_config("", facilitator, per_ip=3).replace('public_url = ""\n', "")
    text = text.replace("[agents.echo]", '[proxy]\ntrusted = ["127.0.0.1"]\n\n[agents.echo]', 1)
    gate = start_gate(write_config(text), port=port)
    with nginx_in_front(port, tmp_path / "nginx") as url:
        yield gate, url


def test_limiter_keys_on_the_real_client_behind_nginx(proxied):
    _, proxy = proxied
    with client_from("127.0.0.2") as first, client_from("127.0.0.3") as second:
        codes = [first.post(f"{proxy}/a2a/paid", json=send_body("x")).status_code for _ in range(4)]
        assert codes == [402, 402, 402, 429]
        # a spoofed X-Forwarded-For sent to nginx is replaced by the real address
        spoofed = first.post(f"{proxy}/a2a/paid", json=send_body("x"), headers={"X-Forwarded-For": "198.51.100.7"})
        assert spoofed.status_code == 429
        assert second.post(f"{proxy}/a2a/paid", json=send_body("x")).status_code == 402


def test_direct_untrusted_peer_cannot_spoof_its_address(proxied):
    gate, _ = proxied
    with client_from("127.0.0.9") as direct:
        codes = [
            direct.post(
                f"{gate.url}/a2a/paid", json=send_body("x"), headers={"X-Forwarded-For": f"203.0.113.{i}"}
            ).status_code
            for i in range(4)
        ]
    assert codes == [402, 402, 402, 429]  # every spoofed address landed in the one real bucket


def test_public_urls_come_from_the_trusted_proxy_only(proxied):
    gate, proxy = proxied
    host = proxy.removeprefix("http://")
    with client_from("127.0.0.4") as via_proxy:
        card = via_proxy.get(f"{proxy}/a2a/paid/.well-known/agent-card.json").json()
        required = via_proxy.post(f"{proxy}/a2a/paid", json=send_body("x"))
    assert card["url"] == f"https://{host}/a2a/paid"
    assert decode_header(required.headers["PAYMENT-REQUIRED"])["resource"]["url"] == f"https://{host}/a2a/paid"

    with client_from("127.0.0.5") as direct:
        headers = {"Host": "evil.example", "X-Forwarded-Proto": "https"}
        card = direct.get(f"{gate.url}/a2a/paid/.well-known/agent-card.json", headers=headers).json()
    assert card["url"] == f"http://127.0.0.1:{gate.port}/a2a/paid"
