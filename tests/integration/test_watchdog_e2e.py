"""End to end, after a deployment succeeded: the watchdog restarts a server that exits 0 on its
own, and one whose completions keep failing while its process lives on, and goes on doing so
while the next deployment downloads; it leaves a slow but alive server alone while its probe
answers within the probe's timeout (30 s per read, health::Target::request_timeout) and restarts
it once a probe exceeds that; the benchmark phase measures a server of known pace (fake_vllm
--token-seconds) and records its figures in the deployment and in /metrics."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from modeld_env import SERVER_STARTING, ModeldEnv, completion, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

RESTART_MESSAGE_ID = "5a0f4e2d8c9b4d7e9f1a2b3c4d5e6f75"
BENCH_PACE = 0.1     # seconds per token of bench's server
BENCH_TOKENS = 21    # the benchmark's max_tokens: the first token, then 20 decoded ones
PROBE_TIMEOUT = 30   # seconds: health::Target::request_timeout, the probe's limit per read


def health_table(name: str, interval: str = "1s", failures: int = 3) -> str:
    return f"""
[models.{name}.health]
watch_interval = "{interval}"
watch_failures = {failures}
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("watchdog")
    e = ModeldEnv(workdir=work, hub_args=["--control", str(work / "hub-control.json")])
    e.hub_control = work / "hub-control.json"
    e.hub_control.write_text("{}")
    e.add_repo("acme/quitter", shards=1, shard_size=100_000, seed=31)
    e.add_repo("acme/wedged", shards=1, shard_size=100_000, seed=32)
    e.add_repo("acme/bench", shards=1, shard_size=100_000, seed=33)
    e.add_repo("acme/steady", shards=1, shard_size=100_000, seed=34)
    e.add_repo("acme/next", shards=3, shard_size=400_000, seed=35)
    e.add_repo("acme/slow", shards=1, shard_size=100_000, seed=36)
    e.ports = {n: free_port() for n in ("quitter", "wedged", "bench", "steady", "next", "slow")}
    # The pace of slow's server, seconds per token, while this file exists (fake_vllm
    # --token-seconds-file): absent, it answers at full speed.
    e.slow_pace = work / "slow-pace"
    e.tables = (
        # Ready, then exits 0 two seconds after it started listening, every time it is started.
        model_table("quitter", "acme/quitter", e.ports["quitter"], serve_args=["--exit-zero-after-ready", "2"])
        + health_table("quitter")
        # Ready, then every completion answers 500 from 6 s after listening; /health stays 200.
        + model_table("wedged", "acme/wedged", e.ports["wedged"], serve_args=["--fail-completions-after", "6"])
        + health_table("wedged", failures=3)
        + model_table("steady", "acme/steady", e.ports["steady"]) + health_table("steady")
        + model_table("next", "acme/next", e.ports["next"])
        # Every token takes BENCH_PACE seconds.
        + model_table("bench", "acme/bench", e.ports["bench"], serve_args=["--token-seconds", str(BENCH_PACE)])
        + f"""
[models.bench.benchmark]
enabled = true
max_tokens = {BENCH_TOKENS}
"""
        # As slow as the test makes it; one failed probe is enough for a restart.
        + model_table("slow", "acme/slow", e.ports["slow"], serve_args=["--token-seconds-file", str(e.slow_pace)])
        + health_table("slow", failures=1))
    try:
        e.start(e.tables)
        yield e
    finally:
        e.stop()


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
                    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*\})? '
                    r'(-?[0-9.]+(?:[eE][-+]?[0-9]+)?|NaN|[+-]Inf)$')


