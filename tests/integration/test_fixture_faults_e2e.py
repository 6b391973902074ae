"""End to end, what the hub fixture's newer abilities make visible in modeld (issue 13, item 7):

  * the CDN on another host (127.0.0.2, not only another port): the download works through the
    redirect, and the token reaches the Hub's origin only, never the CDN's;
  * a resolve step that fails (502, or a reset) while the CDN works: downloads retry and succeed,
    and a resolve step that never recovers ends the deployment with hub_unavailable;
  * a push during a download, with a daemon restart in between: the deployment finishes at the
    commit it planned (the Hub still serves the old commit), and the next deployment picks the
    new one.

One hub (with a token and its CDN on 127.0.0.2), one systemd and one modeld serve every test;
faults are switched per test through the hub's control file and limited to the test's own
repository."""

from __future__ import annotations

import filecmp
import hashlib
import json
import urllib.request

import pytest

from modeld_env import ModeldEnv, completion, free_port, model_table, wait_for, write_control
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

TOKEN = "hf_fixtureFaultsTokenNeverForTheCdn0123456789"
CDN_HOST = "127.0.0.2"
MODELS = ["faraway", "flaky", "flakyreset", "gone", "pushed"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("fixture-faults")
    control = work / "hub-control.json"
    token_file = work / "hf-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    e = ModeldEnv(workdir=work / "env", hub_args=["--control", str(control), "--cdn-host", CDN_HOST,
                                                   "--token", TOKEN],
                  config_extra=f'token_file = "{token_file}"\nread_timeout = "5s"')
    e.hub_control = control
    e.ports = {}
    tables = ""
    for i, name in enumerate(MODELS):
        e.add_repo(f"acme/{name}", shards=2, shard_size=400_000, seed=400 + i)
        e.ports[name] = free_port()
        tables += model_table(name, f"acme/{name}", e.ports[name])
    try:
        e.start(tables)
        yield e
    finally:
        e.stop()


# --- helpers -----------------------------------------------------------------------------------


def shards(env, name: str) -> list[str]:
    return sorted(p.name for p in (env.repos / "acme" / name).glob("*.safetensors"))


def requests_of(env, name: str, origin: str, file: str | None = None) -> list[dict]:
    """GET requests of acme/NAME (or of one file of it) that reached `origin`, oldest first."""
    prefix = f"acme/{name}/"
    return [r for r in env.hub.requests()
            if r["origin"] == origin and r["method"] == "GET" and (r.get("file") or "").startswith(prefix)
            and (file is None or r["file"] == prefix + file)]


