"""End to end: `modelctl plan`, `verify` and `rm` through a real modeld under a namespaced systemd,
with the bundled hub: a dry run that changes nothing, re-hashing that finds a corrupt byte and a
missing shard, deletion that refuses the active model, and `rm --commit` of the revision the
model's link names, which removes the link."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from modeld_env import ModeldEnv, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = ModeldEnv(workdir=tmp_path_factory.mktemp("pvr"))
    e.add_repo("acme/model-a", shards=3, shard_size=300_000, seed=1)
    # Large enough that evicting it makes room the free-space noise of a shared disk cannot.
    e.add_repo("acme/model-b", shards=4, shard_size=8 << 20, seed=2)
    e.ports = {"model-a": free_port(), "model-b": free_port()}
    try:
        e.start(model_table("model-a", "acme/model-a", e.ports["model-a"])
                + model_table("model-b", "acme/model-b", e.ports["model-b"]))
        yield e
    finally:
        e.stop()


def repo_bytes(env: ModeldEnv, repo: str) -> tuple[int, int]:
    """Files and bytes of a fixture repository as the hub lists them (no .git, no .hub)."""
    root = env.repos / repo
    files = [p for p in root.rglob("*") if p.is_file() and ".git" not in p.relative_to(root).parts
             and ".hub" not in p.relative_to(root).parts]
    return len(files), sum(p.stat().st_size for p in files)


def listing(folder: Path) -> list[tuple]:
    """Every entry under `folder` with what a change to it would alter."""
    out = []
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        out.append((str(p.relative_to(folder)), st.st_mode, st.st_size, st.st_ino, st.st_nlink, st.st_mtime_ns,
                    os.readlink(p) if p.is_symlink() else None))
    return out


def plan(env: ModeldEnv, name: str, *flags: str) -> tuple[int, dict]:
    r = env.modelctl("--json", "plan", name, *flags)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    return r.returncode, json.loads(r.stdout)


def set_reserve(env: ModeldEnv, reserve: str) -> None:
    """Rewrites daemon.disk_reserve and restarts modeld, which reads it at start."""
    text = env.config.read_text()
    old = next(line for line in text.splitlines() if line.startswith("disk_reserve = "))
    env.config.write_text(text.replace(old, f'disk_reserve = "{reserve}"'))
    env.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
    wait_for("modeld after its restart", lambda: env.modelctl("status").returncode == 0, timeout=60)


def test_unknown_model_exits_2_for_plan_verify_and_rm(env):
    for command in ("plan", "verify", "rm"):
        r = env.modelctl(command, "no-such-model")
        assert r.returncode == 2, f"{command}: {r.stdout}{r.stderr}"
        assert "no-such-model" in r.stderr


def test_plan_of_a_model_that_fits_counts_the_checkpoint_and_changes_nothing(env):
    env.models_dir.mkdir(parents=True, exist_ok=True)
    before = listing(env.models_dir)
    code, p = plan(env, "model-a")
    assert code == 0
    files, size = repo_bytes(env, "acme/model-a")
    assert p["fits"] is True and p["shortfall_bytes"] == 0
    assert len(p["commit"]) == 40
    assert (p["files_total"], p["bytes_total"]) == (files, size)
    assert (p["files_to_fetch"], p["bytes_to_fetch"]) == (files, size)
    assert p["bytes_local"] == 0 and p["bytes_partial"] == 0 and p["bytes_needed"] == size
    assert p["evictions"] == [] and p["rollback_possible"] is True
    assert p["bytes_free"] > 0 and p["disk_reserve"] == 0
    human = env.modelctl("plan", "model-a")
    assert human.returncode == 0, human.stderr
    assert "fits" in human.stdout and "does not fit" not in human.stdout
    print(human.stdout)
    assert listing(env.models_dir) == before, "plan must not change anything under models_dir"
    assert not (env.models_dir / ".store" / "model-a").exists()


def test_verify_of_a_model_not_on_disk_exits_2(env):
    r = env.modelctl("verify", "model-a")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "model-a" in r.stderr


def test_plan_of_a_deployed_model_has_nothing_to_fetch(env):
    env.deploy_and_wait("model-a")
    env.deploy_and_wait("model-b")
    assert env.status()["active"]["model"] == "model-b"
    before = listing(env.models_dir)
    code, p = plan(env, "model-a")
    assert code == 0
    assert p["verified"] is True and p["files_to_fetch"] == 0 and p["bytes_to_fetch"] == 0
    assert p["bytes_local"] == p["bytes_total"] == repo_bytes(env, "acme/model-a")[1]
    assert p["active_model"] == "model-b" and p["rollback_possible"] is True
    assert listing(env.models_dir) == before


def shard(env: ModeldEnv, name: str, k: int, n: int) -> Path:
    return env.models_dir / name / f"model-{k:05d}-of-{n:05d}.safetensors"


def test_verify_of_an_intact_deployed_model_exits_0(env):
    r = env.modelctl("verify", "model-a")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verified" in r.stdout
    j = json.loads(env.modelctl("--json", "verify", "model-a").stdout)
    assert j["ok"] is True and j["problems"] == []
    assert (j["files"], j["bytes"]) == repo_bytes(env, "acme/model-a")


def test_verify_finds_one_corrupt_byte_and_names_the_shard(env):
    path = shard(env, "model-a", 2, 3)
    original = path.read_bytes()
    middle = len(original) // 2
    with open(path, "r+b") as f:
        f.seek(middle)
        f.write(bytes([original[middle] ^ 0xFF]))
    try:
        r = env.modelctl("verify", "model-a")
        assert r.returncode == 1, r.stdout + r.stderr
        assert path.name in r.stdout and "checksum_mismatch" in r.stdout
        j = json.loads(env.modelctl("--json", "verify", "model-a").stdout)
        assert j["ok"] is False
        assert [p["file"] for p in j["problems"]] == [path.name]
    finally:
        path.write_bytes(original)
    assert env.modelctl("verify", "model-a").returncode == 0


def test_verify_finds_a_deleted_shard_and_names_it(env):
    path = shard(env, "model-a", 3, 3)
    saved = env.workdir / "saved.safetensors"
    shutil.copy2(path, saved)
    path.unlink()
    try:
        r = env.modelctl("verify", "model-a")
        assert r.returncode == 1, r.stdout + r.stderr
        assert path.name in r.stdout and "missing" in r.stdout
        j = json.loads(env.modelctl("--json", "verify", "model-a").stdout)
        assert {p["file"] for p in j["problems"]} == {path.name}
    finally:
        shutil.copy2(saved, path)
    assert env.modelctl("verify", "model-a").returncode == 0


def model_state(env: ModeldEnv, name: str) -> str:
    r = env.modelctl("--json", "models")
    assert r.returncode == 0, r.stdout + r.stderr
    return next(m["state"] for m in json.loads(r.stdout)["models"] if m["name"] == name)


def test_models_says_corrupt_once_a_verified_models_shard_changed_until_verify_finds_it_intact(env):
    assert model_state(env, "model-a") == "verified"
    path = shard(env, "model-a", 1, 3)
    saved = env.workdir / "saved-1.safetensors"
    shutil.copy2(path, saved)
    path.unlink()
    try:
        assert model_state(env, "model-a") == "corrupt"
        r = env.modelctl("models")
        assert r.returncode == 0 and "corrupt" in r.stdout, r.stdout + r.stderr
    finally:
        shutil.copy2(saved, path)
    # The same bytes in another file: not the file that was verified, until verify hashes it.
    assert model_state(env, "model-a") == "corrupt"
    assert env.modelctl("verify", "model-a").returncode == 0
    assert model_state(env, "model-a") == "verified"


def test_a_deploy_downloads_again_a_shard_edited_since_its_verification(env):
    active = env.status()["active"]["model"]
    assert active != "model-a"
    path = shard(env, "model-a", 2, 3)
    original = path.read_bytes()
    middle = len(original) // 2
    with open(path, "r+b") as f:  # in place: the same file, other bytes
        f.seek(middle)
        f.write(bytes([original[middle] ^ 0xFF]))
    assert model_state(env, "model-a") == "corrupt"
    code, p = plan(env, "model-a")
    assert code == 0 and p["files_to_fetch"] == 1 and p["bytes_to_fetch"] == len(original), p
    dep = env.deploy_and_wait("model-a")
    assert dep["state"] == "succeeded", dep
    assert path.read_bytes() == original
    assert model_state(env, "model-a") == "verified"
    lines = env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep['id']}")
    assert any("changed since" in e.get("MESSAGE", "") and path.name in e.get("MESSAGE", "") for e in lines)
    assert env.deploy_and_wait(active)["state"] == "succeeded"  # as the tests after this one expect


def restart_modeld(env: ModeldEnv) -> int:
    """Restarts modeld and waits for its socket; returns how many modeld journal lines came before."""
    seen = len(env.journal("SYSLOG_IDENTIFIER=modeld"))
    env.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
    wait_for("modeld after its restart", lambda: env.modelctl("status").returncode == 0, timeout=60)
    return seen


def journal_line(env: ModeldEnv, since: int, *words: str) -> dict:
    """Waits for a modeld journal line after the first `since` that holds every one of `words`."""
    def find():
        for e in env.journal("SYSLOG_IDENTIFIER=modeld")[since:]:
            if all(w in e.get("MESSAGE", "") for w in words):
                return e
        return None
    return wait_for(f"a journal line with {words}", find, timeout=60)


def test_a_daemon_start_trusts_unchanged_files_and_rehashes_changed_ones_before_starting_the_model(env):
    active = env.status()["active"]
    name, unit = active["model"], active["unit"]
    # Unchanged: a stat per file, timed in the journal.
    journal_line(env, restart_modeld(env), "unchanged since their verification", " ms)")

    # A byte changed while the model was down (say, a bad disk before a reboot): re-hashed, found,
    # named, and the model is not started on it.
    path = sorted((env.models_dir / name).glob("*.safetensors"))[0]
    original = path.read_bytes()
    env.systemd.run(["systemctl", "stop", unit], check=True)
    with open(path, "r+b") as f:
        f.seek(len(original) // 3)
        f.write(bytes([original[len(original) // 3] ^ 0xFF]))
    try:
        since = restart_modeld(env)
        refused = journal_line(env, since, "not starting", unit)
        named = journal_line(env, since, path.name, "sha256")
        assert named.get("MODELD_FILE") == path.name, named
        assert refused["PRIORITY"] == "3"
        assert env.unit_state(unit) in ("inactive", "failed")
    finally:
        path.write_bytes(original)
    # Repaired: the re-hash passes, the model starts, and the next start trusts it again.
    journal_line(env, restart_modeld(env), "files intact")
    wait_for(f"{unit} active", lambda: env.unit_state(unit) == "active", timeout=60)
    journal_line(env, restart_modeld(env), "unchanged since their verification")


def test_rm_refuses_the_active_model(env):
    r = env.modelctl("rm", "model-b")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "model-b" in r.stderr and "active" in r.stderr
    j = json.loads(env.modelctl("--json", "rm", "model-b").stdout)
    assert j["error"]["code"] == "model_active"
    assert (env.models_dir / ".store" / "model-b").is_dir()


def test_rm_of_an_inactive_model_deletes_its_store_folder_and_link(env):
    r = env.modelctl("rm", "model-a")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Removed model-a" in r.stdout
    assert not (env.models_dir / ".store" / "model-a").exists()
    assert not os.path.lexists(env.models_dir / "model-a")
    models = {m["name"]: m for m in json.loads(env.modelctl("--json", "models").stdout)["models"]}
    assert models["model-a"]["state"] == "absent"
    # Gone from disk but still configured: verify has nothing to check.
    assert env.modelctl("verify", "model-a").returncode == 2


def test_plan_that_needs_the_active_models_room_says_rollback_is_lost(env):
    need = repo_bytes(env, "acme/model-a")[1]
    b_size = sum(p.stat().st_size for p in (env.models_dir / ".store" / "model-b").rglob("*") if p.is_file())
    free = shutil.disk_usage(env.models_dir).free
    # Short by half of model-b: only evicting the active model makes room.
    set_reserve(env, str(free - need + b_size // 2))
    code, p = plan(env, "model-a")
    assert code == 1 and p["fits"] is False and p["evictions"] == []
    code, p = plan(env, "model-a", "--allow-downtime")
    assert code == 0, p
    assert [(e["name"], e["active"]) for e in p["evictions"]] == [("model-b", True)]
    assert p["rollback_possible"] is False
    human = env.modelctl("plan", "model-a", "--allow-downtime")
    assert human.returncode == 0 and "not possible" in human.stdout and "model-b" in human.stdout
    print(human.stdout)


def test_plan_of_a_model_that_does_not_fit_states_needed_and_available(env):
    set_reserve(env, "1000TB")
    before = listing(env.models_dir)
    code, p = plan(env, "model-a")
    assert code == 1
    assert p["fits"] is False and p["shortfall_bytes"] > 0
    assert p["disk_reserve"] == 1000 * 1000 ** 4
    r = env.modelctl("plan", "model-a")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "does not fit by" in r.stdout and "needs" in r.stdout and "available" in r.stdout
    print(r.stdout)
    assert listing(env.models_dir) == before


def test_rm_commit_of_the_linked_revision_removes_the_link(env):
    set_reserve(env, "0")
    assert env.status()["active"]["model"] == "model-b"
    assert env.deploy_and_wait("model-a")["state"] == "succeeded"
    # model-b is out of service, its link still naming the revision it served.
    link = env.models_dir / "model-b"
    commit = Path(os.readlink(link)).name
    assert (env.models_dir / ".store" / "model-b" / commit).is_dir()
    r = env.modelctl("--json", "rm", "model-b", "--commit", commit)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["commits"] == [commit]
    assert not (env.models_dir / ".store" / "model-b" / commit).exists()
    assert not os.path.lexists(link)
    models = {m["name"]: m for m in json.loads(env.modelctl("--json", "models").stdout)["models"]}
    assert models["model-b"]["state"] == "absent" and models["model-b"]["revisions"] == [], models["model-b"]
