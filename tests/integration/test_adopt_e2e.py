"""End to end: adopting a model folder made outside modeld (issue 4). A folder written by
`hf download --local-dir` (with that tool's records under .cache/huggingface/download/, written
here in its format) or copied by hand at models_dir/NAME is hashed against the listing; matching
files join the revision as hard links and only the files that differ cross the wire."""

from __future__ import annotations

import filecmp
import json
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from modeld_env import ModeldEnv, completion, free_port, model_table
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

SHARDS = 3
SHARD_SIZE = 300_000


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = ModeldEnv(workdir=tmp_path_factory.mktemp("adopt"))
    names = ["hfdl", "byhand", "linked"]
    for i, name in enumerate(names):
        e.add_repo(f"acme/{name}", shards=SHARDS, shard_size=SHARD_SIZE, seed=10 + i)
    e.ports = {n: free_port() for n in names}
    try:
        e.start("".join(model_table(n, f"acme/{n}", e.ports[n]) for n in names))
        yield e
    finally:
        e.stop()


def repo_files(env: ModeldEnv, name: str) -> list[str]:
    root = env.repos / "acme" / name
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and not {".git", ".hub"} & set(p.relative_to(root).parts))


def shards(env: ModeldEnv, name: str) -> list[str]:
    return [f for f in repo_files(env, name) if f.endswith(".safetensors")]


def listing(env: ModeldEnv, name: str) -> dict:
    """The Hub's answer for acme/NAME at main: commit and per file its digest."""
    with urllib.request.urlopen(f"{env.hub.endpoint}/api/models/acme/{name}/revision/main?blobs=true",
                                timeout=10) as r:
        return json.loads(r.read())


def copy_checkpoint(env: ModeldEnv, name: str, dest: Path) -> None:
    src = env.repos / "acme" / name
    for rel in repo_files(env, name):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dest / rel)


def write_hf_records(env: ModeldEnv, name: str, folder: Path) -> None:
    """What `hf download --local-dir` leaves per file: commit, ETag (sha256 for LFS files, the git
    blob id otherwise) and the time, in folder/.cache/huggingface/download/PATH.metadata."""
    info = listing(env, name)
    for s in info["siblings"]:
        etag = s["lfs"]["sha256"] if s.get("lfs") else s["blobId"]
        meta = folder / ".cache" / "huggingface" / "download" / (s["rfilename"] + ".metadata")
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(f"{info['sha']}\n{etag}\n{time.time() + 2}\n")


INDEX = "model.safetensors.index.json"


def fetched(env: ModeldEnv, name: str, plannings: int) -> set[str]:
    """Files of acme/NAME whose contents crossed the wire (CDN downloads, plain-file resolves).
    Each planning (a deployment's, or a `modelctl plan`) reads the safetensors index from the Hub
    to check the shards it names, so the index counts as fetched only beyond `plannings` reads."""
    prefix = f"acme/{name}/"
    got = [r["file"][len(prefix):] for r in env.hub.requests()
           if r["method"] == "GET" and (r.get("file") or "").startswith(prefix)
           and (r["origin"] == "cdn" or not r["file"].endswith(".safetensors"))]
    assert got.count(INDEX) >= plannings, got
    for _ in range(plannings):
        got.remove(INDEX)
    return set(got)


def plan(env: ModeldEnv, name: str) -> dict:
    r = env.modelctl("--json", "plan", name)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(data)


def assert_served(env: ModeldEnv, name: str) -> None:
    served = env.models_dir / name
    assert served.is_symlink() and env.status()["active"]["model"] == name
    files = repo_files(env, name)
    assert files, f"acme/{name} has no files"
    for rel in files:
        assert filecmp.cmp(served / rel, env.repos / "acme" / name / rel, shallow=False), rel
    assert completion(env.ports[name], name)


def adopted_folder(env: ModeldEnv, name: str) -> Path:
    found = sorted((env.models_dir / ".adopted").glob(f"{name}-*"))
    assert len(found) == 1, found
    return found[0]


