"""A disk that another writer fills while a download runs: the deployment fails with disk_full
naming the path and the shortfall, nothing is promoted, the partial files stay, the serving model
is untouched, and the next deployment resumes once there is room.

models_dir is a size-limited tmpfs (which also exercises the engine's fallback from O_DIRECT,
which tmpfs refuses, to buffered writes)."""

from __future__ import annotations

import pytest

import modeld_env
from modeld_env import ModeldEnv, completion, free_bytes, free_port, model_table, wait_for, write_control
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

MiB = 1 << 20
TMPFS_SIZE = 40 * MiB


@pytest.fixture
def small_disk(tmp_path):
    with modeld_env.small_disk(tmp_path / "work", TMPFS_SIZE) as work:
        yield work


def halves_on_disk(env: ModeldEnv) -> None:
    """Waits until the hub holds each of the 4 shards half-way and those halves are on disk."""
    wait_for("every shard of the new model to be held half-way", lambda: env.hub.stats()["held"] == 4,
             timeout=120)
    commit = env.status()["deployment"]["commit"]
    partial = env.models_dir / ".store" / "new" / commit / ".modeld" / "partial"
    wait_for("the halves to be written to the partial files", lambda: sum(
        p.stat().st_blocks * 512 for p in partial.glob("*.part")) >= 4 * 2 * MiB, timeout=120)


def fill_disk(folder, leave: int):
    """Writes FOLDER/filler.bin until `leave` bytes are free (or the disk is full); returns its path."""
    filler = folder / "filler.bin"
    with open(filler, "wb") as f:
        remaining = free_bytes(folder) - leave
        block = b"\0" * MiB
        while remaining > 0:
            n = min(remaining, len(block))
            try:
                f.write(block[:n])
                f.flush()
            except OSError:
                break
            remaining -= n
    return filler


def test_a_disk_filled_mid_download_fails_with_disk_full_and_the_next_deploy_resumes(small_disk):
    work = small_disk
    control = work / "hub-control.json"
    env = ModeldEnv(workdir=work, hub_args=["--control", str(control)])
    try:
        env.add_repo("acme/old", shards=2, shard_size=1 * MiB, seed=1)
        env.add_repo("acme/new", shards=4, shard_size=4 * MiB, seed=2)
        ports = {"old": free_port(), "new": free_port()}
        env.start(model_table("old", "acme/old", ports["old"]) + model_table("new", "acme/new", ports["new"]))
        env.deploy_and_wait("old")

        # Each shard of the new model sends half of itself, then waits until the test lets it go on.
        write_control(control, hold="acme/new/*.safetensors")
        assert env.modelctl("deploy", "new").returncode == 0
        halves_on_disk(env)
        # Another writer takes all but 256 KiB of what is left; then the rest of the shards comes.
        filler = fill_disk(env.models_dir, leave=256 * 1024)
        write_control(control)
        dep = wait_for("the deployment to end", lambda: (
            (d := env.status()["deployment"]) and d["state"] != "running" and d), timeout=120)

        assert dep["state"] == "failed" and dep["phase"] == "downloading", dep
        assert dep["error"]["code"] == "disk_full", dep["error"]
        msg = dep["error"]["message"]
        assert str(env.models_dir) in msg and "short by" in msg and "partial files are kept" in msg, msg
        revision = env.models_dir / ".store" / "new" / dep["commit"]
        assert not list(revision.glob("*.safetensors")), "a shard was promoted on a full disk"
        partials = list((revision / ".modeld" / "partial").glob("*.part"))
        assert partials and sum(p.stat().st_size for p in partials) > 0, "the partial files were not kept"
        assert env.status()["active"]["model"] == "old"
        assert completion(ports["old"], "old")

        # Room again: the next deployment continues from the partial files.
        filler.unlink()
        before = env.hub.stats()["cdn_body_bytes"]
        env.deploy_and_wait("new")
        sent = env.hub.stats()["cdn_body_bytes"] - before
        # Half of each shard (8 MiB) was on disk before it filled: not fetched again, but for the
        # tail of what was written last (a resume starts where the sidecar's ranges end).
        assert sent <= 16 * MiB - 8 * MiB + MiB, sent
        assert completion(ports["new"], "new")
    finally:
        env.stop()
