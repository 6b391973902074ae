"""A hostile Hub (or anything between modeld and a plain-http endpoint) must not fill the disk or
take the serving model down: sizes that would wrap the plan's sums, files larger than any real
one, files under modeld's own `.modeld/` folder of a revision, and a disk that fills while a
download runs. models_dir is a size-limited tmpfs in each test, so even a modeld that believed the
listing could only fill that."""

from __future__ import annotations

import hashlib
import json

import pytest

import modeld_env
from modeld_env import (ModeldEnv, completion, free_bytes, free_port, model_table, wait_for,
                        write_control)
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

MiB = 1 << 20
U64_MAX = (1 << 64) - 1


def phantom(path: str, size: int, content: str | None = None) -> dict:
    """A listing entry with no file behind it: the hub serves `content`, else an endless body."""
    data = (content or "").encode()
    entry = {"rfilename": path, "size": size,
             "blobId": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
    if content is not None:
        entry["content"] = content
    return entry


def served_pid(env: ModeldEnv, model: str) -> int:
    pid = env.main_pid(f"modeld-serve@{model}.service")
    assert pid > 0, f"{model} does not serve"
    return pid


def deploy_fails(env: ModeldEnv, model: str) -> dict:
    """`modelctl deploy MODEL --wait` that must fail; returns the deployment as recorded."""
    r = env.modelctl("deploy", model, "--wait")
    assert r.returncode == 1, f"exit {r.returncode}:\n{r.stdout}{r.stderr}"
    dep = env.status()["deployment"]
    assert dep["state"] == "failed", dep
    return dep


@pytest.fixture
def serving(tmp_path):
    """modeld on a 48 MiB models_dir with model `old` serving and `new` configured; the hub's
    --control file is env.control."""
    with modeld_env.small_disk(tmp_path / "work", 48 * MiB) as work:
        control = work / "hub-control.json"
        env = ModeldEnv(workdir=work, hub_args=["--control", str(control)], disk_reserve="8MiB")
        env.control = control
        try:
            env.add_repo("acme/old", shards=2, shard_size=1 * MiB, seed=1)
            env.add_repo("acme/new", shards=4, shard_size=4 * MiB, seed=2)
            env.ports = {"old": free_port(), "new": free_port()}
            env.start(model_table("old", "acme/old", env.ports["old"])
                      + model_table("new", "acme/new", env.ports["new"]))
            env.deploy_and_wait("old")
            yield env
        finally:
            env.stop()


@pytest.mark.parametrize("sizes", [[1 << 63, 1 << 63], [U64_MAX, 1]], ids=["2^63+2^63", "2^64-1+1"])
def test_sizes_that_wrap_the_plan_are_refused_in_planning(serving, sizes):
    env = serving
    write_control(env.control, listing_extra=[phantom(f"evil-{i}.bin", n) for i, n in enumerate(sizes)])
    old_pid = served_pid(env, "old")
    free_before = free_bytes(env.models_dir)

    plan = env.modelctl("--json", "plan", "new")
    assert plan.returncode != 0, plan.stdout
    err = json.loads(plan.stdout)["error"]
    assert err["code"] == "hub_bad_response", err
    assert "evil-0.bin" in err["message"] and "hub.max_file_size" in err["message"], err

    dep = deploy_fails(env, "new")
    assert dep["phase"] == "planning" and dep["error"]["code"] == "hub_bad_response", dep
    assert "evil-0.bin" in dep["error"]["message"], dep["error"]
    assert free_bytes(env.models_dir) >= free_before - MiB, "planning wrote to the disk"
    assert not list(env.models_dir.glob(".store/new/*/.modeld/partial/*.part"))
    assert served_pid(env, "old") == old_pid and env.status()["active"]["model"] == "old"


def test_a_file_larger_than_max_file_size_is_refused_naming_it(serving):
    env = serving
    write_control(env.control, listing_extra=[phantom("huge.safetensors", 3 << 40)])
    dep = deploy_fails(env, "new")
    assert dep["phase"] == "planning" and dep["error"]["code"] == "hub_bad_response", dep
    msg = dep["error"]["message"]
    assert f"'huge.safetensors' is {3 << 40} bytes" in msg and f"({1 << 40} bytes)" in msg, msg
    assert completion(env.ports["old"], "old")


def test_a_file_under_the_revisions_modeld_folder_is_refused_before_the_old_model_stops(serving):
    env = serving
    # What a Hub could plant: a manifest of its own, with the right blob id, so a modeld that
    # took it would download it, overwrite it with its own, and find its files "changed" only at
    # launch, after stopping the model that served.
    write_control(env.control, listing_extra=[phantom(".modeld/manifest.json", 2, "{}")])
    old_pid = served_pid(env, "old")
    dep = deploy_fails(env, "new")
    assert dep["phase"] == "planning" and dep["error"]["code"] == "hub_bad_response", dep
    msg = dep["error"]["message"]
    assert ".modeld/manifest.json" in msg and "modeld's own" in msg and 'exclude' in msg, msg
    assert dep["error"].get("files") in (None, [".modeld/manifest.json"]), dep["error"]
    assert served_pid(env, "old") == old_pid, "the serving model was restarted"
    assert env.status()["active"]["model"] == "old"
    # The refused listing is not kept: once the Hub (or what sat in between) sends an honest
    # one at the same commit, the deployment goes through.
    write_control(env.control)
    assert env.deploy_and_wait("new")["state"] == "succeeded"


def test_a_download_stops_at_disk_reserve_whoever_fills_the_disk(serving):
    env = serving
    reserve = 8 * MiB
    # Each shard sends half of itself, then waits until the test lets it go on.
    write_control(env.control, hold="acme/new/*.safetensors")
    old_pid = served_pid(env, "old")
    assert env.modelctl("deploy", "new").returncode == 0
    wait_for("every shard of the new model to be held half-way",
             lambda: env.hub.stats()["held"] == 4, timeout=120)
    commit = env.status()["deployment"]["commit"]
    partial = env.models_dir / ".store" / "new" / commit / ".modeld" / "partial"
    wait_for("the halves to be written to the partial files", lambda: sum(
        p.stat().st_blocks * 512 for p in partial.glob("*.part")) >= 4 * 2 * MiB, timeout=120)
    # Another writer takes the disk down to 3 MiB above the reserve; 8 MiB of shards are to come.
    filler = env.models_dir / "filler.bin"
    with open(filler, "wb") as f:
        f.write(bytes(free_bytes(env.models_dir) - reserve - 3 * MiB))
    write_control(env.control)

    dep = wait_for("the deployment to end", lambda: (
        (d := env.status()["deployment"]) and d["state"] != "running" and d), timeout=120)
    assert dep["state"] == "failed" and dep["phase"] == "downloading", dep
    err = dep["error"]
    assert err["code"] == "disk_full", err
    assert "disk_reserve" in err["message"] and str(reserve) in err["message"], err
    assert any(s in err["message"] for s in ("model-0000", ".safetensors")), err
    assert "partial files are kept" in err["message"], err
    # Nothing modeld wrote is deleted, so the free space now is the least there ever was.
    assert free_bytes(env.models_dir) >= reserve, (free_bytes(env.models_dir), reserve)
    revision = env.models_dir / ".store" / "new" / commit
    # A shard whose second half fitted in the 3 MiB was verified and kept; the others wait.
    assert len(list(revision.glob("*.safetensors"))) < 4, "every shard was promoted"
    assert list(partial.glob("*.part")), "the partial files were not kept"
    assert served_pid(env, "old") == old_pid and env.status()["active"]["model"] == "old"
    assert completion(env.ports["old"], "old")


def test_a_safetensors_index_the_hub_refuses_once_is_read_again_in_planning(serving):
    env = serving
    index = "acme/new/model.safetensors.index.json"
    # The first read of the index answers 503: planning retries it as it retries listings.
    write_control(env.control, fail_first=1, fail_glob=index, fail_status=503)
    plan = env.modelctl("--json", "plan", "new")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    reads = [r for r in env.hub.requests() if r.get("file") == index and r.get("method") == "GET"]
    assert len(reads) == 2, reads
    write_control(env.control)
