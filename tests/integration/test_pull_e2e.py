"""End to end: staging ahead with `modelctl pull` under a namespaced systemd, with the bundled hub
on a models_dir that fills (a tmpfs): a pull never touches a service, one record runs at a time
(a deploy while a pull runs gets 409), a pulled revision survives the cleanup after a deployment
of another revision of its model and an eviction for another model, `deploy --commit` of it
fetches no file and deploys that commit even though the branch moved since, and a pull that
only evicting the model in service would make room for fails, leaving it on disk and watched."""

from __future__ import annotations

import json

import pytest

import modeld_env
from contract_helpers import MESSAGE_ID, answers, ended, hub_commit, journal_mark, push
from modeld_env import ModeldEnv, free_bytes, free_port, model_table, wait_for, write_control
from nsystemd import unsupported_reason

import make_checkpoint  # noqa: E402 - on sys.path through modeld_env

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

MiB = 1 << 20
NAMES = ("a", "x", "p", "h", "q", "big", "huge")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("pull")
    with modeld_env.small_disk(work, 24 * MiB, "modeld-test-pull") as work:
        control = work / "hub-control.json"
        write_control(control)
        e = ModeldEnv(workdir=work, hub_args=["--control", str(control)])
        e.hub_control = control
        for i, n in enumerate(NAMES):
            e.add_repo(f"acme/{n}", shards=2, shard_size=256 * 1024, seed=150 + i)
        e.ports = {n: free_port() for n in NAMES}
        try:
            # big's watcher looks every second: a test sees it restart a killed server soon.
            e.start("".join(model_table(n, f"acme/{n}", e.ports[n]) for n in NAMES)
                    + '\n[models.big.health]\nwatch_interval = "1s"\n')
            # x served once and is on disk, a serves now.
            for n in ("x", "a"):
                assert e.deploy_and_wait(n)["state"] == "succeeded"
            yield e
        finally:
            e.stop()


def models(env: ModeldEnv) -> dict[str, dict]:
    return {m["name"]: m for m in json.loads(env.modelctl("--json", "models").stdout)["models"]}


def revisions(env: ModeldEnv, name: str) -> dict[str, dict]:
    return {r["commit"]: r for r in models(env)[name]["revisions"]}


