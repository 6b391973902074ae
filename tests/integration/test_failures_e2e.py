"""End to end, things going wrong: a new model that cannot start after the old one was stopped
(rolled back), a hub answering an HTML page instead of a shard (nothing promoted, the old model
keeps serving), a shard the index names but the repository lacks and a plan that cannot fit
on the disk (both refused before any shard is fetched), a cancel while the old model stops,
and a restart in the middle of a download."""

from __future__ import annotations

import json

import pytest

from modeld_env import SERVER_STARTING, ModeldEnv, completion, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")


# A server that writes one line and exits at once, as one that runs out of GPU memory does: the
# line reaches journald after the process (and its control group) are gone, so journald cannot
# stamp it with the run's _SYSTEMD_INVOCATION_ID.
OOM_LINE = "CUDA error: out of memory"
OOM_TABLE = """
[models.oom]
repo = "acme/oom"
revision = "main"
[models.oom.serve]
command = ["/bin/sh", "-c", "echo '""" + OOM_LINE + """' >&2; exit 3"]
port = {port}
startup_timeout = "60s"
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("failures")
    control = work / "hub-control.json"
    e = ModeldEnv(workdir=work, hub_args=["--control", str(control)])
    e.hub_control = control
    e.add_repo("acme/good", shards=2, shard_size=200_000, seed=11)
    e.add_repo("acme/broken", shards=2, shard_size=200_000, seed=12)
    e.add_repo("acme/other", shards=3, shard_size=200_000, seed=13)
    e.add_repo("acme/fresh", shards=2, shard_size=200_000, seed=14)
    e.add_repo("acme/big", shards=2, shard_size=3_000_000, seed=15)
    e.add_repo("acme/stubborn", shards=1, shard_size=100_000, seed=16)
    # A repository whose index names a shard that was never pushed.
    holey = e.add_repo("acme/holey", shards=3, shard_size=100_000, seed=17)
    (holey / "model-00002-of-00003.safetensors").unlink()
    e.add_repo("acme/mojibake", shards=1, shard_size=100_000, seed=18)
    e.add_repo("acme/oom", shards=1, shard_size=100_000, seed=19)
    e.ports = {"good": free_port(), "broken": free_port(), "other": free_port(), "fresh": free_port(),
               "big": free_port(), "stubborn": free_port(), "holey": free_port(), "mojibake": free_port(),
               "oom": free_port()}
    e.tables = (model_table("good", "acme/good", e.ports["good"])
                # Starts, then exits 1 at once: what a server does on a bad flag or a CUDA error.
                + model_table("broken", "acme/broken", e.ports["broken"], serve_args=["--exit-after", "0"])
                + model_table("other", "acme/other", e.ports["other"])
                + model_table("fresh", "acme/fresh", e.ports["fresh"])
                + model_table("big", "acme/big", e.ports["big"])
                # Ignores SIGTERM, as a server stuck in a CUDA call does: stopping it takes the
                # whole stop_timeout, after which systemd kills it.
                + model_table("stubborn", "acme/stubborn", e.ports["stubborn"], serve_args=["--ignore-sigterm"],
                              stop_timeout="3s")
                + model_table("holey", "acme/holey", e.ports["holey"])
                # Answers /health with 500 and bytes that are not UTF-8, which modeld quotes.
                + model_table("mojibake", "acme/mojibake", e.ports["mojibake"],
                              serve_args=["--health-body", "fffe206e6f74207265616479"], startup_timeout="3s")
                + OOM_TABLE.format(port=e.ports["oom"]))
    try:
        e.start(e.tables)
        e.deploy_and_wait("good")
        yield e
    finally:
        e.stop()


def downloads(env) -> int:
    """Requests for file contents so far (planning reads only the small safetensors index)."""
    return len([x for x in env.hub.requests()
                if x["origin"] == "cdn" or ("/resolve/" in x["path"] and ".index.json" not in x["path"])])


def test_a_new_model_that_dies_at_start_is_rolled_back_and_the_old_one_serves_again(env):
    dep = env.deploy_and_wait("broken", 1)
    assert dep["model"] == "broken"
    assert dep["state"] == "rolled_back"
    assert dep["phase"] == "rolling_back"
    assert dep["error"]["code"] == "unit_failed"
    assert "modeld-serve@broken.service" in dep["error"]["message"]
    assert env.status()["active"]["model"] == "good"
    assert env.unit_state("modeld-serve@good.service") == "active"
    assert completion(env.ports["good"], "good")
    # The journal tells the story with the terminal state.
    lines = env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep['id']}")
    assert any(e.get("MODELD_PHASE") == "rolling_back" for e in lines)
    assert lines[-1].get("MODELD_STATE") == "rolled_back"


def test_the_line_of_a_server_that_dies_at_once_is_quoted_in_the_error(env):
    # Three runs: journald loses the run's id on such a line often, not always.
    for _ in range(10):
        dep = env.deploy_and_wait("oom", 1)
        assert dep["state"] == "rolled_back", dep
        assert dep["error"]["code"] == "unit_failed", dep
        assert OOM_LINE in dep["error"]["message"], dep["error"]["message"]
    assert env.status()["active"]["model"] == "good"


def test_an_html_page_instead_of_a_shard_is_never_promoted(env):
    env.hub_control.write_text(json.dumps({"html_200": "*.safetensors"}))
    try:
        r = env.modelctl("deploy", "other", "--wait")
    finally:
        env.hub_control.write_text("{}")
    assert r.returncode == 1, r.stdout + r.stderr
    dep = env.status()["deployment"]
    assert dep["state"] == "failed" and dep["phase"] == "downloading"
    assert dep["error"]["code"] in ("size_mismatch", "checksum_mismatch")
    assert ".safetensors" in dep["error"]["message"] and "html" in dep["error"]["message"].lower()
    # No shard carries its final name, and nothing that served was touched.
    revision = env.models_dir / ".store" / "other" / dep["commit"]
    assert not list(revision.glob("*.safetensors"))
    assert not (env.models_dir / "other").exists()
    assert env.status()["active"]["model"] == "good"
    assert completion(env.ports["good"], "good")


def test_a_shard_the_index_names_but_the_repository_lacks_fails_the_plan_before_downloading(env):
    before = downloads(env)
    dep = env.deploy_and_wait("holey", 1)
    assert dep["state"] == "failed" and dep["phase"] == "planning"
    assert dep["error"]["code"] == "checkpoint_incomplete"
    assert "model-00002-of-00003.safetensors" in dep["error"]["message"]
    assert "model.safetensors.index.json" in dep["error"]["message"]
    assert downloads(env) == before, "no shard may be downloaded"


def test_a_retry_after_the_hub_recovers_succeeds(env):
    env.deploy_and_wait("other")
    assert env.status()["active"]["model"] == "other"


def test_a_download_interrupted_by_a_daemon_restart_resumes_where_it_stopped(env):
    # Slow the hub down so the restart lands in the middle of the shards.
    env.hub_control.write_text(json.dumps({"throttle": 1_000_000}))
    try:
        started = env.modelctl("--json", "deploy", "big")
        assert started.returncode == 0, started.stdout + started.stderr
        dep_id = json.loads(started.stdout)["id"]
        wait_for("part of the download to be on disk", lambda: (
            (d := env.status()["deployment"])["phase"] == "downloading"
            and d["progress"]["bytes_done"] > 1_000_000), timeout=60)
        env.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
        env.hub_control.write_text("{}")
        wait_for("the same deployment to end after the restart",
                 lambda: env.status()["deployment"]["id"] == dep_id
                 and env.status()["deployment"]["state"] != "running", timeout=120)
    finally:
        env.hub_control.write_text("{}")
    dep = env.status()["deployment"]
    assert dep["state"] == "succeeded", dep
    assert env.status()["active"]["model"] == "big"
    # The bytes on disk were kept: some shard was continued with a Range request.
    ranges = [x["range"] for x in env.hub.requests() if x["origin"] == "cdn" and x.get("range")]
    assert any(r.startswith("bytes=") and not r.startswith("bytes=0-") for r in ranges), ranges
    lines = env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}")
    assert any("continuing deployment" in e.get("MESSAGE", "") for e in lines)


def test_a_cancel_while_the_old_model_is_stopping_brings_it_back(env):
    env.deploy_and_wait("stubborn")
    started = env.modelctl("--json", "deploy", "good")
    assert started.returncode == 0, started.stdout + started.stderr
    dep_id = json.loads(started.stdout)["id"]
    wait_for("the deployment to reach stopping_old",
             lambda: env.status()["deployment"]["phase"] == "stopping_old", timeout=60)
    # The stop itself has begun (stopping_old first re-checks the files while the old model
    # serves, and a cancel then is a plain cancel): the stubborn unit ignores SIGTERM and stays
    # deactivating.
    wait_for("the old unit to be stopping",
             lambda: env.unit_state("modeld-serve@stubborn.service") == "deactivating", timeout=60)
    assert env.modelctl("cancel").returncode == 0
    wait_for("the deployment to end", lambda: env.status()["deployment"]["state"] != "running", timeout=120)
    dep = env.status()["deployment"]
    assert dep["id"] == dep_id
    assert dep["state"] == "rolled_back", dep
    assert env.status()["active"]["model"] == "stubborn"
    wait_for("stubborn to answer again", lambda: completion(env.ports["stubborn"], "stubborn"), timeout=60,
             retry_on=SERVER_STARTING)


def test_a_health_answer_that_is_not_utf8_is_quoted_safely_and_rolled_back(env):
    """The error quotes the server's bytes; they once made the API and the state files throw."""
    active = env.status()["active"]["model"]
    dep = env.deploy_and_wait("mojibake", 1)
    assert dep["state"] == "rolled_back", dep
    assert "\ufffd" in dep["error"]["message"], dep["error"]
    # The API, the history and the old model are all fine.
    assert env.status()["deployment"]["id"] == dep["id"]
    assert env.modelctl("status").returncode == 0
    assert env.status()["active"]["model"] == active
    assert completion(env.ports[active], active)


def test_a_plan_that_cannot_fit_is_refused_before_downloading(env):
    # Ask for more headroom than any disk has; the running daemon picks it up at restart.
    active_before = env.status()["active"]["model"]
    env.config.write_text(env.config.read_text().replace('disk_reserve = "0"', 'disk_reserve = "1000TB"'))
    env.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
    wait_for("modeld after its restart", lambda: env.modelctl("status").returncode == 0, timeout=60)
    before = downloads(env)
    dep = env.deploy_and_wait("fresh", 1)
    assert dep["state"] == "failed" and dep["phase"] == "freeing_disk"
    assert dep["error"]["code"] == "disk_full"
    assert "disk_reserve" in dep["error"]["message"]
    after = downloads(env)
    assert after == before, "no file may be downloaded for a plan that does not fit"
    assert env.status()["active"]["model"] == active_before
    # A model whose files are all on disk and verified needs no room: it deploys.
    env.deploy_and_wait("good")
    assert env.status()["active"]["model"] == "good"

