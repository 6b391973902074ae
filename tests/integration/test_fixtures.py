"""Tests of the test fixtures themselves: make_checkpoint.py, hub_server.py and fake_vllm.py.

Run: /usr/bin/python3 -m pytest -q tests/integration/test_fixtures.py
Everything talks to 127.0.0.1 only; every process started here is stopped by its fixture.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import re
import socket
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from waiting import poll

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
from make_checkpoint import make_checkpoint, parse_size  # noqa: E402

PY = sys.executable or "/usr/bin/python3"
REPO = "fixture-org/tiny"
SHARDS = 3
SHARD_SIZE = 256 * 1024
DTYPE_SIZE = {"BF16": 2, "F32": 4}


# --- helpers -----------------------------------------------------------------------------------

def wait_for(cond, timeout: float, what: str, proc: subprocess.Popen | None = None, step=0.02):
    """Polls cond() until it returns something truthy; fails after timeout or if proc died."""
    def check():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: process exited with {proc.returncode} first")
        return cond()
    value = poll(check, timeout, step)
    if not value:
        pytest.fail(f"timed out after {timeout}s waiting for {what}")
    return value


class Proc:
    """A child process with stdout/stderr in files, stopped (TERM, then KILL) at close()."""

    def __init__(self, args, workdir: Path, name: str):
        self.out = workdir / f"{name}.stdout"
        self.err = workdir / f"{name}.stderr"
        with open(self.out, "wb") as o, open(self.err, "wb") as e:
            self.p = subprocess.Popen([PY, *map(str, args)], stdout=o, stderr=e,
                                      stdin=subprocess.DEVNULL)

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def terminate(self, timeout=10.0) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_opener = urllib.request.build_opener(NoRedirect)


def fetch(url: str, method="GET", headers=None, data=None, timeout=10):
    """(status, headers, body) without following redirects; HTTP errors are answers too."""
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=data)
    try:
        with _opener.open(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        body = e.read()
        e.close()
        return e.code, e.headers, body


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}"
            f"\nsize {len(data)}\n").encode()


# --- fixtures ----------------------------------------------------------------------------------

@pytest.fixture
def repos(tmp_path) -> Path:
    """DIR with DIR/fixture-org/tiny: a 3-shard checkpoint, a 1.5 MiB .bin and a sub folder."""
    root = tmp_path / "repos"
    repo = root / REPO
    make_checkpoint(repo, shards=SHARDS, shard_size=SHARD_SIZE, seed=7, name=REPO)
    (repo / "big.bin").write_bytes(hashlib.shake_256(b"big").digest(3 * 512 * 1024))
    (repo / "sub").mkdir()
    (repo / "sub" / "notes.txt").write_text("some notes\n")
    (repo / "sub" / "deeper").mkdir()
    (repo / "sub" / "deeper" / "x.json").write_text('{"x": 1}\n')
    return root


class Hub:
    def __init__(self, proc: Proc, ports: dict, log: Path):
        self.proc, self.log = proc, log
        self.hub_port, self.cdn_port = ports["hub_port"], ports["cdn_port"]
        self.ports = ports
        self.url = f"http://127.0.0.1:{self.hub_port}"

    def records(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]


@pytest.fixture
def start_hub(tmp_path, repos):
    started = []

    def start(*flags) -> Hub:
        n = len(started)
        ready = tmp_path / f"hub{n}.ready.json"
        log = tmp_path / f"hub{n}.requests.jsonl"
        proc = Proc([FIXTURES / "hub_server.py", "--repos", repos, "--ready-file", ready,
                     "--request-log", log, *flags], tmp_path, f"hub{n}")
        started.append(proc)

        def ready_ports():
            try:
                return json.loads(ready.read_text())
            except (OSError, ValueError):
                return None
        ports = wait_for(ready_ports, 30, "the hub's ready file", proc.p)
        return Hub(proc, ports, log)

    yield start
    for p in started:
        p.close()


@pytest.fixture
def hub(start_hub) -> Hub:
    return start_hub("--page-size", "4")


# --- make_checkpoint ---------------------------------------------------------------------------

def read_safetensors_header(path: Path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        raw = f.read(n)
    return n, raw, json.loads(raw)


def test_a_checkpoint_is_valid_safetensors_with_a_matching_index(tmp_path):
    info = make_checkpoint(tmp_path / "ck", shards=3, shard_size=100_000, seed=1)
    ck = tmp_path / "ck"
    index = json.loads((ck / "model.safetensors.index.json").read_text())
    assert info["shards"] == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    total = 0
    dtypes = set()
    mapped = {}
    for shard in info["shards"]:
        n, raw, header = read_safetensors_header(ck / shard)
        assert n % 8 == 0 and raw.startswith(b"{")
        assert raw.rstrip(b" ") == raw.rstrip()  # only spaces pad it
        spans = []
        for name, t in header.items():
            if name == "__metadata__":
                continue
            begin, end = t["data_offsets"]
            assert end - begin == math.prod(t["shape"]) * DTYPE_SIZE[t["dtype"]]
            spans.append((begin, end))
            dtypes.add(t["dtype"])
            mapped[name] = shard
        spans.sort()
        assert spans[0][0] == 0
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert 8 + n + spans[-1][1] == (ck / shard).stat().st_size
        total += spans[-1][1]
    assert dtypes == {"BF16", "F32"}
    assert index["metadata"]["total_size"] == total == info["total_size"]
    assert index["weight_map"] == mapped
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        json.loads((ck / f).read_text())
    assert json.loads((ck / "config.json").read_text())["model_type"] == "llama"
    assert json.loads((ck / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert (ck / "README.md").read_text().startswith("---\n")


def test_the_same_arguments_give_the_same_bytes_and_another_seed_other_bytes(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    make_checkpoint(a, shards=2, shard_size=50_000, seed=5)
    r = subprocess.run([PY, FIXTURES / "make_checkpoint.py", "--out", b, "--shards", "2",
                        "--shard-size", "50000", "--seed", "5"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    make_checkpoint(c, shards=2, shard_size=50_000, seed=6)
    names = sorted(p.name for p in a.iterdir())
    assert names and names == sorted(p.name for p in b.iterdir())
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n
    shard = "model-00001-of-00002.safetensors"
    assert (a / shard).read_bytes() != (c / shard).read_bytes()


def test_shard_sizes_parse_with_units_and_bad_ones_are_refused(tmp_path):
    assert parse_size("512MiB") == 512 << 20 and parse_size("4MB") == 4_000_000
    assert parse_size("64k") == 65536 and parse_size("1234") == 1234
    with pytest.raises(ValueError):
        parse_size("lots")
    r = subprocess.run([PY, FIXTURES / "make_checkpoint.py", "--out", tmp_path / "x",
                        "--shard-size", "lots"], capture_output=True, text=True)
    assert r.returncode == 1 and "not a size" in r.stderr


# --- hub_server: listings ----------------------------------------------------------------------

def expected_entries(repo_dir: Path, threshold=1 << 20) -> dict[str, dict]:
    """Independently computed size/blob id/sha256 of every file of a repository folder."""
    out = {}
    for p in sorted(repo_dir.rglob("*")):
        if not p.is_file() or ".hub" in p.relative_to(repo_dir).parts:
            continue
        data = p.read_bytes()
        rel = p.relative_to(repo_dir).as_posix()
        lfs = len(data) > threshold or rel.endswith(".safetensors")
        e = {"size": len(data), "lfs": lfs}
        if lfs:
            ptr = lfs_pointer(data)
            e.update(blobId=git_blob_sha1(ptr), sha256=hashlib.sha256(data).hexdigest(),
                     pointerSize=len(ptr))
        else:
            e.update(blobId=git_blob_sha1(data))
        out[rel] = e
    return out


def test_the_revision_listing_carries_sizes_blob_ids_and_lfs_digests(hub, repos):
    st, h, body = fetch(f"{hub.url}/api/models/{REPO}/revision/main?blobs=true")
    assert st == 200 and h["Content-Type"].startswith("application/json")
    info = json.loads(body)
    assert info["id"] == REPO and re.fullmatch(r"[0-9a-f]{40}", info["sha"])
    want = expected_entries(repos / REPO)
    got = {s["rfilename"]: s for s in info["siblings"]}
    assert set(got) == set(want)
    assert {"big.bin", "sub/notes.txt", "sub/deeper/x.json", "config.json"} <= set(got)
    for name, w in want.items():
        s = got[name]
        assert s["size"] == w["size"] and s["blobId"] == w["blobId"], name
        if w["lfs"]:
            assert s["lfs"] == {"sha256": w["sha256"], "size": w["size"],
                                "pointerSize": w["pointerSize"]}, name
        else:
            assert "lfs" not in s, name
    assert got["big.bin"]["lfs"]  # LFS by size, not by name
    # Without blobs only the names; the commit names the same revision.
    st, _, body = fetch(f"{hub.url}/api/models/{REPO}/revision/main")
    assert st == 200 and set(json.loads(body)["siblings"][0]) == {"rfilename"}
    st, _, body = fetch(f"{hub.url}/api/models/{REPO}/revision/{info['sha']}")
    assert st == 200 and json.loads(body)["sha"] == info["sha"]
    st, h, body = fetch(f"{hub.url}/api/models/{REPO}/revision/nope")
    assert st == 404 and h["X-Error-Code"] == "RevisionNotFound" and "error" in json.loads(body)


def test_the_commit_changes_when_a_file_changes_and_extra_refs_resolve(hub, repos):
    def commit(rev="main"):
        st, _, body = fetch(f"{hub.url}/api/models/{REPO}/revision/{rev}")
        assert st == 200, body
        return json.loads(body)["sha"]
    before = commit()
    assert commit() == before
    # Rewritten in place (same inode, another size): the old commit's bytes are gone.
    (repos / REPO / "sub" / "notes.txt").write_text("other notes\n")
    after = commit()
    assert after != before
    st, h, _ = fetch(f"{hub.url}/api/models/{REPO}/revision/{before}")
    assert st == 404 and h["X-Error-Code"] == "RevisionNotFound"
    # .hub/refs.json: a branch with a slash, URL-encoded whole; .hub itself is never listed.
    pr = repos / REPO / ".hub" / "pr1"
    pr.mkdir(parents=True)
    (pr / "config.json").write_text("{}\n")
    (repos / REPO / ".hub" / "refs.json").write_text(json.dumps({"refs/pr/1": "pr1"}))
    st, _, body = fetch(f"{hub.url}/api/models/{REPO}/revision/refs%2Fpr%2F1?blobs=true")
    assert st == 200
    assert [s["rfilename"] for s in json.loads(body)["siblings"]] == ["config.json"]
    assert commit() == after


def test_a_branch_named_after_a_commit_with_a_slash_is_its_own_revision(hub, repos):
    # A branch "C/sub" (C: main's commit) whose extra.json differs from main's sub/extra.json.
    (repos / REPO / "sub" / "extra.json").write_text('{"from": "the commit"}\n')
    st, _, body = fetch(f"{hub.url}/api/models/{REPO}/revision/main")
    commit = json.loads(body)["sha"]
    branch = repos / REPO / ".hub" / "slash"
    branch.mkdir(parents=True)
    (branch / "extra.json").write_text('{"from": "the branch"}\n')
    (repos / REPO / ".hub" / "refs.json").write_text(json.dumps({f"{commit}/sub": "slash"}))
    # resolve: %2F names the branch, a raw slash the commit's subfolder.
    assert fetch(f"{hub.url}/{REPO}/resolve/{commit}%2Fsub/extra.json")[2] == b'{"from": "the branch"}\n'
    assert fetch(f"{hub.url}/{REPO}/resolve/{commit}/sub/extra.json")[2] == b'{"from": "the commit"}\n'
    # /revision: both forms name the branch.
    for rev in (f"{commit}%2Fsub", f"{commit}/sub"):
        st, _, body = fetch(f"{hub.url}/api/models/{REPO}/revision/{rev}")
        assert st == 200, (rev, body)
        listing = json.loads(body)
        assert listing["sha"] != commit and [s["rfilename"] for s in listing["siblings"]] == ["extra.json"], rev
    st, _, body = fetch(f"{hub.url}/api/models/{REPO}/tree/{commit}%2Fsub")
    assert [e["path"] for e in json.loads(body)] == ["extra.json"]
    st, _, body = fetch(f"{hub.url}/api/models/{REPO}/tree/{commit}/sub")
    assert "sub/extra.json" in [e["path"] for e in json.loads(body)]


def test_json_is_gzipped_when_asked_and_files_never_are(start_hub):
    import gzip
    hub = start_hub()
    url = f"{hub.url}/api/models/{REPO}/revision/main?blobs=true"
    st, h, plain = fetch(url)
    assert st == 200 and h.get("Content-Encoding") is None and h["Vary"] == "Accept-Encoding"
    st, h, packed = fetch(url, headers={"Accept-Encoding": "gzip, deflate"})
    assert st == 200 and h["Content-Encoding"] == "gzip" and int(h["Content-Length"]) == len(packed)
    assert json.loads(gzip.decompress(packed)) == json.loads(plain)
    assert fetch(url, headers={"Accept-Encoding": "gzip;q=0, identity"})[1].get("Content-Encoding") is None
    # An error of the Hub is JSON too; a file of the repository never is compressed.
    st, h, _ = fetch(f"{hub.url}/api/models/{REPO}/revision/nope", headers={"Accept-Encoding": "gzip"})
    assert st == 404 and h["Content-Encoding"] == "gzip"
    st, h, body = fetch(f"{hub.url}/{REPO}/resolve/main/config.json", headers={"Accept-Encoding": "gzip"})
    assert st == 200 and h.get("Content-Encoding") is None and json.loads(body)
    seen = [r for r in hub.records() if r["path"] == url.removeprefix(hub.url)]
    assert [r["accept_encoding"] for r in seen] == ["identity", "gzip, deflate", "gzip;q=0, identity"]
    always = start_hub("--gzip", "always")
    st, h, packed = fetch(f"{always.url}/api/models/{REPO}/revision/main")
    assert h["Content-Encoding"] == "gzip" and json.loads(gzip.decompress(packed))["sha"]
    off = start_hub("--gzip", "off")
    st, h, _ = fetch(f"{off.url}/api/models/{REPO}/revision/main", headers={"Accept-Encoding": "gzip"})
    assert h.get("Content-Encoding") is None and h.get("Vary") is None


def test_the_tree_pages_follow_the_link_header(hub, repos):
    url = f"{hub.url}/api/models/{REPO}/tree/main?recursive=true"
    entries, pages = [], 0
    while url:
        st, h, body = fetch(url)
        assert st == 200
        page = json.loads(body)
        assert 1 <= len(page) <= 4
        entries += page
        pages += 1
        link = h.get("Link")
        m = re.fullmatch(r'<(http://[^>]+)>; rel="next"', link) if link else None
        assert (m is not None) == bool(link)
        url = m.group(1) if m else None
        assert url is None or "cursor=" in url and "recursive=true" in url
    want = expected_entries(repos / REPO)
    files = {e["path"]: e for e in entries if e["type"] == "file"}
    dirs = {e["path"] for e in entries if e["type"] == "directory"}
    assert pages == math.ceil(len(entries) / 4) and pages >= 3
    assert set(files) == set(want) and dirs == {"sub", "sub/deeper"}
    for name, w in want.items():
        e = files[name]
        assert e["size"] == w["size"] and e["oid"] == w["blobId"]
        if w["lfs"]:
            assert e["lfs"] == {"oid": w["sha256"], "size": w["size"], "pointerSize": w["pointerSize"]}
    # Not recursive: direct children only; a sub-path lists below it.
    st, h, body = fetch(f"{hub.url}/api/models/{REPO}/tree/main/sub")
    assert st == 200 and "Link" not in h
    assert sorted(e["path"] for e in json.loads(body)) == ["sub/deeper", "sub/notes.txt"]
    st, h, _ = fetch(f"{hub.url}/api/models/{REPO}/tree/main/nothing?recursive=true")
    assert st == 404 and h["X-Error-Code"] == "EntryNotFound"


# --- hub_server: downloads ---------------------------------------------------------------------

def test_a_plain_file_resolves_to_its_bytes_with_git_etag_and_ranges(hub, repos):
    data = (repos / REPO / "config.json").read_bytes()
    url = f"{hub.url}/{REPO}/resolve/main/config.json"
    st, h, body = fetch(url)
    assert st == 200 and body == data
    assert h["ETag"] == f'"{git_blob_sha1(data)}"'
    assert re.fullmatch(r"[0-9a-f]{40}", h["X-Repo-Commit"])
    assert int(h["Content-Length"]) == len(data)
    st, h, body = fetch(url, headers={"Range": "bytes=10-"})
    assert st == 206 and body == data[10:] and h["Content-Range"] == f"bytes 10-{len(data) - 1}/{len(data)}"
    st, h, body = fetch(url, headers={"Range": "bytes=2-5"})
    assert st == 206 and body == data[2:6]
    st, h, body = fetch(url, headers={"Range": f"bytes={len(data)}-"})
    assert st == 416 and h["Content-Range"] == f"bytes */{len(data)}"
    st, h, body = fetch(url, method="HEAD")
    assert st == 200 and body == b"" and int(h["Content-Length"]) == len(data)
    st, h, _ = fetch(f"{hub.url}/{REPO}/resolve/main/sub/deeper/x.json")
    assert st == 200
    st, h, body = fetch(f"{hub.url}/{REPO}/resolve/main/missing.json")
    assert st == 404 and h["X-Error-Code"] == "EntryNotFound" and h["X-Error-Message"]
    assert "error" in json.loads(body)


def test_an_lfs_file_redirects_to_the_cdn_which_serves_ranges(hub, repos):
    name = "model-00002-of-00003.safetensors"
    data = (repos / REPO / name).read_bytes()
    st, h, _ = fetch(f"{hub.url}/{REPO}/resolve/main/{name}")
    assert st == 302
    sha = hashlib.sha256(data).hexdigest()
    assert h["X-Linked-Etag"] == f'"{sha}"' and int(h["X-Linked-Size"]) == len(data)
    assert re.fullmatch(r"[0-9a-f]{40}", h["X-Repo-Commit"]) and h["ETag"]
    loc = urllib.parse.urlsplit(h["Location"])
    assert loc.scheme == "http" and loc.hostname == "127.0.0.1" and loc.port == hub.cdn_port
    assert loc.port != hub.hub_port and "Expires=" in loc.query
    st, h2, _ = fetch(f"{hub.url}/{REPO}/resolve/main/{name}", method="HEAD")
    assert st == 302 and h2["X-Linked-Size"] == str(len(data))
    cdn = h["Location"]
    st, h, body = fetch(cdn)
    assert st == 200 and body == data and int(h["Content-Length"]) == len(data)
    st, h, body = fetch(cdn, headers={"Range": "bytes=1000-"})
    assert st == 206 and body == data[1000:]
    assert h["Content-Range"] == f"bytes 1000-{len(data) - 1}/{len(data)}"
    assert int(h["Content-Length"]) == len(data) - 1000
    st, h, _ = fetch(cdn, headers={"Range": f"bytes={len(data)}-"})
    assert st == 416 and h["Content-Range"] == f"bytes */{len(data)}"
    st, _, _ = fetch(cdn.replace("Signature=", "Signature=0"))
    assert st == 403
    # Files above the threshold are LFS too.
    st, h, _ = fetch(f"{hub.url}/{REPO}/resolve/main/big.bin")
    assert st == 302 and fetch(h["Location"])[2] == (repos / REPO / "big.bin").read_bytes()


def test_keep_alive_connections_serve_several_answers(hub):
    conn = http.client.HTTPConnection("127.0.0.1", hub.hub_port, timeout=10)
    try:
        for path in (f"/{REPO}/resolve/main/config.json", f"/{REPO}/resolve/main/nope",
                     f"/api/models/{REPO}/revision/main", "/x/y/resolve/main/z"):
            conn.request("GET", path)
            r = conn.getresponse()
            r.read()
            assert r.status in (200, 401, 404) and r.getheader("Content-Length") is not None
    finally:
        conn.close()


def test_odd_file_names_get_a_clean_404(hub):
    for name in ("caf%C3%A9.json", "a%0D%0AX-Evil:%201", "%2E%2E/%2E%2E/etc/passwd"):
        st, h, body = fetch(f"{hub.url}/{REPO}/resolve/main/{name}")
        assert st in (400, 404) and "X-Evil" not in h
        assert int(h["Content-Length"]) == len(body) and "error" in json.loads(body)


def test_unknown_repositories_answer_401_anonymously_and_404_with_a_token(hub):
    for url in (f"{hub.url}/api/models/nobody/nothing/revision/main",
                f"{hub.url}/nobody/nothing/resolve/main/config.json"):
        st, h, body = fetch(url)
        assert st == 401 and h["X-Error-Code"] == "RepoNotFound" and json.loads(body)["error"]
        st, h, _ = fetch(url, headers={"Authorization": "Bearer anything"})
        assert st == 404 and h["X-Error-Code"] == "RepoNotFound"


def test_a_token_is_required_on_the_hub_and_never_asked_by_the_cdn(start_hub):
    hub = start_hub("--token", "hf_secret")
    url = f"{hub.url}/{REPO}/resolve/main/model-00001-of-00003.safetensors"
    st, h, _ = fetch(url)
    assert st == 401 and h["X-Error-Code"] == "GatedRepo"
    st, h, body = fetch(url, headers={"Authorization": "Bearer wrong"})
    # A token the Hub does not know is refused with 401, before the repository is looked at.
    assert st == 401 and "X-Error-Code" not in h
    assert h["X-Error-Message"] == "Invalid credentials in Authorization header"
    assert json.loads(body)["error"] == "Invalid credentials in Authorization header"
    st, h, _ = fetch(f"{hub.url}/api/models/{REPO}/revision/main")
    assert st == 401 and h["X-Error-Code"] == "GatedRepo"
    good = {"Authorization": "Bearer hf_secret"}
    st, h, _ = fetch(url, headers=good)
    assert st == 302
    st, _, body = fetch(h["Location"])  # a careful client drops the token off-origin
    assert st == 200 and len(body) > 0
    st, _, _ = fetch(f"{hub.url}/nobody/nothing/resolve/main/x", headers=good)
    assert st == 404
    recs = hub.records()
    hub_recs = [r for r in recs if r["origin"] == "hub"]
    cdn_recs = [r for r in recs if r["origin"] == "cdn"]
    assert len(hub_recs) == 5 and len(cdn_recs) == 1
    assert [r["authorization"] for r in hub_recs] == [None, "Bearer wrong", None, "Bearer hf_secret",
                                                     "Bearer hf_secret"]
    assert not cdn_recs[0]["authorization_present"] and cdn_recs[0]["authorization"] is None
    # The log does see a leak: a client that forwards the token to the CDN is recorded.
    fetch(h["Location"], headers=good)
    leak = hub.records()[-1]
    assert leak["origin"] == "cdn" and leak["authorization_present"]
    assert leak["authorization"] == "Bearer hf_secret" and leak["method"] == "GET"


# --- hub_server: faults ------------------------------------------------------------------------

def test_a_wrong_token_gets_401_and_a_valid_token_without_access_gets_403(start_hub):
    hub = start_hub("--token", "hf_secret", "--token-no-access", "hf_other")
    wrong, other = {"Authorization": "Bearer hf_wrong"}, {"Authorization": "Bearer hf_other"}
    for url in (f"{hub.url}/api/models/{REPO}/revision/main", f"{hub.url}/{REPO}/resolve/main/config.json",
                f"{hub.url}/api/models/{REPO}/tree/main", f"{hub.url}/nobody/nothing/resolve/main/x"):
        st, h, _ = fetch(url, headers=wrong)
        assert st == 401 and h["X-Error-Message"] == "Invalid credentials in Authorization header", url
        assert "X-Error-Code" not in h, url
    st, h, _ = fetch(f"{hub.url}/api/models/{REPO}/revision/main", headers=other)
    assert st == 403 and h["X-Error-Code"] == "GatedRepo"
    st, h, _ = fetch(f"{hub.url}/{REPO}/resolve/main/config.json", headers=other)
    assert st == 403 and h["X-Error-Code"] == "GatedRepo"
    st, h, _ = fetch(f"{hub.url}/nobody/nothing/resolve/main/x", headers=other)
    assert st == 404 and h["X-Error-Code"] == "RepoNotFound"
    assert fetch(f"{hub.url}/{REPO}/resolve/main/config.json",
                 headers={"Authorization": "Bearer hf_secret"})[0] == 200


def test_old_commits_stay_served_after_a_push_that_replaces_files(hub, repos):
    def info(rev: str):
        st, _, body = fetch(f"{hub.url}/api/models/{REPO}/revision/{rev}?blobs=true")
        assert st == 200, body
        return json.loads(body)
    shard = "model-00002-of-00003.safetensors"
    old_shard, old_config = (repos / REPO / shard).read_bytes(), (repos / REPO / "config.json").read_bytes()
    old = info("main")["sha"]
    # The push: another checkpoint (every shard and config.json change), written by renames.
    make_checkpoint(repos / REPO, shards=SHARDS, shard_size=SHARD_SIZE, seed=8, name=REPO)
    new_info = info("main")
    new = new_info["sha"]
    assert new != old and (repos / REPO / shard).read_bytes() != old_shard
    old_info = info(old)
    assert old_info["sha"] == old
    sizes = {x["rfilename"]: x["size"] for x in old_info["siblings"]}
    assert sizes[shard] == len(old_shard)
    lfs = {x["rfilename"]: x["lfs"]["sha256"] for x in old_info["siblings"] if "lfs" in x}
    assert lfs[shard] == hashlib.sha256(old_shard).hexdigest()
    assert lfs[shard] != {x["rfilename"]: x.get("lfs", {}).get("sha256")
                          for x in new_info["siblings"]}[shard]
    # Resolve at the old commit: the old bytes, plain and LFS (through the CDN); main: the new.
    st, h, body = fetch(f"{hub.url}/{REPO}/resolve/{old}/config.json")
    assert st == 200 and body == old_config and h["X-Repo-Commit"] == old
    st, h, _ = fetch(f"{hub.url}/{REPO}/resolve/{old}/{shard}")
    assert st == 302 and h["X-Repo-Commit"] == old
    st, _, body = fetch(h["Location"], headers={"Range": "bytes=100-"})
    assert st == 206 and body == old_shard[100:]
    st, h, _ = fetch(f"{hub.url}/{REPO}/resolve/main/{shard}")
    assert st == 302 and h["X-Repo-Commit"] == new
    assert fetch(h["Location"])[2] == (repos / REPO / shard).read_bytes()
    st, _, body = fetch(f"{hub.url}/api/models/{REPO}/tree/{old}?recursive=true")  # one page of 4
    page = [x for x in json.loads(body) if x["type"] == "file"]
    assert st == 200 and page and all(sizes[x["path"]] == x["size"] for x in page)
    # The hard links live in a dot folder beside the repositories, never listed as one.
    objects = [d for d in repos.iterdir() if d.name.startswith(".hub-objects-")]
    assert len(objects) == 1 and any(objects[0].iterdir())
    assert fetch(f"{hub.url}/api/models/.hub-objects/x")[0] in (401, 404)
    # A file of the old commit that is gone for good (no link left) ends the old commit.
    for f in objects[0].iterdir():
        if f.stat().st_size == len(old_shard) and f.read_bytes() == old_shard:
            f.unlink()
    st, h, _ = fetch(f"{hub.url}/api/models/{REPO}/revision/{old}")
    assert st == 404 and h["X-Error-Code"] == "RevisionNotFound"


def test_the_object_folder_is_removed_when_the_hub_exits(start_hub, repos):
    hub = start_hub()
    assert [d for d in repos.iterdir() if d.name.startswith(".hub-objects-")]
    assert hub.proc.terminate() == 0
    assert not [d for d in repos.iterdir() if d.name.startswith(".hub-objects-")]


def test_cdn_host_puts_the_cdn_on_another_loopback_host(start_hub, repos):
    hub = start_hub("--cdn-host", "127.0.0.2", "--token", "hf_secret")
    assert hub.ports["cdn_host"] == "127.0.0.2"
    name = "model-00001-of-00003.safetensors"
    st, h, _ = fetch(f"{hub.url}/{REPO}/resolve/main/{name}", headers={"Authorization": "Bearer hf_secret"})
    assert st == 302
    loc = urllib.parse.urlsplit(h["Location"])
    assert loc.hostname == "127.0.0.2" and loc.port == hub.cdn_port
    st, _, body = fetch(h["Location"])
    assert st == 200 and body == (repos / REPO / name).read_bytes()
    # The CDN listens on 127.0.0.2 only; the Hub on 127.0.0.1 only.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", hub.cdn_port), timeout=10).close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", hub.hub_port), timeout=10).close()
    cdn = [r for r in hub.records() if r["origin"] == "cdn"]
    assert len(cdn) == 1 and not cdn[0]["authorization_present"]
    assert cdn[0]["file"] == f"{REPO}/{name}"


def test_resolve_fail_first_faults_the_resolve_route_not_the_cdn(start_hub, repos):
    hub = start_hub("--resolve-fail-first", "2", "--resolve-fail-glob", "*.safetensors",
                    "--retry-after", "1")
    name = "model-00003-of-00003.safetensors"
    url = f"{hub.url}/{REPO}/resolve/main/{name}"
    st, h, _ = fetch(url, method="HEAD")
    assert st == 302  # HEAD is never faulted, nor counted
    for _ in range(2):
        st, h, body = fetch(url)
        assert st == 502 and h["Retry-After"] == "1" and "Injected resolve failure" in json.loads(body)["error"]
    st, h, _ = fetch(url)
    assert st == 302
    st, _, body = fetch(h["Location"])  # the CDN is never faulted by it
    assert st == 200 and body == (repos / REPO / name).read_bytes()
    assert fetch(f"{hub.url}/{REPO}/resolve/main/config.json")[0] == 200  # not matched
    # Each matched file has its own count.
    assert fetch(f"{hub.url}/{REPO}/resolve/main/model-00001-of-00003.safetensors")[0] == 502


def test_resolve_fail_status_reset_resets_the_connection_without_an_answer(start_hub, tmp_path, repos):
    control = tmp_path / "faults.json"
    hub = start_hub("--control", control)
    path = f"/{REPO}/resolve/main/config.json"
    tmp = tmp_path / "faults.tmp"
    tmp.write_text(json.dumps({"resolve_fail_first": 1, "resolve_fail_glob": "config.json",
                               "resolve_fail_status": "reset"}))
    os.replace(tmp, control)
    raw, err = read_until_closed(raw_get(hub.hub_port, path))
    assert raw == b"" and isinstance(err, ConnectionResetError), (raw, err)
    st, _, body = fetch(f"{hub.url}{path}")
    assert st == 200 and body == (repos / REPO / "config.json").read_bytes()
    # A change of the control file starts the count again; 503 through it too.
    tmp.write_text(json.dumps({"resolve_fail_first": 1, "resolve_fail_status": 503}))
    os.replace(tmp, control)
    assert fetch(f"{hub.url}{path}")[0] == 503
    assert fetch(f"{hub.url}{path}")[0] == 200


def test_fail_first_answers_503_with_retry_after_then_the_file(start_hub, repos):
    hub = start_hub("--fail-first", "2", "--fail-glob", "*.json")
    url = f"{hub.url}/{REPO}/resolve/main/config.json"
    for _ in range(2):
        st, h, body = fetch(url)
        assert st == 503 and h["Retry-After"] == "0" and int(h["Content-Length"]) == len(body)
    st, _, body = fetch(url)
    assert st == 200 and body == (repos / REPO / "config.json").read_bytes()
    assert fetch(f"{hub.url}/{REPO}/resolve/main/README.md")[0] == 200  # not matched
    st, _, _ = fetch(f"{hub.url}/{REPO}/resolve/main/tokenizer.json", method="HEAD")
    assert st == 200  # HEAD is never faulted and not counted
    assert fetch(f"{hub.url}/{REPO}/resolve/main/tokenizer.json")[0] == 503


def test_fail_first_on_an_lfs_file_fails_at_the_cdn(start_hub):
    hub = start_hub("--fail-first", "1", "--fail-glob", "*.safetensors", "--fail-status", "429")
    st, h, _ = fetch(f"{hub.url}/{REPO}/resolve/main/model-00003-of-00003.safetensors")
    assert st == 302
    st, h2, _ = fetch(h["Location"])
    assert st == 429 and h2["Retry-After"] == "0"
    assert fetch(h["Location"])[0] == 200


def test_truncate_cuts_the_first_download_short_once(start_hub, repos):
    hub = start_hub("--truncate", "model-00001*")
    name = "model-00001-of-00003.safetensors"
    data = (repos / REPO / name).read_bytes()
    _, h, _ = fetch(f"{hub.url}/{REPO}/resolve/main/{name}")
    loc = urllib.parse.urlsplit(h["Location"])
    conn = http.client.HTTPConnection("127.0.0.1", loc.port, timeout=10)
    try:
        conn.request("GET", f"{loc.path}?{loc.query}")
        r = conn.getresponse()
        assert r.status == 200 and int(r.getheader("Content-Length")) == len(data)
        with pytest.raises(http.client.IncompleteRead) as e:
            r.read()
        assert len(e.value.partial) == len(data) // 2
    finally:
        conn.close()
    st, _, body = fetch(h["Location"])
    assert st == 200 and body == data
    st, h, _ = fetch(f"{hub.url}/{REPO}/resolve/main/README.md")
    assert st == 200  # not matched


def test_stall_sends_half_then_nothing_once(start_hub, repos):
    hub = start_hub("--stall", "README.md", "--stall-seconds", "30")
    data = (repos / REPO / "README.md").read_bytes()
    conn = http.client.HTTPConnection("127.0.0.1", hub.hub_port, timeout=0.5)
    try:
        conn.request("GET", f"/{REPO}/resolve/main/README.md")
        r = conn.getresponse()
        assert r.status == 200 and int(r.getheader("Content-Length")) == len(data)
        assert r.read(len(data) // 2) == data[:len(data) // 2]
        with pytest.raises((socket.timeout, TimeoutError)):
            r.read(1)
    finally:
        conn.close()
    st, _, body = fetch(f"{hub.url}/{REPO}/resolve/main/README.md")
    assert st == 200 and body == data
    assert hub.proc.terminate(timeout=10) == 0  # a stalled answer does not hold up shutdown


def test_html_200_answers_an_error_page_instead_of_the_file(start_hub, repos):
    hub = start_hub("--html-200", "config.json")
    st, h, body = fetch(f"{hub.url}/{REPO}/resolve/main/config.json")
    assert st == 200 and h["Content-Type"].startswith("text/html") and body.startswith(b"<!DOCTYPE")
    assert "ETag" not in h and "X-Repo-Commit" not in h
    st, h, body = fetch(f"{hub.url}/{REPO}/resolve/main/generation_config.json")
    assert st == 200 and body == (repos / REPO / "generation_config.json").read_bytes()


def test_throttle_limits_the_rate_of_a_body(start_hub, repos):
    hub = start_hub("--throttle", "400000")
    name = "model-00002-of-00003.safetensors"
    size = (repos / REPO / name).stat().st_size
    _, h, _ = fetch(f"{hub.url}/{REPO}/resolve/main/{name}")
    t0 = time.monotonic()
    st, _, body = fetch(h["Location"])
    elapsed = time.monotonic() - t0
    assert st == 200 and len(body) == size
    assert elapsed >= 0.8 * size / 400000


def test_corrupt_and_ignore_range_flags(start_hub, repos):
    hub = start_hub("--corrupt", "README.md", "--ignore-range", "config.json")
    data = (repos / REPO / "README.md").read_bytes()
    st, h, body = fetch(f"{hub.url}/{REPO}/resolve/main/README.md")
    assert st == 200 and len(body) == len(data) and body != data and body[1:] == data[1:]
    assert h["ETag"] == f'"{git_blob_sha1(data)}"'  # still the real file's digest
    cfg = (repos / REPO / "config.json").read_bytes()
    st, h, body = fetch(f"{hub.url}/{REPO}/resolve/main/config.json", headers={"Range": "bytes=5-"})
    assert st == 200 and body == cfg and "Content-Range" not in h


def test_the_control_file_changes_faults_while_running(start_hub, tmp_path):
    control = tmp_path / "faults.json"
    hub = start_hub("--control", control)
    url = f"{hub.url}/{REPO}/resolve/main/README.md"
    assert fetch(url)[0] == 200
    tmp = tmp_path / "faults.tmp"
    tmp.write_text(json.dumps({"fail_first": 1, "fail_glob": "README.md", "fail_status": 500}))
    os.replace(tmp, control)
    assert fetch(url)[0] == 500
    assert fetch(url)[0] == 200
    control.unlink()
    assert fetch(url)[0] == 200


def raw_get(port: int, path: str, timeout=10.0, headers=None, tls_ctx=None) -> socket.socket:
    """Sends a GET on a fresh connection and returns the socket, unread."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if tls_ctx is not None:
        s = tls_ctx.wrap_socket(s, server_hostname="127.0.0.1")
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n".encode())
    return s


