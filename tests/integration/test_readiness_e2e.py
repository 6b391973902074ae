"""End to end, honest readiness (issue 5) on the real namespaced systemd, each scenario with the
stand-in server's matching mode (tests/fixtures/fake_vllm.py), times scaled down from minutes to
seconds: a slow load that logs progress succeeds and modeld's journal shows it loading; a server
whose /health and /v1/models answer at once but whose generation comes later is ready only once
a completion works; a server that hangs silently and one that dies during its load both end
`rolled_back`, the first well before startup_timeout with an error that says it hung, the second
with the server's last journal lines and its exit status, and the old model serves again."""

from __future__ import annotations

import time

import pytest

from modeld_env import ModeldEnv, completion, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

STALL = "3s"


def health_table(name: str, stall: str = STALL) -> str:
    """The [models.NAME.health] table, placed through model_table's `extra` (before .serve)."""
    return f'[models.{name}.health]\nstall_timeout = "{stall}"\n'


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("readiness")
    e = ModeldEnv(workdir=work)
    names = ["old", "slow", "late", "hung", "dies"]
    for i, name in enumerate(names):
        e.add_repo(f"acme/{name}", shards=1, shard_size=100_000, seed=40 + i)
    e.ports = {name: free_port() for name in names}
    e.tables = (model_table("old", "acme/old", e.ports["old"])
                # Loads for 6 s, a progress line every half second: alive, never silent for long.
                + model_table("slow", "acme/slow", e.ports["slow"], load_seconds=6,
                              serve_args=["--progress-every", "0.5"], startup_timeout="30s",
                              extra=health_table("slow"))
                # /health and /v1/models at once, completions only once the test allows them.
                + model_table("late", "acme/late", e.ports["late"],
                              serve_args=["--generation-until", str(work / "late-generates")],
                              startup_timeout="120s", extra=health_table("late"))
                # One loading line, then alive and silent for ever, never listening.
                + model_table("hung", "acme/hung", e.ports["hung"], serve_args=["--hang"],
                              startup_timeout="60s", extra=health_table("hung"))
                # Loading lines for 1 s, then a CUDA error on stderr and exit status 3: fewer than
                # ten lines in all, so lines of an earlier run of the unit would show if they leaked.
                + model_table("dies", "acme/dies", e.ports["dies"],
                              serve_args=["--die-during-load", "1", "--exit-code", "3", "--progress-every", "0.4"],
                              startup_timeout="60s", extra=health_table("dies")))
    try:
        e.start(e.tables)
        e.deploy_and_wait("old")
        yield e
    finally:
        e.stop()


def modeld_lines(env, dep_id: str) -> list[dict]:
    return env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}")


def step_lines(lines: list[dict]) -> list[dict]:
    """modeld's readiness step lines of the new server (health_checking), in journal order."""
    return [e for e in lines if e.get("MODELD_PHASE") == "health_checking" and e.get("MODELD_READINESS_STEP")]


def assert_old_serves_again(env, active: str) -> None:
    assert env.status()["active"]["model"] == active
    assert env.unit_state(f"modeld-serve@{active}.service") == "active"
    assert completion(env.ports[active], active)


def test_a_slow_load_that_logs_progress_succeeds_and_modeld_logs_it_loading(env):
    dep = env.deploy_and_wait("slow")
    assert dep["state"] == "succeeded", dep
    assert env.status()["active"]["model"] == "slow"
    lines = step_lines(modeld_lines(env, dep["id"]))
    loading = [e["MESSAGE"] for e in lines if e["MODELD_READINESS_STEP"] == "loading"]
    # stall_timeout 3 s: a progress line every 1.5 s over a 6 s load.
    assert len(loading) >= 2, [e["MESSAGE"] for e in lines]
    assert all(m.startswith("loading: ") for m in loading)
    assert any("last server line: 'INFO" in m and "Loading weights" in m for m in loading), loading
    assert [e["MODELD_READINESS_STEP"] for e in lines if e["MODELD_READINESS_STEP"] != "loading"] == [
        "unit_active", "port", "health", "models", "completion", "ready"]


