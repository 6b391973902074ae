"""The Hub token goes to the Hub's origin only: never to the CDN the Hub redirects to, never
into the journal, a drop-in or the API."""

from __future__ import annotations

import pytest

from modeld_env import ModeldEnv, free_port, model_table
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


def test_a_wrong_token_fails_the_plan_with_a_clear_error_that_does_not_quote_it(tmp_path):
    token_file = tmp_path / "hf-token"
    token_file.write_text("hf_wrongWrongWrong\n")
    env = ModeldEnv(workdir=tmp_path / "env", hub_args=["--token", TOKEN],
                    config_extra=f'token_file = "{token_file}"')
    env.add_repo("acme/gated", shards=1, shard_size=100_000, seed=22)
    try:
        env.start(model_table("gated", "acme/gated", free_port()))
        r = env.modelctl("deploy", "gated", "--wait")
        assert r.returncode == 1
        dep = env.status()["deployment"]
        assert dep["state"] == "failed" and dep["phase"] == "planning"
        assert dep["error"]["code"] == "hub_unauthorized"
        assert "acme/gated" in dep["error"]["message"]
        assert "hf_wrongWrongWrong" not in dep["error"]["message"]
        assert env.status()["active"] is None
    finally:
        env.stop()