def read_until_closed(s: socket.socket) -> tuple[bytes, BaseException | None]:
    """Everything the peer sent until it closed (or reset: the error is returned)."""
    data = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                return data, None
            data += b
    except OSError as e:
        return data, e
    finally:
        s.close()


def cdn_path(hub: Hub, name: str) -> str:
    st, h, _ = fetch(f"{hub.url}/{REPO}/resolve/main/{name}")
    assert st == 302
    loc = urllib.parse.urlsplit(h["Location"])
    return f"{loc.path}?{loc.query}"


def stats(hub: Hub) -> dict:
    st, _, body = fetch(f"{hub.url}/_fixture/stats")
    assert st == 200
    return json.loads(body)


def test_the_byte_counter_counts_body_bytes_per_origin_and_file(hub, repos):
    name = "model-00002-of-00003.safetensors"
    size = (repos / REPO / name).stat().st_size
    before = stats(hub)
    assert before["hub_body_bytes"] == before["cdn_body_bytes"] == before["requests"] == 0
    assert before["by_path"] == {}
    st, h, redirect_body = fetch(f"{hub.url}/{REPO}/resolve/main/{name}")
    st, _, body = fetch(h["Location"], headers={"Range": "bytes=1000-"})
    assert st == 206
    config = (repos / REPO / "config.json").read_bytes()
    assert fetch(f"{hub.url}/{REPO}/resolve/main/config.json")[2] == config
    after = stats(hub)
    assert after["cdn_body_bytes"] == size - 1000
    assert after["by_path"] == {f"{REPO}/{name}": size - 1000, f"{REPO}/config.json": len(config)}
    assert after["hub_body_bytes"] == len(redirect_body) + len(config)
    assert after["requests"] == 3  # the stats route is neither counted nor logged
    assert [r["file"] for r in hub.records()] == [f"{REPO}/{name}"] * 2 + [f"{REPO}/config.json"]
    # HEAD sends no body.
    fetch(f"{hub.url}/{REPO}/resolve/main/config.json", method="HEAD")
    assert stats(hub)["hub_body_bytes"] == after["hub_body_bytes"]