def not_adopted_lines(env: ModeldEnv, name: str) -> dict[str, str]:
    return {e.get("MODELD_FILE"): e["MESSAGE"] for e in env.journal("MODELD_MODEL=" + name)
            if e["MESSAGE"].startswith("not adopted")}


def test_an_hf_download_folder_is_adopted_and_only_the_files_that_differ_are_fetched(env):
    name = "hfdl"
    folder = env.models_dir / name
    copy_checkpoint(env, name, folder)
    write_hf_records(env, name, folder)
    s = shards(env, name)
    # 1: same size, its record says it is right, one byte is wrong: only hashing finds it.
    flip_byte(folder / s[0], SHARD_SIZE // 2)
    # 2: an older revision's file, and hf download's record says so (another ETag): not hashed.
    flip_byte(folder / s[1], 100)
    meta = folder / ".cache" / "huggingface" / "download" / (s[1] + ".metadata")
    lines = meta.read_text().splitlines()
    meta.write_text(f"0123456789abcdef0123456789abcdef01234567\n{'ab' * 32}\n{lines[2]}\n")
    # 3: absent.
    (folder / "config.json").unlink()
    before = {rel: (folder / rel).stat().st_ino for rel in repo_files(env, name) if (folder / rel).exists()}

    p = plan(env, name)
    assert p["adopt_from"] == str(folder)
    # The dry run hashes nothing: the flipped shard with a right-looking record still counts.
    assert p["files_adoptable"] == len(repo_files(env, name)) - 2, p
    text = env.modelctl("plan", name).stdout
    print(text)
    assert "Adopt:" in text and str(folder) in text, text

    dep = env.deploy_and_wait(name)
    assert dep["state"] == "succeeded", dep
    assert fetched(env, name, plannings=3) == {s[0], s[1], "config.json"}
    assert_served(env, name)

    # The matching files are the user's own inodes (hard links, no copy); the folder is kept aside.
    kept = adopted_folder(env, name)
    for rel, ino in before.items():
        assert (kept / rel).stat().st_ino == ino, rel
        if rel not in (s[0], s[1]):
            assert (env.models_dir / name / rel).stat().st_ino == ino, rel
    assert (kept / ".cache" / "huggingface" / "download").is_dir()

    why = not_adopted_lines(env, name)
    for e in env.journal("MODELD_MODEL=" + name, "MODELD_PHASE=planning"):
        print(e["MESSAGE"])
    assert "sha256 is" in why[s[0]] and "the listing says" in why[s[0]], why
    assert "hf download recorded" in why[s[1]] and "0123456789ab" in why[s[1]], why


def test_a_folder_copied_by_hand_is_adopted_and_a_truncated_shard_is_fetched_again(env):
    name = "byhand"
    folder = env.models_dir / name
    copy_checkpoint(env, name, folder)
    s = shards(env, name)
    with open(folder / s[-1], "r+b") as f:
        f.truncate(SHARD_SIZE // 3)  # an interrupted copy
    dep = env.deploy_and_wait(name)
    assert dep["state"] == "succeeded", dep
    assert fetched(env, name, plannings=1) == {s[-1]}
    assert_served(env, name)
    assert f"{SHARD_SIZE // 3} bytes, the listing says" in not_adopted_lines(env, name)[s[-1]]
    # A deployment of the model as it now stands adopts nothing more: it is the store's.
    assert plan(env, name)["adopt_from"] is None


def test_a_symlink_to_a_users_folder_is_adopted_and_the_folder_left_where_it_was(env):
    name = "linked"
    mine = env.workdir / "operators-copy"
    copy_checkpoint(env, name, mine)
    (env.models_dir / name).symlink_to(mine, target_is_directory=True)
    dep = env.deploy_and_wait(name)
    assert dep["state"] == "succeeded", dep
    assert fetched(env, name, plannings=1) == set()
    assert_served(env, name)
    # The operator's folder is untouched; their symlink is kept aside, still pointing at it.
    assert sorted(str(p.relative_to(mine)) for p in mine.rglob("*") if p.is_file()) == repo_files(env, name)
    aside = adopted_folder(env, name)
    assert aside.is_symlink() and aside.resolve() == mine.resolve()
