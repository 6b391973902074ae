"""Helpers shared by the benchmark scripts of this folder (download, verify): the machine's
description, timing of child processes, page-cache coverage, /proc snapshots of a daemon, modeld's
process under the namespaced systemd, and the generated checkpoint a work folder keeps between calls.

Imported by the scripts, which run from this folder (so it is on sys.path as their own folder).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE_DIR = HERE.parent.parent
MB = 1000 ** 2
GB = 1000 ** 3
MiB = 1 << 20
TICK = os.sysconf("SC_CLK_TCK")


def use_build(build_dir: Path) -> None:
    """Points tests/integration/modeld_env at `build_dir` (it reads MODELD_BUILD_DIR at import) and
    puts tests/integration and tests/fixtures on sys.path; call before importing them."""
    os.environ["MODELD_BUILD_DIR"] = str(build_dir)
    for sub in ("fixtures", "integration"):
        path = str(SOURCE_DIR / "tests" / sub)
        if path not in sys.path:
            sys.path.insert(0, path)


# --- machine -----------------------------------------------------------------------------------

def machine_info(workdir: Path, build_dir: Path) -> dict:
    """The machine, the work folder's file system and the build, for the report's head."""
    cpu_model, flags = "?", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and cpu_model == "?":
            cpu_model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    fs = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE,TARGET", "-T", str(workdir)],
                        capture_output=True, text=True).stdout.split()
    mem_kib = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("MemTotal:")), 0)
    build_type = "?"
    cache = build_dir / "CMakeCache.txt"
    if cache.exists():
        for line in cache.read_text(errors="replace").splitlines():
            if line.startswith("CMAKE_BUILD_TYPE:"):
                build_type = line.split("=", 1)[1] or "(empty)"
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model,
        "sha_ni": "sha_ni" in flags,
        "kernel": platform.release(),
        "memory_gib": round(mem_kib / (1 << 20), 1),
        "workdir": str(workdir),
        "workdir_fs": " ".join(fs) if fs else "?",
        "build_dir": str(build_dir),
        "build_type": build_type,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


def print_machine(m: dict) -> None:
    print(f"machine: {m['nproc']} CPUs ({m['cpu_model']}), sha_ni {'yes' if m['sha_ni'] else 'no'}, "
          f"{m['memory_gib']} GiB RAM, kernel {m['kernel']}")
    print(f"workdir: {m['workdir']} on {m['workdir_fs']}")
    print(f"build:   {m['build_dir']} ({m['build_type']}); load average at start {' '.join(m['loadavg'])}")
    if m["build_type"] not in ("Release", "RelWithDebInfo"):
        print("  warning: not an optimised build; modeld's numbers will not mean much")


# --- small helpers -----------------------------------------------------------------------------

def timed_sync() -> float:
    t0 = time.monotonic()
    subprocess.run(["sync"], check=True)
    return time.monotonic() - t0


def spawn_all(cmds: list[list[str]], stdout=subprocess.DEVNULL) -> tuple[float, list[dict]]:
    """Starts every command at once and reaps each; returns (seconds from the first spawn to the
    last exit, [{rc, cpu_s, maxrss_kib, stdout, stderr}]).

    Each command runs under GNU time (/usr/bin/time -f %M): a process's ru_maxrss counts the
    memory of the process it was forked from (Linux records the old mm's high-water mark at
    exec), and Python's ~30 MiB would swamp curl's few MiB; time's own ~1 MiB is the floor left.
    CPU is the os.wait4 rusage of the time process, which includes its reaped child (µs, not
    time's 10 ms)."""
    rss_files = [tempfile.NamedTemporaryFile(prefix="bench-rss-", delete=False) for _ in cmds]
    for f in rss_files:
        f.close()
    t0 = time.monotonic()
    procs = [subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", f.name, *c], stdout=stdout,
                              stderr=subprocess.PIPE) for c, f in zip(cmds, rss_files)]
    out = []
    for p, f in zip(procs, rss_files):
        # Drain the pipes first (small: curl's -w line, errors), then reap with wait4 ourselves
        # so the rusage is not lost to Popen.wait.
        so = p.stdout.read() if p.stdout else b""
        se = p.stderr.read()
        for pipe in (p.stdout, p.stderr):
            if pipe:
                pipe.close()
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.append({"rc": p.returncode, "cpu_s": ru.ru_utime + ru.ru_stime,
                    "stdout": so.decode(errors="replace"), "stderr": se.decode(errors="replace")})
    secs = time.monotonic() - t0
    for r, f in zip(out, rss_files):
        lines = Path(f.name).read_text().split()
        os.unlink(f.name)
        # On failure GNU time writes "Command exited with non-zero status N" first.
        r["maxrss_kib"] = int(lines[-1]) if lines and lines[-1].isdigit() else 0
    return secs, out


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def cached_fraction(files: list[Path]) -> tuple[int, int]:
    """(bytes of `files` resident in page cache, their total size), from fincore."""
    r = subprocess.run(["fincore", "-b", "-n", "-r", "-o", "RES,SIZE", *map(str, files)],
                       capture_output=True, text=True)
    res = size = 0
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            res += int(parts[0])
            size += int(parts[1])
    return res, size


def cache_note(files: list[Path]) -> str:
    res, size = cached_fraction(files)
    pct = 100.0 * res / size if size else 0.0
    return f"{res / MiB:.0f} of {size / MiB:.0f} MiB in page cache ({pct:.0f}%)"