def test_chunked_cut_sends_half_in_chunks_without_the_last_chunk(start_hub, repos):
    hub = start_hub("--chunked-cut", "model-00001*")
    name = "model-00001-of-00003.safetensors"
    data = (repos / REPO / name).read_bytes()
    raw, err = read_until_closed(raw_get(hub.cdn_port, cdn_path(hub, name)))
    assert err is None
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head and b"Content-Length" not in head
    payload, rest = b"", body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        n = int(size_line, 16)
        assert n > 0, "the final 0-size chunk must not be sent"
        payload += rest[:n]
        assert rest[n:n + 2] == b"\r\n"
        rest = rest[n + 2:]
    assert payload == data[:len(data) // 2]
    assert stats(hub)["by_path"][f"{REPO}/{name}"] == len(data) // 2
    st, h, body = fetch(f"http://127.0.0.1:{hub.cdn_port}{cdn_path(hub, name)}")
    assert st == 200 and body == data and "Transfer-Encoding" not in h  # once only


def test_reset_sends_part_of_the_body_then_an_rst(start_hub, repos):
    hub = start_hub("--reset", "big.bin")
    data = (repos / REPO / "big.bin").read_bytes()
    raw, err = read_until_closed(raw_get(hub.cdn_port, cdn_path(hub, "big.bin")))
    assert isinstance(err, ConnectionResetError), (err, len(raw))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and f"Content-Length: {len(data)}".encode() in head
    assert body == data[:len(data) // 2]  # every byte sent arrived before the reset
    assert stats(hub)["by_path"][f"{REPO}/big.bin"] == len(data) // 2
    assert fetch(f"http://127.0.0.1:{hub.cdn_port}{cdn_path(hub, 'big.bin')}")[2] == data


def test_no_answer_reads_the_request_and_stays_silent(start_hub, repos):
    hub = start_hub("--no-answer", "README.md", "--stall-seconds", "30")
    s = raw_get(hub.hub_port, f"/{REPO}/resolve/main/README.md", timeout=0.5)
    try:
        with pytest.raises((socket.timeout, TimeoutError)):
            s.recv(1)
    finally:
        s.close()
    assert [r["file"] for r in hub.records()] == [f"{REPO}/README.md"]  # it was read
    st, _, body = fetch(f"{hub.url}/{REPO}/resolve/main/README.md")
    assert st == 200 and body == (repos / REPO / "README.md").read_bytes()
    assert hub.proc.terminate(timeout=10) == 0  # a silent connection does not hold up shutdown


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_fail_status_works_for_every_retryable_status(start_hub, status):
    hub = start_hub("--fail-first", "1", "--fail-glob", "config.json", "--fail-status", str(status),
                    "--retry-after", "3")
    st, h, body = fetch(f"{hub.url}/{REPO}/resolve/main/config.json")
    assert st == status and h["Retry-After"] == "3" and "error" in json.loads(body)
    assert fetch(f"{hub.url}/{REPO}/resolve/main/config.json")[0] == 200


def test_retry_after_is_sent_verbatim_as_an_http_date(start_hub):
    import email.utils
    date = email.utils.formatdate(time.time() + 2, usegmt=True)
    hub = start_hub("--fail-first", "1", "--retry-after", date)
    st, h, _ = fetch(f"{hub.url}/{REPO}/resolve/main/config.json")
    assert st == 503 and h["Retry-After"] == date


def test_lfs_pointer_answers_the_pointer_text_instead_of_a_redirect(start_hub, repos):
    hub = start_hub("--lfs-pointer", "*.safetensors")
    name = "model-00003-of-00003.safetensors"
    data = (repos / REPO / name).read_bytes()
    st, h, body = fetch(f"{hub.url}/{REPO}/resolve/main/{name}")
    assert st == 200 and body == lfs_pointer(data) and 120 <= len(body) <= 140
    assert int(h["Content-Length"]) == len(body) and "X-Linked-Etag" not in h and "Location" not in h
    assert fetch(f"{hub.url}/{REPO}/resolve/main/big.bin")[0] == 302  # LFS but not matched
    assert fetch(f"{hub.url}/{REPO}/resolve/main/{name}", method="HEAD")[0] == 302  # HEAD: never


def test_range_416_refuses_the_first_ranged_download_once(start_hub, repos):
    hub = start_hub("--range-416", "config.json")
    data = (repos / REPO / "config.json").read_bytes()
    url = f"{hub.url}/{REPO}/resolve/main/config.json"
    assert fetch(url)[0] == 200  # no Range: not matched, not counted
    st, h, _ = fetch(url, headers={"Range": "bytes=10-"})
    assert st == 416 and h["Content-Range"] == f"bytes */{len(data)}"
    st, _, body = fetch(url, headers={"Range": "bytes=10-"})
    assert st == 206 and body == data[10:]


def test_listing_fail_is_switched_through_the_control_file(start_hub, tmp_path, repos):
    control = tmp_path / "faults.json"
    hub = start_hub("--control", control, "--retry-after", "1")
    listing = f"{hub.url}/api/models/{REPO}/revision/main?blobs=true"
    assert fetch(listing)[0] == 200
    tmp = tmp_path / "faults.tmp"
    tmp.write_text(json.dumps({"listing_fail": True}))
    os.replace(tmp, control)
    st, h, body = fetch(listing)
    assert st == 503 and h["Retry-After"] == "1" and "error" in json.loads(body)
    assert fetch(f"{hub.url}/api/models/{REPO}/tree/main?recursive=true")[0] == 503
    assert fetch(f"{hub.url}/{REPO}/resolve/main/config.json")[0] == 200  # downloads still work
    tmp.write_text(json.dumps({"listing_fail": 500}))
    os.replace(tmp, control)
    assert fetch(listing)[0] == 500
    control.unlink()
    assert fetch(listing)[0] == 200
    hub2 = start_hub("--listing-fail")
    assert fetch(f"{hub2.url}/api/models/{REPO}/revision/main")[0] == 503


def test_expand_answers_only_the_properties_asked_for(hub):
    st, _, body = fetch(f"{hub.url}/api/models/{REPO}/revision/main?blobs=true")
    full = json.loads(body)
    st, _, body = fetch(f"{hub.url}/api/models/{REPO}/revision/main?expand=sha")
    assert st == 200
    assert json.loads(body) == {"_id": full["_id"], "id": REPO, "sha": full["sha"]}
    st, _, body = fetch(f"{hub.url}/api/models/{REPO}/revision/main?expand[]=sha&expand[]=siblings")
    assert set(json.loads(body)) == {"_id", "id", "sha", "siblings"}


def test_listing_synthetic_delay_and_drip_shape_the_listing(start_hub, tmp_path):
    control = tmp_path / "faults.json"
    hub = start_hub("--control", control, "--listing-synthetic", "3")
    url = f"{hub.url}/api/models/{REPO}/revision/main?blobs=true"
    st, _, body = fetch(url)
    siblings = json.loads(body)["siblings"]
    extra = [s for s in siblings if s["rfilename"].startswith("extra/")]
    assert [s["rfilename"] for s in extra] == ["extra/000000.bin", "extra/000001.bin", "extra/000002.bin"]
    assert extra[2]["size"] == 1002 and len(extra[2]["blobId"]) == 40
    # A dripping listing: the head at once, then one byte each 0.05 s (a whole answer still arrives).
    tmp = tmp_path / "faults.tmp"
    tmp.write_text(json.dumps({"listing_drip": 0.05, "listing_synthetic": 0}))
    os.replace(tmp, control)
    small = f"{hub.url}/api/models/{REPO}/revision/main?expand=sha"
    with urllib.request.urlopen(small, timeout=30) as r:
        assert r.status == 200
        t0 = time.monotonic()
        first = r.read(1)
        rest = r.read()
        took = time.monotonic() - t0
    assert json.loads(first + rest)["id"] == REPO
    assert took >= 0.05 * (len(first + rest) - 2)
    tmp.write_text(json.dumps({"listing_delay": 0.5}))
    os.replace(tmp, control)
    t0 = time.monotonic()
    assert fetch(small)[0] == 200
    assert time.monotonic() - t0 >= 0.5



def test_listing_hold_keeps_a_listing_unanswered_until_the_control_file_releases_it(start_hub, tmp_path):
    import threading
    control = tmp_path / "faults.json"
    control.write_text(json.dumps({"listing_hold": f"{REPO}/*"}))
    hub = start_hub("--control", control)
    answers = {}
    held = threading.Thread(target=lambda: answers.update(
        held=fetch(f"{hub.url}/api/models/{REPO}/revision/main", timeout=60)[0]))
    held.start()
    wait_for(lambda: stats(hub)["held"] == 1, 10, "the held listing")
    # Only listings of the matched repository wait: another repository's answers at once.
    assert fetch(f"{hub.url}/api/models/other-org/none/revision/main")[0] == 401  # unknown, as the Hub
    assert held.is_alive() and "held" not in answers
    tmp = tmp_path / "faults.tmp"
    tmp.write_text(json.dumps({}))
    os.replace(tmp, control)
    held.join(30)
    assert answers == {"held": 200} and stats(hub)["held"] == 0

def test_tls_serves_both_origins_with_the_given_certificate(start_hub, tmp_path, repos):
    import ssl
    from modeld_env import make_ca, make_leaf
    ca = make_ca(tmp_path / "pki")
    cert, key = make_leaf(ca, tmp_path / "pki", "hub")
    hub = start_hub("--tls-cert", cert, "--tls-key", key)
    ctx = ssl.create_default_context(cafile=str(ca[0]))
    https = urllib.request.build_opener(NoRedirect, urllib.request.HTTPSHandler(context=ctx))
    base = f"https://127.0.0.1:{hub.hub_port}"
    with https.open(f"{base}/api/models/{REPO}/revision/main") as r:
        assert r.status == 200 and json.loads(r.read())["id"] == REPO
    name = "model-00001-of-00003.safetensors"
    try:
        https.open(f"{base}/{REPO}/resolve/main/{name}")
        pytest.fail("expected a redirect")
    except urllib.error.HTTPError as e:
        assert e.code == 302
        loc = e.headers["Location"]
        e.close()
    assert loc.startswith(f"https://127.0.0.1:{hub.cdn_port}/")
    with https.open(loc) as r:
        assert r.read() == (repos / REPO / name).read_bytes()
    # A client that does not trust the CA refuses it; a plain-HTTP client gets nothing useful,
    # and neither blocks the next client.
    with pytest.raises(urllib.error.URLError) as e:
        urllib.request.urlopen(f"{base}/api/models/{REPO}/revision/main", timeout=10,
                               context=ssl.create_default_context())
    assert "CERTIFICATE_VERIFY_FAILED" in str(e.value)
    silent = socket.create_connection(("127.0.0.1", hub.hub_port))
    try:
        with https.open(f"{base}/_fixture/stats") as r:
            assert json.loads(r.read())["cdn_body_bytes"] == (repos / REPO / name).stat().st_size
    finally:
        silent.close()


def test_the_hub_exits_0_on_sigterm(start_hub):
    hub = start_hub()
    assert fetch(f"{hub.url}/api/models/{REPO}/revision/main")[0] == 200
    assert hub.proc.terminate(timeout=10) == 0


def test_the_hub_refuses_a_missing_repos_folder(tmp_path):
    r = subprocess.run([PY, FIXTURES / "hub_server.py", "--repos", tmp_path / "nope"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "nope" in r.stderr


# --- fake_vllm ---------------------------------------------------------------------------------

@pytest.fixture
def model_dir(tmp_path) -> Path:
    d = tmp_path / "model"
    make_checkpoint(d, shards=SHARDS, shard_size=64 * 1024, seed=3)
    return d


@pytest.fixture
def start_vllm(tmp_path):
    started = []

    def start(model: Path, *flags, name="tiny") -> Proc:
        p = Proc([FIXTURES / "fake_vllm.py", "serve", model, "--served-model-name", name,
                  "--port", "0", *flags], tmp_path, f"vllm{len(started)}")
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()


def vllm_port(p: Proc) -> int:
    m = wait_for(lambda: re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", p.stdout()),
                 30, "fake vLLM to listen", p.p)
    return int(m.group(1))


def refused(start_vllm, model: Path) -> str:
    p = start_vllm(model)
    assert p.p.wait(30) == 1
    return p.stderr()


def test_fake_vllm_refuses_a_checkpoint_with_a_deleted_shard(start_vllm, model_dir):
    (model_dir / "model-00002-of-00003.safetensors").unlink()
    err = refused(start_vllm, model_dir)
    assert "model-00002-of-00003.safetensors" in err and "missing" in err


def test_fake_vllm_refuses_a_truncated_shard_naming_it(start_vllm, model_dir):
    shard = model_dir / "model-00003-of-00003.safetensors"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 10)
    err = refused(start_vllm, model_dir)
    assert "model-00003-of-00003.safetensors" in err and "truncated" in err


def test_fake_vllm_refuses_a_tensor_missing_from_its_shard(start_vllm, model_dir):
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.9.ghost.weight"] = "model-00001-of-00003.safetensors"
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    err = refused(start_vllm, model_dir)
    assert "model.layers.9.ghost.weight" in err and "model-00001-of-00003.safetensors" in err


def test_fake_vllm_refuses_a_bad_header_and_a_missing_tokenizer(start_vllm, model_dir, tmp_path):
    shard = model_dir / "model-00001-of-00003.safetensors"
    good = shard.read_bytes()
    shard.write_bytes(struct.pack("<Q", 200_000_000) + good[8:])
    err = refused(start_vllm, model_dir)
    assert "model-00001-of-00003.safetensors" in err and "header length" in err
    n = struct.unpack("<Q", good[:8])[0]
    hdr = json.loads(good[8:8 + n])
    t = next(k for k in hdr if k.endswith("q_proj.weight"))
    hdr[t]["shape"][0] += 1  # size no longer matches the offsets
    raw = json.dumps(hdr).encode()
    raw += b" " * (-len(raw) % 8)
    shard.write_bytes(struct.pack("<Q", len(raw)) + raw + good[8 + n:])
    err = refused(start_vllm, model_dir)
    assert t in err and "model-00001-of-00003.safetensors" in err
    shard.write_bytes(good)
    (model_dir / "tokenizer.json").unlink()
    assert "tokenizer" in refused(start_vllm, model_dir)


def post(url, obj, headers=None):
    return fetch(url, method="POST", data=json.dumps(obj).encode(),
                 headers={"Content-Type": "application/json", **(headers or {})})


def test_fake_vllm_serves_a_good_checkpoint(start_vllm, model_dir):
    p = start_vllm(model_dir, "--tensor-parallel-size", "8", "--trust-remote-code")
    base = f"http://127.0.0.1:{vllm_port(p)}"
    st, h, body = fetch(f"{base}/health")
    assert st == 200 and body == b""
    st, _, body = fetch(f"{base}/v1/models")
    m = json.loads(body)
    assert st == 200 and m["object"] == "list"
    assert m["data"][0]["id"] == "tiny" and m["data"][0]["owned_by"] == "vllm"
    assert m["data"][0]["root"] == str(model_dir)
    st, _, body = post(f"{base}/v1/completions", {"model": "tiny", "prompt": "Hello there",
                                                  "max_tokens": 5})
    c = json.loads(body)
    assert st == 200 and c["object"] == "text_completion" and c["model"] == "tiny"
    assert len(c["choices"][0]["text"].split()) == 5
    assert c["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    again = json.loads(post(f"{base}/v1/completions", {"model": "tiny", "prompt": "Hello there",
                                                       "max_tokens": 5})[2])
    assert again["choices"][0]["text"] == c["choices"][0]["text"]
    st, h, body = post(f"{base}/v1/completions", {"model": "tiny", "prompt": "Hi",
                                                  "max_tokens": 3, "stream": True})
    assert st == 200 and h["Content-Type"].startswith("text/event-stream")
    events = [line[6:] for line in body.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) == 4
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    st, _, body = post(f"{base}/v1/completions", {"model": "other", "prompt": "x", "max_tokens": 1})
    assert st == 404 and "other" in json.loads(body)["message"]
    st, _, body = post(f"{base}/v1/chat/completions",
                       {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 2})
    assert st == 200 and json.loads(body)["choices"][0]["message"]["role"] == "assistant"
    out = p.stdout()
    assert "Loading safetensors checkpoint shards" in out and '"GET /health HTTP/1.1" 200' in out
    assert "ignoring vLLM options" in out
    assert p.terminate(timeout=10) == 0


def stream_times(url: str, max_tokens: int) -> tuple[float, list[float]]:
    """Streams a completion; returns (time to the first token event, times of every token event
    after the request was sent), read as the events arrive."""
    conn = http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc, timeout=60)
    try:
        t0 = time.monotonic()
        conn.request("POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": "Hi", "max_tokens": max_tokens,
                                                            "stream": True}),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200
        times = []
        while True:
            line = r.fp.readline()  # the raw chunked stream: chunk sizes, then event lines
            if not line or line.startswith(b"data: [DONE]"):
                break
            if line.startswith(b"data: {"):
                times.append(time.monotonic() - t0)
        return times[0], times
    finally:
        conn.close()