def pull_and_wait(env: ModeldEnv, name: str) -> dict:
    r = env.modelctl("--json", "pull", name, "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def fetched_since(env: ModeldEnv, mark: int, repo: str) -> list[dict]:
    """Downloads of files of `repo` (resolve or CDN) the hub logged after its first `mark` requests;
    planning's read of the safetensors index (a few kB: the shards it names are checked against
    the listing) is none."""
    return [q for q in env.hub.requests()[mark:]
            if (q["origin"] == "cdn" or f"/{repo}/resolve/" in q["path"])
            and not q["path"].endswith(".safetensors.index.json")]


def test_a_pull_downloads_and_verifies_without_touching_a_service(env):
    pid = env.main_pid("modeld-serve@a.service")
    assert pid > 0
    dep = pull_and_wait(env, "p")
    assert (dep["kind"], dep["state"], dep["changed"], dep["phase"]) == ("pull", "succeeded", True, "verifying"), dep
    assert dep["commit"] == hub_commit(env, "acme/p")
    assert env.main_pid("modeld-serve@a.service") == pid
    assert env.unit_state("modeld-serve@p.service") == "inactive"
    status = env.status()
    assert status["active"]["model"] == "a" and status["deployment"]["id"] == dep["id"]
    rev = revisions(env, "p")[dep["commit"]]
    assert rev == {"commit": dep["commit"], "state": "verified", "pulled": True, "in_service": False}, rev
    assert not (env.models_dir / "p").exists()  # no link: nothing serves it
    assert "pulled" in env.modelctl("models").stdout
    # Again: the commit is on disk and verified, nothing changes.
    mark = len(env.hub.requests())
    again = pull_and_wait(env, "p")
    assert (again["state"], again["changed"], again["commit"]) == ("succeeded", False, dep["commit"]), again
    assert fetched_since(env, mark, "acme/p") == []
    assert env.main_pid("modeld-serve@a.service") == pid


def test_a_deploy_while_a_pull_runs_is_refused_and_the_pull_can_be_cancelled(env):
    write_control(env.hub_control, hold="acme/h/*.safetensors")
    try:
        r = env.modelctl("--json", "pull", "h")
        assert r.returncode == 0, r.stdout + r.stderr
        pull_id = json.loads(r.stdout)["id"]
        wait_for("a held download", lambda: env.hub.stats()["held"] >= 1, timeout=60)
        for args in (("deploy", "a"), ("pull", "x")):
            refused = env.modelctl(*args)
            assert refused.returncode == 2 and "running" in refused.stderr, refused.stdout + refused.stderr
        status, _, body = env.api("GET", "/v1/status")
        assert json.loads(body)["deployment"]["kind"] == "pull"
        assert env.modelctl("cancel").returncode == 0
        dep = ended(env, pull_id)
    finally:
        write_control(env.hub_control)
    assert (dep["kind"], dep["state"]) == ("pull", "cancelled"), dep
    assert env.status()["active"]["model"] == "a"
    # What it left goes; nothing of h stays pulled.
    assert env.modelctl("rm", "h").returncode == 0
    assert models(env)["h"]["revisions"] == []


def test_a_pulled_revision_survives_the_cleanup_and_deploy_commit_fetches_nothing(env):
    c1 = revisions_pulled(env, "p")
    c2 = push(env, "acme/p", 77)  # the branch moves on
    assert c2 != c1
    assert env.deploy_and_wait("p")["commit"] == c2
    revs = revisions(env, "p")
    assert revs[c1]["pulled"] and revs[c1]["state"] == "verified", revs
    assert revs[c2]["in_service"] and not revs[c2]["pulled"], revs

    mark = len(env.hub.requests())
    r = env.modelctl("--json", "deploy", "p", "--commit", c1, "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    dep = json.loads(r.stdout)
    assert (dep["state"], dep["commit"]) == ("succeeded", c1), dep
    assert fetched_since(env, mark, "acme/p") == []
    assert hub_commit(env, "acme/p") == c2  # the branch still names the other commit
    assert env.status()["active"]["commit"] == c1
    revs = revisions(env, "p")
    assert revs[c1] == {"commit": c1, "state": "verified", "pulled": False, "in_service": True}, revs
    bad = env.modelctl("deploy", "p", "--commit", "main")
    assert bad.returncode == 2


def revisions_pulled(env: ModeldEnv, name: str) -> str:
    pulled = [c for c, r in revisions(env, name).items() if r["pulled"]]
    assert len(pulled) == 1, pulled
    return pulled[0]


def allocated(folder) -> int:
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*"))


def repo_size(folder) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_pulled_revision_is_not_evicted_for_another_model_and_rm_commit_removes_it(env):
    q = pull_and_wait(env, "q")["commit"]
    store = env.models_dir / ".store"
    # big needs more than the free space and less than that plus x: without the pull, q (never
    # active, so first in line) would go instead.
    free = free_bytes(env.models_dir)
    size_x = allocated(store / "x")
    target = free + size_x // 2
    folder = env.repos / "acme" / "big"
    overhead = repo_size(folder) - 2 * 256 * 1024
    make_checkpoint.make_checkpoint(str(folder), 2, (target - overhead) // 2, 155)
    need = repo_size(folder)
    assert free < need < free + size_x - size_x // 4, (free, size_x, need)
    plan = json.loads(env.modelctl("--json", "plan", "big").stdout)
    assert [e["name"] for e in plan["evictions"]] == ["x"], plan
    assert env.deploy_and_wait("big")["state"] == "succeeded"
    assert not (store / "x").exists()
    assert revisions(env, "q")[q]["pulled"]

    # rm --commit: the commit in service is refused, a pulled one goes with its mark.
    active = env.status()["active"]
    refused = env.modelctl("rm", active["model"], "--commit", active["commit"])
    assert refused.returncode == 1 and "in service" in refused.stderr, refused.stdout + refused.stderr
    r = env.modelctl("--json", "rm", "q", "--commit", q)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["commits"] == [q]
    assert not (store / "q" / q).exists()
    assert revisions(env, "q") == {}


def files(folder) -> list[tuple[str, int, int]]:
    """(path, size, inode) of every file under `folder`."""
    return sorted((str(p.relative_to(folder)), p.lstat().st_size, p.lstat().st_ino) for p in folder.rglob("*"))


def test_a_pull_never_evicts_the_model_in_service_and_leaves_its_watcher_watching(env):
    active = env.status()["active"]
    assert active["model"] == "big", active
    store = env.models_dir / ".store"
    big_files = files(store / "big")
    others = [m for m in ("a", "p") if (store / m).is_dir()]
    assert others, "no model out of service on disk"
    evictable = sum(allocated(store / m) for m in others)
    # huge needs more than the free space plus every model out of service, less than that plus big.
    free = free_bytes(env.models_dir)
    target = free + evictable + allocated(store / "big") // 2
    folder = env.repos / "acme" / "huge"
    overhead = repo_size(folder) - 2 * 256 * 1024
    make_checkpoint.make_checkpoint(str(folder), 2, (target - overhead) // 2, 157)
    assert free + evictable < repo_size(folder) < free + evictable + allocated(store / "big"), (
        free, evictable, repo_size(folder))
    pid = env.main_pid("modeld-serve@big.service")

    r = env.modelctl("--json", "pull", "huge", "--wait")
    assert r.returncode == 1, r.stdout + r.stderr
    dep = json.loads(r.stdout)
    assert (dep["kind"], dep["state"], dep["error"]["code"]) == ("pull", "failed", "disk_full"), dep
    # Nothing was evicted, the serving model's files least of all, and its server runs on.
    assert files(store / "big") == big_files
    assert all((store / m).is_dir() for m in others)
    assert env.main_pid("modeld-serve@big.service") == pid
    assert env.status()["active"]["model"] == "big"

    # Its watcher still watches: a killed server is restarted.
    wait_for("big watched", lambda: (w := env.status()["watchdog"]) and w["state"] == "watching", timeout=30)
    mark = journal_mark()
    env.systemd.run(["kill", "-9", str(pid)], check=True)
    wait_for("big's watcher to restart it", lambda: env.main_pid("modeld-serve@big.service") not in (0, pid),
             timeout=60)
    restarts = [e for e in env.journal(f"MESSAGE_ID={MESSAGE_ID['watchdog']}", "MODELD_MODEL=big")
                if int(e["__REALTIME_TIMESTAMP"]) >= mark]
    assert len(restarts) == 1, restarts
    wait_for("big to answer again", lambda: answers(env.ports["big"], "big"), timeout=60)
