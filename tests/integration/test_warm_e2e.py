"""End to end, the warming phase on a models_dir that is an ext4 loop image (on tmpfs mincore
shows every page resident): a forced small RAM budget warms a prefix of the checkpoint and says
so (record and journal); pages dropped with posix_fadvise(DONTNEED) are not resident, and what
warming read is; warming cancelled leaves the old model serving, and a daemon restart during
warming continues the deployment without reading again what is resident; rolling back warms the
old revision. Warming is held in its phase by the test-only read rate MODELD_TEST_WARM_RATE
(builds with test hooks), so the test catches it half-way by waiting for conditions only."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import mmap
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from modeld_env import ModeldEnv, completion, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = [
    pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or ""),
    pytest.mark.skipif(shutil.which("mkfs.ext4") is None, reason="e2fsprogs (mkfs.ext4) is not installed"),
]

MiB = 1 << 20
SHARD = 2 * MiB  # each checkpoint: 3 shards of about 2 MiB
RATE = MiB  # warming's read rate once the test slows it down: about 5 s per checkpoint (its budget)

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident(path: Path) -> int:
    """Bytes of `path` in the page cache (mincore over a read-only mapping), measured by the test."""
    size = path.stat().st_size
    if size == 0:
        return 0
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer((size + page - 1) // page)
            assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return min(size, sum(b & 1 for b in vec.raw) * page)
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop(path: Path) -> None:
    """Drops the file's clean pages from the page cache (posix_fadvise DONTNEED)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def shards(env: ModeldEnv, model: str, commit: str) -> list[Path]:
    return sorted((env.models_dir / ".store" / model / commit).glob("*.safetensors"))


@contextlib.contextmanager
def ext4_disk(work: Path, size: int):
    """WORK/models as an ext4 file system in a loop image, mounted before the namespaced systemd
    boots (so modeld sees it), unmounted afterwards; yields WORK."""
    models, image = work / "models", work / "models.ext4"
    models.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(models)], check=True)
    try:
        yield work
    finally:
        subprocess.run(["umount", "-l", str(models)], check=False)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with ext4_disk(tmp_path_factory.mktemp("warm"), 256 * MiB) as work:
        # A RAM budget of 5 MiB: the first two shards (sorted by name, as loaders read them) fit.
        e = ModeldEnv(workdir=work, environment={"MODELD_TEST_WARM_BUDGET": str(5 * MiB)})
        e.ports = {}
        tables = ""
        for n, seed in (("a", 41), ("b", 42), ("c", 43)):
            e.add_repo(f"acme/{n}", shards=3, shard_size=SHARD, seed=seed)
            e.ports[n] = free_port()
        tables += model_table("a", "acme/a", e.ports["a"], serve_args=["--read-weights"])
        tables += model_table("b", "acme/b", e.ports["b"])
        # c never becomes ready: its deployment rolls back.
        tables += model_table("c", "acme/c", e.ports["c"], serve_args=["--fail-health"], startup_timeout="5s")
        with e:
            e.start(tables)
            yield e


def messages(env: ModeldEnv, dep_id: str) -> list[str]:
    return [x.get("MESSAGE", "") for x in env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}")]


def start_deploy(env: ModeldEnv, model: str) -> str:
    started = env.modelctl("--json", "deploy", model)
    assert started.returncode == 0, started.stdout + started.stderr
    return json.loads(started.stdout)["id"]


def warming_read(env: ModeldEnv, dep_id: str, at_least: int):
    d = env.status()["deployment"]
    assert d["id"] == dep_id
    assert d["state"] == "running", d
    return d["phase"] == "warming" and d["warm"] and d["warm"]["bytes_warmed"] >= at_least and d


def test_a_small_budget_warms_a_prefix_and_says_so(env):
    dep = env.deploy_and_wait("a")
    assert dep["state"] == "succeeded", dep
    files = shards(env, "a", dep["commit"])
    assert len(files) == 3
    total = sum(f.stat().st_size for f in files)
    warm = dep["warm"]
    assert warm["bytes_total"] >= total, warm
    assert 0 < warm["bytes_warmed"] <= 5 * MiB, warm
    assert warm["bytes_resident_at_launch"] >= warm["bytes_warmed"], warm
    assert warm["bytes_resident_at_launch"] < total, warm  # the last shard did not fit
    text = messages(env, dep["id"])
    assert any(m.startswith("warming a at ") for m in text), text
    assert any("RAM budget" in m and files[2].name in m for m in text), text
    # The test's own measure: dropped pages are gone, and the page cache holds what was warmed.
    for f in files:
        drop(f)
    assert sum(resident(f) for f in files) <= MiB


def test_warming_cancelled_leaves_the_old_model_and_a_restart_continues_it(env):
    env.reconfigure(environment={**env.environment, "MODELD_TEST_WARM_RATE": str(RATE)})
    dep_id = start_deploy(env, "b")
    wait_for("warming to have read some of b", lambda: warming_read(env, dep_id, 1), timeout=120)
    assert env.modelctl("cancel").returncode == 0
    wait_for("the deployment to end", lambda: env.status()["deployment"]["state"] != "running", timeout=60)
    dep = env.status()["deployment"]
    assert dep["state"] == "cancelled" and dep["phase"] == "warming", dep
    assert env.status()["active"]["model"] == "a"
    assert completion(env.ports["a"], "a")

    dep_id = start_deploy(env, "b")
    seen = wait_for("warming to have read 1 MiB of b", lambda: warming_read(env, dep_id, MiB), timeout=120)
    env.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
    wait_for("the deployment to end after the restart",
             lambda: env.status()["deployment"]["state"] != "running", timeout=120)
    dep = env.status()["deployment"]
    assert dep["id"] == dep_id and dep["state"] == "succeeded", dep
    assert any("continuing deployment" in m for m in messages(env, dep_id))
    # What the first run read was found resident, not read again.
    assert dep["warm"]["bytes_resident_before"] >= seen["warm"]["bytes_warmed"] - MiB, (seen, dep)
    assert env.status()["active"]["model"] == "b"


def test_rolling_back_warms_the_old_revision(env):
    active = env.status()["active"]
    assert active["model"] == "b"
    files = shards(env, "b", active["commit"])
    for f in files:
        drop(f)
    assert sum(resident(f) for f in files) <= MiB
    dep = env.deploy_and_wait("c", expect_exit=1)
    assert dep["state"] == "rolled_back", dep
    text = messages(env, dep["id"])
    assert any("warming the previous revision of b" in m for m in text), text
    assert any(m.startswith("warming b at ") for m in text), text
    # The budget's prefix of b is back in the page cache (b's stand-in server reads only headers).
    assert resident(files[0]) >= files[0].stat().st_size - 64 * 1024
    assert completion(env.ports["b"], "b")