def test_fake_vllm_token_seconds_spaces_every_token_and_stays_alive(start_vllm, model_dir):
    p = start_vllm(model_dir, "--token-seconds", "0.2")
    base = f"http://127.0.0.1:{vllm_port(p)}"
    first, times = stream_times(base, 5)
    assert len(times) == 5
    # Each token takes at least 0.2 s: the first after 0.2 s, 5 after 1 s (lower bounds only).
    assert first >= 0.2 and times[-1] >= 1.0
    assert all(b - a >= 0.15 for a, b in zip(times, times[1:])), times
    # Not streamed: the whole answer after max_tokens * S; /health answers meanwhile.
    t0 = time.monotonic()
    st, _, body = post(f"{base}/v1/completions", {"model": "tiny", "prompt": "Hi", "max_tokens": 3})
    assert st == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
    assert time.monotonic() - t0 >= 0.6


def test_fake_vllm_token_seconds_file_changes_the_pace_of_a_running_server(start_vllm, model_dir, tmp_path):
    pace = tmp_path / "pace"
    p = start_vllm(model_dir, "--token-seconds-file", pace)
    base = f"http://127.0.0.1:{vllm_port(p)}"
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 1}
    t0 = time.monotonic()
    assert post(f"{base}/v1/completions", body)[0] == 200
    fast = time.monotonic() - t0
    (tmp_path / "pace.tmp").write_text("1.5\n")
    os.replace(tmp_path / "pace.tmp", pace)
    import threading
    done = {}

    def slow():
        t = time.monotonic()
        done["status"] = post(f"{base}/v1/completions", body)[0]
        done["seconds"] = time.monotonic() - t
    th = threading.Thread(target=slow)
    th.start()
    # Slow but alive: while the completion takes its 1.5 s, /health and /v1/models answer.
    assert fetch(f"{base}/health")[0] == 200 and fetch(f"{base}/v1/models")[0] == 200
    th.join(60)
    assert done["status"] == 200 and done["seconds"] >= 1.5, (done, fast)
    pace.unlink()
    t0 = time.monotonic()
    assert post(f"{base}/v1/completions", body)[0] == 200
    assert time.monotonic() - t0 < 1.5  # back to full speed (an upper bound: S itself)


