"""End to end, modeld on a disk that stalls: models_dir is a FUSE file system
(tests/fixtures/slow_fs.py) mounted inside the test's namespaced systemd, mirroring a backing
folder, whose unlink, rmdir and readdir of chosen paths wait until the test releases them.
While `modelctl rm` is held there at an unlink (and another model downloads), GET /v1/status,
GET /v1/models and the SSE stream answer, and systemd keeps getting WATCHDOG=1; held at a
readdir, GET /v1/models waits on its own pool and the rest still flows: nothing on modeld's
event loop waits for the disk. The test waits for conditions
only (the hold is seen through the file system's control folder)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time

import pytest

from modeld_env import FIXTURES, PYTHON, ModeldEnv, free_port, model_table, wait_for, write_control
from nsystemd import unsupported_reason
from test_cli_follow_e2e import SseClient

pytestmark = [
    pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or ""),
    pytest.mark.skipif(shutil.which("fusermount3") is None, reason="fuse3 is not installed"),
]

WATCHDOG_SEC = 6
WATCHDOG_DROPIN = f"[Service]\nWatchdogSec={WATCHDOG_SEC}s\n"


def mount_slow_fs(env: ModeldEnv) -> None:
    """Mounts slow_fs.py at env.models_dir inside the namespace, as a transient unit of its systemd
    (so the mount is in the namespace's mount table, which modeld.service's sandbox copies)."""
    backing, control = env.workdir / "models-backing", env.workdir / "slow-fs"
    for d in (backing, control, env.models_dir):
        d.mkdir(parents=True, exist_ok=True)
    env.slow_fs_control = control
    env.systemd.run(["systemd-run", "--unit=slow-fs", "--property=KillMode=mixed", PYTHON,
                     str(FIXTURES / "slow_fs.py"), str(backing), str(env.models_dir), str(control)], check=True)
    wait_for("the slow file system to be mounted", lambda: (control / "ready").exists(), timeout=30)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("slowdisk")
    hub_control = work / "hub-control.json"
    e = ModeldEnv(workdir=work, hub_args=["--control", str(hub_control)])
    e.hub_control = hub_control
    write_control(hub_control)
    e.add_repo("acme/a", shards=2, shard_size=256 * 1024, seed=81)
    e.add_repo("acme/b", shards=2, shard_size=256 * 1024, seed=82)
    e.add_repo("acme/c", shards=2, shard_size=4 << 20, seed=83)
    tables = "".join(model_table(n, f"acme/{n}", free_port()) for n in ("a", "b", "c"))
    try:
        e.boot(tables)
        mount_slow_fs(e)
        e.systemd.write_file("/run/systemd/system/modeld.service.d/60-watchdog.conf", WATCHDOG_DROPIN)
        e.systemd.run(["systemctl", "daemon-reload"], check=True)
        e.systemd.run(["systemctl", "start", "modeld.service"], check=True)
        wait_for("modeld's control socket", lambda: e.modelctl("status").returncode == 0, timeout=60)
        yield e
    finally:
        if getattr(e, "slow_fs_control", None):
            (e.slow_fs_control / "hold-remove").unlink(missing_ok=True)
        if e.systemd:
            e.systemd.run(["systemctl", "stop", "modeld.service"])
            e.systemd.run(["fusermount3", "-u", str(e.models_dir)])
        e.stop()


def get_json(env: ModeldEnv, path: str, timeout: float = 10) -> dict:
    status, _, body = env.api("GET", path, timeout=timeout)
    assert status == 200, (path, status, body)
    return json.loads(body)


def watchdog_pet(env: ModeldEnv) -> int:
    """When systemd last saw WATCHDOG=1 from modeld (CLOCK_MONOTONIC µs)."""
    out = env.systemd.run(["systemctl", "show", "-p", "WatchdogTimestampMonotonic", "--value", "modeld.service"],
                          check=True).stdout
    return int(out.strip() or 0)


def downloading(env: ModeldEnv, dep_id: str) -> bool:
    d = env.status()["deployment"]
    return d["id"] == dep_id and d["phase"] == "downloading" and d["progress"]["bytes_done"] > 0


def next_progress(events: SseClient, dep_id: str) -> dict:
    """The next progress event of deployment `dep_id` on the stream (other events skipped)."""
    deadline = time.monotonic() + 60
    while True:
        kind, data = events.next_event(deadline)
        if kind == "progress" and data["id"] == dep_id:
            return data


class HeldRm:
    """While `download` downloads slowly (64 KiB/s per file), `modelctl rm victim` held by the
    file system at its `kind` ("remove" or "readdir") of `paths`; ends by cancelling the download,
    releasing the hold and checking that both end as they should."""

    def __init__(self, env: ModeldEnv, download: str, victim: str, kind: str, paths: list[str]):
        self.env, self.download, self.victim, self.kind, self.paths = env, download, victim, kind, paths
        self.hold = env.slow_fs_control / f"hold-{kind}"
        self.held = env.slow_fs_control / f"held-{kind}"

    def __enter__(self) -> "HeldRm":
        env = self.env
        write_control(env.hub_control, throttle=64 * 1024)
        r = env.modelctl("--json", "deploy", self.download)
        assert r.returncode == 0, r.stdout + r.stderr
        self.dep_id = json.loads(r.stdout)["id"]
        wait_for(f"{self.download}'s download under way", lambda: downloading(env, self.dep_id), timeout=60)
        self.hold.write_text("".join(p + "\n" for p in self.paths))
        self.rm = subprocess.Popen([str(env.modelctl_bin), "--socket", str(env.socket), "rm", self.victim],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for(f"rm's {self.kind} to be held by the file system", self.held.exists, timeout=60)
        self.pet = watchdog_pet(env)
        return self

    def loop_keeps_flowing(self) -> None:
        """Status, the download's progress on a stream opened now (events made while the hold
        lasts) and systemd's WATCHDOG=1 all come while the rm is held."""
        env = self.env
        status = get_json(env, "/v1/status")
        assert status["deployment"]["id"] == self.dep_id and status["deployment"]["state"] == "running", status
        events = SseClient(env.socket)
        try:
            assert next_progress(events, self.dep_id)["progress"]["bytes_done"] > 0
        finally:
            events.close()
        wait_for("a watchdog pet after the hold began", lambda: watchdog_pet(env) > self.pet,
                 timeout=3 * WATCHDOG_SEC)
        assert self.held.exists() and self.rm.poll() is None, "the rm was not held throughout"

    def __exit__(self, *exc) -> None:
        env = self.env
        try:
            assert env.modelctl("cancel").returncode == 0
        finally:
            self.hold.unlink(missing_ok=True)
            write_control(env.hub_control)
        out, _ = self.rm.communicate(timeout=120)
        assert self.rm.returncode == 0, out
        dep = wait_for(f"the cancelled deployment of {self.download} to end",
                       lambda: (d := get_json(env, f"/v1/deployments/{self.dep_id}"))["state"] != "running" and d,
                       timeout=120)
        assert dep["state"] == "cancelled", dep


