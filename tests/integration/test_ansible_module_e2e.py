"""End to end, the Ansible module modeld.fleet.modeld_deploy (ansible/) against a real modeld under
a namespaced systemd with the bundled hub, run by Debian's ansible as an operator would
(`ansible localhost -c local -m modeld.fleet.modeld_deploy`): real `changed` from the record,
check mode predicting it through `plan`, reattachment to a running record of the same kind by
its id (and never to someone else's: a branch deploy still resolving its commit is not a deploy
of another commit), a busy host waited for within busy_timeout, rm of a revision (check mode
predicting the refusal of the commit in service), and a failed record failing the task with its
error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from contract_helpers import push
from modeld_env import SOURCE_DIR, ModeldEnv, free_port, model_table, wait_for, write_control
from nsystemd import unsupported_reason

pytestmark = [
    pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or ""),
    pytest.mark.skipif(shutil.which("ansible") is None, reason="ansible is missing (scripts/install-deps.sh)"),
]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("ansible")
    control = work / "hub-control.json"
    write_control(control)
    e = ModeldEnv(workdir=work, hub_args=["--control", str(control)])
    e.hub_control = control
    e.add_repo("acme/m", shards=2, shard_size=200_000, seed=181)
    e.add_repo("acme/broken", shards=2, shard_size=100_000, seed=182)
    e.ports = {"m": free_port(), "broken": free_port()}
    collections = work / "collections" / "ansible_collections" / "modeld"
    collections.mkdir(parents=True)
    (collections / "fleet").symlink_to(SOURCE_DIR / "ansible")
    e.ansible_env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(work / "collections"), ANSIBLE_NOCOLOR="1",
                         ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_LOCAL_TEMP=str(work / "ansible-tmp"),
                         ANSIBLE_REMOTE_TEMP=str(work / "ansible-remote-tmp"), ANSIBLE_STDOUT_CALLBACK="json",
                         ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_PYTHON_INTERPRETER="/usr/bin/python3")
    try:
        e.start(model_table("m", "acme/m", e.ports["m"])
                + model_table("broken", "acme/broken", e.ports["broken"], serve_args=["--fail-health"],
                              startup_timeout="5s"))
        yield e
    finally:
        e.stop()


def module(env: ModeldEnv, *, check: bool = False, **params) -> dict:
    """Runs the module once on localhost; returns its result (rc in "rc_ansible")."""
    params.setdefault("modelctl", str(env.modelctl_bin))
    params.setdefault("socket", str(env.socket))
    argv = ["ansible", "localhost", "-c", "local", "-i", "localhost,", "-m", "modeld.fleet.modeld_deploy",
            "-a", json.dumps(params)] + (["--check"] if check else [])
    return parse(subprocess.run(argv, env=env.ansible_env, capture_output=True, text=True, timeout=300))


def spawn(env: ModeldEnv, *, check: bool = False, **params) -> subprocess.Popen:
    params.setdefault("modelctl", str(env.modelctl_bin))
    params.setdefault("socket", str(env.socket))
    argv = ["ansible", "localhost", "-c", "local", "-i", "localhost,", "-m", "modeld.fleet.modeld_deploy",
            "-a", json.dumps(params)] + (["--check"] if check else [])
    return subprocess.Popen(argv, env=env.ansible_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def parse(r) -> dict:
    out = r.stdout if isinstance(r, subprocess.CompletedProcess) else r[0]
    try:
        doc = json.loads(out)
        result = doc["plays"][0]["tasks"][0]["hosts"]["localhost"]
    except (ValueError, KeyError, IndexError):
        raise AssertionError(f"ansible printed no result:\n{out}\n{r.stderr if hasattr(r, 'stderr') else r[1]}")
    return result


def test_check_mode_predicts_a_first_deploy_and_changes_nothing(env):
    r = module(env, check=True, name="m")
    assert not r.get("failed"), r
    assert r["changed"] is True and r["already_serving"] is False, r
    assert env.status()["deployment"] is None, "check mode started a deployment"


def test_a_deploy_changes_and_the_same_again_does_not(env):
    r = module(env, name="m")
    assert not r.get("failed"), r
    assert r["changed"] is True and r["deployment"]["state"] == "succeeded", r
    assert r["previous_commit"] is None and r["commit"] == env.status()["active"]["commit"]
    pid = env.main_pid("modeld-serve@m.service")
    again = module(env, name="m", commit=r["commit"])
    assert not again.get("failed") and again["changed"] is False, again
    assert again["previous_commit"] == r["commit"]
    predicted = module(env, check=True, name="m", commit=r["commit"])
    assert predicted["changed"] is False and predicted["already_serving"] is True, predicted
    assert env.main_pid("modeld-serve@m.service") == pid


def test_a_running_pull_of_the_same_commit_is_reattached_to_by_its_id(env):
    new = push(env, "acme/m", 51)
    write_control(env.hub_control, hold="acme/m/*")
    try:
        started = json.loads(env.modelctl("--json", "pull", "m", "--commit", new).stdout)
        wait_for("a held download", lambda: env.hub.stats()["held"] >= 1, timeout=60)
        task = spawn(env, name="m", commit=new, action="pull")
        wait_for("the module following the pull", lambda: task.poll() is None and _follower(started["id"]), timeout=30)
    finally:
        write_control(env.hub_control)
    r = parse(task.communicate(timeout=120))
    assert not r.get("failed"), r
    assert r["deployment"]["id"] == started["id"] and r["changed"] is True, r
    history = json.loads(env.api("GET", "/v1/deployments")[2])["deployments"]
    assert sum(1 for d in history if d["kind"] == "pull") == 1, "the module started a second pull"


def _follower(record_id: str) -> bool:
    """Whether a `modelctl deployment ID --wait` of that record runs now."""
    r = subprocess.run(["pgrep", "-f", f"deployment {record_id} --wait"], capture_output=True)
    return r.returncode == 0


def test_a_busy_host_is_waited_for_within_busy_timeout(env):
    other = push(env, "acme/broken", 52)
    write_control(env.hub_control, hold="acme/broken/*")
    try:
        json.loads(env.modelctl("--json", "pull", "broken", "--commit", other).stdout)
        wait_for("a held download", lambda: env.hub.stats()["held"] >= 1, timeout=60)
        r = module(env, name="m", busy_timeout=2, poll_interval=1)
        assert r.get("failed") and "busy with pull" in r["msg"] and "broken" in r["msg"], r
        task = spawn(env, name="m", busy_timeout=120, poll_interval=1)
    finally:
        write_control(env.hub_control)
    done = parse(task.communicate(timeout=180))
    assert not done.get("failed"), done
    assert done["deployment"]["kind"] == "deploy" and done["deployment"]["state"] == "succeeded", done


def test_rm_removes_a_kept_revision_once(env):
    old = env.status()["active"]["commit"]
    keep = module(env, name="m", commit=old, action="pull")  # kept through the next cleanup
    assert not keep.get("failed") and keep["changed"] is False, keep
    new = push(env, "acme/m", 53)
    assert module(env, name="m", commit=new)["changed"] is True
    models = json.loads(env.modelctl("--json", "models").stdout)["models"]
    kept = [r["commit"] for m in models if m["name"] == "m" for r in m["revisions"] if r["commit"] == old]
    assert kept, models
    assert module(env, check=True, name="m", commit=kept[0], action="rm")["changed"] is True
    r = module(env, name="m", commit=kept[0], action="rm")
    assert not r.get("failed") and r["changed"] is True, r
    again = module(env, name="m", commit=kept[0], action="rm")
    assert not again.get("failed") and again["changed"] is False, again


def test_a_failed_deployment_fails_the_task_with_its_error(env):
    r = module(env, name="broken")
    assert r.get("failed"), r
    assert "ended failed" in r["msg"] or "rolled_back" in r["msg"], r
    assert r["deployment"]["state"] in ("failed", "rolled_back"), r
    bad = module(env, name="m", commit="main")
    assert bad.get("failed") and "40 lowercase hex" in bad["msg"], bad


def logging_modelctl(env: ModeldEnv, folder, calls) -> str:
    """A modelctl that appends its arguments to `calls` (one line per run), then runs the real one."""
    wrapper = folder / "modelctl-logged"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {env.modelctl_bin} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def commands_run(calls) -> list[str]:
    """The modelctl commands the module ran, oldest first (status, deploy, rm...: the word after
    `--json --socket S`, which module() and spawn() always pass)."""
    return [line.split()[3] for line in calls.read_text().splitlines()] if calls.exists() else []


def revisions_on_disk(env: ModeldEnv) -> dict:
    """{model: [(commit, state), ...]} from `modelctl models`."""
    models = json.loads(env.modelctl("--json", "models").stdout)["models"]
    return {m["name"]: [(r["commit"], r["state"]) for r in m.get("revisions") or []] for m in models}


def serving(env: ModeldEnv, model: str) -> str | None:
    return next((s["commit"] for s in env.status().get("services") or [] if s["model"] == model), None)


def test_a_branch_deploy_still_resolving_is_not_taken_for_a_deploy_of_another_commit(env, tmp_path):
    asked = push(env, "acme/m", 61)
    head = push(env, "acme/m", 62)  # the branch moved on: a deploy of the branch ends on `head`
    calls = tmp_path / "modelctl-calls"
    write_control(env.hub_control, listing_hold="acme/m/*")
    try:
        branch = json.loads(env.modelctl("--json", "deploy", "m").stdout)
        wait_for("the branch deploy held resolving its revision", lambda: env.hub.stats()["held"] >= 1, timeout=60)
        task = spawn(env, name="m", commit=asked, busy_timeout=240, poll_interval=1,
                     modelctl=logging_modelctl(env, tmp_path, calls))
        # The module has looked at the running record and decided: it follows it, or looks again.
        wait_for("the module following the branch deploy or waiting for it",
                 lambda: task.poll() is None and (_follower(branch["id"]) or commands_run(calls).count("status") >= 2),
                 timeout=60)
        running = env.status()["deployment"]
        assert running["id"] == branch["id"] and running["commit"] is None, running
    finally:
        write_control(env.hub_control)
    r = parse(task.communicate(timeout=300))
    assert not r.get("failed"), r.get("msg")
    assert r["deployment"]["id"] != branch["id"], f"the module reported the branch deploy as its own: {r}"
    assert r["commit"] == asked and r["deployment"]["state"] == "succeeded" and r["changed"] is True, r
    other = json.loads(env.api("GET", f"/v1/deployments/{branch['id']}")[2])
    assert other["state"] == "succeeded" and other["commit"] == head, other
    assert serving(env, "m") == asked


def test_check_mode_rm_of_the_serving_commit_predicts_the_refusal_and_changes_nothing(env):
    if serving(env, "m") is None:  # run alone: nothing serves yet
        env.deploy_and_wait("m")
    commit = serving(env, "m")
    assert commit, env.status()
    models = revisions_on_disk(env)
    history = json.loads(env.api("GET", "/v1/deployments")[2])["deployments"]
    pid = env.main_pid("modeld-serve@m.service")
    predicted = module(env, check=True, name="m", commit=commit, action="rm")
    assert predicted.get("failed") and predicted["changed"] is False, predicted
    assert commit in predicted["msg"] and "in service" in predicted["msg"] and "model_active" in predicted["msg"], predicted
    assert revisions_on_disk(env) == models
    assert json.loads(env.api("GET", "/v1/deployments")[2])["deployments"] == history
    assert env.main_pid("modeld-serve@m.service") == pid and serving(env, "m") == commit
    real = module(env, name="m", commit=commit, action="rm")
    assert real.get("failed") and real.get("error_code") == "model_active", real
    unknown = module(env, check=True, name="nonesuch", commit=commit, action="rm")
    assert unknown.get("failed") and "no model named nonesuch" in unknown["msg"], unknown


def test_rm_waits_while_a_pull_of_the_model_runs_then_removes(env, tmp_path):
    kept = push(env, "acme/m", 63)
    assert module(env, name="m", commit=kept, action="pull")["changed"] is True
    # Check mode waits as the real run does (modeld refuses an rm while a pull of m runs): it
    # predicts only once the pull has ended.
    predicted, _ = rm_during_a_held_pull(env, tmp_path / "check", kept, check=True, waited="status")
    assert not predicted.get("failed") and predicted["changed"] is True, predicted.get("msg", predicted)
    assert kept in [c for c, _ in revisions_on_disk(env)["m"]]
    # The real run is refused (409 deployment_running), tries again, and removes it after the pull.
    r, pull = rm_during_a_held_pull(env, tmp_path / "real", kept, check=False, waited="rm")
    assert not r.get("failed") and r["changed"] is True, r.get("msg", r)
    assert kept not in [c for c, _ in revisions_on_disk(env)["m"]]
    assert json.loads(env.api("GET", f"/v1/deployments/{pull['id']}")[2])["state"] == "succeeded"


def rm_during_a_held_pull(env: ModeldEnv, folder, commit: str, *, check: bool, waited: str) -> tuple[dict, dict]:
    """Runs the module's rm of `commit` while a pull of a new commit of m is held, until it has run
    modelctl `waited` twice (it waits), then lets the pull end; returns (its result, the pull)."""
    folder.mkdir()
    calls = folder / "modelctl-calls"
    write_control(env.hub_control, hold="acme/m/*")
    try:
        pull = json.loads(env.modelctl("--json", "pull", "m", "--commit", push(env, "acme/m", 70 + check)).stdout)
        wait_for("a held download", lambda: env.hub.stats()["held"] >= 1, timeout=60)
        task = spawn(env, check=check, name="m", commit=commit, action="rm", busy_timeout=240, poll_interval=1,
                     modelctl=logging_modelctl(env, folder, calls))
        wait_for(f"the module running {waited} twice, or ending",
                 lambda: task.poll() is not None or commands_run(calls).count(waited) >= 2, timeout=60)
        assert task.poll() is None, f"the module ended while the pull ran: {parse(task.communicate())}"
        assert env.status()["deployment"]["id"] == pull["id"]
        assert commit in [c for c, _ in revisions_on_disk(env)["m"]]
    finally:
        write_control(env.hub_control)
    return parse(task.communicate(timeout=300)), pull
