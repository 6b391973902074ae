"""End to end, the switch from the old model to the new one (issue 5): stopping_old waits until
nothing of the old service is left (control group, port, GPU memory through a fake NVML), the
pre-flight of planning refuses to stop anything when a stranger holds the new model's port, GPU
memory is checked before launching, and with allow_downtime the old model stops before
freeing_disk evicts it."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

import modeld_env
from contract_helpers import ended, journal_mark, server_starts, start_deploy, wait_line
from modeld_env import BUILD_DIR, ModeldEnv, completion, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

MiB = 1 << 20
GiB = 1 << 30
FAKE_NVML = BUILD_DIR / "fake_nvml" / "libnvidia-ml.so.1"
UUID = "GPU-11111111-2222-3333-4444-555555555555"
TOTAL = 141 * GiB
IDLE = 615 * MiB


def nvml_state(path: Path, used: int = IDLE, procs: list[tuple[int, int]] = ()) -> None:
    """One fake H200 with `used` bytes in use and compute processes (pid, bytes)."""
    lines = ["init 0", f"gpu {UUID} {TOTAL} {used} {TOTAL - used} {IDLE} NVIDIA H200"]
    lines += [f"proc 0 {pid} {n}" for pid, n in procs]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("stop")
    state = work / "nvml-state.txt"
    nvml_state(state)
    e = ModeldEnv(workdir=work, environment={"MODELD_NVML_LIBRARY": str(FAKE_NVML), "FAKE_NVML_STATE": str(state)})
    e.nvml = state
    names = ["a", "b", "c", "big", "slow", "slow2", "stubborn", "holder", "next"]
    for i, n in enumerate(names):
        e.add_repo(f"acme/{n}", shards=2, shard_size=64 * 1024, seed=20 + i)
    e.ports = {n: free_port() for n in names}
    # a: the old model of the GPU memory wait, long enough for the test to watch it under load.
    tables = model_table("a", "acme/a", e.ports["a"], stop_timeout="30s")
    tables += "".join(model_table(n, f"acme/{n}", e.ports[n], stop_timeout="3s") for n in ["b", "c"])
    # Needs more GPU memory than the fake GPU has free.
    tables += model_table("big", "acme/big", e.ports["big"], extra_serve='gpus = 1\ngpu_memory = "200GiB"')
    # Slow to load, so a test can act while they are in health_checking.
    tables += "".join(model_table(n, f"acme/{n}", e.ports[n], load_seconds=6, stop_timeout="3s")
                      for n in ["slow", "slow2"])
    # Servers that leave something behind when stopped; "next" serves on holder's port.
    tables += model_table("stubborn", "acme/stubborn", e.ports["stubborn"], stop_timeout="3s",
                          serve_args=["--child-ignores-sigterm"])
    tables += model_table("holder", "acme/holder", e.ports["holder"], stop_timeout="20s",
                          serve_args=["--hold-port-after-exit", "3"])
    e.ports["next"] = e.ports["holder"]
    tables += model_table("next", "acme/next", e.ports["next"])
    try:
        e.start(tables)
        assert FAKE_NVML.exists(), FAKE_NVML
        e.deploy_and_wait("a")
        yield e
    finally:
        e.stop()


def deployment_ends(env: ModeldEnv) -> dict:
    return wait_for("the deployment to end", lambda: (
        (d := env.status()["deployment"]) and d["state"] != "running" and d), timeout=120)


def messages(env: ModeldEnv, dep: dict) -> list[str]:
    return [e["MESSAGE"] for e in env.journal(f"MODELD_DEPLOYMENT={dep['id']}")]


def test_the_first_deployment_measured_the_gpu_baseline(env):
    baseline = json.loads((env.state_dir / "gpu-baseline.json").read_text())
    assert baseline["used_bytes"] == {UUID: IDLE}


def test_a_stranger_on_the_new_models_port_stops_nothing(env):
    active = env.status()["active"]
    entered = env.unit_timestamp(active["unit"], "ActiveEnterTimestampMonotonic")
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", env.ports["b"]))
    squatter.listen()
    try:
        dep = env.deploy_and_wait("b", expect_exit=1)
    finally:
        squatter.close()
    # The pre-flight of planning finds the stranger before any download (it runs again right
    # before stopping_old: test_preflight_e2e takes a wrapper away in between).
    assert dep["state"] == "failed" and dep["phase"] == "planning", dep
    msg = dep["error"]["message"]
    # modeld runs in its own PID namespace here: it sees the listener, not its holder.
    assert f"port {env.ports['b']}" in msg and "not deploying" in msg, msg
    assert env.unit_timestamp(active["unit"], "ActiveEnterTimestampMonotonic") == entered
    assert completion(active["port"], active["model"])


def test_the_new_server_waits_until_the_old_ones_gpu_memory_is_back(env):
    old = env.status()["active"]
    assert old["model"] == "a", old  # whose stop_timeout gives the wait 45 s before it gives up
    new_unit = "modeld-serve@b.service"
    # The old server's worker still holds 20 GiB when its unit has stopped, until the test says.
    nvml_state(env.nvml, IDLE + 20 * GiB, [(4242, 20 * GiB)])
    mark = journal_mark()
    dep_id = start_deploy(env, "b")
    line = wait_line(env, "waiting for GPU memory: ", mark, f"MODELD_DEPLOYMENT={dep_id}", timeout=40)
    assert "GPU 0 (NVIDIA H200): 20.0 GiB above the baseline, held by pid 4242" in line["MESSAGE"], line
    assert env.unit_state(old["unit"]) in ("inactive", "failed")
    # systemd records the new unit's first start: none while modeld waits, one after the release.
    assert env.unit_timestamp(new_unit, "InactiveExitTimestampMonotonic") == 0
    dep = env.status()["deployment"]
    assert dep["id"] == dep_id and dep["phase"] == "stopping_old" and dep["state"] == "running", dep
    released = time.monotonic_ns() // 1000  # the clock systemd's ...Monotonic properties count
    nvml_state(env.nvml)  # the worker exits
    dep = ended(env, dep_id)
    assert dep["state"] == "succeeded", dep
    assert env.unit_timestamp(new_unit, "InactiveExitTimestampMonotonic") > released
    assert server_starts(env, "b", mark) == 1
    wait_line(env, "GPU memory is back at its baseline on GPU 0", mark, f"MODELD_DEPLOYMENT={dep_id}")
    assert completion(env.ports["b"], "b")


def test_gpu_memory_that_never_comes_back_fails_the_stop_naming_the_holder_and_rolls_back(env):
    nvml_state(env.nvml, IDLE + 20 * GiB, [(4343, 20 * GiB)])
    try:
        dep = env.deploy_and_wait("c", expect_exit=1)
    finally:
        nvml_state(env.nvml)
    assert dep["state"] == "rolled_back", dep
    msg = dep["error"]["message"]
    assert "GPU 0 (NVIDIA H200)" in msg and "pid 4343" in msg and "20.0 GiB above the baseline" in msg, msg
    assert env.unit_state("modeld-serve@c.service") != "active"
    assert env.status()["active"]["model"] == "b"
    assert completion(env.ports["b"], "b")


def test_a_model_needing_more_gpu_memory_than_is_free_is_not_launched_and_rolled_back(env):
    dep = env.deploy_and_wait("big", expect_exit=1)
    assert dep["state"] == "rolled_back" and dep["error"]["code"] == "unit_failed", dep
    msg = dep["error"]["message"]
    assert "model big" in msg and "GPU 0 (NVIDIA H200)" in msg and "200.0 GiB" in msg, msg
    assert env.unit_state("modeld-serve@big.service") != "active"
    assert completion(env.ports["b"], "b")


def wait_health_checking(env: ModeldEnv, name: str) -> dict:
    return wait_for(f"{name}'s deployment in health_checking", lambda: (
        (d := env.status()["deployment"]) and d["model"] == name and d["phase"] == "health_checking" and d),
        timeout=60)


def test_a_daemon_restart_during_health_checking_continues_the_deployment(env):
    assert env.modelctl("deploy", "slow").returncode == 0
    dep = wait_health_checking(env, "slow")
    unit = "modeld-serve@slow.service"
    pid = env.main_pid(unit)
    assert pid > 0
    env.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
    wait_for("modeld after its restart", lambda: env.modelctl("status").returncode == 0, timeout=60)
    end = deployment_ends(env)
    assert end["id"] == dep["id"] and end["state"] == "succeeded", end
    # The server that was loading kept loading: it was not started again.
    assert env.main_pid(unit) == pid
    assert env.status()["active"]["model"] == "slow"
    assert completion(env.ports["slow"], "slow")
    assert any("runs already" in m for m in messages(env, end))


def test_a_cancel_after_stopping_old_rolls_back_to_the_old_model(env):
    assert env.modelctl("deploy", "slow2").returncode == 0
    wait_health_checking(env, "slow2")
    r = env.modelctl("cancel")
    assert r.returncode == 0, r.stdout + r.stderr
    dep = deployment_ends(env)
    assert dep["state"] == "rolled_back" and dep["error"]["code"] == "cancelled", dep
    assert env.unit_state("modeld-serve@slow2.service") != "active"
    assert env.status()["active"]["model"] == "slow"
    assert completion(env.ports["slow"], "slow")


def stop_seconds(env: ModeldEnv, dep: dict) -> float:
    """Seconds between modeld's "stopping UNIT" and "UNIT stopped" lines of a deployment."""
    t = {}
    for e in env.journal(f"MODELD_DEPLOYMENT={dep['id']}", "MODELD_PHASE=stopping_old"):
        if e["MESSAGE"].startswith("stopping "):
            t["from"] = int(e["__REALTIME_TIMESTAMP"])
        elif " stopped: " in e["MESSAGE"]:
            t["to"] = int(e["__REALTIME_TIMESTAMP"])
    return (t["to"] - t["from"]) / 1e6