def main_commit(env, name: str) -> str:
    req = urllib.request.Request(f"{env.hub.endpoint}/api/models/acme/{name}/revision/main?expand=sha",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["sha"]


def assert_served_files_match(env, name: str, expected: dict[str, bytes] | None = None) -> None:
    """The files in service are the repository's (or the `expected` bytes per shard)."""
    served = env.models_dir / name
    for s in shards(env, name):
        if expected is None:
            assert filecmp.cmp(served / s, env.repos / "acme" / name / s, shallow=False), s
        else:
            assert hashlib.sha256((served / s).read_bytes()).digest() == hashlib.sha256(expected[s]).digest(), s


# --- the CDN on another host -------------------------------------------------------------------

def test_a_download_through_a_cdn_on_another_host_works_and_the_cdn_never_sees_the_token(env):
    assert env.hub.cdn_host == CDN_HOST
    dep = env.deploy_and_wait("faraway")
    assert dep["state"] == "succeeded", dep
    assert_served_files_match(env, "faraway")
    assert completion(env.ports["faraway"], "faraway")

    hub = [r for r in env.hub.requests() if r["origin"] == "hub"]
    cdn = requests_of(env, "faraway", "cdn")
    # Every shard came from the CDN (which listens on 127.0.0.2 only) ...
    assert {r["file"] for r in cdn} == {f"acme/faraway/{s}" for s in shards(env, "faraway")}
    # ... after a resolve at the Hub that carried the token, while no CDN request carried it.
    resolves = [r for r in hub if "/resolve/" in r["path"] and r["file"].endswith(".safetensors")
                and r["file"].startswith("acme/faraway/")]
    assert resolves and all(r["authorization"] == f"Bearer {TOKEN}" for r in resolves)
    assert hub and all(r["authorization"] == f"Bearer {TOKEN}" for r in hub)
    assert not [r for r in env.hub.requests() if r["origin"] == "cdn" and r["authorization_present"]]


# --- the resolve step fails --------------------------------------------------------------------

@pytest.mark.parametrize("name,status", [("flaky", 502), ("flakyreset", "reset")])
def test_a_resolve_step_that_fails_twice_is_retried_and_the_download_succeeds(env, name, status):
    write_control(env.hub_control, resolve_fail_first=2, resolve_fail_glob=f"acme/{name}/*.safetensors",
               resolve_fail_status=status, retry_after="0")
    try:
        dep = env.deploy_and_wait(name)
    finally:
        write_control(env.hub_control)
    assert dep["state"] == "succeeded", dep
    assert_served_files_match(env, name)
    names = shards(env, name)
    assert names, f"acme/{name} has no shards"
    for s in names:
        # Two failed resolves, then the one that redirected; the CDN was asked once.
        assert len(requests_of(env, name, "hub", s)) == 3, requests_of(env, name, "hub", s)
        assert len(requests_of(env, name, "cdn", s)) == 1


def test_a_resolve_step_that_never_recovers_fails_the_deployment_with_hub_unavailable(env):
    active = env.status()["active"]
    write_control(env.hub_control, resolve_fail_first=1000, resolve_fail_glob="acme/gone/*.safetensors",
               resolve_fail_status=502, retry_after="0")
    try:
        dep = env.deploy_and_wait("gone", expect_exit=1)
    finally:
        write_control(env.hub_control)
    assert dep["state"] == "failed" and dep["phase"] == "downloading", dep
    assert dep["error"]["code"] == "hub_unavailable", dep["error"]
    message = dep["error"]["message"]
    assert "HTTP 502" in message and "Injected resolve failure" in message, message
    assert any(s in message for s in shards(env, "gone")), message
    assert "gave up" in message or "attempts" in message, message
    # The CDN was never reached for those shards, and the model in service stayed.
    assert not requests_of(env, "gone", "cdn")
    tries = sum(len(requests_of(env, "gone", "hub", s)) for s in shards(env, "gone"))
    assert 2 <= tries <= 6 * len(shards(env, "gone")), tries
    assert env.status()["active"] == active
    assert TOKEN not in message


# --- a push during a download ------------------------------------------------------------------

def test_a_push_during_a_download_leaves_the_deployment_at_its_planned_commit_even_across_a_restart(env):
    name = "pushed"
    old_bytes = {s: (env.repos / "acme" / name / s).read_bytes() for s in shards(env, name)}
    held = f"acme/{name}/{shards(env, name)[1]}"
    write_control(env.hub_control, hold=held)
    try:
        assert env.modelctl("deploy", name).returncode == 0
        wait_for("the second shard's download to be held at half",
                 lambda: env.hub.stats()["held"] >= 1 or None, timeout=60)
        planned = env.status()["deployment"]["commit"]
        assert planned == main_commit(env, name)

        # The push: every file of the repository is replaced (written aside, renamed over).
        env.add_repo(f"acme/{name}", shards=2, shard_size=400_000, seed=499)
        pushed = main_commit(env, name)
        assert pushed != planned

        # A restart in the middle: the deployment continues, planning again at its commit.
        log_before = len(env.hub.requests())
        env.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
        wait_for("modeld's control socket after the restart", lambda: env.modelctl("status").returncode == 0,
                 timeout=60)
    finally:
        write_control(env.hub_control)  # releases the hold
    dep = wait_for("the deployment to end",
                   lambda: (d := env.status()["deployment"])["state"] != "running" and d, timeout=120)
    assert dep["state"] == "succeeded", dep
    assert dep["commit"] == planned
    assert env.status()["active"]["model"] == name and env.status()["active"]["commit"] == planned
    assert_served_files_match(env, name, old_bytes)
    assert (env.models_dir / name).resolve().name == planned
    # After the restart modeld listed and resolved at the planned commit, never at main.
    after = env.hub.requests()[log_before:]
    listings = [r["path"] for r in after if r["origin"] == "hub" and r["path"].startswith(f"/api/models/acme/{name}")]
    assert listings and all(f"/revision/{planned}" in p or f"/tree/{planned}" in p for p in listings), listings
    resolves = [r["path"] for r in after if r["origin"] == "hub" and f"/acme/{name}/resolve/" in r["path"]]
    assert resolves and all(f"/resolve/{planned}/" in p for p in resolves), resolves
    assert completion(env.ports[name], name)

    # A new deployment picks the pushed commit.
    dep = env.deploy_and_wait(name)
    assert dep["state"] == "succeeded" and dep["commit"] == pushed, dep
    assert env.status()["active"]["commit"] == pushed
    assert_served_files_match(env, name)
    assert (env.models_dir / name).resolve().name == pushed
