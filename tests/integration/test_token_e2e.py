"""The Hub token goes to the Hub's origin only: never to the CDN the Hub redirects to, never
into the journal, a drop-in or the API. Where it comes from, in order: [hub] token_file (which
must be private to root), the systemd credential "hf-token" (LoadCredential= with an empty
SetCredential= fallback, as modeld.service ships it), $HF_TOKEN."""

from __future__ import annotations

import subprocess

import pytest

from modeld_env import ModeldEnv, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

TOKEN = "hf_e2eSecretTokenThatMustNeverLeak0123456789"


def test_the_token_reaches_the_hub_and_nothing_else(tmp_path):
    token_file = tmp_path / "hf-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    env = ModeldEnv(workdir=tmp_path / "env", hub_args=["--token", TOKEN],
                    config_extra=f'token_file = "{token_file}"')
    env.add_repo("acme/gated", shards=2, shard_size=300_000, seed=21)
    try:
        env.start(model_table("gated", "acme/gated", free_port()))
        env.deploy_and_wait("gated")

        requests = env.hub.requests()
        hub = [x for x in requests if x["origin"] == "hub"]
        cdn = [x for x in requests if x["origin"] == "cdn"]
        assert hub and cdn, "the deployment must have used both origins"
        assert all(x["authorization"] == f"Bearer {TOKEN}" for x in hub)
        assert not any(x["authorization_present"] for x in cdn), "the CDN saw an Authorization header"

        journal = env.systemd.run(["journalctl", "--no-pager", "-o", "json",
                                   f"--since=@{env.systemd.started_at}"], check=True).stdout
        assert "Bearer" not in journal and TOKEN not in journal
        dropins = env.systemd.run(["sh", "-c", "cat /run/systemd/system/*.d/*.conf"], check=True).stdout
        assert TOKEN not in dropins
        for cmd in (("--json", "status"), ("--json", "models")):
            assert TOKEN not in env.modelctl(*cmd).stdout
    finally:
        env.stop()


@pytest.mark.parametrize("token, status, advice", [
    # A token the Hub does not know (wrong, expired, revoked): 401, as the Hub answers it.
    ("hf_wrongWrongWrong", "HTTP 401", "refused the token modeld sent"),
    # A valid token without access to the gated repository: 403 GatedRepo.
    ("hf_validButNoAccess", "HTTP 403 GatedRepo", "has no access to this repository"),
])
def test_a_refused_token_fails_the_plan_with_a_clear_error_that_does_not_quote_it(tmp_path, token, status, advice):
    token_file = tmp_path / "hf-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    env = ModeldEnv(workdir=tmp_path / "env", hub_args=["--token", TOKEN, "--token-no-access", "hf_validButNoAccess"],
                    config_extra=f'token_file = "{token_file}"')
    env.add_repo("acme/gated", shards=1, shard_size=100_000, seed=22)
    try:
        env.start(model_table("gated", "acme/gated", free_port()))
        r = env.modelctl("deploy", "gated", "--wait")
        assert r.returncode == 1
        dep = env.status()["deployment"]
        assert dep["state"] == "failed" and dep["phase"] == "planning"
        assert dep["error"]["code"] == "hub_unauthorized"
        message = dep["error"]["message"]
        assert "acme/gated" in message and status in message, message
        # The message says what to do about it, and never quotes the token.
        assert advice in message, message
        if status == "HTTP 401":
            assert "token_file" in message and "restart modeld" in message, message
        assert token not in message and token not in r.stdout + r.stderr
        assert env.status()["active"] is None
        assert [x["authorization"] for x in env.hub.requests() if x["origin"] == "hub"][:1] == [f"Bearer {token}"]
    finally:
        env.stop()


# -- the credential and the order of sources ---------------------------------------------------

def write_credential(env: ModeldEnv, text: str) -> None:
    """The file the test drop-in's LoadCredential=hf-token: reads (the shipped unit's
    /etc/modeld/hf-token, moved into this run's folder)."""
    cred = env.workdir / "credentials" / "hf-token"
    cred.parent.mkdir(parents=True, exist_ok=True)
    cred.write_text(text)
    cred.chmod(0o600)


def hub_authorizations(env: ModeldEnv) -> list:
    return [x["authorization"] for x in env.hub.requests() if x["origin"] == "hub"]


def ready_line(env: ModeldEnv) -> str:
    """modeld's "ready" journal line, which names where the token came from (never the token)."""
    entry = env.systemd.wait_journal(lambda e: " ready: " in e.get("MESSAGE", ""), unit="modeld.service")
    assert entry, "modeld wrote no ready line"
    return entry["MESSAGE"]


