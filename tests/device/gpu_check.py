#!/usr/bin/env python3
"""lib/gpu against a real GPU (the H200 `device` machine): a PyTorch process allocates GPU memory,
a child of it allocates too; gpu_probe must list both with their PIDs; after the parent is stopped
the child's memory is still above the baseline (a worker outliving its server, vLLM's failure
mode); after the child is killed, used memory is back at the baseline, and how long that took is
printed.

    python3 tests/device/gpu_check.py [PATH/TO/gpu_probe]

Needs python3 with torch and CUDA; exit status 0 when every step held.
"""

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

PROBE = sys.argv[1] if len(sys.argv) > 1 else "build-gpu/tests/device/gpu_probe"
GIB = 1 << 30
PARENT_GIB = 8
CHILD_GIB = 2
SLACK = 64 << 20  # bytes: driver bookkeeping may move by a few MiB

CHILD = f"""
import os, signal, torch
x = torch.empty({CHILD_GIB} << 30, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
print("child-ready", os.getpid(), flush=True)
signal.pause()
"""

PARENT = f"""
import os, signal, subprocess, sys, torch
x = torch.empty({PARENT_GIB} << 30, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
print("parent-ready", os.getpid(), flush=True)
subprocess.Popen([sys.executable, "-c", {CHILD!r}])
signal.pause()
"""


def log(*args):
    print(*args, flush=True)


def probe(*args, timeout=120):
    cmd = [PROBE, *map(str, args)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    log(f"$ {' '.join(cmd)}  -> rc {p.returncode} in {time.monotonic() - t0:.3f} s")
    if p.stderr:
        log(p.stderr.rstrip())
    out = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    for o in out:
        log(json.dumps(o, indent=1) if "gpus" in o and len(json.dumps(o)) < 4000 else json.dumps(o))
    return p.returncode, out[-1] if out else {}


def expect(cond, what):
    log(("ok: " if cond else "FAILED: ") + what)
    if not cond:
        raise SystemExit(1)


def read_ready(stream, tags, deadline):
    """Reads lines like 'parent-ready PID' until every tag is seen; returns {tag: pid}."""
    seen = {}
    while len(seen) < len(tags):
        left = deadline - time.monotonic()
        expect(left > 0, f"{tags} ready before the deadline (seen {seen})")
        r, _, _ = select.select([stream], [], [], left)
        if not r:
            continue
        line = stream.readline()
        expect(line != "", f"holder process still running while waiting for {tags} (seen {seen})")
        parts = line.split()
        if len(parts) == 2 and parts[0] in tags:
            seen[parts[0]] = int(parts[1])
            log(f"{parts[0]}: pid {parts[1]}")
    return seen


def gpu_used(snap, index=0):
    return snap["gpus"][index]["used_bytes"]


def main():
    rc, snap = probe("snapshot")
    expect(rc == 0 and snap.get("gpus"), "NVML loaded and lists GPUs")
    total = snap["gpus"][0]["total_bytes"]

    rc, base = probe("baseline")
    expect(rc == 0, "baseline taken")
    base_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(base, base_file)
    base_file.close()
    log(f"baseline GPU 0 used: {gpu_used(snap) / (1 << 20):.0f} MiB (driver reservation)")

    holder = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child_pid = None
    try:
        pids = read_ready(holder.stdout, {"parent-ready", "child-ready"}, time.monotonic() + 180)
        parent_pid, child_pid = pids["parent-ready"], pids["child-ready"]

        rc, snap = probe("wait-listed", parent_pid, 30)
        expect(rc == 0, f"parent pid {parent_pid} listed by NVML")
        rc, snap = probe("wait-listed", child_pid, 30)
        expect(rc == 0, f"child pid {child_pid} listed by NVML")
        procs = {p["pid"]: p for g in snap["gpus"] for p in g["processes"]}
        expect(procs[parent_pid].get("used_bytes", 0) >= PARENT_GIB * GIB,
               f"parent holds at least {PARENT_GIB} GiB ({procs[parent_pid].get('used_bytes')} bytes)")
        expect(procs[child_pid].get("used_bytes", 0) >= CHILD_GIB * GIB,
               f"child holds at least {CHILD_GIB} GiB ({procs[child_pid].get('used_bytes')} bytes)")
        log("holders: " + snap["holders"])

        rc, out = probe("check-free", 1, total - 4 * GIB)
        expect(rc == 1 and f"pid {parent_pid}" in out.get("error", ""),
               "check_free refuses a GPU short of memory and names the holder")

        t_term = time.monotonic()
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=30)
        log(f"parent exited (rc {holder.returncode}) {time.monotonic() - t_term:.3f} s after SIGTERM")

        rc, out = probe("wait-back", base_file.name, SLACK, 3)
        expect(rc == 1 and f"pid {child_pid}" in out.get("excess", ""),
               "memory is not back while the surviving child holds it, and the child is named")

        t_kill = time.monotonic()
        os.kill(child_pid, signal.SIGKILL)
        rc, out = probe("wait-back", base_file.name, SLACK, 30)
        elapsed = time.monotonic() - t_kill
        expect(rc == 0, "memory back at the baseline after SIGKILL of the child")
        log(f"back at the baseline {out['back_after_s']:.3f} s after the probe started, "
            f"{elapsed:.3f} s after SIGKILL (incl. probe start-up), {out['polls']} polls; "
            f"GPU 0 used now {gpu_used(out) / (1 << 20):.0f} MiB, baseline {base['used_bytes']}")
        child_pid = None
    finally:
        if holder.poll() is None:
            holder.kill()
        if child_pid:
            try:
                os.kill(child_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.unlink(base_file.name)
    log("gpu_check: all steps held")


if __name__ == "__main__":
    main()
