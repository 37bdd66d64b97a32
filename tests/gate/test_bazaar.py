"""The x402 `bazaar` discovery extension in each priced agent's 402 (gate/bazaar.py), and the
development facilitator's catalog of what it has settled (devnet/devnet/discovery.py).

The declaration is what the x402 package's own helpers make for a JSON POST, and passes the
package's validation; an agent is declared only where its operator lists it (`discovery = true`),
and a facilitator running the package's discovery code lists it after its first settled payment,
and not before.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from x402.extensions.bazaar import (
    ListDiscoveryResourcesParams,
    OutputConfig,
    bazaar_resource_server_extension,
    declare_discovery_extension,
    validate_discovery_extension,
    with_bazaar,
)
from x402.extensions.bazaar.types import parse_discovery_extension
from x402.http import FacilitatorConfig, HTTPFacilitatorClientSync

from gate import bazaar
from server.config import AgentConfig, Skill
from tests.support.paid import PaidSetup, Payer, decode_header, send_body, start_paid

AGENT = AgentConfig(
    name="weather",
    description="Forecasts by city.",
    skills=(Skill(id="forecast", name="Forecast", description="Tomorrow's weather", examples=("Paris?",)),),
)


def test_the_declaration_is_the_packages_own_and_valid() -> None:
    declared = bazaar.extension(AGENT)["bazaar"]
    info = declared["info"]
    made = declare_discovery_extension(
        input=info["input"]["body"],
        input_schema=bazaar.INPUT_SCHEMA,
        body_type="json",
        output=OutputConfig(example=info["output"]["example"], schema={"description": bazaar.description(AGENT)}),
    )["bazaar"]
    assert declared == bazaar_resource_server_extension.enrich_declaration(made, SimpleNamespace(method="POST"))
    assert validate_discovery_extension(parse_discovery_extension(declared)).valid
    assert info["input"]["body"]["params"]["message"]["parts"][0]["text"] == "Paris?"  # the skill's example
    described = declared["schema"]["properties"]["output"]["properties"]["example"]["description"]
    assert described == "Forecasts by city. Skills: Forecast: Tomorrow's weather."


def test_an_agent_without_skills_is_described_by_its_card_alone() -> None:
    declared = bazaar.extension(AgentConfig(name="plain"))["bazaar"]
    assert validate_discovery_extension(parse_discovery_extension(declared)).valid
    assert declared["schema"]["properties"]["output"]["properties"]["example"]["description"] == "plain"


def listed(facilitator: str) -> list:
    """The catalog as the x402 package's facilitator client reads it."""
    with HTTPFacilitatorClientSync(FacilitatorConfig(url=facilitator)) as client:
        bazaar_client = with_bazaar(client).extensions.bazaar
        return bazaar_client.list_resources(ListDiscoveryResourcesParams(type="http")).items


@pytest.fixture
def discoverable(tmp_path: Path, facilitator: str, start_gate, write_config) -> PaidSetup:
    """The `paid` gate, its agent `paid` listed (`discovery = true`)."""
    return start_paid(tmp_path, facilitator, start_gate, write_config, paid_lines="discovery = true")


def test_an_agent_is_declared_only_where_its_operator_lists_it(paid) -> None:
    answer = paid.post("paid", send_body("price?"))
    assert answer.status_code == 402
    assert "bazaar" not in decode_header(answer.headers["PAYMENT-REQUIRED"])["extensions"]
    assert "bazaar" not in answer.json()["payment_required"]["extensions"]


def test_the_facilitator_lists_a_paid_agent_after_its_first_settled_payment_and_not_before(discoverable) -> None:
    paid = discoverable
    door = f"{paid.gate.url}/a2a/paid"
    answer = paid.post("paid", send_body("price?"))
    assert answer.status_code == 402
    declared = decode_header(answer.headers["PAYMENT-REQUIRED"])["extensions"]["bazaar"]
    assert validate_discovery_extension(parse_discovery_extension(declared)).valid
    assert listed(paid.facilitator_url) == []  # asked for a price: nothing settled, nothing listed

    payer = Payer()
    assert paid.post("paid", send_body("hello"), payer.header_for(paid.gate.url)).json()["result"]
    [resource] = listed(paid.facilitator_url)
    assert resource.resource == door and resource.description == "paid echo"
    assert resource.accepts[0]["payTo"] == answer.json()["payment_required"]["accepts"][0]["payTo"]
    assert resource.extensions == {"bazaar": declared}

    paid.post("paid", send_body("again"), payer.header_for(paid.gate.url))
    assert [r.resource for r in listed(paid.facilitator_url)] == [door]  # one entry per resource


def test_the_catalog_refuses_a_page_that_is_not_whole_numbers(paid) -> None:
    for query in ("limit=ten", "offset=-1", "limit=1.5"):
        answer = httpx.get(f"{paid.facilitator_url}/discovery/resources?{query}")
        assert answer.status_code == 400 and answer.json()["error"] == "invalid_request", query
    assert httpx.get(f"{paid.facilitator_url}/discovery/resources?limit=1000").json()["pagination"]["limit"] == 100
