"""SIGHUP reloads the configuration's payment terms while serving: a new price is offered from
the next request on, nothing drains, the work in flight finishes and is settled at the price it
was paid, and a file the running server could not take is refused whole, the old terms kept.
With `--workers N` the supervisor hands SIGHUP to every worker instead of restarting them."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.gate_helpers import wait_for
from tests.support.gate_process import GateProcess, free_port
from tests.support.paid import PaidSetup, Payer, decode_header, paid_config, send_body, start_paid_gate

OLD, NEW = '"1000"', '"2500"'


def offered_amount(url: str, agent: str = "paid") -> str:
    """The amount an unpaid call to `agent` is asked for (its 402's first offer)."""
    response = httpx.post(f"{url}/a2a/{agent}", json=send_body("hi"), timeout=10)
    assert response.status_code == 402, response.text
    return str(decode_header(response.headers["payment-required"])["accepts"][0]["amount"])


def reload_with(paid: PaidSetup, text: str, pid: int | None = None) -> None:
    paid.gate.config.write_text(text)
    assert paid.gate.process is not None
    (psutil.Process(pid) if pid else psutil.Process(paid.gate.process.pid)).send_signal(signal.SIGHUP)


def test_sighup_offers_the_new_price_and_lets_the_paid_work_in_flight_finish_at_its_own(
    tmp_path, facilitator, write_config
):
    paid, text = start_paid_gate(tmp_path, facilitator, write_config)
    try:
        assert offered_amount(paid.gate.url) == "1000"
        headers = Payer().header_for(paid.gate.url, "paid-slow")  # signed for 1000
        answers: list[httpx.Response] = []
        sender = threading.Thread(
            target=lambda: answers.append(
                httpx.post(f"{paid.gate.url}/a2a/paid-slow", json=send_body("sleep 2"), headers=headers, timeout=60)
            )
        )
        sender.start()
        wait_for(lambda: paid.claim_states() == ["running"])

        reload_with(paid, text.replace(OLD, NEW))
        wait_for(lambda: offered_amount(paid.gate.url) == "2500", timeout=15)
        assert offered_amount(paid.gate.url, "paid-slow") == "2500"
        card = httpx.get(f"{paid.gate.url}/a2a/paid/.well-known/agent-card.json", timeout=10).json()
        assert '"2500"' in str(card).replace("'", '"'), "the card offers the new price"

        sender.join(60)
        assert answers and answers[0].status_code == 200, answers
        task = answers[0].json()["result"]
        assert task["status"]["state"] == "completed"  # nothing drained: the work in flight was delivered
        settled = paid.payment_rows("settle")
        assert [r["amount"] for r in settled] == ["1000"]  # at the price it was signed for
        assert paid.gate.process is not None and paid.gate.process.poll() is None  # still serving
        log = paid.gate.log.read_text()
        assert "configuration reloaded" in log and "Traceback" not in log
        assert "draining" not in log.lower()
    finally:
        paid.gate.stop()


BROKEN = {  # a new price beside something the server's reader refuses, and what the refusal names
    "not TOML": (lambda text: text.replace(OLD, NEW) + "[agents.paid\n", "not valid TOML"),
    "a table twice": (lambda text: text.replace(OLD, NEW) + '\n[facilitator]\nurl = "x"\n', "facilitator"),
    "an amount that is no integer": (lambda text: text.replace(OLD, NEW).replace(NEW, '"12.5"', 1), "amount"),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_file_the_server_could_not_take_is_refused_whole_and_the_old_terms_stay(
    tmp_path, facilitator, write_config, broken
):
    paid, text = start_paid_gate(tmp_path, facilitator, write_config)
    try:
        make, why = BROKEN[broken]
        reload_with(paid, make(text))
        wait_for(lambda: "configuration reload refused" in paid.gate.log.read_text(), timeout=15)
        line = next(x for x in paid.gate.log.read_text().splitlines() if "configuration reload refused" in x)
        assert why in line
        assert offered_amount(paid.gate.url) == "1000"  # nothing of the refused file applied
        assert paid.gate.process is not None and paid.gate.process.poll() is None
        # deploy/alerts.yml's A2AGateConfigReloadRefused: 0 until a file is taken again
        assert last_reload_successful(paid.gate.url) == 0
        reload_with(paid, text)
        wait_for(lambda: last_reload_successful(paid.gate.url) == 1, timeout=15)
    finally:
        paid.gate.stop()


def last_reload_successful(url: str) -> float:
    """The gauge an alert rule watches: 1 while the file read last was taken."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("a2a_gate_config_last_reload_successful "):
            return float(line.split()[1])
    raise AssertionError("a2a_gate_config_last_reload_successful is not exported")


def test_an_agent_left_out_of_the_file_keeps_its_price_until_a_restart(tmp_path, facilitator, write_config):
    """Removing a priced agent from the file cannot make it free while the server still runs it."""
    paid, text = start_paid_gate(tmp_path, facilitator, write_config)
    try:
        start_of_vip = text.index("[agents.vip]")
        without_vip = text[:start_of_vip] + text[text.index("[agents.unpaid-hidden]") :]
        reload_with(paid, without_vip.replace(OLD, NEW))
        wait_for(lambda: offered_amount(paid.gate.url) == "2500", timeout=15)
        assert offered_amount(paid.gate.url, "vip") == "1000"  # its terms as loaded, not free
        log = paid.gate.log.read_text()
        assert "vip" in log.split("configuration reloaded", 1)[1], "the log names what waits for a restart"
    finally:
        paid.gate.stop()


def test_sighup_to_the_supervisor_reloads_every_worker_without_restarting_one(tmp_path, facilitator, write_config):
    paid, text = start_paid_gate(tmp_path, facilitator, write_config, "--workers", "2")
    try:
        assert paid.gate.process is not None
        supervisor = psutil.Process(paid.gate.process.pid)
        wait_for(lambda: len(workers_of(supervisor)) == 2, timeout=30)
        before = {w.pid for w in workers_of(supervisor)}
        reload_with(paid, text.replace(OLD, NEW))
        # each new connection may reach either worker: every answer over a while shows the new price
        wait_for(lambda: all(offered_amount(paid.gate.url) == "2500" for _ in range(20)), timeout=20)
        # a worker still starting holds its SIGHUP and reloads once it serves, maybe after the answers above
        wait_for(lambda: paid.gate.log.read_text().count("configuration reloaded") >= 2, timeout=30)
        time.sleep(0.5)
        assert {w.pid for w in workers_of(supervisor)} == before  # reloaded, not replaced
        assert paid.gate.process.poll() is None
        log = paid.gate.log.read_text()
        assert log.count("configuration reloaded") == 2  # once each
        assert log.count("Application startup complete") == 2
    finally:
        paid.gate.stop()


def workers_of(supervisor: psutil.Process) -> list[psutil.Process]:
    """The supervisor's uvicorn workers (multiprocessing's spawned children), zombies left out."""
    workers = []
    for child in supervisor.children():
        try:
            if "spawn_main" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                workers.append(child)
        except psutil.Error:  # gone, or a zombie whose command line cannot be read
            continue
    return workers


@pytest.mark.parametrize("workers", [1, 2])
def test_sighups_while_the_gate_starts_end_no_process_and_each_reloads_once_serving(
    tmp_path, facilitator, write_config, workers
):
    """`systemctl reload` right after a start: a SIGHUP that comes while a process (the gate, its
    supervisor, a worker the supervisor spawns) has not yet reached its handler is held, then read
    once it serves. None ends a process (SIGHUP's default action), and each serves the new terms."""
    port = free_port()
    text = "claim_lease_seconds = 300\n" + paid_config(f"http://127.0.0.1:{port}", facilitator)
    config = write_config(text)
    extra = ["--workers", str(workers)] if workers > 1 else []
    gate = GateProcess(config, tmp_path / "gate.log", port=port, extra_args=extra)
    failures: list[BaseException] = []

    def start() -> None:
        try:
            gate.start()
        except (RuntimeError, TimeoutError) as exc:  # the gate died, or never served: the assertions say how
            failures.append(exc)

    starter = threading.Thread(target=start)
    starter.start()
    try:
        wait_for(lambda: gate.process is not None and takes_sighup(gate.process.pid), timeout=30, interval=0.005)
        assert gate.process is not None
        config.write_text(text.replace(OLD, NEW))
        started = 0
        while gate.process.poll() is None and started < workers:  # until every worker has started
            gate.process.send_signal(signal.SIGHUP)
            for worker in workers_of(psutil.Process(gate.process.pid)):
                with contextlib.suppress(psutil.Error):
                    worker.send_signal(signal.SIGHUP)  # a worker may get one of its own, as from `kill -HUP`
            time.sleep(0.02)
            started = gate.log.read_text().count("Application startup complete")
        starter.join(60)
        assert not failures, failures
        assert gate.process.poll() is None, gate.log.read_text()[-3000:]
        wait_for(lambda: all(offered_amount(gate.url) == "2500" for _ in range(20)), timeout=20)
        wait_for(lambda: gate.log.read_text().count("configuration reloaded") >= workers, timeout=30)
        log = gate.log.read_text()
        assert "died" not in log and "Traceback" not in log, log[-3000:]
        assert log.count("Application startup complete") == workers  # none replaced
        assert log.count("configuration reloaded") >= workers
    finally:
        starter.join(60)
        gate.stop()


def takes_sighup(pid: int) -> bool:
    """Whether `pid` catches or holds SIGHUP (its /proc masks): from then on no SIGHUP may end it."""
    bit = 1 << (signal.SIGHUP - 1)
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    masks = [line.split()[1] for line in status.splitlines() if line.startswith(("SigBlk:", "SigCgt:"))]
    return any(int(mask, 16) & bit for mask in masks)
