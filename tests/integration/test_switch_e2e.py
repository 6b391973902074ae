"""End to end: the outage of a switch A -> B as modeld reports it (DEPLOYMENT.switch, its journal
line, its metrics, modelctl's line) agrees with what an independent client measures: a prober
thread asking the old and the new port for completions every 50 ms; the journal line's fields
are the record's parts and add up to its downtime, and `modelctl watch` without a terminal says
the switch right after the result line."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from contract_helpers import ended, in_phase, restart_modeld_after_kill, start_deploy
from modeld_env import BUILD_DIR, SERVER_STARTING, ModeldEnv, completion, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

LOAD_SECONDS = 3  # B "loads" this long: the outage is a few seconds


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = ModeldEnv(workdir=tmp_path_factory.mktemp("switch"))
    e.add_repo("acme/model-a", shards=2, shard_size=100_000, seed=1)
    e.add_repo("acme/model-b", shards=2, shard_size=100_000, seed=2)
    e.add_repo("acme/model-c", shards=2, shard_size=100_000, seed=3)
    e.ports = {"model-a": free_port(), "model-b": free_port(), "model-c": free_port()}
    e.c_loaded = e.workdir / "c-loaded"  # model-c "loads" until this file exists
    tables = (model_table("model-a", "acme/model-a", e.ports["model-a"])
              + model_table("model-b", "acme/model-b", e.ports["model-b"], load_seconds=LOAD_SECONDS)
              + model_table("model-c", "acme/model-c", e.ports["model-c"],
                            serve_args=["--load-until", str(e.c_loaded)]))
    try:
        e.start(tables)
        yield e
    finally:
        e.stop()


class Prober:
    """Asks each of `ports` ({model: port}) for a completion every `period` seconds on a thread of
    its own and keeps the wall-clock times of the answers that succeeded."""

    def __init__(self, ports: dict[str, int], period: float = 0.05):
        self.ports = ports
        self.period = period
        self.successes: list[float] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stopping.is_set():
            for model, port in self.ports.items():
                try:
                    completion(port, model, max_tokens=1)
                    self.successes.append(time.time())
                except SERVER_STARTING:
                    pass
            self.stopping.wait(self.period)  # the probing period, as a client would poll

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.thread.join(timeout=30)

    def outage(self) -> float:
        """The longest time between two successful answers, in seconds: from the last answer
        before the gap to the first one after it."""
        times = sorted(self.successes)
        assert len(times) >= 2, "the prober saw fewer than two answers"
        return max(b - a for a, b in zip(times, times[1:]))


def test_a_first_deployment_reports_its_start_as_the_switch(env):
    env.deploy_and_wait("model-a")
    dep = env.status()["deployment"]
    sw = dep["switch"]
    assert sw is not None, dep
    # Nothing served: the outage is the new service's start, nothing was stopped.
    assert sw["stop_s"] == 0 and sw["launch_s"] == 0
    assert sw["downtime_s"] == pytest.approx(sw["start_to_port_s"] + sw["port_to_ready_s"], abs=1e-6)


def test_the_switch_agrees_with_an_independent_prober(env):
    assert completion(env.ports["model-a"], "model-a")
    with Prober(env.ports) as prober:
        wait_for("the prober's first answer from model-a", lambda: prober.successes, timeout=30)
        r = env.modelctl("deploy", "model-b", "--wait")
        assert r.returncode == 0, r.stdout + r.stderr
        # The prober sees B answer too, so the gap is closed on its side.
        seen = len(prober.successes)
        wait_for("the prober's answers from model-b", lambda: len(prober.successes) >= seen + 3, timeout=30)
    dep = env.status()["deployment"]
    assert dep["model"] == "model-b" and dep["state"] == "succeeded", dep
    sw = dep["switch"]
    assert sw is not None, dep
    measured = prober.outage()
    assert abs(measured - sw["downtime_s"]) <= 1.0, (measured, sw)
    assert sw["downtime_s"] >= LOAD_SECONDS
    parts = sw["stop_s"] + sw["launch_s"] + sw["start_to_port_s"] + sw["port_to_ready_s"]
    assert sw["downtime_s"] == pytest.approx(parts, abs=1e-6)
    # modelctl deploy --wait says it, and so does status.
    assert "Switch: downtime " in r.stdout, r.stdout
    status = env.modelctl("status")
    assert "Switch:    downtime " in status.stdout, status.stdout

    # The journal line with its fields.
    lines = [e for e in env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep['id']}")
             if e.get("MESSAGE", "").startswith("switch downtime ")]
    assert len(lines) == 1, lines
    line = lines[0]
    assert float(line["MODELD_DOWNTIME_S"]) == pytest.approx(sw["downtime_s"], abs=1e-3)
    assert float(line["MODELD_LOAD_S"]) == pytest.approx(sw["start_to_port_s"], abs=1e-3)
    for part in (": stop ", ", launch ", ", load ", ", readiness "):
        assert part in line["MESSAGE"], line["MESSAGE"]

    # The metrics: B's last switch, and both switches in the histogram.
    text = env.metrics()
    gauge = [l for l in text.splitlines() if l.startswith('modeld_switch_downtime_seconds{model="model-b"} ')]
    assert len(gauge) == 1, text
    assert float(gauge[0].split()[-1]) == pytest.approx(sw["downtime_s"])
    assert "modeld_switch_downtimes_seconds_count 2\n" in text, text


def test_a_restart_mid_switch_is_part_of_the_outage(env):
    assert env.status()["active"]["model"] == "model-b"
    with Prober({"model-b": env.ports["model-b"], "model-c": env.ports["model-c"]}) as prober:
        wait_for("the prober's first answer from model-b", lambda: prober.successes, timeout=30)
        dep_id = start_deploy(env, "model-c")
        in_phase(env, dep_id, "health_checking")
        # B is gone, C loads: modeld is killed and started again in the middle of the outage.
        killed_at = time.time()
        restart_modeld_after_kill(env)
        back_at = time.time()
        env.c_loaded.touch()
        dep = ended(env, dep_id)
        seen = len(prober.successes)
        wait_for("the prober's answers from model-c", lambda: len(prober.successes) >= seen + 3, timeout=30)
    assert dep["state"] == "succeeded", dep
    sw = dep["switch"]
    assert sw is not None, dep
    measured = prober.outage()
    assert abs(measured - sw["downtime_s"]) <= 1.0, (measured, sw)
    # Measured from the first daemon's stop request: the restart lies inside the outage.
    assert sw["downtime_s"] >= back_at - killed_at, (back_at - killed_at, sw)


def switch_line(env: ModeldEnv, dep_id: str) -> dict:
    """The deployment's one "switch downtime" journal entry."""
    lines = [e for e in env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}")
             if e.get("MESSAGE", "").startswith("switch downtime ")]
    assert len(lines) == 1, lines
    return lines[0]


