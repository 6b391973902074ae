"""End to end: the files a new commit shares with the old one are hard links of the same inodes,
and modeld's own links and unlinks (planning links unchanged files into the new revision, the
switch removes the old revision) change their link count, hence their ctime, which is part of the
identity a manifest records. None of that may make the watchdog take the files in service for
changed ones: a server killed after a redeploy at a new commit, or while the next commit is being
downloaded, is restarted. A real change still stops it, and `modelctl verify` finding the files
intact has it watched and restarted again."""

from __future__ import annotations

import json

import pytest

from contract_helpers import (answers, deployment, ended, journal_mark, lines, link_target, push,
                              start_deploy, try_status)
from modeld_env import ModeldEnv, free_port, model_table, wait_for, write_control
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

UNIT = "modeld-serve@m.service"
SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("shared")
    control = work / "hub-control.json"
    e = ModeldEnv(workdir=work, hub_args=["--control", str(control)])
    e.hub_control = control
    write_control(control)
    e.add_repo("acme/m", shards=2, shard_size=100_000, seed=81)
    e.port = free_port()
    try:
        e.start(model_table("m", "acme/m", e.port) + '\n[models.m.health]\nwatch_interval = "1s"\n')
        yield e
    finally:
        e.stop()


def watching(env: ModeldEnv) -> dict:
    """The watchdog's record once it watches m."""
    def check():
        w = (try_status(env) or {}).get("watchdog") or {}
        return w if w.get("model") == "m" and w.get("state") == "watching" else None
    return wait_for("the watchdog watching m", check, timeout=60)


def refused_since(env: ModeldEnv, mark: int) -> list[dict]:
    return [e for e in lines(env, "MODELD_MODEL=m") if int(e["__REALTIME_TIMESTAMP"]) >= mark
            and "not restarting it" in e.get("MESSAGE", "")]


def kill_and_see_it_restarted(env: ModeldEnv) -> None:
    """Kills m's server; the watchdog must restart it (a refusal fails at once)."""
    before = watching(env)["restarts"]
    mark = journal_mark()
    env.systemd.run(["systemctl", "kill", "-s", "KILL", UNIT], check=True)

    def restarted():
        refused = refused_since(env, mark)
        assert not refused, f"the watchdog refused to restart m: {refused[0]['MESSAGE']}"
        w = (try_status(env) or {}).get("watchdog") or {}
        if w.get("restarts", 0) <= before or w.get("state") != "watching":
            return None
        return env.unit_state(UNIT) == "active" and answers(env.port, "m")
    wait_for("the watchdog to restart m's server", restarted, timeout=90)


def test_a_server_killed_after_a_redeploy_at_a_commit_sharing_files_is_restarted(env):
    first = env.deploy_and_wait("m")
    assert first["state"] == "succeeded", first
    c2 = push(env, "acme/m", 2)
    assert c2 != first["commit"]
    dep = env.deploy_and_wait("m")
    assert dep["state"] == "succeeded" and dep["commit"] == c2, dep
    # The old revision, which shared the shards by hard link, is gone: their link count changed.
    assert not (env.models_dir / ".store" / "m" / first["commit"]).exists()
    assert (env.models_dir / ".store" / "m" / c2 / SHARD).stat().st_nlink == 1
    kill_and_see_it_restarted(env)
    # And /v1/models still calls the revision in service verified.
    status, _, body = env.api("GET", "/v1/models")
    assert status == 200, body
    m = next(x for x in json.loads(body)["models"] if x["name"] == "m")
    assert m["state"] == "verified" and m["commit"] == c2, m


def test_a_server_killed_while_the_next_commit_is_planned_and_downloaded_is_restarted(env):
    c_old = link_target(env, "m")
    c_new = push(env, "acme/m", 3)
    # The changed file's download is held: planning has linked the shards into the new revision.
    write_control(env.hub_control, hold="acme/m/generation_config.json")
    try:
        dep_id = start_deploy(env, "m")
        wait_for("the changed file's download to be held", lambda: env.hub.stats()["held"] > 0, timeout=60)
        d = deployment(env)
        assert d["id"] == dep_id and d["phase"] == "downloading", d
        old_shard = env.models_dir / ".store" / "m" / c_old / SHARD
        assert (env.models_dir / ".store" / "m" / c_new / SHARD).stat().st_ino == old_shard.stat().st_ino
        kill_and_see_it_restarted(env)
    finally:
        write_control(env.hub_control)
    dep = ended(env, dep_id)
    assert dep["state"] == "succeeded" and dep["commit"] == c_new, dep
    kill_and_see_it_restarted(env)


def test_a_real_change_stops_the_watchdog_and_a_clean_verify_has_it_restart_the_server(env):
    watching(env)
    commit = link_target(env, "m")
    # Rewritten with the same bytes: its mtime moves, so it counts as changed until re-hashed.
    touched = env.models_dir / ".store" / "m" / commit / "config.json"
    touched.write_text(touched.read_text())
    mark = journal_mark()
    env.systemd.run(["systemctl", "kill", "-s", "KILL", UNIT], check=True)
    refused = wait_for("the watchdog's refusal", lambda: refused_since(env, mark), timeout=60)
    assert "modelctl verify m" in refused[0]["MESSAGE"], refused[0]["MESSAGE"]
    w = wait_for("the watchdog to stop", lambda: (
        (s := try_status(env)) and s["watchdog"]["state"] == "stopped" and s["watchdog"]), timeout=30)
    restarts = w["restarts"]
    assert env.unit_state(UNIT) == "failed"

    r = env.modelctl("verify", "m")
    assert r.returncode == 0, r.stdout + r.stderr

    def restarted():
        w = (try_status(env) or {}).get("watchdog") or {}
        return (w.get("restarts", 0) > restarts and w.get("state") == "watching"
                and env.unit_state(UNIT) == "active" and answers(env.port, "m"))
    wait_for("the watchdog to restart m after the verify", restarted, timeout=90)
