"""End to end, never restarting what serves (interface.md "Never restarting what serves"): a
redeploy of the model that serves, at the commit that serves, with the settings its server was
started with, changes nothing (same MainPID, "changed": false, `modelctl deploy` says so and exits
0), also after `systemctl reload modeld` and a daemon restart; a change only in stop_timeout
restarts nothing; `--restart` restarts it; a changed environment restarts it, and when the new
server fails, the rollback starts the old one with the environment it ran with (read from
/proc/MAINPID/environ inside the namespace)."""

from __future__ import annotations

import json
import os

import pytest

from contract_helpers import hub_commit, journal_mark, push, reload, wait_line
from modeld_env import ModeldEnv, completion, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

UNIT = "modeld-serve@kimi.service"


def table(port: int, vllm_x: str, *, stop_timeout: str = "30s", serve_args: list[str] | None = None) -> str:
    return model_table("kimi", "acme/kimi", port, stop_timeout=stop_timeout, serve_args=serve_args,
                       extra_serve=f'environment = {{ VLLM_X = "{vllm_x}" }}', startup_timeout="20s")


def configure(env: ModeldEnv, tables: str) -> None:
    """Rewrites modeld.toml and reloads modeld (the drop-in is rewritten, the server untouched)."""
    env.write_config(tables)
    reload(env)


def environ(env: ModeldEnv, pid: int) -> dict[str, str]:
    """The environment of process `pid` of the namespace."""
    r = env.systemd.run(["cat", f"/proc/{pid}/environ"], check=True)
    return dict(item.split("=", 1) for item in r.stdout.split("\0") if "=" in item)


def deploy(env: ModeldEnv, *flags: str, expect_exit: int = 0) -> tuple[str, dict]:
    """`modelctl deploy kimi --wait FLAGS`: its human output and the deployment it ended."""
    r = env.modelctl("deploy", "kimi", "--wait", *flags)
    assert r.returncode == expect_exit, f"exit {r.returncode}:\n{r.stdout}{r.stderr}"
    return r.stdout, env.status()["deployment"]


def serving_pid(env: ModeldEnv) -> int:
    pid = wait_for(f"{UNIT}'s main PID", lambda: env.main_pid(UNIT), timeout=30)
    assert completion(env.ports["kimi"], "kimi")
    return pid


def assert_noop(env: ModeldEnv, pid: int) -> None:
    mark = journal_mark()
    out, dep = deploy(env)
    assert "already serving, nothing to do" in out, out
    assert dep["state"] == "succeeded" and dep["changed"] is False, dep
    assert env.main_pid(UNIT) == pid
    wait_line(env, "nothing to do: kimi already serves commit", mark)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("noop")
    e = ModeldEnv(workdir=work)
    e.add_repo("acme/kimi", shards=2, shard_size=100_000, seed=31)
    e.ports = {"kimi": free_port()}
    e.start(table(e.ports["kimi"], "1"))
    out, dep = deploy(e)
    assert dep["state"] == "succeeded" and dep["changed"] is True, dep
    try:
        yield e
    finally:
        e.stop()


def test_a_redeploy_of_the_serving_model_changes_nothing_and_json_shows_the_record(env):
    pid = serving_pid(env)
    assert_noop(env, pid)
    r = env.modelctl("--json", "deploy", "kimi", "--wait")
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout.strip().splitlines()[-1])
    assert record["changed"] is False and record["state"] == "succeeded", record
    assert env.main_pid(UNIT) == pid


def test_after_a_reload_and_a_daemon_restart_a_redeploy_still_changes_nothing(env):
    pid = serving_pid(env)
    configure(env, table(env.ports["kimi"], "1"))
    assert_noop(env, pid)
    env.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
    wait_for("modeld's control socket after a restart", lambda: env.modelctl("status").returncode == 0,
             timeout=60)
    assert env.main_pid(UNIT) == pid
    assert_noop(env, pid)


def test_a_change_only_in_stop_timeout_restarts_nothing(env):
    pid = serving_pid(env)
    configure(env, table(env.ports["kimi"], "1", stop_timeout="45s"))
    assert_noop(env, pid)


def test_restart_restarts_the_serving_model(env):
    pid = serving_pid(env)
    out, dep = deploy(env, "--restart")
    assert dep["state"] == "succeeded" and dep["changed"] is True, dep
    assert "nothing to do" not in out
    assert serving_pid(env) != pid


def test_a_changed_environment_that_fails_rolls_back_to_the_old_environment(env):
    pid = serving_pid(env)
    assert environ(env, pid).get("VLLM_X") == "1"
    # The new server exits at once: health fails, and the rollback starts the old one again.
    configure(env, table(env.ports["kimi"], "2", serve_args=["--exit-after", "0"]))
    mark = journal_mark()
    _, dep = deploy(env, expect_exit=1)
    assert dep["state"] == "rolled_back", dep
    wait_line(env, "restarting kimi: command changed, environment changed (VLLM_X)", mark)
    back = serving_pid(env)
    assert back != pid
    assert environ(env, back).get("VLLM_X") == "1"
    # What it runs with now is still what it was started with: a redeploy with the first
    # configuration changes nothing.
    configure(env, table(env.ports["kimi"], "1"))
    assert_noop(env, back)


def test_a_changed_environment_restarts_the_serving_model_with_it(env):
    pid = serving_pid(env)
    configure(env, table(env.ports["kimi"], "3"))
    mark = journal_mark()
    _, dep = deploy(env)
    assert dep["state"] == "succeeded" and dep["changed"] is True, dep
    line = wait_line(env, "restarting kimi: environment changed (VLLM_X)", mark)
    assert '"3"' not in line["MESSAGE"] and "=3" not in line["MESSAGE"]
    now = serving_pid(env)
    assert now != pid
    assert environ(env, now).get("VLLM_X") == "3"
    assert_noop(env, now)


def other_commit(env: ModeldEnv, serving: str) -> str:
    """A second commit of acme/kimi that the hub serves, while main still names `serving`: a push
    (generation_config.json renamed over), then the old file renamed back in place."""
    gen = env.repos / "acme/kimi" / "generation_config.json"
    original = gen.read_bytes()
    other = push(env, "acme/kimi", 7)
    back = gen.with_suffix(".back")
    back.write_bytes(original)
    os.replace(back, gen)
    assert other != serving and hub_commit(env, "acme/kimi") == serving, (other, serving)
    return other


def plan_json(env: ModeldEnv, *flags: str) -> dict:
    r = env.modelctl("--json", "plan", "kimi", *flags)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_plan_predicts_whether_a_deploy_would_change_anything_and_touches_nothing(env):
    pid = serving_pid(env)
    plan = plan_json(env)
    assert plan["already_serving"] is True, plan
    commit = env.status()["active"]["commit"]
    assert plan_json(env, "--commit", commit)["already_serving"] is True
    human = env.modelctl("plan", "kimi")
    assert f"kimi already serves commit {commit[:12]} with the same settings" in human.stdout, human.stdout
    # Another commit, or other settings: a deploy would restart, and the plan says so.
    other = other_commit(env, commit)
    plan = plan_json(env, "--commit", other)
    assert plan["commit"] == other and plan["already_serving"] is False, plan
    configure(env, table(env.ports["kimi"], "4"))
    assert plan_json(env)["already_serving"] is False
    assert env.main_pid(UNIT) == pid, "a plan restarted the server"
    _, dep = deploy(env)
    assert dep["changed"] is True
    assert plan_json(env)["already_serving"] is True