def test_a_worker_that_ignores_sigterm_is_killed_with_the_control_group_before_the_next_server(env):
    env.deploy_and_wait("stubborn")
    wait_for("the stubborn worker's line", lambda: any(
        "ignores SIGTERM" in e.get("MESSAGE", "") for e in env.journal(unit="modeld-serve@stubborn.service")),
        timeout=30)
    dep = env.deploy_and_wait("a")
    assert dep["state"] == "succeeded", dep
    # The main process went at SIGTERM; the worker only at SIGKILL after TimeoutStopSec=3s.
    assert stop_seconds(env, dep) >= 3.0
    # Its control group is gone with the worker (systemd's SIGKILL of the whole group).
    assert env.unit_state("modeld-serve@stubborn.service") in ("inactive", "failed")
    out = env.systemd.run(["systemctl", "show", "-p", "MainPID", "-p", "ControlGroup", "--value",
                           "modeld-serve@stubborn.service"], check=True).stdout.split()
    assert out[:1] == ["0"] and len(out) == 1, out
    assert completion(env.ports["a"], "a")


def test_a_port_held_after_the_main_process_exits_delays_the_next_server_on_that_port(env):
    env.deploy_and_wait("holder")
    dep = env.deploy_and_wait("next")
    assert dep["state"] == "succeeded", dep
    held = [e for e in env.journal(unit="modeld-serve@holder.service") if " held by " in e.get("MESSAGE", "")]
    assert held, "the holder fixture did not keep its port"
    assert stop_seconds(env, dep) >= 3.0
    # The new server came up on the same port only after the old socket was closed.
    assert completion(env.ports["next"], "next")