def test_fake_vllm_api_key_guards_v1_but_not_health(start_vllm, model_dir):
    p = start_vllm(model_dir, "--api-key", "k3y")
    base = f"http://127.0.0.1:{vllm_port(p)}"
    assert fetch(f"{base}/health")[0] == 200
    st, _, body = fetch(f"{base}/v1/models")
    assert st == 401 and json.loads(body) == {"error": "Unauthorized"}
    assert fetch(f"{base}/v1/models", headers={"Authorization": "Bearer nope"})[0] == 401
    assert fetch(f"{base}/v1/models", headers={"Authorization": "Bearer k3y"})[0] == 200
    st, _, _ = post(f"{base}/v1/completions", {"model": "tiny", "prompt": "a", "max_tokens": 1},
                    headers={"Authorization": "Bearer k3y"})
    assert st == 200
    assert "k3y" not in p.stdout()


def test_fake_vllm_exits_0_on_sigterm_while_loading(start_vllm, model_dir):
    p = start_vllm(model_dir, "--load-seconds", "120")
    wait_for(lambda: "Loading weights" in p.stdout(), 30, "a loading line", p.p)
    t0 = time.monotonic()
    assert p.terminate(timeout=10) == 0
    assert time.monotonic() - t0 < 5
    assert "Uvicorn running" not in p.stdout()