def check_exposition(text: str) -> None:
    """The text exposition format's rules that matter here: every sample line parses, and every
    family (a histogram's _bucket, _sum and _count samples are of theirs) has one HELP and one TYPE
    line before its samples. With promtool installed, it checks
    the text too (its lint rules included)."""
    assert text.endswith("\n")
    declared: dict[str, set[str]] = {}
    histograms: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            kind, name = line[2:6], line.split(" ")[2]
            assert kind not in declared.setdefault(name, set()), f"second {kind} for {name}"
            declared[name].add(kind)
            if line.split(" ")[3:] == ["histogram"]:
                histograms.add(name)
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        # A histogram's samples are its family's name with _bucket, _sum or _count.
        family = next((m.group(1)[:-len(s)] for s in ("_bucket", "_sum", "_count")
                       if m.group(1).endswith(s) and m.group(1)[:-len(s)] in histograms), m.group(1))
        assert declared.get(family) == {"HELP", "TYPE"}, f"{m.group(1)} sampled before its HELP and TYPE"
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr


def sample(text: str, name: str, model: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f'{name}{{model="{model}"}} '):
            return float(line.rsplit(" ", 1)[1])
    return None


def unit_property(env, unit: str, prop: str) -> str:
    return env.systemd.run(["systemctl", "show", "-p", prop, "--value", unit], check=True).stdout.strip()


def test_a_server_that_exits_0_after_becoming_ready_is_restarted_by_the_watchdog(env):
    unit = "modeld-serve@quitter.service"
    dep = env.deploy_and_wait("quitter")
    assert dep["state"] == "succeeded", dep
    first_invocation = unit_property(env, unit, "InvocationID")
    first_entered = unit_property(env, unit, "ActiveEnterTimestampMonotonic")
    assert first_invocation

    w = wait_for("a watchdog restart", lambda: (
        (s := env.status()["watchdog"]) is not None and s["restarts"] >= 1 and s), timeout=60)
    assert w["model"] == "quitter"
    assert w["last_restart_at"]
    assert "exited with status 0" in w["last_restart_reason"], w
    assert unit in w["last_restart_reason"]
    # A new run of the unit, which answers again (within the 2 s it lives each time).
    wait_for("a new invocation of the unit", lambda: unit_property(env, unit, "InvocationID") not in
             ("", first_invocation), timeout=30)
    assert unit_property(env, unit, "ActiveEnterTimestampMonotonic") != first_entered
    wait_for("quitter to answer a completion again", lambda: completion(env.ports["quitter"], "quitter"),
             timeout=60, interval=0.05, retry_on=SERVER_STARTING)

    restart = env.systemd.wait_journal(lambda e: e.get("MESSAGE_ID") == RESTART_MESSAGE_ID,
                                       matches=["SYSLOG_IDENTIFIER=modeld", "MODELD_MODEL=quitter"])
    assert restart is not None, "no restart line in the journal"
    assert unit in restart["MESSAGE"] and "quitter" in restart["MESSAGE"]
    assert "exited with status 0" in restart["MESSAGE"]
    assert restart["PRIORITY"] == "4"
    assert restart.get("MODELD_UNIT") == unit

    text = env.metrics()
    check_exposition(text)
    assert (sample(text, "modeld_watchdog_restarts_total", "quitter") or 0) >= 1
    assert sample(text, "modeld_watchdog_consecutive_failures", "quitter") is not None

    out = env.modelctl("status")
    assert out.returncode == 0, out.stderr
    assert "Watchdog:" in out.stdout and "restart" in out.stdout, out.stdout