def test_a_server_that_generates_only_later_is_ready_only_once_a_completion_works(env):
    assert env.modelctl("deploy", "late").returncode == 0
    dep_id = env.status()["deployment"]["id"]
    wait_for("late's /v1/models step", lambda: "models" in steps_of(env, dep_id), timeout=120)
    # /health and /v1/models passed; generation cannot work yet, so it is not ready.
    dep = env.status()["deployment"]
    assert dep["state"] == "running" and dep["phase"] == "health_checking", dep
    assert "ready" not in steps_of(env, dep_id)
    allowed_at = time.monotonic()
    (env.workdir / "late-generates").touch()
    dep = wait_for("late's deployment to end", lambda: (d := env.status()["deployment"])["state"] != "running"
                   and d, timeout=120)
    assert dep["state"] == "succeeded", dep
    steps = steps_of(env, dep_id)
    assert list(steps) == ["unit_active", "port", "health", "models", "completion", "ready"], steps
    # Ready only after generation was allowed (the journal's clock is CLOCK_MONOTONIC too).
    assert steps["ready"] >= allowed_at * 1e6, (steps, allowed_at)
    assert completion(env.ports["late"], "late")


def steps_of(env, dep_id: str) -> dict[str, int]:
    """The deployment's readiness steps other than loading so far: step -> CLOCK_MONOTONIC µs of
    its first line, in journal order."""
    steps: dict[str, int] = {}
    for e in step_lines(modeld_lines(env, dep_id)):
        if e["MODELD_READINESS_STEP"] != "loading":
            steps.setdefault(e["MODELD_READINESS_STEP"], int(e["__MONOTONIC_TIMESTAMP"]))
    return steps


def test_a_server_that_hangs_silently_is_rolled_back_well_before_startup_timeout(env):
    active = env.status()["active"]["model"]
    t0 = time.monotonic()
    dep = env.deploy_and_wait("hung", 1)
    took = time.monotonic() - t0
    assert dep["state"] == "rolled_back", dep
    assert dep["error"]["code"] == "readiness_timeout", dep["error"]
    message = dep["error"]["message"]
    assert "modeld-serve@hung.service is hung" in message and "silent for" in message, message
    assert "stall_timeout 3.0 s" in message and "Loading weights" in message, message
    assert took < 40, f"startup_timeout is 60 s; a hang must be seen after 3 s of silence, took {took:.0f} s"
    assert_old_serves_again(env, active)
    # The hung server was stopped, not left holding its GPUs.
    assert env.unit_state("modeld-serve@hung.service") in ("inactive", "failed")
    print(f"\nhung error: {message}")


def test_a_server_that_dies_during_load_is_rolled_back_with_its_last_journal_lines(env):
    active = env.status()["active"]["model"]
    dep = env.deploy_and_wait("dies", 1)
    assert dep["state"] == "rolled_back", dep
    assert dep["error"]["code"] == "unit_failed", dep["error"]
    message = dep["error"]["message"]
    assert "modeld-serve@dies.service failed while starting" in message, message
    assert "exit status 3" in message, message
    assert "its last journal lines:" in message, message
    # The server's own lines: its stdout progress and the stderr line it died with, last.
    quoted = message.split("its last journal lines:", 1)[1].strip().splitlines()
    assert 1 < len(quoted) <= 10, quoted
    assert any("Loading weights... shard group" in q for q in quoted), quoted
    assert "CUDA error: out of memory while loading weights" in quoted[-1], quoted
    assert all(len(q.strip()) <= 303 for q in quoted)
    # Only this run's lines: the one start line names this run's main process.
    pid = int(env.systemd.run(["systemctl", "show", "-p", "ExecMainPID", "--value", "modeld-serve@dies.service"],
                              check=True).stdout.strip())
    starts = [q for q in quoted if "fake vLLM API server, pid" in q]
    assert len(starts) == 1 and f"pid {pid}," in starts[0], quoted
    assert_old_serves_again(env, active)
    print(f"\ndead error: {message}")
