#!/usr/bin/env python3
"""How long serve_hf.py takes to load a checkpoint with a cold and with a warm page cache, without
modeld: the check that a checkpoint is large enough for its load not to be hidden by fixed
start-up costs (Python imports, CUDA context, model construction).

    sudo python3 tests/device/load_check.py DIR [DIR...] [--port 8711]

For each DIR (a checkpoint folder as make_checkpoints.py writes it): drop the page cache
(`sync; echo 3 > /proc/sys/vm/drop_caches`, root), start serve_hf.py, wait for /health 200, ask
one completion (max_tokens 8), stop it; then read every file of DIR once (8 readers in parallel,
timed: the warming a plain read does) and start it again. Prints one JSON line per DIR: bytes,
cold and warm load seconds (serve_hf's own figure), process start to /health 200 for both, the
read's seconds, warm/cold ratio, and the completion's text.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def read_folder(folder: Path, readers: int = 8) -> float:
    """Reads every file of `folder` once, `readers` at a time; returns the seconds it took."""
    def read(f: Path) -> None:
        with open(f, "rb", buffering=0) as fh:
            while fh.read(16 << 20):
                pass

    t0 = time.monotonic()
    with ThreadPoolExecutor(readers) as pool:
        list(pool.map(read, [f for f in folder.iterdir() if f.is_file()]))
    return time.monotonic() - t0


def get(url: str, body: dict | None = None, timeout: float = 5) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def serve_once(folder: Path, port: int, deadline_s: float = 300) -> dict:
    """Starts serve_hf.py on `folder`, waits until /health answers 200, asks one completion, stops
    it; returns load seconds (its own), start→ready seconds and the completion's text."""
    with tempfile.TemporaryDirectory() as tmp:
        load_file = Path(tmp) / "load"
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, str(HERE / "serve_hf.py"), str(folder), "--port", str(port),
                                 "--served-model-name", "check", "--load-time-file", str(load_file)])
        try:
            while get(f"http://127.0.0.1:{port}/health")[0] != 200:
                if proc.poll() is not None or time.monotonic() - t0 > deadline_s:
                    raise RuntimeError(f"serve_hf.py did not become ready (exit {proc.poll()})")
                time.sleep(0.05)  # polling a server's readiness, not waiting for time to pass
            ready = time.monotonic() - t0
            status, body = get(f"http://127.0.0.1:{port}/v1/completions",
                               {"model": "check", "prompt": "hello world", "max_tokens": 8}, timeout=60)
            if status != 200:
                raise RuntimeError(f"completion answered {status}: {body[:300]!r}")
            answer = json.loads(body)
            return {"load_s": float(load_file.read_text()), "ready_s": round(ready, 3),
                    "text": answer["choices"][0]["text"], "usage": answer["usage"]}
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--port", type=int, default=8711)
    args = ap.parse_args()
    for folder in args.dirs:
        size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
        drop_caches()
        cold = serve_once(folder, args.port)
        drop_caches()
        read_s = read_folder(folder)
        warm = serve_once(folder, args.port)
        print(json.dumps({"dir": str(folder), "bytes": size, "cold": cold, "read_s": round(read_s, 3),
                          "warm": warm, "ratio": round(warm["load_s"] / cold["load_s"], 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