def test_failed_probes_in_a_row_get_a_live_server_restarted(env):
    unit = "modeld-serve@wedged.service"
    dep = env.deploy_and_wait("wedged")
    assert dep["state"] == "succeeded", dep
    # Deploying stopped watching quitter: its unit stays down now.
    assert env.status()["watchdog"]["model"] == "wedged"
    first_invocation = unit_property(env, unit, "InvocationID")

    w = wait_for("a failed probe", lambda: (
        (s := env.status()["watchdog"])["last_probe_ok"] is False and s), timeout=60)
    assert w["consecutive_failures"] >= 1
    w = wait_for("a restart after 3 failed probes", lambda: (
        (s := env.status()["watchdog"])["restarts"] >= 1 and s), timeout=60)
    assert w["last_restart_reason"].startswith("3 probes in a row failed"), w
    assert "500" in w["last_restart_reason"] and "EngineDeadError" in w["last_restart_reason"], w
    wait_for("a new invocation of the unit", lambda: unit_property(env, unit, "InvocationID") not in
             ("", first_invocation), timeout=30)
    wait_for("wedged to answer a completion again", lambda: completion(env.ports["wedged"], "wedged"), timeout=60,
             retry_on=SERVER_STARTING)

    text = env.metrics()
    check_exposition(text)
    assert (sample(text, "modeld_watchdog_probe_failures_total", "wedged") or 0) >= 3
    assert (sample(text, "modeld_watchdog_restarts_total", "wedged") or 0) >= 1
    assert (sample(text, "modeld_readiness_probe_seconds", "wedged") or -1) >= 0
    # Counters of a model watched earlier stay.
    assert (sample(text, "modeld_watchdog_restarts_total", "quitter") or 0) >= 1
    lines = env.journal("SYSLOG_IDENTIFIER=modeld", "MODELD_MODEL=wedged", f"MESSAGE_ID={RESTART_MESSAGE_ID}")
    assert lines and "probes in a row failed" in lines[0]["MESSAGE"]


def test_the_benchmark_phase_records_its_figures_in_the_deployment_and_the_metrics(env):
    dep = env.deploy_and_wait("bench")
    assert dep["state"] == "succeeded", dep
    b = dep["benchmark"]
    assert b is not None, dep
    # The server sends each token BENCH_PACE s after the one before, the first BENCH_PACE s after
    # the request: the first token can come no sooner than that.
    assert BENCH_PACE <= b["ttft_s"] < 30, b
    # 20 tokens decoded in 20 * BENCH_PACE s: 1/BENCH_PACE = 10 tokens/s. The server cannot be
    # faster; the bound above allows the first token's arrival to be read up to 0.6 s late (a busy
    # host), and one that counted events or bytes wrongly (two per token, say) lands above it.
    # Below: within a generous factor of 10 (each token up to 1 s).
    rate = b["decode_tokens_per_s"]
    assert 1 / (10 * BENCH_PACE) <= rate <= 1.5 / BENCH_PACE, b
    text = env.metrics()
    check_exposition(text)
    assert sample(text, "modeld_benchmark_ttft_seconds", "bench") == pytest.approx(b["ttft_s"])
    assert sample(text, "modeld_benchmark_decode_tokens_per_second", "bench") == pytest.approx(b["decode_tokens_per_s"])
    out = env.modelctl("status")
    assert "Benchmark:" in out.stdout, out.stdout
    assert env.status()["watchdog"]["model"] == "bench"


def test_the_model_in_service_is_still_watched_while_the_next_one_downloads(env):
    assert env.deploy_and_wait("steady")["state"] == "succeeded"
    wait_for("the watchdog to watch steady", lambda: (env.status()["watchdog"] or {}).get("model") == "steady"
             and env.status()["watchdog"]["state"] == "watching", timeout=30)
    restarts = env.status()["watchdog"]["restarts"]
    env.hub_control.write_text(json.dumps({"throttle": 40_000}))  # about 10 s per shard
    try:
        assert env.modelctl("deploy", "next").returncode == 0
        wait_for("next's download under way", lambda: (d := env.status()["deployment"])["phase"] == "downloading"
                 and d["progress"]["bytes_done"] > 0, timeout=60)
        # The server in service dies while the next checkpoint downloads: the watchdog brings it
        # back without waiting for the deployment.
        env.systemd.run(["systemctl", "kill", "-s", "KILL", "modeld-serve@steady.service"], check=True)
        st = wait_for("the watchdog's restart of steady during the download",
                      lambda: (s := env.status())["watchdog"]["restarts"] > restarts and s, timeout=60)
        assert st["deployment"]["model"] == "next" and st["deployment"]["state"] == "running"
        assert st["deployment"]["phase"] in ("downloading", "verifying"), st["deployment"]
        wait_for("steady to answer again", lambda: completion(env.ports["steady"], "steady"), timeout=60,
                 retry_on=SERVER_STARTING)
    finally:
        env.hub_control.write_text("{}")
    dep = wait_for("the deployment of next to end",
                   lambda: (d := env.status()["deployment"])["state"] != "running" and d, timeout=120)
    assert dep["state"] == "succeeded", dep
    assert env.status()["active"]["model"] == "next"
    assert env.unit_state("modeld-serve@steady.service") in ("inactive", "failed")


