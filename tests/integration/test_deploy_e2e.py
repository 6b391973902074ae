"""End to end: modeld as a unit of a real (namespaced) systemd deploys model A, then model B,
from the bundled hub, with the stand-in inference server; then refuses bad requests."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from modeld_env import SERVER_STARTING, ModeldEnv, completion, free_port, model_table, wait_for
from nsystemd import unsupported_reason

PHASES = ["planning", "freeing_disk", "downloading", "verifying", "warming", "stopping_old", "launching",
          "health_checking", "benchmarking"]

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = ModeldEnv(workdir=tmp_path_factory.mktemp("e2e"))
    e.add_repo("acme/model-a", shards=3, shard_size=300_000, seed=1)
    e.add_repo("acme/model-b", shards=4, shard_size=400_000, seed=2)
    e.add_repo("acme/slow", shards=2, shard_size=100_000, seed=3)
    e.ports = {"model-a": free_port(), "model-b": free_port(), "slow": free_port()}
    tables = (model_table("model-a", "acme/model-a", e.ports["model-a"])
              + model_table("model-b", "acme/model-b", e.ports["model-b"])
              + model_table("slow", "acme/slow", e.ports["slow"], load_seconds=30))
    try:
        e.start(tables)
        yield e
    finally:
        e.stop()


def files_of(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and ".modeld" not in p.parts and ".hub" not in p.parts)


def test_deploying_a_first_model_makes_it_active_and_answering(env):
    env.deploy_and_wait("model-a")
    st = env.status()
    assert st["active"]["model"] == "model-a"
    assert st["deployment"]["state"] == "succeeded"
    assert env.unit_state("modeld-serve@model-a.service") == "active"
    assert completion(env.ports["model-a"], "model-a")
    # systemd took every setting of modeld's drop-in.
    props = env.systemd.run(["systemctl", "show", "-p", "WorkingDirectory,TimeoutStopUSec,TimeoutStartUSec,KillMode",
                             "modeld-serve@model-a.service"], check=True).stdout.split()
    assert f"WorkingDirectory={env.models_dir / 'model-a'}" in props
    assert "TimeoutStopUSec=30s" in props and "TimeoutStartUSec=infinity" in props
    assert "KillMode=control-group" in props


def test_deploying_a_second_model_replaces_the_first(env):
    env.deploy_and_wait("model-b")
    st = env.status()
    assert st["active"]["model"] == "model-b"
    assert st["active"]["unit"] == "modeld-serve@model-b.service"
    dep = st["deployment"]
    assert dep["state"] == "succeeded" and dep["model"] == "model-b"
    assert len(dep["commit"]) == 40
    assert dep["progress"]["bytes_done"] == dep["progress"]["bytes_total"] > 0

    # A's unit is stopped before B's starts.
    assert env.unit_state("modeld-serve@model-a.service") in ("inactive", "failed")
    assert env.unit_state("modeld-serve@model-b.service") == "active"
    # systemd unloads an inactive unit, so its timestamps are gone; the journal keeps the order:
    # A's server said goodbye, modeld saw A's unit inactive, and only then started B's unit,
    # whose server logged its first line after that.
    def first(entries, text):
        hit = [e for e in entries if text in e.get("MESSAGE", "")]
        assert hit, f"no journal line containing {text!r}"
        return int(hit[0]["__MONOTONIC_TIMESTAMP"])
    a_lines = env.journal("SYSLOG_IDENTIFIER=modeld-serve@model-a")
    b_lines = env.journal("SYSLOG_IDENTIFIER=modeld-serve@model-b")
    ours = env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={st['deployment']['id']}")
    a_bye = first(a_lines, "Shutting down")
    a_seen_stopped = first(ours, "modeld-serve@model-a.service stopped")
    b_starting = first(ours, "starting modeld-serve@model-b.service")
    b_first = int(b_lines[0]["__MONOTONIC_TIMESTAMP"])
    assert a_bye < a_seen_stopped < b_starting < b_first

    # B's files are byte-identical to the hub's.
    served = env.models_dir / "model-b"
    repo = env.repos / "acme" / "model-b"
    files = files_of(repo)
    assert files and files_of(served) == files
    for name in files:
        assert filecmp.cmp(served / name, repo / name, shallow=False), name

    # B answers a completion.
    assert completion(env.ports["model-b"], "model-b")

    # Every phase wrote a journal line with MODELD_PHASE for this deployment.
    lines = env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep['id']}")
    phases = {e.get("MODELD_PHASE") for e in lines}
    missing = [p for p in PHASES if p not in phases]
    assert not missing, f"no journal line for phases {missing}"
    terminal = [e for e in lines if e.get("MODELD_STATE")]
    assert terminal and terminal[-1]["MODELD_STATE"] == "succeeded"


def test_restarting_modeld_leaves_the_model_serving(env):
    pid_before = env.systemd.run(["systemctl", "show", "-p", "MainPID", "--value",
                                  "modeld-serve@model-b.service"], check=True).stdout.strip()
    env.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
    wait_for("modeld to answer after its restart", lambda: env.modelctl("status").returncode == 0, timeout=60)
    assert env.status()["active"]["model"] == "model-b"
    pid_after = env.systemd.run(["systemctl", "show", "-p", "MainPID", "--value",
                                 "modeld-serve@model-b.service"], check=True).stdout.strip()
    assert pid_before == pid_after != "0"
    assert completion(env.ports["model-b"], "model-b")


def test_a_daemon_start_starts_the_active_model_if_it_is_not_running(env):
    # As after a reboot: the model's service is down when modeld starts.
    env.systemd.run(["systemctl", "stop", "modeld.service"], check=True)
    env.systemd.run(["systemctl", "stop", "modeld-serve@model-b.service"], check=True)
    assert env.unit_state("modeld-serve@model-b.service") == "inactive"
    env.systemd.run(["systemctl", "start", "modeld.service"], check=True)
    wait_for("modeld to start model-b's service again",
             lambda: env.unit_state("modeld-serve@model-b.service") == "active", timeout=60)
    wait_for("model-b to answer again", lambda: completion(env.ports["model-b"], "model-b"), timeout=60,
             retry_on=SERVER_STARTING)


def test_an_unknown_model_is_refused_with_404(env):
    r = env.modelctl("deploy", "no-such-model")
    assert r.returncode == 2
    assert "no-such-model" in (r.stdout + r.stderr)
    raw = env.modelctl("--json", "deploy", "no-such-model")
    assert raw.returncode == 2


def test_a_deploy_while_one_runs_is_refused_with_409(env):
    first = env.modelctl("deploy", "slow")
    assert first.returncode == 0, first.stdout + first.stderr
    second = env.modelctl("deploy", "model-a")
    assert second.returncode == 2, second.stdout + second.stderr
    assert "running" in (second.stdout + second.stderr)
    # Leave the host as it was: cancel the slow deployment and wait for its end.
    env.modelctl("cancel")
    wait_for("the slow deployment to end", lambda: env.status()["deployment"]["state"] != "running", timeout=120)
    assert env.status()["deployment"]["state"] in ("cancelled", "rolled_back")
    assert env.status()["active"]["model"] == "model-b"


def test_a_restarted_system_bus_does_not_break_the_next_deployment(env):
    # dbus-daemon going away (an upgrade restarts it) drops modeld's bus connection; the next
    # call must reconnect instead of failing the deployment in phase launching.
    env.systemd.run(["systemctl", "restart", "dbus.service"], check=True)
    env.deploy_and_wait("model-a")
    assert env.status()["active"]["model"] == "model-a"
