"""End to end: who may do what on the control socket, with real users of this machine.

modeld runs under a namespaced systemd (modeld_env) with `[control] group` set to a group the
test creates; two unprivileged system users are created too: one has that group as a
supplementary group, the other does not. modelctl runs as each of them (runuser) and as root
against the socket, which lives in a work folder other users may traverse (0711).

Contract (interface.md "Access"): the socket is 0666; read routes (status, models, plan) are
open to every local user; mutating routes (deploy, cancel, verify, rm) only to root and members
of control.group, supplementary groups included; anyone else gets 403 `forbidden` (modelctl
exit 2) and the journal records the uid.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import subprocess

import pytest

from modeld_env import ModeldEnv, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

SUFFIX = os.getpid()
GROUP = f"modeld-test-ctl-{SUFFIX}"
USER_IN = f"mdt-in-{SUFFIX}"    # member of GROUP (supplementary)
USER_OUT = f"mdt-out-{SUFFIX}"  # not a member


def _run(*cmd: str) -> None:
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr}"


@pytest.fixture(scope="module")
def users():
    """Creates GROUP and the two users; removes them at the end (also after a failure)."""
    created_users: list[str] = []
    created_group = False
    try:
        _run("groupadd", "--system", GROUP)
        created_group = True
        _run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
             "--groups", GROUP, USER_IN)
        created_users.append(USER_IN)
        _run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER_OUT)
        created_users.append(USER_OUT)
        yield {"in": pwd.getpwnam(USER_IN), "out": pwd.getpwnam(USER_OUT)}
    finally:
        for u in created_users:
            subprocess.run(["userdel", u], capture_output=True, timeout=60)
        if created_group:
            subprocess.run(["groupdel", GROUP], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def env(users):
    # A fresh folder under /tmp (0700 from mkdtemp): opened to traversal so that the other users
    # reach the socket inside it; /tmp itself is 1777.
    e = ModeldEnv(control_group=GROUP)
    os.chmod(e.workdir, 0o711)
    e.add_repo("acme/model-a", shards=3, shard_size=300_000, seed=1)
    e.add_repo("acme/model-b", shards=2, shard_size=200_000, seed=2)
    e.add_repo("acme/model-slow", shards=2, shard_size=200_000, seed=3)
    e.ports = {n: free_port() for n in ("model-a", "model-b", "model-slow")}
    try:
        e.start(model_table("model-a", "acme/model-a", e.ports["model-a"])
                + model_table("model-b", "acme/model-b", e.ports["model-b"])
                # Loads for a long time, so that a deployment of it is running while others try
                # to cancel it.
                + model_table("model-slow", "acme/model-slow", e.ports["model-slow"], load_seconds=600))
        yield e
    finally:
        e.stop()


def as_user(env: ModeldEnv, user: str | None, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """modelctl ARGS as `user` (None: root, this process)."""
    cmd = [str(env.modelctl_bin), "--socket", str(env.socket), *args]
    if user is not None:
        cmd = ["runuser", "-u", user, "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/")


def assert_forbidden(env: ModeldEnv, user: str, *args: str) -> None:
    """modelctl ARGS as `user` is refused: exit 2 and a message naming the group; with --json the
    daemon's answer, error code `forbidden`."""
    what = f"{user} {' '.join(args)}"
    r = as_user(env, user, *args)
    assert r.returncode == 2, f"{what}: exit {r.returncode}\n{r.stdout}{r.stderr}"
    assert "allowed only to root and members of group" in r.stderr and GROUP in r.stderr, f"{what}: {r.stderr}"
    r = as_user(env, user, "--json", *args)
    assert r.returncode == 2, f"{what} --json: exit {r.returncode}\n{r.stdout}{r.stderr}"
    assert json.loads(r.stdout)["error"]["code"] == "forbidden", f"{what} --json: {r.stdout}"


def assert_refusal_logged(env: ModeldEnv, uid: int, method: str, path: str) -> None:
    entry = env.systemd.wait_journal(
        lambda e: e.get("MODELD_UID") == str(uid) and f"refused {method} {path} " in e.get("MESSAGE", ""),
        unit="modeld.service")
    assert entry, f"no journal line refusing {method} {path} to uid {uid}"
    assert f"uid {uid}" in entry["MESSAGE"]


def deployment_state(env: ModeldEnv) -> tuple[str, str]:
    d = env.status()["deployment"] or {}
    return d.get("model", ""), d.get("state", "")