def test_the_credential_is_the_token_when_no_token_file_is_configured(tmp_path):
    env = ModeldEnv(workdir=tmp_path / "env", hub_args=["--token", TOKEN])
    write_credential(env, TOKEN + "\n")
    env.add_repo("acme/gated", shards=1, shard_size=100_000, seed=23)
    try:
        env.start(model_table("gated", "acme/gated", free_port()))
        assert "(token: credential hf-token)" in ready_line(env)
        # A process holding the token leaves no core dump (prctl PR_SET_DUMPABLE 0).
        assert env.systemd.wait_journal(lambda e: "core dumps are off" in e.get("MESSAGE", ""),
                                        unit="modeld.service")
        assert env.deploy_and_wait("gated")["state"] == "succeeded"
        auths = hub_authorizations(env)
        assert auths and all(a == f"Bearer {TOKEN}" for a in auths)
        journal = env.systemd.run(["journalctl", "--no-pager", "-o", "json",
                                   f"--since=@{env.systemd.started_at}"], check=True).stdout
        assert TOKEN not in journal
    finally:
        env.stop()


def test_without_the_credential_file_modeld_starts_and_sends_no_token(tmp_path):
    env = ModeldEnv(workdir=tmp_path / "env")
    assert not (env.workdir / "credentials" / "hf-token").exists()
    env.add_repo("acme/public", shards=1, shard_size=100_000, seed=24)
    try:
        env.start(model_table("public", "acme/public", free_port()))
        # The fallback SetCredential= gave an empty credential: no token, and no complaint.
        assert "(token: none)" in ready_line(env)
        assert not [e for e in env.journal(unit="modeld.service") if "core dumps are off" in e.get("MESSAGE", "")]
        assert env.deploy_and_wait("public")["state"] == "succeeded"
        requests = env.hub.requests()
        assert requests and not any(x["authorization_present"] for x in requests)
    finally:
        env.stop()


def test_an_empty_credential_falls_through_to_hf_token(tmp_path):
    env = ModeldEnv(workdir=tmp_path / "env", hub_args=["--token", TOKEN], environment={"HF_TOKEN": TOKEN})
    env.add_repo("acme/gated", shards=1, shard_size=100_000, seed=25)
    try:
        env.start(model_table("gated", "acme/gated", free_port()))
        assert "(token: $HF_TOKEN)" in ready_line(env)
        assert env.deploy_and_wait("gated")["state"] == "succeeded"
        assert set(hub_authorizations(env)) == {f"Bearer {TOKEN}"}
    finally:
        env.stop()


def test_token_file_wins_over_the_credential(tmp_path):
    token_file = tmp_path / "hf-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    env = ModeldEnv(workdir=tmp_path / "env", hub_args=["--token", TOKEN],
                    config_extra=f'token_file = "{token_file}"')
    write_credential(env, "hf_theCredentialLoses\n")
    env.add_repo("acme/gated", shards=1, shard_size=100_000, seed=26)
    try:
        env.start(model_table("gated", "acme/gated", free_port()))
        assert f"(token: token_file {token_file})" in ready_line(env)
        assert env.deploy_and_wait("gated")["state"] == "succeeded"
        assert set(hub_authorizations(env)) == {f"Bearer {TOKEN}"}
    finally:
        env.stop()


def test_a_token_file_readable_by_others_is_refused_naming_the_file_and_its_mode(tmp_path):
    token_file = tmp_path / "hf-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o644)
    env = ModeldEnv(workdir=tmp_path / "env", config_extra=f'token_file = "{token_file}"')
    try:
        # modeld is expected not to come up (and --check-config refuses this file too).
        env.boot("", check_config=False)
        r = env.systemd.run(["systemctl", "start", "modeld.service"])
        assert r.returncode != 0, "modeld started with a world-readable token file"
        line = wait_for("modeld's refusal in the journal", lambda: next(
            (e["MESSAGE"] for e in env.journal(unit="modeld.service")
             if "hub.token_file" in e.get("MESSAGE", "")), None), timeout=20)
        assert str(token_file) in line and "0644" in line and f"chmod 600 {token_file}" in line, line
        assert env.systemd.wait_journal(lambda e: "not starting" in e.get("MESSAGE", ""), unit="modeld.service")
        # --check-config (and so a reload) finds it too, before any restart could fail on it.
        check = subprocess.run([str(env.modeld), "--check-config", "--config", str(env.config)],
                               capture_output=True, text=True)
        assert check.returncode == 1 and "has mode 0644" in check.stderr and TOKEN not in check.stderr, check
        assert env.unit_state("modeld.service") in ("failed", "activating", "inactive")
        journal = env.systemd.run(["journalctl", "--no-pager", "-o", "json",
                                   f"--since=@{env.systemd.started_at}"], check=True).stdout
        assert TOKEN not in journal
        assert not env.hub.requests(), "modeld talked to the Hub"
    finally:
        env.stop()
