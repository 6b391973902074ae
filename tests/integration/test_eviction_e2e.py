"""End to end: eviction in a real deployment on a models_dir that fills (a tmpfs): the least
recently active models go first, a pinned model stays however old, the model in service stays,
and each eviction is a journal line with MODELD_EVICTED."""

from __future__ import annotations

import json
import os

import pytest

import modeld_env
from contract_helpers import lines
from modeld_env import ModeldEnv, free_bytes, free_port, model_table
from nsystemd import unsupported_reason

import make_checkpoint  # noqa: E402 - on sys.path through modeld_env

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

MiB = 1 << 20


def allocated(folder) -> int:
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*"))


def repo_size(folder) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def small_disk(tmp_path):
    with modeld_env.small_disk(tmp_path / "work", 16 * MiB, "modeld-test-eviction") as work:
        yield work


def test_eviction_takes_the_least_recently_active_keeps_pinned_and_active_and_logs_it(small_disk):
    env = ModeldEnv(workdir=small_disk)
    try:
        names = ["p", "a", "b", "c"]
        for i, n in enumerate(names):
            env.add_repo(f"acme/{n}", shards=2, shard_size=1 * MiB, seed=90 + i)
        ports = {n: free_port() for n in names + ["n"]}
        tables = "".join(model_table(n, f"acme/{n}", ports[n], extra="pinned = true" if n == "p" else "")
                         for n in names)
        tables += model_table("n", "acme/n", ports["n"])
        env.add_repo("acme/n", shards=1, shard_size=64 * 1024, seed=99)  # replaced below, once sizes are known
        env.start(tables)
        # Active in turn: p (pinned) is the least recently active, then a, then b; c serves.
        for n in names:
            assert env.deploy_and_wait(n)["state"] == "succeeded"
        store = env.models_dir / ".store"
        free = free_bytes(env.models_dir)
        size_a, size_b = allocated(store / "a"), allocated(store / "b")
        # n needs more than the free space plus a, and less than that plus b: a and b must go.
        target = free + size_a + size_b // 2
        make_checkpoint.make_checkpoint(str(env.repos / "acme" / "n"), 2, 1 * MiB, 99)
        overhead = repo_size(env.repos / "acme" / "n") - 2 * MiB
        make_checkpoint.make_checkpoint(str(env.repos / "acme" / "n"), 2, (target - overhead) // 2, 99)
        need = repo_size(env.repos / "acme" / "n")
        assert free + size_a + size_b // 4 < need < free + size_a + size_b - size_b // 4, (free, size_a, size_b, need)

        r = env.modelctl("--json", "plan", "n")
        plan = json.loads(r.stdout)
        assert r.returncode == 0 and plan["fits"], plan
        assert [e["name"] for e in plan["evictions"]] == ["a", "b"], plan["evictions"]

        dep = env.deploy_and_wait("n")
        assert dep["state"] == "succeeded", dep
        evicted = [e for e in lines(env, f"MODELD_DEPLOYMENT={dep['id']}") if "MODELD_EVICTED" in e]
        assert [e["MODELD_EVICTED"] for e in evicted] == ["a", "b"], evicted
        assert all(e["MODELD_PHASE"] == "freeing_disk" for e in evicted)
        assert "evicted model a" in evicted[0]["MESSAGE"]
        assert not (store / "a").exists() and not (store / "b").exists()
        assert not os.path.lexists(env.models_dir / "a") and not os.path.lexists(env.models_dir / "b")
        # The pinned model, though the least recently active, and the model that served stay.
        assert (store / "p").is_dir() and (store / "c").is_dir()
        models = {m["name"]: m for m in json.loads(env.modelctl("--json", "models").stdout)["models"]}
        assert models["p"]["state"] == "verified" and models["c"]["state"] == "verified"
        assert models["a"]["state"] == "absent" and models["b"]["state"] == "absent"
        assert env.status()["active"]["model"] == "n"
    finally:
        env.stop()
