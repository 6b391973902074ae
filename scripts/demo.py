#!/usr/bin/python3
"""The demo deployment: the bundled hub, a private systemd, modeld as a unit, two models."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from modeld_env import ModeldEnv, completion, free_port, model_table  # noqa: E402
from nsystemd import unsupported_reason  # noqa: E402


def say(text: str):
    print(f"\n\033[1m==> {text}\033[0m" if sys.stdout.isatty() else f"\n==> {text}", flush=True)


class Stopped(Exception):
    """SIGTERM or SIGHUP (a closed terminal or SSH session) arrived: clean up as Ctrl-C does."""


def stop_on_signal(signum, _frame):
    raise Stopped(signal.Signals(signum).name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keep", action="store_true", help="leave the hub, systemd and modeld running")
    ap.add_argument("--shard-size", type=int, default=32 << 20, help="bytes per safetensors shard")
    args = ap.parse_args()
    reason = unsupported_reason()
    if reason:
        print(f"demo: cannot run here: {reason}", file=sys.stderr)
        return 1

    env = ModeldEnv(keep=args.keep, hub_args=["--throttle", "8MiB"], journal_to_host=True)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop_on_signal)
    try:
        say(f"generating two checkpoints in Hugging Face layout under {env.repos}")
        env.add_repo("demo-org/tiny-chat", shards=4, shard_size=args.shard_size, seed=1)
        env.add_repo("demo-org/tiny-chat-2", shards=6, shard_size=args.shard_size, seed=2)
        pa, pb = free_port(), free_port()
        tables = (model_table("tiny-chat", "demo-org/tiny-chat", pa, load_seconds=2)
                  + model_table("tiny-chat-2", "demo-org/tiny-chat-2", pb, load_seconds=3))
        say("starting the bundled hub, a private systemd, and modeld.service inside it")
        env.start(tables)
        print(f"hub at {env.hub.endpoint}, modeld socket {env.socket}, config {env.config}")

        for name in ("tiny-chat", "tiny-chat-2"):
            say(f"modelctl deploy {name} --wait")
            r = subprocess.run([str(env.modelctl_bin), "--socket", str(env.socket), "deploy", name, "--wait"])
            if r.returncode != 0:
                print(f"demo: deployment of {name} failed (exit {r.returncode})", file=sys.stderr)
                print(env.systemd.run(["journalctl", "--no-pager", "-n", "40"], check=False).stdout)
                return 1

        say("modelctl status")
        subprocess.run([str(env.modelctl_bin), "--socket", str(env.socket), "status"])
        say("modelctl models")
        subprocess.run([str(env.modelctl_bin), "--socket", str(env.socket), "models"])

        say(f"asking tiny-chat-2 for a completion on port {pb}")
        text = completion(pb, "tiny-chat-2", prompt="Hello, GPU host", max_tokens=8)
        print(f"prompt: 'Hello, GPU host' -> completion: {text!r}")

        say("the journal of the second deployment (MODELD_PHASE per line)")
        for e in env.journal("SYSLOG_IDENTIFIER=modeld", "MODELD_MODEL=tiny-chat-2"):
            print(f"  [{e.get('MODELD_PHASE', ''):>15}] {e.get('MESSAGE', '')}")
        say("demo finished: tiny-chat-2 serves, tiny-chat was stopped first")
        if args.keep:
            print(f"left running. Look with:\n  {env.modelctl_bin} --socket {env.socket} status\n"
                  f"  nsenter -t {env.systemd.pid} -p -m journalctl -u modeld.service --since today\n"
                  f"and stop with:\n  nsenter -t {env.systemd.pid} -p -m systemctl poweroff; "
                  f"kill {env.hub.proc.pid}; rm -rf {env.workdir}")
        return 0
    except (KeyboardInterrupt, Stopped) as e:
        print(f"\ndemo: interrupted ({e or 'Ctrl-C'}): stopping the hub, the private systemd and modeld",
              file=sys.stderr)
        return 130
    finally:
        if not args.keep:
            # A second signal while cleaning up must not cut the cleanup short.
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            env.stop()


if __name__ == "__main__":
    sys.exit(main())
