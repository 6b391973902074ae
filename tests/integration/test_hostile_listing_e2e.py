"""End to end: what a huge or trickling Hub listing can cost modeld, with a real unprivileged user.

modeld runs under a namespaced systemd (modeld_env) against the bundled hub, whose listings are
switched per test through its control file: `listing_synthetic` (synthetic files that make the
listing huge), `listing_delay` (every listing route answers late, so that clients overlap) and
`listing_drip` (the body of a listing one byte at a time). An unprivileged system user (not in
control.group) runs `modelctl plan` through runuser, as in test_access_e2e.py.

Contract (issue 12, items 3 and 5; interface.md "Added by this project"):
- concurrent plans of a model share one Hub listing; a plan at a commit already listed makes no
  listing request (a branch costs the small `?expand=sha` request that resolves it);
- an unprivileged user has at most 2 plans in progress; more are answered 429
  `too_many_requests` (modelctl exits 1), while root still gets through;
- a listing that trickles ends after `hub.listing_timeout` per try, retried, in `timeout`.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess

import pytest

from modeld_env import ModeldEnv, free_port, model_table, wait_for, write_control
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

USER = f"mdt-plan-{os.getpid()}"
EXTRA_FILES = 20_000


@pytest.fixture(scope="module")
def user():
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
                   check=True, capture_output=True, timeout=60)
    try:
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["userdel", USER], capture_output=True, timeout=60)


def make_env(names: list[str], config_extra: str = "") -> ModeldEnv:
    # A fresh folder under /tmp (1777), opened to traversal so that other users reach the socket.
    e = ModeldEnv(config_extra=config_extra)
    os.chmod(e.workdir, 0o711)
    e.hub_control = e.workdir / "hub-control.json"
    e.hub_args = ["--control", str(e.hub_control)]
    tables = ""
    for i, name in enumerate(names):
        e.add_repo(f"acme/{name}", shards=2, shard_size=200_000, seed=40 + i)
        tables += model_table(name, f"acme/{name}", free_port())
    try:
        e.start(tables)
    except BaseException:
        e.stop()
        raise
    return e


@pytest.fixture(scope="module")
def env(user):
    e = make_env(["model-a", "model-b"])
    try:
        yield e
    finally:
        e.stop()



def listing_requests(env: ModeldEnv, since: int, repo: str) -> tuple[list[str], list[str]]:
    """(resolve requests, full listing requests) of `repo` after the first `since` log lines."""
    paths = [r["path"] for r in env.hub.requests()[since:] if r["path"].startswith(f"/api/models/{repo}/")]
    return [p for p in paths if "expand=sha" in p], [p for p in paths if "blobs=true" in p]


def plan_as(env: ModeldEnv, user: str | None, model: str) -> subprocess.Popen:
    """`modelctl --json plan MODEL` as `user` (None: root), started, not waited for."""
    cmd = [str(env.modelctl_bin), "--socket", str(env.socket), "--json", "plan", model]
    if user is not None:
        cmd = ["runuser", "-u", user, "--", *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")


def answer(p: subprocess.Popen) -> tuple[int, dict]:
    out, err = p.communicate(timeout=300)
    assert out.strip(), f"exit {p.returncode}, no output: {err}"
    return p.returncode, json.loads(out)


def test_concurrent_plans_of_a_user_share_one_listing_of_a_huge_repository(env):
    write_control(env.hub_control, listing_synthetic=EXTRA_FILES, listing_delay=2)
    since = len(env.hub.requests())
    plans = [plan_as(env, USER, "model-a") for _ in range(2)]
    for p in plans:
        code, j = answer(p)
        assert code in (0, 1), j
        assert j["files_total"] > EXTRA_FILES, j
    resolves, listings = listing_requests(env, since, "acme/model-a")
    assert len(listings) == 1, f"two concurrent plans listed the Hub {len(listings)} times: {listings}"
    assert len(resolves) == 1, resolves


def test_a_second_plan_at_the_same_commit_makes_no_listing_request(env):
    write_control(env.hub_control, listing_synthetic=EXTRA_FILES)
    since = len(env.hub.requests())
    code, j = answer(plan_as(env, USER, "model-a"))
    assert code in (0, 1), j
    assert j["files_total"] > EXTRA_FILES
    resolves, listings = listing_requests(env, since, "acme/model-a")
    assert listings == [], f"the listing at {j['commit']} was requested again: {listings}"
    assert len(resolves) == 1, "the branch is resolved to its commit with one small request"


def test_a_user_beyond_two_plans_at_once_is_answered_429_and_root_still_gets_through(env, user):
    write_control(env.hub_control, listing_delay=3)
    since = len(env.hub.requests())
    mine = [plan_as(env, USER, "model-b") for _ in range(3)]
    wait_for("the first plan to reach the hub", lambda: any(listing_requests(env, since, "acme/model-b")), timeout=60)
    roots = plan_as(env, None, "model-b")
    results = [answer(p) for p in mine]
    refused = [j for code, j in results if "error" in j]
    served = [j for code, j in results if "error" not in j]
    assert len(refused) == 1 and len(served) == 2, results
    assert refused[0]["error"]["code"] == "too_many_requests", refused
    assert f"uid {user.pw_uid}" in refused[0]["error"]["message"], refused
    assert [code for code, j in results if "error" in j] == [1], results
    code, j = answer(roots)
    assert code in (0, 1) and "error" not in j, j
    entry = env.systemd.wait_journal(
        lambda e: e.get("MODELD_UID") == str(user.pw_uid) and "refused GET /v1/models/model-b/plan" in e.get("MESSAGE", ""),
        unit="modeld.service")
    assert entry, f"no journal line refusing uid {user.pw_uid}'s plan"
    assert "requests that list the Hub" in entry["MESSAGE"], entry
    # Places are given back: the user plans again.
    write_control(env.hub_control)
    code, j = answer(plan_as(env, USER, "model-b"))
    assert code in (0, 1) and "error" not in j, j


# --- item 5: a trickling listing --------------------------------------------------------------

@pytest.fixture(scope="module")
def drip_env():
    e = make_env(["model-d"], config_extra='listing_timeout = "2s"')
    try:
        yield e
    finally:
        e.stop()


def test_a_listing_that_trickles_ends_in_timeout_after_listing_timeout_with_retries(drip_env):
    env = drip_env
    write_control(env.hub_control, listing_drip=0.5)
    since = len(env.hub.requests())
    r = env.modelctl("--json", "deploy", "model-d")
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        # 5 tries of 2 s and the backoff between them (1, 2, 4, 8 s): about 25 s.
        wait_for("the deployment to fail", lambda: (env.status()["deployment"] or {}).get("state") == "failed",
                 timeout=120)
    finally:
        d = env.status()["deployment"] or {}
        if d.get("state") == "running":
            env.modelctl("cancel")
        write_control(env.hub_control)
    d = env.status()["deployment"]
    assert d["phase"] == "planning", d
    assert d["error"]["code"] == "timeout", d
    assert "hub.listing_timeout" in d["error"]["message"] and "gave up after 5 tries" in d["error"]["message"], d
    tries = [p for p in (r["path"] for r in env.hub.requests()[since:]) if p.startswith("/api/models/acme/model-d/")]
    assert len(tries) == 5, tries
