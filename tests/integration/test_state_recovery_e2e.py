"""End to end, state recovery (issue 25 item 5, docs/hardening.md "State recovery") under a
namespaced systemd: a state.json that is lost, `null`, `[]` or garbage never reads as "nothing in
service" and never keeps modeld in a restart loop. modeld falls back to state.json.prev (the copy
every save keeps), or rebuilds the state by adopting the model service that runs; `rm` refuses a
model whose unit runs; a conflicting deploy stops the adopted service; `modeld --check-state`
says what the next start does."""

from __future__ import annotations

import json
import subprocess

import pytest

from contract_helpers import journal_mark
from modeld_env import ModeldEnv, completion, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

UNIT_A = "modeld-serve@a.service"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = ModeldEnv(workdir=tmp_path_factory.mktemp("state-recovery"))
    for i, n in enumerate(["a", "b"]):
        e.add_repo(f"acme/{n}", shards=2, shard_size=64 * 1024, seed=250 + i)
    e.ports = {n: free_port() for n in ["a", "b"]}
    # Neither sets gpu_ids: both use every GPU, so they cannot serve side by side.
    tables = "".join(model_table(n, f"acme/{n}", e.ports[n], stop_timeout="3s") for n in ["a", "b"])
    try:
        e.start(tables)
        e.deploy_and_wait("a")
        yield e
    finally:
        e.stop()


def check_state(env: ModeldEnv) -> subprocess.CompletedProcess:
    return subprocess.run([str(env.modeld), "--check-state", "--config", str(env.config)],
                          capture_output=True, text=True, timeout=30)


def restart_with_state(env: ModeldEnv, state: str | None, prev: str | None) -> None:
    """Stops modeld (the model service keeps running), writes state.json and state.json.prev
    (None: deleted), and starts modeld again; waits for its socket."""
    env.systemd.run(["systemctl", "stop", "modeld.service"], check=True)
    for name, text in (("state.json", state), ("state.json.prev", prev)):
        path = env.state_dir / name
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)
    env.systemd.run(["systemctl", "start", "modeld.service"], check=True)
    wait_for("modeld's control socket", lambda: env.modelctl("status").returncode == 0, timeout=60)


def recovery_lines(env: ModeldEnv, since: int) -> list[str]:
    """modeld's "state recovery" journal lines since the journal mark `since`."""
    return [e["MESSAGE"] for e in env.journal("SYSLOG_IDENTIFIER=modeld")
            if int(e["__REALTIME_TIMESTAMP"]) >= since and "state recovery" in e.get("MESSAGE", "")]


def serving(env: ModeldEnv) -> list[tuple[str, str]]:
    return [(s["model"], s["commit"]) for s in env.status()["services"]]


def nrestarts(env: ModeldEnv) -> int:
    out = env.systemd.run(["systemctl", "show", "-p", "NRestarts", "--value", "modeld.service"], check=True).stdout
    return int(out.strip() or 0)


@pytest.mark.parametrize("damage", ["null", "[]", "{\"services\": [", "\x00\x01 garbage"])
def test_a_damaged_state_json_falls_back_to_its_copy_and_the_model_keeps_serving(env, damage):
    before = serving(env)
    assert before and before[0][0] == "a", before
    entered = env.unit_timestamp(UNIT_A, "ActiveEnterTimestampMonotonic")
    prev = (env.state_dir / "state.json.prev").read_text()
    assert json.loads(prev) == json.loads((env.state_dir / "state.json").read_text())
    env.systemd.run(["systemctl", "stop", "modeld.service"], check=True)
    (env.state_dir / "state.json").write_text(damage)
    checked = check_state(env)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "state.json: INVALID" in checked.stdout and "falls back to" in checked.stdout, checked.stdout
    mark = journal_mark()
    env.systemd.run(["systemctl", "start", "modeld.service"], check=True)
    wait_for("modeld's control socket", lambda: env.modelctl("status").returncode == 0, timeout=60)
    lines = recovery_lines(env, mark)
    assert any("state.json: not a valid state file" in m for m in lines), lines
    assert any("starting from" in m and "state.json.prev" in m for m in lines), lines
    assert serving(env) == before
    assert (env.state_dir / "state.json.bad").read_text() == damage
    assert json.loads((env.state_dir / "state.json").read_text())["services"][0]["model"] == "a"
    assert check_state(env).returncode == 0
    assert env.unit_timestamp(UNIT_A, "ActiveEnterTimestampMonotonic") == entered  # never restarted
    assert completion(env.ports["a"], "a")
    assert nrestarts(env) == 0


@pytest.mark.parametrize("state", [None, "null", "[]", "garbage"])
def test_with_no_usable_state_the_running_service_is_adopted_watched_and_kept_from_rm(env, state):
    before = serving(env)
    entered = env.unit_timestamp(UNIT_A, "ActiveEnterTimestampMonotonic")
    mark = journal_mark()
    restart_with_state(env, state, None)
    lines = recovery_lines(env, mark)
    assert any(f"{UNIT_A} runs and state.json has no service of model a: adopted" in m for m in lines), lines
    assert serving(env) == before
    wait_for("the adopted service watched", lambda: env.status()["services"][0]["watchdog"], timeout=30)
    rm = env.modelctl("rm", "a")
    assert rm.returncode != 0 and "active" in (rm.stdout + rm.stderr), rm
    assert (env.models_dir / "a").exists()
    assert env.unit_timestamp(UNIT_A, "ActiveEnterTimestampMonotonic") == entered
    assert completion(env.ports["a"], "a")
    assert nrestarts(env) == 0


def test_an_adopted_service_is_stopped_by_a_deploy_it_conflicts_with(env):
    restart_with_state(env, "[]", None)
    assert [m for m, _ in serving(env)] == ["a"]
    env.deploy_and_wait("b")
    assert env.unit_state(UNIT_A) in ("inactive", "failed")
    assert env.unit_state("modeld-serve@b.service") == "active"
    assert [m for m, _ in serving(env)] == ["b"]
    assert completion(env.ports["b"], "b")