def test_status_models_events_and_watchdog_keep_flowing_while_an_rm_is_held_on_the_disk(env):
    env.deploy_and_wait("a")
    env.deploy_and_wait("b")
    models = {m["name"]: m for m in get_json(env, "/v1/models")["models"]}
    assert models["a"]["state"] == "verified" and not models["a"]["active"], models
    # Only a's link and store folder are held: c's download goes on unhindered.
    with HeldRm(env, "c", "a", "remove", ["/a", "/.store/a"]) as held:
        listed = {m["name"]: m["state"] for m in get_json(env, "/v1/models")["models"]}
        assert listed["a"] == "verified", listed  # the list as of the last walk: rm has not ended
        held.loop_keeps_flowing()
    listed = {m["name"]: m["state"] for m in get_json(env, "/v1/models")["models"]}
    assert listed["a"] == "absent", listed


def test_status_events_and_watchdog_keep_flowing_while_an_rms_walk_is_held_at_readdir(env):
    """A listing of c's store folder stalls (rm walks it first): GET /v1/models, which walks the
    store too, waits on its own pool, and nothing else waits with it."""
    assert get_json(env, "/v1/status")["active"]["model"] == "b"
    models: list[dict] = []
    with HeldRm(env, "a", "c", "readdir", ["/.store/c"]) as held:
        walk = threading.Thread(target=lambda: models.append(get_json(env, "/v1/models", timeout=300)), daemon=True)
        walk.start()
        held.loop_keeps_flowing()
    wait_for("GET /v1/models to answer once the listing went on", lambda: models, timeout=60)
    assert {m["name"] for m in models[0]["models"]} == {"a", "b", "c"}, models