def watched_lines(out: Path) -> list[str]:
    """`modelctl watch`'s plain lines without their clock."""
    return [line.split(" ", 1)[1] for line in out.read_text().splitlines()]


def test_the_switch_lines_fields_add_up_and_watch_prints_the_switch_after_the_result(env, tmp_path):
    assert env.status()["active"]["model"] == "model-c"
    out = tmp_path / "watch.txt"
    with open(out, "wb") as sink:
        watch = subprocess.Popen([str(BUILD_DIR / "modelctl"), "--socket", str(env.socket), "watch"], stdout=sink,
                                 stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        wait_for("watch's first lines", lambda: any(l.startswith("active: ") for l in watched_lines(out)), timeout=30)
        r = env.modelctl("--json", "deploy", "model-a", "--wait")
        assert r.returncode == 0, r.stdout + r.stderr
        dep = json.loads(r.stdout)
        result = f"{dep['id']} of model-a succeeded"
        wait_for("the switch in watch's lines", lambda: any(
            l.startswith(f"{dep['id']} switch ") for l in watched_lines(out)), timeout=30)
    finally:
        watch.send_signal(signal.SIGINT)
        rc = watch.wait(timeout=30)
    assert rc == 0, watch.stderr.read().decode()
    sw = dep["switch"]
    assert sw is not None, dep

    # The fields: seconds with three decimals, the record's parts, summing to the downtime.
    line = switch_line(env, dep["id"])
    parts = {"MODELD_STOP_S": "stop_s", "MODELD_LAUNCH_S": "launch_s", "MODELD_LOAD_S": "start_to_port_s",
             "MODELD_READINESS_S": "port_to_ready_s"}
    for field in [*parts, "MODELD_DOWNTIME_S"]:
        assert re.fullmatch(r"\d+\.\d{3}", line.get(field, "")), (field, line)
    for field, key in parts.items():
        assert float(line[field]) == pytest.approx(sw[key], abs=1e-3), (field, line[field], sw)
    assert sw["stop_s"] > 0 and sw["launch_s"] > 0, sw  # a stop and a launch happened
    total = sum(float(line[f]) for f in parts)
    assert total == pytest.approx(float(line["MODELD_DOWNTIME_S"]), abs=4e-3), (total, line)

    # watch: "ID switch downtime ..." right after the result line, the journal's text.
    lines = watched_lines(out)
    i = lines.index(result)
    assert lines[i + 1] == f"{dep['id']} {line['MESSAGE']}", lines[i:]
