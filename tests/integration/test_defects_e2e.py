"""End to end, one defect per checkpoint: a healthy model serves, then checkpoints that each carry
exactly one defect are deployed. Every one must end `failed` before `stopping_old`, with the error
code and a message naming the file, the tensor where one is concerned, and the problem; and the
serving model must not notice: same unit process, same files, still answering.

The Hub fixture lists whatever is on disk, so structural defects arrive with matching hashes and
only verification can catch them; a corrupted download and files dropped by `exclude` are caught
while downloading and while planning."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from modeld_env import ModeldEnv, completion, free_port, model_table
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"
# The second tensor of shard 1 by offset (after model.embed_tokens.weight): an F32 [128] norm.
NORM = "model.layers.0.input_layernorm.weight"
PHASES = ["planning", "freeing_disk", "downloading", "verifying", "warming", "stopping_old"]


# --- building defective safetensors ------------------------------------------------------------

def read_safetensors(path: Path) -> tuple[dict, bytes]:
    """(header JSON, data buffer) of a valid safetensors file."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_safetensors(path: Path, header: dict | bytes, data: bytes) -> None:
    """Writes the 8-byte length, the header (a dict, or raw bytes taken as they are) padded with
    spaces to a multiple of 8, then `data`."""
    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def edit_header(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    """A mutation of shard 1 that changes its header in place and keeps its data."""
    def mutate(repo: Path) -> None:
        header, data = read_safetensors(repo / SHARD1)
        edit(header)
        write_safetensors(repo / SHARD1, header, data)
    return mutate


def replace_header(text: bytes) -> Callable[[Path], None]:
    """A mutation of shard 1 whose header becomes `text` (its length stays right)."""
    def mutate(repo: Path) -> None:
        _, data = read_safetensors(repo / SHARD1)
        write_safetensors(repo / SHARD1, text, data)
    return mutate


def set_header_length(n: Callable[[int], int]) -> Callable[[Path], None]:
    """A mutation of shard 1 whose 8-byte header length becomes n(file size); nothing else changes."""
    def mutate(repo: Path) -> None:
        raw = (repo / SHARD1).read_bytes()
        (repo / SHARD1).write_bytes(struct.pack("<Q", n(len(raw))) + raw[8:])
    return mutate


def shift_from(tensor: str, delta: int) -> Callable[[Path], None]:
    """A mutation of shard 1 that moves `tensor` and every tensor after it by `delta` bytes and
    inserts (delta > 0: a gap) or removes (delta < 0: an overlap with the tensor before) as many
    bytes of the buffer, so every tensor keeps its size and the file its 8 + N + buffer length."""
    def mutate(repo: Path) -> None:
        header, data = read_safetensors(repo / SHARD1)
        at = header[tensor]["data_offsets"][0]
        for name, entry in header.items():
            if name != "__metadata__" and entry["data_offsets"][0] >= at:
                entry["data_offsets"] = [o + delta for o in entry["data_offsets"]]
        data = data[:at] + bytes(delta) + data[at:] if delta > 0 else data[:at + delta] + data[at:]
        write_safetensors(repo / SHARD1, header, data)
    return mutate


def append_bytes(n: int) -> Callable[[Path], None]:
    def mutate(repo: Path) -> None:
        with open(repo / SHARD1, "ab") as f:
            f.write(b"\0" * n)
    return mutate


def truncate_shard(n: int) -> Callable[[Path], None]:
    def mutate(repo: Path) -> None:
        raw = (repo / SHARD1).read_bytes()
        (repo / SHARD1).write_bytes(raw[:n])
    return mutate


def edit_index(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def mutate(repo: Path) -> None:
        index = json.loads((repo / INDEX).read_text())
        edit(index["weight_map"])
        (repo / INDEX).write_text(json.dumps(index, indent=2))
    return mutate


def write_file(name: str, text: str) -> Callable[[Path], None]:
    def mutate(repo: Path) -> None:
        (repo / name).write_text(text)
    return mutate


def delete_file(name: str) -> Callable[[Path], None]:
    def mutate(repo: Path) -> None:
        (repo / name).unlink()
    return mutate


def no_change(repo: Path) -> None:
    pass


# --- the defects -------------------------------------------------------------------------------

@dataclass
class Defect:
    name: str                        # model name and test id
    mutate: Callable[[Path], None]   # applied to a freshly generated 2-shard checkpoint
    phase: str                       # the phase the deployment must stop in
    code: str                        # error.code
    file: str                        # the file the message (and MODELD_FILE) names
    says: list[str]                  # substrings of the message that name the problem
    tensor: str = ""                 # the tensor the message (and MODELD_TENSOR) names
    model_extra: str = ""            # extra lines of the [models.NAME] table
    hub_faults: dict = field(default_factory=dict)  # hub control file while it deploys


DEFECTS = [
    # safetensors structure (hub-protocol.md "safetensors")
    Defect("header-past-end", set_header_length(lambda size: size), "verifying", "safetensors_invalid", SHARD1,
           ["header length", "past the end"]),
    Defect("header-over-limit", set_header_length(lambda size: 100_000_001), "verifying", "safetensors_invalid",
           SHARD1, ["100000001", "exceeds the limit of 100000000"]),
    Defect("shorter-than-8-bytes", truncate_shard(5), "verifying", "safetensors_invalid", SHARD1,
           ["5 bytes", "too short"]),
    Defect("header-not-json", replace_header(b'{"model.embed_tokens.weight": {"dtype": "BF16",'), "verifying",
           "safetensors_invalid", SHARD1, ["not valid JSON", "column"]),
    Defect("header-not-object", replace_header(b'["model.embed_tokens.weight"]'), "verifying",
           "safetensors_invalid", SHARD1, ["not a JSON object", "starts with '['"]),
    Defect("unknown-dtype", edit_header(lambda h: h[NORM].update(dtype="Q4_K")), "verifying",
           "safetensors_invalid", SHARD1, ['unknown dtype "Q4_K"'], tensor=NORM),
    Defect("byte-count", edit_header(lambda h: h[NORM].update(shape=[127])), "verifying", "safetensors_invalid",
           SHARD1, ["span 512 bytes", "need 508"], tensor=NORM),
    Defect("gap", shift_from(NORM, 16), "verifying", "safetensors_invalid", SHARD1, ["hole"], tensor=NORM),
    Defect("overlap", shift_from(NORM, -16), "verifying", "safetensors_invalid", SHARD1, ["overlaps"], tensor=NORM),
    Defect("trailing-bytes", append_bytes(24), "verifying", "safetensors_invalid", SHARD1,
           ["24 trailing bytes after the last tensor", "8 + "]),
    # the index against the shards' headers
    Defect("index-names-absent-shard", delete_file(SHARD2), "planning", "checkpoint_incomplete", SHARD2,
           [INDEX, "does not have"]),
    Defect("index-maps-absent-tensor",
           edit_index(lambda wm: wm.update({"model.layers.0.self_attn.k_proj.weight": SHARD1})),
           "verifying", "checkpoint_incomplete", SHARD1, [INDEX, "not in its header"],
           tensor="model.layers.0.self_attn.k_proj.weight"),
    # a weight_map entry that is no shard name: planning reads the index and refuses it, as
    # verifying would (one parser, lib/verify/index.hpp)
    Defect("index-shard-not-a-string", edit_index(lambda wm: wm.update({NORM: 7})), "planning",
           "checkpoint_incomplete", INDEX, [INDEX, f"tensor '{NORM}'", "shard is not a string"]),
    Defect("index-lacks-tensor", edit_index(lambda wm: wm.pop("model.layers.1.mlp.down_proj.weight")),
           "verifying", "checkpoint_incomplete", SHARD2, [INDEX, "does not map it"],
           tensor="model.layers.1.mlp.down_proj.weight"),
    # config.json
    Defect("config-not-json", write_file("config.json", '{"model_type": "llama",\n'), "verifying",
           "checkpoint_incomplete", "config.json", ["not valid JSON", "line 2"]),
    Defect("config-not-object", write_file("config.json", '["llama"]\n'), "verifying", "checkpoint_incomplete",
           "config.json", ["not a JSON object"]),
    # files the checkpoint needs but the filters drop: refused before any byte is downloaded
    Defect("exclude-drops-shard", no_change, "planning", "plan_invalid", SHARD2, ["include/exclude"],
           model_extra=f'exclude = ["{SHARD2}"]'),
    Defect("exclude-drops-tokenizer", no_change, "planning", "plan_invalid", "tokenizer.json", ["include/exclude"],
           model_extra='exclude = ["tokenizer.json"]'),
    # bytes that differ from the listing (the hub flips the first byte of what it sends)
    Defect("corrupt-shard", no_change, "downloading", "checksum_mismatch", SHARD1, ["sha256", "listing"],
           hub_faults={"corrupt": f"acme/corrupt-shard/{SHARD1}"}),
    Defect("corrupt-config", no_change, "downloading", "checksum_mismatch", "config.json",
           ["git blob sha1", "listing"], hub_faults={"corrupt": "acme/corrupt-config/config.json"}),
]


# --- the environment ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("defects")
    control = work / "hub-control.json"
    e = ModeldEnv(workdir=work, hub_args=["--control", str(control)])
    e.hub_control = control
    e.outcomes = {}
    e.add_repo("acme/good", shards=2, shard_size=128 << 10, seed=100)
    tables = model_table("good", "acme/good", free_port())
    for seed, d in enumerate(DEFECTS, start=101):
        repo = e.add_repo(f"acme/{d.name}", shards=2, shard_size=64 << 10, seed=seed)
        d.mutate(repo)
        tables += model_table(d.name, f"acme/{d.name}", free_port(), extra=d.model_extra)
    try:
        e.start(tables)
        e.deploy_and_wait("good")
        yield e
    finally:
        e.stop()


def set_hub_faults(env: ModeldEnv, faults: dict) -> None:
    """Rewrites the hub's control file atomically (the hub re-reads it when it changes)."""
    tmp = env.hub_control.with_suffix(".tmp")
    tmp.write_text(json.dumps(faults))
    os.replace(tmp, env.hub_control)


def files_of(folder: Path) -> list[tuple]:
    """Every entry under `folder` with what a change to it would alter (the link count is left
    out: another model's revision may hard-link an identical file)."""
    out = []
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else None
        out.append((str(p.relative_to(folder)), st.st_mode, st.st_size, st.st_ino, st.st_mtime_ns, digest,
                    os.readlink(p) if p.is_symlink() else None))
    return out


def serving(env: ModeldEnv) -> dict:
    """What must not change while a defective checkpoint fails: the active model and commit, its
    unit's process and start time, and its files."""
    active = env.status()["active"]
    unit = active["unit"]
    return {"active": (active["model"], active["commit"], unit, active["port"]),
            "main_pid": env.main_pid(unit),
            "entered": env.unit_timestamp(unit, "ActiveEnterTimestampMonotonic"),
            "link": os.readlink(env.models_dir / active["model"]),
            "files": files_of(env.models_dir / ".store" / active["model"])}


def test_the_healthy_model_serves(env):
    active = env.status()["active"]
    assert active["model"] == "good"
    assert env.unit_state(active["unit"]) == "active"
    assert completion(active["port"], "good")


def deployed(env: ModeldEnv, defect: Defect) -> tuple[dict, dict, dict]:
    """Deploys the defective model once per module (later tests reuse the outcome); returns the
    deployment as modeld reports it, and what serves before and after."""
    if defect.name not in env.outcomes:
        before = serving(env)
        set_hub_faults(env, defect.hub_faults)
        try:
            dep = env.deploy_and_wait(defect.name, expect_exit=1)
        finally:
            set_hub_faults(env, {})
        env.outcomes[defect.name] = (dep, before, serving(env))
    return env.outcomes[defect.name]


@pytest.mark.parametrize("defect", DEFECTS, ids=[d.name for d in DEFECTS])
def test_a_checkpoint_with_one_defect_fails_before_stopping_old_and_the_old_model_serves_on(env, defect):
    dep, before, after = deployed(env, defect)
    assert dep["model"] == defect.name
    assert dep["state"] == "failed", dep
    assert dep["phase"] == defect.phase, dep
    assert PHASES.index(dep["phase"]) < PHASES.index("stopping_old")
    assert dep["error"]["code"] == defect.code, dep["error"]
    message = dep["error"]["message"]
    print(f"{defect.name}: {dep['phase']} {dep['error']['code']}: {message}")
    assert defect.file in message, message
    if defect.tensor:
        assert f"'{defect.tensor}'" in message, message
    assert defect.says, f"{defect.name} names no words of the message"
    for words in defect.says:
        assert words in message, f"{words!r} not in {message!r}"

    # The journal's terminal line says the same.
    last = env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep['id']}")[-1]
    assert last.get("MODELD_STATE") == "failed" and defect.file in last.get("MESSAGE", ""), last

    if defect.phase == "planning":
        # Refused before any byte of the checkpoint is downloaded (planning reads only the index).
        fetched = {r["file"] for r in env.hub.requests() if (r.get("file") or "").startswith(f"acme/{defect.name}/")}
        assert fetched <= {f"acme/{defect.name}/{INDEX}"}, fetched

    # Nothing of the new model was promoted, and the serving model did not notice.
    assert not os.path.lexists(env.models_dir / defect.name)
    assert after == before
    assert env.unit_state(before["active"][2]) == "active"
    assert completion(before["active"][3], "good")


# Problems found while verifying get one journal line each with MODELD_FILE and MODELD_TENSOR
# (lib/deploy/verify.cpp); a planning error or a mismatch found while downloading names its files
# in MODELD_FILE on the deployment's terminal line (Error::files).
@pytest.mark.parametrize("defect", DEFECTS, ids=[d.name for d in DEFECTS])
def test_the_journal_names_the_file_and_tensor_in_fields(env, defect):
    dep, _, _ = deployed(env, defect)
    lines = env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep['id']}")
    named = [e for e in lines if e.get("MODELD_FILE") == defect.file]
    assert named, f"no journal line of deployment {dep['id']} has MODELD_FILE={defect.file}"
    if defect.tensor:
        assert any(e.get("MODELD_TENSOR") == defect.tensor for e in named), named
