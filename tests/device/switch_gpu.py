#!/usr/bin/env python3
"""The switch on a real GPU (the H200 `device` machine): modeld deploys checkpoint A, then switches
between A and B with `serve.warm = "off"` and `"auto"`, and prints the outage and its steps, the
new server's weight-load time, the warm time and how long NVML took to show the old server's
memory back (tests/bench/switchlib.py holds the protocol; tests/device/README.md the command).

    python3 tests/device/switch_gpu.py [--bundle build-gpu] [--size-gb 11] [--runs 3]
                                       [--settings off,auto] [--work /var/tmp/modeld-switch] [--plain]

Run as root from the repository root with the bundle of tests/device/bundle.sh (modeld, modelctl,
the shared libraries that machine lacks): it makes the two checkpoints (make_checkpoints.py) in
the hub fixture's folder, starts tests/fixtures/hub_server.py on loopback and modeld as a child
process (`service_manager = "process"`; models_dir and state_dir under --work, on the machine's
disk), both models served by tests/device/serve_hf.py on one port with `gpus = 1` and a completion
in readiness. Each run pulls the model that is not serving, drops the page cache, deploys it at the
pulled commit, and reads the record's `switch` and `warm`, the warming phase's duration, the
server's own load time (its --load-time-file) and NVML.

Ends with the ratio of the median server load times, warm auto / warm off, and exits 1 when it is
above 0.5 (the issue's target), 2 when it cannot measure (one line on stderr: a missing bundle, too
little disk, a modeld without pull or `switch`), 0 otherwise. With $OUT set, the raw numbers go to
$OUT/switch_gpu.json too. --plain runs against a modeld without pull, `--commit` and `warm` (main
before issue 15): it deploys by name, with one setting "plain", and checks no ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent.parent
sys.path.insert(0, str(SOURCE / "tests" / "bench"))
MODELS = ("switch-a", "switch-b")
PORT = 8800
TARGET = 0.5


def fail(message: str) -> NoReturn:
    print(f"switch_gpu: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def use_bundle(bundle: Path) -> None:
    """Points modeld_env at the bundle's binaries and the loader at its libraries."""
    for name in ("modeld", "modelctl"):
        if not (bundle / name).is_file():
            fail(f"{bundle / name} is missing: run tests/device/bundle.sh here and carry {bundle}")
    lib = str((bundle / "lib").resolve())
    os.environ["LD_LIBRARY_PATH"] = lib + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else "")
    import benchlib

    benchlib.use_build(bundle.resolve())


def model_tables(work: Path, warm: str | None, gpu_ids: str | None = None) -> str:
    """Both models' TOML; `warm` None leaves serve.warm out (a modeld that does not know it);
    `gpu_ids` ("0") gives each model serve.gpu_ids (CUDA_VISIBLE_DEVICES by UUID) instead of gpus = 1."""
    gpus = f"gpu_ids = [{gpu_ids}]" if gpu_ids else "gpus = 1"
    out = []
    for name in MODELS:
        command = [sys.executable, str(HERE / "serve_hf.py"), "{model_dir}", "--port", "{port}",
                   "--served-model-name", "{served_name}", "--load-time-file", str(work / f"load-{name}")]
        out.append(f"""
[models.{name}]
repo = "device/{name}"
revision = "main"

[models.{name}.serve]
command = {json.dumps(command)}
port = {PORT}
startup_timeout = "10m"
stop_timeout = "60s"
{gpus}
gpu_memory = "30GiB"
{f'warm = "{warm}"' if warm else ''}

[models.{name}.health]
path = "/health"
models_path = "/v1/models"
completion = true
""")
    return "".join(out)


def load_time(work: Path):
    """load_time(model): serve_hf.py's last weight-load seconds for `model`, consumed (None if none)."""
    def read(model: str) -> float | None:
        path = work / f"load-{model}"
        try:
            value = float(path.read_text())
        except (OSError, ValueError):
            return None
        path.unlink()
        return value
    return read


def make_checkpoints(repos: Path, size_gb: float) -> None:
    free = shutil.disk_usage(repos.parent).free
    need = 4 * size_gb * 1e9 + 4e9  # hub copies + store copies + room
    if free < need:
        fail(f"{free / 1e9:.0f} GB free under {repos.parent}, {need / 1e9:.0f} GB needed for --size-gb {size_gb:g}")
    t = time.monotonic()
    subprocess.run([sys.executable, str(HERE / "make_checkpoints.py"), str(repos), "--size-gb", str(size_gb),
                    "--names", ",".join(MODELS)], check=True)
    print(f"checkpoints made in {time.monotonic() - t:.1f} s", flush=True)


def run(args: argparse.Namespace) -> dict:
    import modeld_env
    import switchlib

    modeld_env.PYTHON = sys.executable  # the fixtures need no more than the standard library
    work = Path(args.work)
    env = modeld_env.ProcessModeld(work)
    env.repos.mkdir(parents=True, exist_ok=True)
    if not args.reuse:
        make_checkpoints(env.repos, args.size_gb)
    settings = ["plain"] if args.plain else args.settings.split(",")

    def use_setting(setting: str) -> None:
        if args.plain:
            return
        env.write_config(model_tables(work, setting, args.gpu_ids))
        env.stop_modeld()
        env.start_modeld()

    with env:
        try:
            switchlib.start_env(env, model_tables(work, None if args.plain else settings[0], args.gpu_ids))
            setup = switchlib.Setup(socket=env.socket, models_dir=env.models_dir, port=PORT,
                                    load_time=load_time(work), plain=args.plain, timeout=args.timeout)
            print(f"GPU baseline (NVML used): {setup.gpu.baseline and setup.gpu.baseline / 2**20:.0f} MiB",
                  flush=True)
            by_setting = switchlib.measure(setup, MODELS, settings, args.runs, use_setting)
        except (switchlib.SwitchError, TimeoutError) as e:
            print(env.log()[-4000:], file=sys.stderr)
            fail(str(e))
    summary = switchlib.print_table(by_setting, baseline="off")
    return {"settings": by_setting, **summary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--bundle", default="build-gpu", help="tests/device/bundle.sh's folder (default build-gpu)")
    ap.add_argument("--size-gb", type=float, default=11.0, help="each checkpoint's size in GB (default 11)")
    ap.add_argument("--runs", type=int, default=3, help="switches per setting (default 3)")
    ap.add_argument("--settings", default="off,auto", help="serve.warm values, in order (default off,auto)")
    ap.add_argument("--work", default="/var/tmp/modeld-switch", help="work folder (on the disk, not tmpfs)")
    ap.add_argument("--reuse", action="store_true", help="keep the checkpoints already in --work/repos")
    ap.add_argument("--plain", action="store_true", help="a modeld without pull/commit/warm: deploy by name")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a pull or deployment may take")
    ap.add_argument("--gpu-ids", default=None, help="serve.gpu_ids of both models, e.g. 0 (default: gpus = 1)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        fail("run it as root (dropping the page cache needs it)")
    use_bundle(Path(args.bundle))
    result = run(args)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "switch_gpu.json").write_text(json.dumps(result, indent=1, default=str))
    if args.plain:
        return 0
    ratio = (result["ratios"].get("auto") or {}).get("server load")
    print(f"\nserver load time, median warm auto / warm off: {ratio if ratio is None else round(ratio, 3)} "
          f"(target <= {TARGET})")
    return 0 if ratio is not None and ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