# --- a slow but alive server ---------------------------------------------------------------------

def set_pace(env, seconds: float | None) -> None:
    """Seconds per token of slow's server from its next completion on (None: full speed)."""
    if seconds is None:
        env.slow_pace.unlink(missing_ok=True)
        return
    tmp = env.slow_pace.with_suffix(".tmp")
    tmp.write_text(f"{seconds}\n")
    os.replace(tmp, env.slow_pace)


def test_a_slow_server_whose_probe_ends_within_its_timeout_is_not_restarted(env):
    unit = "modeld-serve@slow.service"
    set_pace(env, None)
    dep = env.deploy_and_wait("slow")
    assert dep["state"] == "succeeded", dep
    wait_for("the watchdog to watch slow", lambda: (w := env.status()["watchdog"] or {}).get("model") == "slow"
             and w["state"] == "watching", timeout=30)
    invocation = unit_property(env, unit, "InvocationID")
    restarts = env.status()["watchdog"]["restarts"]
    # Each probe's max_tokens=1 completion now takes 2 s, far within the probe's 30 s: slow, alive.
    set_pace(env, 2)
    seen: set[str] = set()

    def slow_probes():
        w = env.status()["watchdog"]
        assert w["restarts"] == restarts and w["consecutive_failures"] == 0, w
        if w["last_probe_ok"] and (w["last_probe_seconds"] or 0) >= 2:
            seen.add(w["last_probe_at"])
        return len(seen) >= 3 or None
    try:
        wait_for("three slow probes that succeeded", slow_probes, timeout=90, interval=0.2)
    finally:
        set_pace(env, None)
    w = env.status()["watchdog"]
    assert w["restarts"] == restarts and w["state"] == "watching", w
    assert unit_property(env, unit, "InvocationID") == invocation
    assert env.unit_state(unit) == "active"
    assert not env.journal("SYSLOG_IDENTIFIER=modeld", "MODELD_MODEL=slow", f"MESSAGE_ID={RESTART_MESSAGE_ID}")


def test_a_server_whose_probe_exceeds_its_timeout_is_restarted(env):
    unit = "modeld-serve@slow.service"
    if (env.status()["active"] or {}).get("model") != "slow":
        assert env.deploy_and_wait("slow")["state"] == "succeeded"
    wait_for("the watchdog to watch slow", lambda: (w := env.status()["watchdog"] or {}).get("model") == "slow"
             and w["state"] == "watching", timeout=30)
    invocation = unit_property(env, unit, "InvocationID")
    restarts = env.status()["watchdog"]["restarts"]
    # A max_tokens=1 completion now takes longer than the probe waits for an answer.
    set_pace(env, PROBE_TIMEOUT + 30)
    try:
        w = wait_for("a probe that timed out", lambda: (s := env.status()["watchdog"])["last_probe_ok"] is False
                     and s, timeout=PROBE_TIMEOUT + 60, interval=0.1)
    finally:
        set_pace(env, None)  # the restarted server answers at full speed again
    assert w["last_probe_seconds"] >= PROBE_TIMEOUT - 1, w
    w = wait_for("the restart after one failed probe",
                 lambda: (s := env.status()["watchdog"])["restarts"] > restarts and s, timeout=60)
    assert w["last_restart_reason"].startswith("1 probe in a row failed"), w
    assert "tim" in w["last_restart_reason"].lower(), w  # timeout / timed out
    wait_for("a new invocation of the unit", lambda: unit_property(env, unit, "InvocationID") not in
             ("", invocation), timeout=60)
    wait_for("slow to answer a completion again", lambda: completion(env.ports["slow"], "slow"), timeout=120,
             retry_on=SERVER_STARTING)