def test_fake_vllm_fail_health_and_exit_after(start_vllm, model_dir):
    # 5 s: room for the /health request below on a slow host before the server exits.
    p = start_vllm(model_dir, "--fail-health", "--exit-after", "5", "--exit-code", "3")
    port = vllm_port(p)
    assert fetch(f"http://127.0.0.1:{port}/health")[0] == 503
    assert p.p.wait(30) == 3


def test_fake_vllm_health_body_answers_500_with_those_bytes(start_vllm, model_dir):
    p = start_vllm(model_dir, "--health-body", "fffe206e6f74")
    status, _, body = fetch(f"http://127.0.0.1:{vllm_port(p)}/health")
    assert (status, body) == (500, b"\xff\xfe not")


def test_fake_vllm_ignore_sigterm_needs_sigkill(start_vllm, model_dir):
    p = start_vllm(model_dir, "--ignore-sigterm")
    base = f"http://127.0.0.1:{vllm_port(p)}"
    p.p.send_signal(signal.SIGTERM)
    assert fetch(f"{base}/health")[0] == 200  # answered after the signal arrived
    assert p.p.poll() is None
    p.p.kill()
    assert p.p.wait(10) == -signal.SIGKILL


def quiet_for(p: Proc, seconds: float) -> bool:
    """Whether p prints nothing new for `seconds` (a deadline on a condition that must not come)."""
    before = p.stdout() + p.stderr()
    return poll(lambda: p.stdout() + p.stderr() != before, seconds, 0.05) is None


