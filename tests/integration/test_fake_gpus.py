"""The fake NVML follows the stand-in servers, not the test (issue 16): fake_vllm.py reports its
GPU memory in a `procs` folder (--gpu-procs, --gpu-memory) for the GPUs of its
CUDA_VISIBLE_DEVICES, the fake counts it while the process runs, and a leftover worker
(--leftover-worker POS:SECONDS) keeps its GPU's memory for SECONDS after it is gone. Snapshots are
read with gpu_probe against the fake, as modeld reads them. Needs the fake_nvml and gpu_probe
targets built; no systemd.

Run: cd build && ctest -R test_fake_gpus --output-on-failure
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modeld_env import BUILD_DIR
from waiting import wait_for

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
from make_checkpoint import make_checkpoint  # noqa: E402

FAKE_NVML = BUILD_DIR / "fake_nvml" / "libnvidia-ml.so.1"
GPU_PROBE = BUILD_DIR / "tests" / "device" / "gpu_probe"
MiB = 1 << 20
GiB = 1 << 30
TOTAL = 141 * GiB
IDLE = 615 * MiB
HELD = 20 * GiB
UUIDS = [f"GPU-{i}{i}{i}{i}{i}{i}{i}{i}-0000-4000-8000-00000000000{i}" for i in range(8)]
LINGER = 5.0


@pytest.fixture
def gpus(tmp_path):
    """Eight idle fake H200s whose state names a `procs` folder; yields (state file, folder)."""
    for built in (FAKE_NVML, GPU_PROBE):
        assert built.exists(), f"{built} is missing: build the fake_nvml and gpu_probe targets"
    procs = tmp_path / "gpu-procs"
    procs.mkdir()
    state = tmp_path / "nvml-state.txt"
    lines = ["init 0", f"procs {procs}"]
    lines += [f"gpu {u} {TOTAL} {IDLE} {TOTAL - IDLE} {IDLE} NVIDIA H200" for u in UUIDS]
    state.write_text("\n".join(lines) + "\n")
    return state, procs


def snapshot(state: Path) -> dict:
    """gpu_probe's snapshot of the fake GPUs."""
    env = dict(os.environ, MODELD_NVML_LIBRARY=str(FAKE_NVML), FAKE_NVML_STATE=str(state))
    out = subprocess.run([str(GPU_PROBE), "snapshot"], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def gpus_of(snap: dict, pid: int) -> list[int]:
    """The indices of the GPUs whose process list has `pid`."""
    return [g["index"] for g in snap["gpus"] if any(p["pid"] == pid for p in g["processes"])]


def used(snap: dict) -> list[int]:
    return [g["used_bytes"] for g in snap["gpus"]]


@pytest.fixture
def model_dir(tmp_path) -> Path:
    d = tmp_path / "model"
    make_checkpoint(d, shards=2, shard_size=64 * 1024, seed=5)
    return d


@pytest.fixture
def start_vllm(tmp_path, model_dir):
    started: list[subprocess.Popen] = []

    def start(visible: str | None, *flags) -> subprocess.Popen:
        env = dict(os.environ)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        out = open(tmp_path / f"vllm{len(started)}.stdout", "wb")
        p = subprocess.Popen([sys.executable, str(FIXTURES / "fake_vllm.py"), "serve", str(model_dir),
                              "--port", "0", *flags], env=env, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        p.out_path = tmp_path / f"vllm{len(started)}.stdout"
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def output(p: subprocess.Popen) -> str:
    return p.out_path.read_text(errors="replace")


def listening(p: subprocess.Popen) -> str:
    def up():
        assert p.poll() is None, f"fake_vllm exited with {p.returncode}: {output(p)}"
        return "Uvicorn running on" in output(p)
    wait_for("fake_vllm to listen", up)
    return output(p)


def runs(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def test_a_server_holds_memory_on_exactly_its_visible_gpus_until_it_exits(gpus, start_vllm):
    state, procs = gpus
    p = start_vllm(f"{UUIDS[2]},{UUIDS[5]}", "--gpu-procs", str(procs), "--gpu-memory", str(HELD))
    listening(p)
    snap = snapshot(state)
    assert gpus_of(snap, p.pid) == [2, 5]
    assert used(snap) == [IDLE, IDLE, IDLE + HELD, IDLE, IDLE, IDLE + HELD, IDLE, IDLE]
    assert snap["gpus"][2]["free_bytes"] == TOTAL - IDLE - HELD
    assert [q["used_bytes"] for q in snap["gpus"][5]["processes"]] == [HELD]
    assert (procs / str(p.pid)).read_text().startswith(f"gpu {UUIDS[2]} {HELD}\ngpu {UUIDS[5]} {HELD}\n")

    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0
    snap = wait_for("its memory to be given back", lambda: (s := snapshot(state)) and not gpus_of(s, p.pid) and s)
    assert used(snap) == [IDLE] * 8
    assert not (procs / str(p.pid)).exists()  # the fake deleted the file of a process that is gone


def test_unset_visible_devices_hold_every_gpu_and_empty_ones_none(gpus, start_vllm):
    state, procs = gpus
    every = start_vllm(None, "--gpu-procs", str(procs), "--gpu-memory", str(HELD))
    none = start_vllm("", "--gpu-procs", str(procs), "--gpu-memory", str(HELD))
    listening(every)
    assert "on no GPU" in listening(none)
    snap = snapshot(state)
    assert gpus_of(snap, every.pid) == list(range(8))
    assert gpus_of(snap, none.pid) == []
    assert used(snap) == [IDLE + HELD] * 8
    assert not (procs / str(none.pid)).exists()


def test_a_leftover_worker_keeps_its_gpu_for_its_linger_after_the_server_exits(gpus, start_vllm):
    state, procs = gpus
    p = start_vllm(",".join(UUIDS[4:]), "--gpu-procs", str(procs), "--gpu-memory", str(HELD),
                   "--leftover-worker", f"2:{LINGER:g}")
    worker = int(re.search(r"leftover worker (\d+) holds GPU (\S+)", listening(p)).group(1))
    snap = snapshot(state)
    assert gpus_of(snap, p.pid) == [4, 5, 6, 7]
    assert gpus_of(snap, worker) == [6]
    assert used(snap)[6] == IDLE + 2 * HELD

    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0
    wait_for("the worker to end with its parent", lambda: not runs(worker))
    snap = snapshot(state)
    assert gpus_of(snap, p.pid) == []
    assert gpus_of(snap, worker) == [6], "a leftover's memory must outlive its process"
    assert used(snap) == [IDLE] * 6 + [IDLE + HELD, IDLE]
    gone_at = float(re.search(r"^gone_at (\S+)$", (procs / str(worker)).read_text(), re.M).group(1))

    wait_for("the leftover's memory to vanish", lambda: not gpus_of(snapshot(state), worker), timeout=60)
    assert time.time() >= gone_at + LINGER
    assert used(snapshot(state)) == [IDLE] * 8
    assert not (procs / str(worker)).exists()


def test_a_leftover_worker_needs_a_visible_gpu_at_its_position(gpus, start_vllm):
    _, procs = gpus
    p = start_vllm(UUIDS[0], "--gpu-procs", str(procs), "--gpu-memory", str(HELD), "--leftover-worker", "1:5")
    assert p.wait(30) == 2
    assert "CUDA_VISIBLE_DEVICES lists 1" in output(p)