def test_the_users_are_real_and_only_one_is_in_the_group(users):
    members = grp.getgrnam(GROUP).gr_mem
    assert USER_IN in members and USER_OUT not in members
    # Supplementary, not primary: the primary group of each is its own.
    assert users["in"].pw_gid != grp.getgrnam(GROUP).gr_gid


def test_the_socket_is_a_socket_open_to_every_local_user(env):
    st = os.stat(env.socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o666


def test_read_routes_answer_root_a_member_and_a_stranger(env):
    for user in (None, USER_IN, USER_OUT):
        for args in (("--json", "status"), ("--json", "models"), ("--json", "plan", "model-a")):
            r = as_user(env, user, *args)
            assert r.returncode == 0, f"{user or 'root'} {' '.join(args)}: exit {r.returncode}\n{r.stderr}"
            json.loads(r.stdout)


def test_cancel_is_refused_to_a_stranger_and_allowed_to_a_member(env, users):
    r = as_user(env, None, "deploy", "model-slow")
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for("model-slow's deployment to run",
             lambda: deployment_state(env) == ("model-slow", "running"), timeout=30)
    dep_id = env.status()["deployment"]["id"]

    assert_forbidden(env, USER_OUT, "cancel")
    assert_refusal_logged(env, users["out"].pw_uid, "POST", f"/v1/deployments/{dep_id}/cancel")
    assert deployment_state(env) == ("model-slow", "running"), "a refused cancel changed the deployment"

    r = as_user(env, USER_IN, "cancel")
    assert r.returncode == 0, f"cancel by a member: exit {r.returncode}\n{r.stdout}{r.stderr}"
    wait_for("model-slow's deployment to end", lambda: deployment_state(env)[1] not in ("running", ""),
             timeout=120)
    assert deployment_state(env) == ("model-slow", "cancelled")


def test_deploy_verify_and_rm_are_refused_to_a_stranger(env, users):
    before = env.status()["deployment"]["id"]
    uid = users["out"].pw_uid
    assert_forbidden(env, USER_OUT, "deploy", "model-a")
    assert_refusal_logged(env, uid, "POST", "/v1/deployments")
    assert env.status()["deployment"]["id"] == before, "a refused deploy started a deployment"

    assert_forbidden(env, USER_OUT, "verify", "model-a")
    assert_refusal_logged(env, uid, "POST", "/v1/models/model-a/verify")

    assert_forbidden(env, USER_OUT, "rm", "model-slow")
    assert_refusal_logged(env, uid, "DELETE", "/v1/models/model-slow")


def test_a_member_by_supplementary_group_deploys_verifies_and_removes(env):
    r = as_user(env, USER_IN, "deploy", "model-a", "--wait")
    assert r.returncode == 0, f"deploy --wait by a member: exit {r.returncode}\n{r.stdout}{r.stderr}"
    status = env.status()
    assert status["active"]["model"] == "model-a"
    assert status["deployment"]["state"] == "succeeded"

    r = as_user(env, USER_IN, "--json", "verify", "model-a")
    assert r.returncode == 0, f"verify by a member: exit {r.returncode}\n{r.stdout}{r.stderr}"

    # model-slow was cancelled and is not active: a member may delete what it downloaded.
    r = as_user(env, USER_IN, "--json", "rm", "model-slow")
    assert r.returncode == 0, f"rm by a member: exit {r.returncode}\n{r.stdout}{r.stderr}"
    assert not (env.models_dir / "model-slow").exists()


def test_root_deploys_verifies_and_removes(env):
    r = as_user(env, None, "deploy", "model-b", "--wait")
    assert r.returncode == 0, f"deploy --wait by root: exit {r.returncode}\n{r.stdout}{r.stderr}"
    assert env.status()["active"]["model"] == "model-b"
    r = as_user(env, None, "verify", "model-b")
    assert r.returncode == 0, r.stdout + r.stderr
    r = as_user(env, None, "rm", "model-a")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (env.models_dir / "model-a").exists()


def test_no_refusal_was_logged_for_root_or_the_member(env, users):
    refused = [e for e in env.journal(unit="modeld.service") if "refused" in e.get("MESSAGE", "")
               and e.get("MODELD_UID") is not None]
    assert refused, "the stranger's refusals should be in the journal"
    assert {e["MODELD_UID"] for e in refused} == {str(users["out"].pw_uid)}