# -- allow_downtime on a disk that holds one model only --------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    with modeld_env.small_disk(tmp_path / "work", 40 * MiB, "modeld-test-downtime") as work:
        yield work


def test_allow_downtime_stops_the_old_model_before_evicting_it(small_disk):
    env = ModeldEnv(workdir=small_disk)
    try:
        env.add_repo("acme/old", shards=2, shard_size=12 * MiB, seed=31)
        env.add_repo("acme/new", shards=2, shard_size=12 * MiB, seed=32)
        ports = {"old": free_port(), "new": free_port()}
        env.start(model_table("old", "acme/old", ports["old"]) + model_table("new", "acme/new", ports["new"]))
        env.deploy_and_wait("old")

        plan = json.loads(env.modelctl("--json", "plan", "new").stdout)
        assert plan["fits"] is False and plan["fits_with_allow_downtime"] is True, plan
        assert "fits with --allow-downtime" in env.modelctl("plan", "new").stdout
        plan = json.loads(env.modelctl("--json", "plan", "new", "--allow-downtime").stdout)
        assert plan["fits"] is True and plan["rollback_possible"] is False, plan
        assert [e["name"] for e in plan["evictions"]] == ["old"]
        assert plan["warming"] == "in_outage", plan

        # Without the flag the old model is never touched.
        dep = env.deploy_and_wait("new", expect_exit=1)
        assert dep["state"] == "failed" and dep["error"]["code"] == "disk_full", dep
        assert "--allow-downtime" in dep["error"]["message"], dep["error"]
        assert completion(ports["old"], "old")

        r = env.modelctl("deploy", "new", "--wait", "--allow-downtime")
        assert r.returncode == 0, r.stdout + r.stderr
        dep = env.status()["deployment"]
        assert dep["state"] == "succeeded", dep
        phases = []
        for e in env.journal(f"MODELD_DEPLOYMENT={dep['id']}"):
            p = e.get("MODELD_PHASE")
            if p and (not phases or phases[-1] != p):
                phases.append(p)
        assert phases[:7] == ["planning", "stopping_old", "freeing_disk", "downloading", "verifying",
                              "warming", "launching"], phases
        assert env.status()["active"]["model"] == "new"
        assert not (env.models_dir / ".store" / "old").exists()
        assert completion(ports["new"], "new")
    finally:
        env.stop()