def read_all(files: list[Path]) -> None:
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(8 * MiB):
                pass


def clear_folder(folder: Path) -> None:
    """Removes everything inside `folder`, keeping the folder."""
    if not folder.exists():
        return
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


# --- the generated checkpoint ------------------------------------------------------------------

def checkpoint_reusable(workdir: Path, src: Path, shards: int, shard_size: int) -> bool:
    """Whether `src` holds the checkpoint make_checkpoint writes for these arguments (seed 0), as
    recorded by prepare_checkpoint in workdir/checkpoint.json."""
    stamp = workdir / "checkpoint.json"
    want = {"shards": shards, "shard_size": shard_size, "seed": 0}
    return stamp.exists() and json.loads(stamp.read_text()) == want and src.is_dir()


def prepare_checkpoint(workdir: Path, src: Path, shards: int, shard_size: int, reuse: bool) -> None:
    """Generates the checkpoint into `src` (tests/fixtures/make_checkpoint.py, seed 0) unless
    `reuse`, and records its arguments in workdir/checkpoint.json; prints what it did. Needs
    use_build() first (for sys.path)."""
    import make_checkpoint  # noqa: E402 - on sys.path after use_build

    if reuse:
        print(f"checkpoint: reusing {src}")
        return
    shutil.rmtree(src, ignore_errors=True)
    t = time.monotonic()
    made = make_checkpoint.make_checkpoint(str(src), shards, shard_size, 0)
    (workdir / "checkpoint.json").write_text(json.dumps({"shards": shards, "shard_size": shard_size, "seed": 0}))
    print(f"checkpoint: generated {len(made['shards'])} shards in {time.monotonic() - t:.1f} s")


# --- modeld's process --------------------------------------------------------------------------

def proc_snapshot(pid: int) -> dict:
    """utime+stime (seconds), VmRSS and VmHWM (KiB) of process `pid` (all its threads)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # fields[0] is field 3 (state)
    cpu = (int(fields[11]) + int(fields[12])) / TICK
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            status[k] = int(v.split()[0])
    return {"t": time.monotonic(), "cpu_s": cpu, "rss_kib": status.get("VmRSS", 0),
            "hwm_kib": status.get("VmHWM", 0)}


def modeld_pid(env) -> int:
    """modeld's PID as this (host) PID namespace sees it: the child of `env`'s (a ModeldEnv)
    namespaced systemd that runs the built binary."""
    ns_pid = env.systemd.pid
    binary = env.modeld.resolve()
    for child in Path(f"/proc/{ns_pid}/task/{ns_pid}/children").read_text().split():
        try:
            if Path(f"/proc/{child}/exe").resolve() == binary:
                return int(child)
        except OSError:
            continue
    raise RuntimeError("modeld's process was not found under the namespaced systemd")


# --- the report --------------------------------------------------------------------------------

def spread(values: list[float], fmt: str) -> str:
    """min/median/max of `values`, each formatted with `fmt`; "-" when there are none."""
    if not values:
        return "-"
    return "/".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


# --- modeld's event stream ---------------------------------------------------------------------

class EventStream:
    """GET /v1/events over modeld's control socket, read by a thread that stamps each event with
    time.monotonic() on receipt; `on_event(kind, data)` runs on that thread right after stamping.
    (The same reader as tests/bench/download's, shared here for tests/bench/status.)"""

    def __init__(self, socket_path: Path, on_event=None):
        import queue
        import socket
        import threading

        self.events: "queue.Queue[tuple[float, str, dict]]" = queue.Queue()
        self._empty = queue.Empty
        self.on_event = on_event
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(socket_path))
        self.sock.sendall(b"GET /v1/events HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n")
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise RuntimeError("the event stream closed before its head")
            buf += chunk
        head, _, self._rest = buf.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"GET /v1/events answered {head.splitlines()[0]!r}")
        self.sock.settimeout(None)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        buf = self._rest
        kind, data = "message", []
        while True:
            while b"\n" in buf:
                line, _, buf = buf.partition(b"\n")
                line = line.rstrip(b"\r").decode(errors="replace")
                if line == "":
                    if data:
                        t = time.monotonic()
                        try:
                            payload = json.loads("\n".join(data))
                        except ValueError:
                            payload = {"raw": "\n".join(data)}
                        if self.on_event:
                            self.on_event(kind, payload)
                        self.events.put((t, kind, payload))
                    kind, data = "message", []
                elif line.startswith(":"):
                    continue
                elif line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" ") if line[5:6] == " " else line[5:])
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                self.events.put((time.monotonic(), "closed", {}))
                return
            buf += chunk

    def next(self, deadline: float) -> tuple[float, str, dict]:
        """The next event (time, kind, data); TimeoutError when none comes before `deadline`."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no event before the deadline")
        try:
            return self.events.get(timeout=left)
        except self._empty:
            raise TimeoutError("no event before the deadline") from None

    def close(self):
        import socket

        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def percentile(sorted_values: list[float], p: float) -> float:
    """The p-th percentile (0..100) of already sorted values, nearest-rank; nan when empty."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, int(-(-p * len(sorted_values) // 100)) - 1))
    return sorted_values[k]


def thread_schedstat(pid: int, tid: int | None = None) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for a CPU) of thread `tid` of `pid` (its
    main thread by default), from /proc/PID/task/TID/schedstat."""
    fields = Path(f"/proc/{pid}/task/{tid or pid}/schedstat").read_text().split()
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9
