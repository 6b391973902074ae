"""End to end: modeld killed (kill -9) while a deployment is in stopping_old, launching or
rolling_back continues it from the recorded phase at its next start and ends it as an
uninterrupted run would. Each phase is held open deterministically while the test kills modeld:
stopping_old by an old server that ignores SIGTERM (the test SIGKILLs it when it wants the stop to
end), launching by a frozen D-Bus daemon (modeld's StartUnit cannot get through) after a GPU-memory
wait in stopping_old (fake NVML), rolling_back by an old server that loads until the test creates
a file (fake_vllm --load-until)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from contract_helpers import (MESSAGE_ID, answers, deployment, ended, in_phase, journal_mark, kill_modeld,
                              lines, link_target, push, restart_killed_modeld, restart_modeld_after_kill,
                              start_deploy, wait_line)
from modeld_env import BUILD_DIR, ModeldEnv, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

MiB = 1 << 20
GiB = 1 << 30
FAKE_NVML = BUILD_DIR / "fake_nvml" / "libnvidia-ml.so.1"
UUID = "GPU-99999999-2222-3333-4444-555555555555"
TOTAL = 141 * GiB
IDLE = 615 * MiB


def nvml_state(path: Path, used: int = IDLE) -> None:
    """One fake H200 with `used` bytes in use (test_stop_e2e.py's format)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"init 0\ngpu {UUID} {TOTAL} {used} {TOTAL - used} {IDLE} NVIDIA H200\n")
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("restart-phases")
    state = work / "nvml-state.txt"
    nvml_state(state)
    e = ModeldEnv(workdir=work, environment={"MODELD_NVML_LIBRARY": str(FAKE_NVML), "FAKE_NVML_STATE": str(state)})
    e.nvml = state
    for i, n in enumerate(["hold", "one", "back", "dies"]):
        e.add_repo(f"acme/{n}", shards=1, shard_size=64 * 1024, seed=80 + i)
    e.ports = {n: free_port() for n in ("hold", "one", "back", "dies")}
    e.back_loaded = work / "back-loaded"
    e.back_loaded.touch()
    tables = (
        # Ignores SIGTERM: its stop lasts until the test SIGKILLs it (or 60 s).
        model_table("hold", "acme/hold", e.ports["hold"], serve_args=["--ignore-sigterm"], stop_timeout="60s")
        + model_table("one", "acme/one", e.ports["one"])
        # Loads until back-loaded exists: its start (in a rollback) lasts as long as the test wants.
        + model_table("back", "acme/back", e.ports["back"], serve_args=["--load-until", str(e.back_loaded)])
        + model_table("dies", "acme/dies", e.ports["dies"], serve_args=["--die-during-load", "0"]))
    try:
        assert FAKE_NVML.exists(), f"{FAKE_NVML} is missing: build the fake_nvml target"
        e.start(tables)
        yield e
    finally:
        e.stop()


def continuing(env, dep_id: str, interrupted: str, first: str) -> dict:
    line = wait_line(env, "continuing deployment", 0, f"MODELD_DEPLOYMENT={dep_id}")
    assert f"interrupted in phase {interrupted}, from phase {first}" in line["MESSAGE"], line["MESSAGE"]
    return line


def server_starts(env, model: str, since: int) -> int:
    """How many times model's server started since the journal mark `since`."""
    return len([e for e in env.journal(f"SYSLOG_IDENTIFIER=modeld-serve@{model}")
                if int(e["__REALTIME_TIMESTAMP"]) >= since and "fake vLLM API server" in e.get("MESSAGE", "")])


def test_a_kill_during_stopping_old_finishes_the_stop_then_launches(env):
    assert env.deploy_and_wait("hold")["state"] == "succeeded"
    old, new = "modeld-serve@hold.service", "modeld-serve@one.service"
    dep_id = start_deploy(env, "one")
    in_phase(env, dep_id, "stopping_old")
    wait_for("the old unit to be stopping", lambda: env.unit_state(old) == "deactivating", timeout=60)

    restart_modeld_after_kill(env)
    continuing(env, dep_id, "stopping_old", "stopping_old")
    d = deployment(env)
    assert d["id"] == dep_id and d["state"] == "running" and d["phase"] == "stopping_old", d
    # The old server still stops; the new one has not been started on top of it.
    assert env.unit_state(old) == "deactivating"
    assert env.unit_state(new) in ("inactive", "")
    env.systemd.run(["systemctl", "kill", "-s", "KILL", old], check=True)

    dep = ended(env, dep_id)
    assert dep["state"] == "succeeded" and dep["phase"] == "benchmarking", dep
    assert env.status()["active"]["model"] == "one"
    assert env.unit_state(old) in ("inactive", "failed")
    assert answers(env.ports["one"], "one")
    # One started line, one terminal line: the same deployment, continued, not a second one.
    assert len(lines(env, f"MODELD_DEPLOYMENT={dep_id}", f"MESSAGE_ID={MESSAGE_ID['started']}")) == 1
    assert len(lines(env, f"MODELD_DEPLOYMENT={dep_id}", f"MESSAGE_ID={MESSAGE_ID['succeeded']}")) == 1


def test_a_kill_during_launching_stops_nothing_twice_and_launches_the_new_commit(env):
    unit = "modeld-serve@one.service"
    c_old = env.status()["active"]["commit"]
    c_new = push(env, "acme/one", 99)
    assert c_new != c_old

    # The old server's GPU memory "stays" after its stop: stopping_old waits (no bus call).
    nvml_state(env.nvml, IDLE + 20 * GiB)
    mark = journal_mark()
    dep_id = start_deploy(env, "one")
    wait_line(env, f"{unit} stopped: ", mark, f"MODELD_DEPLOYMENT={dep_id}", timeout=60)
    dbus = int(env.systemd.run(["systemctl", "show", "-p", "MainPID", "--value", "dbus.service"],
                               check=True).stdout.strip())
    assert dbus > 0
    env.systemd.run(["kill", "-STOP", str(dbus)], check=True)
    try:
        nvml_state(env.nvml)  # the memory is back: on to launching, whose first bus call hangs
        in_phase(env, dep_id, "launching")
        killed = kill_modeld(env)
    finally:
        env.systemd.run(["kill", "-CONT", str(dbus)], check=True)
    restart_killed_modeld(env, killed)
    continuing(env, dep_id, "launching", "stopping_old")

    dep = ended(env, dep_id)
    assert dep["state"] == "succeeded" and dep["commit"] == c_new, dep
    st = env.status()
    assert st["active"]["model"] == "one" and st["active"]["commit"] == c_new
    assert link_target(env, "one") == c_new
    assert server_starts(env, "one", mark) == 1
    msgs = [e["MESSAGE"] for e in lines(env, f"MODELD_DEPLOYMENT={dep_id}", "MODELD_PHASE=stopping_old")]
    assert any(f"nothing to stop: {unit} is already" in m for m in msgs), msgs
    assert answers(env.ports["one"], "one")


def test_a_kill_during_rolling_back_finishes_the_rollback(env):
    assert env.deploy_and_wait("back")["state"] == "succeeded"
    old = "modeld-serve@back.service"
    env.back_loaded.unlink()  # its next start loads until the test says so
    mark = journal_mark()
    dep_id = start_deploy(env, "dies")
    in_phase(env, dep_id, "rolling_back")
    wait_line(env, f"starting {old} again", mark, f"MODELD_DEPLOYMENT={dep_id}", timeout=60)
    pid = wait_for("the old server to be loading again", lambda: env.main_pid(old) or None, timeout=60)

    restart_modeld_after_kill(env)
    continuing(env, dep_id, "rolling_back", "rolling_back")
    d = deployment(env)
    assert d["id"] == dep_id and d["state"] == "running" and d["phase"] == "rolling_back", d
    env.back_loaded.touch()

    dep = ended(env, dep_id)
    assert dep["state"] == "rolled_back" and dep["phase"] == "rolling_back", dep
    # The reason from before the restart is kept.
    assert dep["error"]["code"] == "unit_failed" and "modeld-serve@dies.service" in dep["error"]["message"], dep
    assert env.status()["active"]["model"] == "back"
    # The server that was loading went on loading: it was not started again.
    assert env.main_pid(old) == pid
    assert server_starts(env, "back", mark) == 1
    assert answers(env.ports["back"], "back")
    terminal = lines(env, f"MODELD_DEPLOYMENT={dep_id}", f"MESSAGE_ID={MESSAGE_ID['rolled_back']}")
    assert len(terminal) == 1, terminal