def process_state(pid: int) -> str | None:
    """The state letter in /proc/PID/stat (R, S, Z, ...), or None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def test_fake_vllm_logs_a_progress_line_every_progress_every_seconds_while_loading(start_vllm, model_dir):
    t0 = time.monotonic()
    p = start_vllm(model_dir, "--load-seconds", "600", "--progress-every", "0.2")
    wait_for(lambda: p.stdout().count("Loading weights...") >= 4, 30, "4 progress lines", p.p)
    took = time.monotonic() - t0
    # Never more often than every 0.2 s (a slow host only spaces them out), and not listening yet.
    assert p.stdout().count("Loading weights...") <= took / 0.2 + 2, (took, p.stdout())
    assert "Uvicorn running" not in p.stdout()
    assert p.terminate(timeout=10) == 0


def test_fake_vllm_generation_until_answers_health_and_models_at_once_and_completions_later(
        start_vllm, model_dir, tmp_path):
    gate = tmp_path / "generate"
    p = start_vllm(model_dir, "--generation-until", str(gate))
    base = f"http://127.0.0.1:{vllm_port(p)}"
    body = json.dumps({"model": "tiny", "prompt": "Hi", "max_tokens": 1}).encode()
    assert fetch(f"{base}/health")[0] == 200
    assert fetch(f"{base}/v1/models")[0] == 200
    status, _, answer = fetch(f"{base}/v1/completions", "POST", {"Content-Type": "application/json"}, body)
    assert status == 503 and b"warming up" in answer
    gate.touch()
    status, _, answer = fetch(f"{base}/v1/completions", "POST", {"Content-Type": "application/json"}, body)
    assert status == 200, answer


def test_fake_vllm_generation_after_answers_completions_503_until_then(start_vllm, model_dir):
    # 600 s: the 503 is certain however slow the host; "later" is --generation-until's test.
    p = start_vllm(model_dir, "--generation-after", "600")
    base = f"http://127.0.0.1:{vllm_port(p)}"
    assert fetch(f"{base}/health")[0] == 200
    body = json.dumps({"model": "tiny", "prompt": "Hi", "max_tokens": 1}).encode()
    status, _, answer = fetch(f"{base}/v1/completions", "POST", {"Content-Type": "application/json"}, body)
    assert status == 503 and b"--generation-after" in answer


def test_fake_vllm_hang_prints_one_loading_line_then_stays_silent_and_never_listens(start_vllm, model_dir):
    p = start_vllm(model_dir, "--hang")
    wait_for(lambda: "Loading weights..." in p.stdout(), 30, "the loading line", p.p)
    assert quiet_for(p, 1.0)
    assert p.p.poll() is None
    assert "Uvicorn running" not in p.stdout()
    assert p.terminate() == 0


def test_fake_vllm_die_during_load_prints_load_lines_then_exits_with_the_exit_code(start_vllm, model_dir):
    # 2 s of loading: two progress lines 0.2 s apart fit however slow the host.
    p = start_vllm(model_dir, "--die-during-load", "2", "--exit-code", "7", "--progress-every", "0.2")
    assert p.p.wait(30) == 7
    assert "Loading weights... shard group 2" in p.stdout()
    assert "CUDA error: out of memory while loading weights" in p.stderr()
    assert "Uvicorn running" not in p.stdout()


def test_fake_vllm_exit_zero_after_ready_becomes_ready_then_exits_0(start_vllm, model_dir):
    # 5 s: room for the /health request below on a slow host before the server exits.
    p = start_vllm(model_dir, "--exit-zero-after-ready", "5")
    assert fetch(f"http://127.0.0.1:{vllm_port(p)}/health")[0] == 200
    assert p.p.wait(30) == 0
    assert "Exiting on its own" in p.stdout()


def test_fake_vllm_child_ignores_sigterm_outlives_the_main_process(start_vllm, model_dir):
    p = start_vllm(model_dir, "--child-ignores-sigterm")
    vllm_port(p)
    pid = int(wait_for(lambda: re.search(r"worker process (\d+) ignores SIGTERM", p.stdout()), 30,
                       "the worker line", p.p).group(1))
    try:
        os.kill(pid, signal.SIGTERM)
        assert p.terminate() == 0
        assert process_state(pid) not in (None, "Z"), "the worker must outlive the main process"
    finally:
        if process_state(pid) is not None:
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: process_state(pid) in (None, "Z"), 10, "the worker to end on SIGKILL")


def test_fake_vllm_hold_port_after_exit_keeps_the_port_bound_after_the_main_process_exits(start_vllm, model_dir):
    # 5 s: longer than a slow host takes from the holder's line to the test's bind below.
    p = start_vllm(model_dir, "--hold-port-after-exit", "5")
    port = vllm_port(p)

    def bindable() -> bool:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
                s.listen()
                return True
            except OSError:
                return False

    assert p.terminate() == 0
    held = wait_for(lambda: re.search(rf"port {port} held by (\d+) for 5 s", p.stdout()), 10, "the holder line")
    holder = int(held.group(1))
    try:
        assert not bindable(), "the port must stay in use after the main process exited"
        wait_for(bindable, 15, "the port to be released", step=0.1)
    finally:
        if process_state(holder) not in (None, "Z"):
            os.kill(holder, signal.SIGKILL)
