"""The index of agents (`GET /`, `/a2a`, `/a2a/`) against a real gate: every exposed agent with its
card's URL, its endpoint and what its card declares; a hidden agent is as absent as on its card;
a priced agent's offers in the index are the very ones its 402 asks for."""

from __future__ import annotations

import base64
import json

import httpx
import pytest

from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import ASSET, PAY_TO, send_body

PUBLIC = "https://agents.example"
CONFIG = f"""
public_url = "{PUBLIC}"
database = "gate.db"

[facilitator]
url = "http://127.0.0.1:9"

[agents.echo]
description = "free echo"
skills = [{{ id = "echo", name = "Echo" }}]

[agents.paid]
description = "paid echo"
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "1000", pay_to = "{PAY_TO}" }}

[agents.secret-agent]
exposed = false
price = {{ network = "eip155:84532", asset = "{ASSET}", amount = "7", pay_to = "{PAY_TO}" }}
"""


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    root = tmp_path_factory.mktemp("discovery")
    (root / "gate.toml").write_text(CONFIG)
    process = GateProcess(root / "gate.toml", root / "gate.log", port=free_port()).start()
    yield process
    process.stop()


def test_the_index_lists_the_exposed_agents_at_each_of_its_paths(gate):
    bodies = [httpx.get(f"{gate.url}{path}") for path in ("/", "/a2a", "/a2a/")]
    assert all(b.status_code == 200 for b in bodies) and len({b.content for b in bodies}) == 1
    index = bodies[0].json()
    assert [a["name"] for a in index["agents"]] == ["echo", "paid"]
    assert "secret-agent" not in bodies[0].text
    echo = index["agents"][0]
    assert echo["url"] == f"{PUBLIC}/a2a/echo" and echo["card"] == f"{PUBLIC}/a2a/echo/.well-known/agent-card.json"
    assert echo["skills"] == [{"id": "echo", "name": "Echo"}] and echo["extensions"] == []


def test_each_entry_is_what_its_card_says(gate):
    for entry in httpx.get(f"{gate.url}/a2a/").json()["agents"]:
        card = httpx.get(entry["card"].replace(PUBLIC, gate.url)).json()
        assert card["name"] == entry["name"] and card["url"] == entry["url"]
        declared = card["capabilities"].get("extensions", [])
        assert sorted(u for e in entry["extensions"] for u in e["uris"]) == sorted(e["uri"] for e in declared)
        for extension in declared:
            group = next(e for e in entry["extensions"] if extension["uri"] in e["uris"])
            assert group["params"] == extension["params"] and group["required"] == extension["required"]


def test_a_priced_agents_offers_in_the_index_are_its_402s(gate):
    paid = next(a for a in httpx.get(f"{gate.url}/a2a").json()["agents"] if a["name"] == "paid")
    assert len(paid["extensions"]) == 1  # one payment declaration, under every URI clients know it by
    offers = paid["extensions"][0]["params"]["accepts"]
    answer = httpx.post(f"{gate.url}/a2a/paid", json=send_body("hi"))
    assert answer.status_code == 402
    required = json.loads(base64.b64decode(answer.headers["payment-required"]))
    assert offers == required["accepts"]
    assert {(o["scheme"], o["amount"], o["payTo"]) for o in offers} == {("exact", "1000", PAY_TO)}


def test_the_index_is_cached_like_a_card(gate):
    first = httpx.get(f"{gate.url}/")
    again = httpx.get(f"{gate.url}/", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and first.headers["cache-control"].startswith("public")
