"""End to end, the steps a fleet rollout takes on one host (docs/fleet.md), under a namespaced
systemd with the bundled hub: `pull --commit` of the commit in service keeps it through the next
deployment's cleanup (so a rollback fetches nothing), `pull --commit` of a new commit stages
exactly that commit while the branch moves on, `deploy --commit` switches to it, and `modelctl
deployment ID [--wait]` follows a record by its id with deploy's exit codes."""

from __future__ import annotations

import json
import select
import subprocess

import pytest

from contract_helpers import hub_commit, push
from modeld_env import ModeldEnv, free_port, model_table, wait_for, write_control
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("fleetsteps")
    control = work / "hub-control.json"
    write_control(control)
    e = ModeldEnv(workdir=work, hub_args=["--control", str(control)])
    e.hub_control = control
    e.add_repo("acme/m", shards=2, shard_size=300_000, seed=171)
    e.port = free_port()
    try:
        e.start(model_table("m", "acme/m", e.port))
        assert e.deploy_and_wait("m")["state"] == "succeeded"
        yield e
    finally:
        e.stop()


def revisions(env: ModeldEnv) -> dict[str, dict]:
    models = json.loads(env.modelctl("--json", "models").stdout)["models"]
    return {r["commit"]: r for r in next(m for m in models if m["name"] == "m")["revisions"]}


def downloads_since(env: ModeldEnv, mark: int) -> list[dict]:
    """File downloads (resolve or CDN) the hub logged after its first `mark` requests, but
    planning's few kB read of the safetensors index."""
    return [q for q in env.hub.requests()[mark:]
            if (q["origin"] == "cdn" or "/acme/m/resolve/" in q["path"])
            and not q["path"].endswith(".safetensors.index.json")]


def run_json(env: ModeldEnv, *args: str) -> dict:
    r = env.modelctl("--json", *args)
    assert r.returncode == 0, f"modelctl {' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}"
    return json.loads(r.stdout)


def test_the_old_revision_kept_by_a_pull_survives_the_switch_and_the_rollback_fetches_nothing(env):
    old = env.status()["active"]["commit"]
    mark = len(env.hub.requests())
    kept = run_json(env, "pull", "m", "--commit", old, "--wait")
    assert (kept["kind"], kept["state"], kept["changed"], kept["commit"]) == ("pull", "succeeded", False, old), kept
    assert downloads_since(env, mark) == []
    assert revisions(env)[old] == {"commit": old, "state": "verified", "pulled": True, "in_service": True}

    new = push(env, "acme/m", 91)
    staged = run_json(env, "pull", "m", "--commit", new, "--wait")
    assert (staged["state"], staged["changed"], staged["commit"]) == ("succeeded", True, new), staged
    moved = push(env, "acme/m", 92)  # the branch moves mid-rollout: the pinned commit stays
    assert moved not in (old, new) and hub_commit(env, "acme/m") == moved

    mark = len(env.hub.requests())
    switched = run_json(env, "deploy", "m", "--commit", new, "--wait")
    assert (switched["state"], switched["commit"]) == ("succeeded", new), switched
    assert downloads_since(env, mark) == [], "the staged commit was downloaded again"
    revs = revisions(env)
    assert revs[old]["state"] == "verified" and revs[old]["pulled"], revs
    assert revs[new]["in_service"] and moved not in revs, revs

    mark = len(env.hub.requests())
    back = run_json(env, "deploy", "m", "--commit", old, "--wait")
    assert (back["state"], back["commit"]) == ("succeeded", old), back
    assert downloads_since(env, mark) == [], "the rollback downloaded"
    assert env.status()["active"]["commit"] == old


def test_a_pull_commit_that_is_not_a_commit_is_refused(env):
    r = env.modelctl("pull", "m", "--commit", "main")
    assert r.returncode == 2, r.stdout + r.stderr
    status, _, body = env.api("POST", "/v1/models/m/pull", body=json.dumps({"commit": "xyz"}))
    assert status == 400 and "40 lowercase hex" in body, body
    status, _, body = env.api("POST", "/v1/models/m/pull", body=json.dumps({"revision": "main"}))
    assert status == 400 and "unknown field" in body, body


def test_deployment_id_shows_a_record_and_wait_follows_it_with_deploys_exit_codes(env):
    done = env.status()["deployment"]
    shown = run_json(env, "deployment", done["id"])
    assert shown["id"] == done["id"] and shown["state"] == "succeeded"
    assert run_json(env, "deployment", done["id"], "--wait")["state"] == "succeeded"
    unknown = env.modelctl("deployment", "20260101T000000Z-nope")
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr

    # A pull held at the hub, followed by id from another modelctl, then cancelled: exit 1.
    push(env, "acme/m", 93)
    write_control(env.hub_control, hold="acme/m/*")  # the new commit changes a small file only
    try:
        started = run_json(env, "pull", "m")
        wait_for("a held download", lambda: env.hub.stats()["held"] >= 1, timeout=60)
        follower = subprocess.Popen([str(env.modelctl_bin), "--socket", str(env.socket), "deployment",
                                     started["id"], "--wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # It found the pull running and follows it.
        ready, _, _ = select.select([follower.stdout], [], [], 30)
        assert ready, "modelctl deployment --wait printed nothing"
        first = follower.stdout.readline()
        assert first.startswith(f"Following pull {started['id']} of m"), first
        assert env.modelctl("cancel").returncode == 0
        out, err = follower.communicate(timeout=60)
    finally:
        write_control(env.hub_control)
    assert follower.returncode == 1, out + err
    assert f"Pull {started['id']} cancelled" in out, out
