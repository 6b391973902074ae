"""End to end, warming on a disk with a bad sector: models_dir is a FUSE file system
(tests/fixtures/slow_fs.py) mounted before the test's namespaced systemd boots, mirroring a
backing folder, that answers EIO to reads of a chosen shard past a chosen byte once the test says so.

  * A read error while warming fails the deployment in phase warming with io_error naming the
    shard and the byte, before stopping_old: the old model keeps its MainPID and answers
    completions throughout, and nothing is stopped. (Before this was fixed, warming logged
    success, the old model was stopped, the new server died on the same EIO loading its weights
    and the deployment rolled back: an outage for an error warming had met.)
  * Rolling back onto an old revision whose shard has a bad sector says so in the journal
    (warning, the shard and the byte) and starts the old server anyway: it still loads (it reads
    only the headers), so the rollback succeeds.

The fault begins after the download and the verification: the revision is pulled first (a
deploy then trusts the verified files without reading them), and the test switches the fault on
before the deploy. The file system opens no file with FOPEN_KEEP_CACHE, so warming's open drops
the kernel's cached pages and its reads reach the file system; the fixture's eio-answered file
shows that the fault was met. Waits are for conditions only.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from modeld_env import ModeldEnv, completion, free_port, fuse_models, model_table
from nsystemd import unsupported_reason
from page_cache import drop
from test_several_models_e2e import Client

pytestmark = [
    pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or ""),
    pytest.mark.skipif(shutil.which("fusermount3") is None, reason="fuse3 is not installed"),
]

KiB, MiB = 1 << 10, 1 << 20
SHARD = 2 * MiB  # each checkpoint: 3 shards of about 2 MiB
BAD_AT = 1 * MiB  # the bad sector: reads of the last shard reaching past this byte fail
# FUSE reads a file in requests of up to 128 KiB (readahead's may start anywhere before the bad
# byte): the failed read warming reports begins at most this far before it.
REQUEST = 128 * KiB
WHOLE_BUDGET = {"MODELD_TEST_WARM_BUDGET": str(64 * MiB)}  # a whole checkpoint fits


def unit(model: str) -> str:
    return f"modeld-serve@{model}.service"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with fuse_models(tmp_path_factory.mktemp("warm-eio")) as work:
        e = ModeldEnv(workdir=work, environment=WHOLE_BUDGET)
        e.slow_fs_control = work / "slow-fs"
        e.ports = {n: free_port() for n in ("a", "b", "c")}
        for n, seed in (("a", 91), ("b", 92), ("c", 93)):
            e.add_repo(f"acme/{n}", shards=3, shard_size=SHARD, seed=seed)
        tables = model_table("a", "acme/a", e.ports["a"])
        # b's server reads every tensor's bytes as it loads, as a real one does: a bad sector kills it.
        tables += model_table("b", "acme/b", e.ports["b"], serve_args=["--read-weights"])
        # c never becomes ready: its deployment rolls back.
        tables += model_table("c", "acme/c", e.ports["c"], serve_args=["--fail-health"], startup_timeout="5s")
        with e:
            e.start(tables)
            assert e.deploy_and_wait("a")["state"] == "succeeded"
            yield e


def last_shard(env: ModeldEnv, model: str, commit: str) -> Path:
    shards = sorted((env.models_dir / ".store" / model / commit).glob("*.safetensors"))
    assert len(shards) == 3, shards
    return shards[-1]


class BadSector:
    """The fixture's read fault on `shard` past byte BAD_AT, from entering to leaving; the shard's
    cached pages are dropped first, so that readers go to the file system."""

    def __init__(self, env: ModeldEnv, shard: Path):
        self.env, self.shard = env, shard
        self.path = "/" + str(shard.relative_to(env.models_dir))
        self.control = env.slow_fs_control / "eio-read"
        self.answered = env.slow_fs_control / "eio-answered"

    def __enter__(self) -> "BadSector":
        self.answered.unlink(missing_ok=True)
        self.control.write_text(f"{self.path} {BAD_AT}\n")
        drop(self.shard)
        return self

    def __exit__(self, *exc):
        self.control.unlink(missing_ok=True)

    def met(self) -> list[str]:
        """The reads the fault answered with EIO."""
        text = self.answered.read_text() if self.answered.exists() else ""
        return [line for line in text.splitlines() if line.startswith(self.path + " ")]


def read_error(text: str, shard: Path, model: str, commit: str) -> int:
    """The byte a message "cannot read SHARD of MODEL at COMMIT12, at byte N: Input/output error"
    names, checked to lie just before the bad sector."""
    m = re.search(rf"cannot read {re.escape(shard.name)} of {model} at {commit[:12]}, at byte (\d+): "
                  r"Input/output error", text)
    assert m, text
    offset = int(m[1])
    assert BAD_AT - REQUEST <= offset <= BAD_AT, (offset, text)
    return offset


def entries(env: ModeldEnv, dep_id: str, *matches: str) -> list[dict]:
    return env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}", *matches)


def pulled(env: ModeldEnv, model: str) -> str:
    """Pulls `model` (downloaded and verified while the disk is sound); returns its commit."""
    r = env.modelctl("--json", "pull", model, "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    pull = json.loads(r.stdout)
    assert pull["state"] == "succeeded", pull
    return pull["commit"]


def test_a_read_error_while_warming_fails_the_deployment_before_the_old_model_is_stopped(env):
    assert env.status()["active"]["model"] == "a"
    old_pid = env.main_pid(unit("a"))
    assert old_pid > 0
    commit = pulled(env, "b")
    shard = last_shard(env, "b", commit)
    with BadSector(env, shard) as fault, Client(env.ports["a"], "a") as client:
        dep = env.deploy_and_wait("b", expect_exit=1)
    assert fault.met(), "warming's reads never reached the bad sector"
    assert dep["state"] == "failed" and dep["phase"] == "warming", dep
    assert dep["error"]["code"] == "io_error", dep
    read_error(dep["error"]["message"], shard, "b", commit)
    # The old model was never touched: same process, answering all along, still in service.
    assert client.answered > 0 and client.failures == [], (client.answered, client.failures[:3])
    assert env.main_pid(unit("a")) == old_pid
    assert env.status()["active"]["model"] == "a"
    assert completion(env.ports["a"], "a")
    assert env.main_pid(unit("b")) == 0
    assert entries(env, dep["id"], "MODELD_PHASE=stopping_old") == []
    assert entries(env, dep["id"], "MODELD_PHASE=launching") == []
    failure = entries(env, dep["id"], f"MODELD_FILE={shard.name}")
    assert any(f"deployment {dep['id']} failed in phase warming" in x["MESSAGE"] for x in failure), failure


def test_rolling_back_onto_an_unreadable_old_revision_says_so_and_starts_it_anyway(env):
    active = env.status()["active"]
    assert active["model"] == "a"
    shard = last_shard(env, "a", active["commit"])
    with BadSector(env, shard) as fault:
        dep = env.deploy_and_wait("c", expect_exit=1)
    assert dep["state"] == "rolled_back", dep
    assert fault.met(), "the rollback's warming never reached the bad sector"
    said = [x for x in entries(env, dep["id"], f"MODELD_FILE={shard.name}", "MODELD_PHASE=rolling_back")
            if x["MESSAGE"].startswith("cannot warm a: ")]
    assert len(said) == 1, entries(env, dep["id"], "MODELD_PHASE=rolling_back")
    assert said[0]["PRIORITY"] == "4", said  # a warning: the rollback goes on
    read_error(said[0]["MESSAGE"], shard, "a", active["commit"])
    assert said[0]["MESSAGE"].endswith("; starting it anyway"), said
    assert env.status()["active"]["model"] == "a"
    assert completion(env.ports["a"], "a")
