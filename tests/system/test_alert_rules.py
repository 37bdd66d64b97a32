"""deploy/alerts.yml, the operator's alert rules: promtool checks them and fires each one in
deploy/alerts.test.yml, and a real `a2a-gate serve` exports every metric and label value they
name, so a renamed metric (or outcome) turns a test red here instead of silencing an alert.

Without promtool (Debian's `prometheus` package ships it: .ci/run installs it) the promtool tests
skip, and fail where CI is set."""

from __future__ import annotations

import math
import re
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gate.cli import build_parser
from tests.support.gate_helpers import wait_for
from tests.support.gate_process import free_port
from tests.support.paid import PaidSetup, Payer, paid_config, send_body
from tests.support.services import in_ci

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "alerts.test.yml"

SELECTOR = re.compile(r"\b(a2a_gate_[a-z_]+)\b(?:\{([^}]*)\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
DOC_SECTION = r'(docs/[\w.-]+\.md), "([^"]+)"'  # where a description sends the operator
SCRAPE_LABELS = frozenset({"job", "instance"})  # Prometheus's own, added at scrape


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if in_ci():
            pytest.fail("promtool is not installed (.ci/run installs it: apt-get install prometheus)", pytrace=False)
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return found


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules():
    done = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_promtool_fires_every_rule_and_keeps_each_quiet():
    done = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_rule_is_tested_firing_and_quiet_and_tells_the_operator_what_to_do():
    checks: dict[str, set[bool]] = {}
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            checks.setdefault(check["alertname"], set()).add(bool(check.get("exp_alerts")))
    for rule in rules():
        name = rule["alert"]
        assert checks.get(name) == {True, False}, f"{name}: alerts.test.yml must see it fire and stay quiet"
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        summary, description = rule["annotations"]["summary"], rule["annotations"]["description"]
        assert summary and re.search(DOC_SECTION, description), f"{name}: which section of the docs to read"
        for doc, section in re.findall(DOC_SECTION, description):
            assert section in (ROOT / doc).read_text(), f"{name}: {doc} has no {section!r}"
        for command in re.findall(r"`a2a-gate ([^`]*)`", description):  # a command the operator can run
            words = [w for w in shlex.split(command) if not w.startswith("[")]
            build_parser().parse_args([w.replace("FILE", "gate.toml") for w in words])


def selectors() -> list[tuple[str, str, dict[str, tuple[str, str]]]]:
    """(rule, metric name, {label: (operator, value)}) for every series selector the rules use."""
    found = []
    for rule in rules():
        for name, matchers in SELECTOR.findall(rule["expr"]):
            labels = {label: (op, value) for label, op, value in MATCHER.findall(matchers)}
            found.append((rule["alert"], name, labels))
    return found


def scrape(url: str) -> dict[str, list[dict[str, str]]]:
    """Every sample name /metrics exports, with each sample's labels; a counter or histogram with
    labels and no sample yet is still there by its family (`# TYPE`)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    samples: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}.get(family.type, ("",)):
            samples.setdefault(family.name + suffix, [])
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample.labels)
    return samples


def exported(samples: dict[str, list[dict[str, str]]], labels: dict[str, tuple[str, str]]) -> list[str]:
    """What of a selector's label matchers no exported sample carries: each value a matcher names
    (each alternative of `a|b`) must be a label value there (the counters start their known
    outcomes at 0)."""
    wanted = []
    for label, (op, value) in labels.items():
        if label in SCRAPE_LABELS or op.startswith("!"):
            continue
        wanted.extend((label, v) for v in (value.split("|") if op == "=~" else [value]))
    return [f'{label}="{v}"' for label, v in wanted if not any(s.get(label) == v for s in samples)]


def reading(url: str, name: str) -> float | None:
    for sample in scrape_values(url):
        if sample[0] == name:
            return sample[1]
    return None


def scrape_values(url: str) -> list[tuple[str, float]]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return [(s.name, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


WEBHOOK = """
[[webhooks.endpoints]]
name = "books"
url = "http://127.0.0.1:9/hook"
events = ["payment.settled"]
secret_env = "BOOKS_WEBHOOK_SECRET"
"""


def test_a_serving_gate_exports_every_metric_and_label_value_the_rules_name(
    tmp_path: Path, facilitator: str, start_gate, write_config, monkeypatch: pytest.MonkeyPatch
):
    """After a paid request through the development facilitator, /metrics has every series the
    rules select: a metric renamed in the code, or in the rules, leaves a rule that never fires.
    (With a webhook endpoint: its series are labelled by the endpoint's name.)"""
    monkeypatch.setenv("BOOKS_WEBHOOK_SECRET", "s3cr3t")
    port = free_port()
    gate = start_gate(write_config(paid_config(f"http://127.0.0.1:{port}", facilitator) + WEBHOOK), port=port)
    paid = PaidSetup(gate=gate, facilitator_url=facilitator, db_path=tmp_path / "gate.db")
    answer = paid.post("paid", send_body("alert me"), Payer().header_for(paid.gate.url))
    assert answer.json()["result"]["status"]["state"] == "completed", answer.text
    samples = scrape(paid.gate.url)
    assert samples["a2a_gate_settlements_total"], "the paid request's settlement is counted"
    missing = []
    for alert, name, labels in selectors():
        if name not in samples:
            missing.append(f"{alert}: {name}")
        elif labels and (absent := exported(samples[name], labels)):
            missing.append(f"{alert}: {name} with {', '.join(absent)}")
    assert not missing, "the rules name series a2a-gate serve does not export:\n" + "\n".join(missing)


def test_the_facilitator_gauge_follows_scrapes_without_a_readiness_probe(own_paid: PaidSetup):
    """A2AGateFacilitatorUnreachable reads a2a_gate_facilitator_reachable: scrapes alone keep it
    current (nobody asks /readyz here), and it is not 0 before anyone asked."""
    first = reading(own_paid.gate.url, "a2a_gate_facilitator_reachable")
    assert first is not None and (math.isnan(first) or first == 1)
    wait_for(lambda: reading(own_paid.gate.url, "a2a_gate_facilitator_reachable") == 1, timeout=15)


def test_a_facilitator_that_does_not_answer_reads_0_from_scrapes_alone(start_gate, write_config):
    port = free_port()
    gate = start_gate(
        write_config(paid_config(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{free_port()}")), port=port
    )
    wait_for(lambda: reading(gate.url, "a2a_gate_facilitator_reachable") == 0, timeout=15)


def test_a_scrape_never_waits_for_a_facilitator_that_hangs(start_gate, write_config):
    """The check a scrape starts runs beside it: a facilitator that takes connections and never
    answers (timeout_seconds 1.5 here) leaves /metrics as quick as ever, then reads 0."""
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)  # connections land in its backlog and are never answered
    try:
        port = free_port()
        text = paid_config(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{hung.getsockname()[1]}")
        gate = start_gate(write_config(text), port=port)
        for _ in range(3):
            started = time.monotonic()
            reading(gate.url, "a2a_gate_facilitator_reachable")
            assert time.monotonic() - started < 1.0, "the scrape waited for the facilitator"
        wait_for(lambda: reading(gate.url, "a2a_gate_facilitator_reachable") == 0, timeout=15)
    finally:
        hung.close()
