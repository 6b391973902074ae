"""Helpers shared by the contract tests (test_contract_e2e.py, test_restart_phases_e2e.py,
test_eviction_e2e.py). Every condition here returns a value or None and never raises for "not
yet", so it works with a wait that ends at the first exception."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from modeld_env import ModeldEnv, completion, wait_for

MESSAGE_ID = {name: f"5a0f4e2d8c9b4d7e9f1a2b3c4d5e6f7{n}"
              for n, name in enumerate(["started", "succeeded", "failed", "rolled_back", "cancelled", "watchdog"])}


def try_status(env: ModeldEnv) -> dict | None:
    """GET /v1/status through modelctl, or None while modeld does not answer (restarting)."""
    r = env.modelctl("--json", "status")
    if r.returncode != 0:
        return None
    return json.loads(r.stdout)


def deployment(env: ModeldEnv) -> dict | None:
    st = try_status(env)
    return st["deployment"] if st else None


def answers(port: int, model: str) -> str | None:
    """The text of a completion, or None while the server does not answer."""
    try:
        return completion(port, model)
    except (OSError, urllib.error.URLError, ValueError):
        return None


def start_deploy(env: ModeldEnv, model: str, *flags: str) -> str:
    """`modelctl deploy MODEL` without --wait; returns the new deployment's id."""
    r = env.modelctl("--json", "deploy", model, *flags)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)["id"]


def ended(env: ModeldEnv, dep_id: str, timeout: float = 120) -> dict:
    """Waits until deployment `dep_id` has a terminal state; returns it."""
    def done():
        status, _, body = env.api("GET", f"/v1/deployments/{dep_id}")
        if status != 200:
            return None
        d = json.loads(body)
        return d if d["state"] != "running" else None
    return wait_for(f"deployment {dep_id} to end", done, timeout=timeout)


def in_phase(env: ModeldEnv, dep_id: str, phase: str, timeout: float = 60) -> dict:
    """Waits until deployment `dep_id` runs in `phase` (fails at once if it ended instead)."""
    def check():
        d = deployment(env)
        if not d or d["id"] != dep_id:
            return None
        assert d["state"] == "running", f"deployment ended before reaching {phase}: {d}"
        return d if d["phase"] == phase else None
    return wait_for(f"deployment {dep_id} in phase {phase}", check, timeout=timeout)


def journal_mark() -> int:
    """Now, as __REALTIME_TIMESTAMP counts (µs since the epoch; the namespace shares the clock)."""
    return time.time_ns() // 1000


def wait_line(env: ModeldEnv, text: str, since: int = 0, *matches: str, timeout: float = 30) -> dict:
    """The first journal line of modeld (plus `matches`) at or after `since` whose MESSAGE
    contains `text`."""
    def find():
        for e in env.journal("SYSLOG_IDENTIFIER=modeld", *matches):
            if int(e["__REALTIME_TIMESTAMP"]) >= since and text in e.get("MESSAGE", ""):
                return e
        return None
    return wait_for(f"a journal line with {text!r}", find, timeout=timeout)


def server_starts(env: ModeldEnv, model: str, since: int) -> int:
    """How many times `model`'s (fake vLLM) server started since the journal mark `since`."""
    return len([e for e in env.journal(f"SYSLOG_IDENTIFIER=modeld-serve@{model}")
                if int(e["__REALTIME_TIMESTAMP"]) >= since and "fake vLLM API server" in e.get("MESSAGE", "")])


def lines(env: ModeldEnv, *matches: str) -> list[dict]:
    return env.journal("SYSLOG_IDENTIFIER=modeld", *matches)


def reload(env: ModeldEnv) -> int:
    """systemctl reload modeld.service (must succeed); returns a journal mark from before it,
    after waiting for the "configuration reloaded" line."""
    mark = journal_mark()
    r = env.systemd.run(["systemctl", "reload", "modeld.service"])
    assert r.returncode == 0, r.stdout + r.stderr
    wait_line(env, "configuration reloaded", mark)
    return mark


def hub_commit(env: ModeldEnv, repo: str, revision: str = "main") -> str:
    """The commit the hub fixture names for `repo` at `revision` now."""
    url = f"{env.hub.endpoint}/api/models/{repo}/revision/{revision}?expand=sha"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())["sha"]


def push(env: ModeldEnv, repo: str, max_new_tokens: int) -> str:
    """A new commit of `repo` (ORG/NAME) that changes one small file, generation_config.json
    (written aside and renamed over the old one, as git does, so the hub keeps serving the old
    commit), and shares the shards; returns the new commit."""
    gen = env.repos / repo / "generation_config.json"
    cfg = json.loads(gen.read_text())
    cfg["max_new_tokens"] = max_new_tokens
    tmp = gen.with_suffix(".tmp")
    tmp.write_text(json.dumps(cfg))
    os.replace(tmp, gen)
    return hub_commit(env, repo)


def link_target(env: ModeldEnv, model: str) -> str:
    """The commit models_dir/MODEL points to (its link's last component)."""
    return Path((env.models_dir / model).readlink()).name


def kill_modeld(env: ModeldEnv) -> int:
    """kill -9 of modeld's main process (env.kill_modeld), which must be running; returns its PID."""
    pid = env.main_pid()
    assert pid, "modeld.service has no main process to kill"
    env.kill_modeld("KILL")
    return pid


def restart_killed_modeld(env: ModeldEnv, killed: int) -> None:
    """After kill_modeld returned `killed`: a start without waiting for RestartSec=; waits until
    a new modeld answers."""
    # restart (not start): a start job waits for the auto-restart's holdoff, a restart does not.
    env.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
    wait_for("modeld to answer after the kill", lambda: env.main_pid() not in (0, killed)
             and try_status(env) is not None, timeout=60)


def restart_modeld_after_kill(env: ModeldEnv) -> None:
    """kill_modeld, then restart_killed_modeld."""
    restart_killed_modeld(env, kill_modeld(env))


def ns_popen(env: ModeldEnv, cmd: list[str]) -> subprocess.Popen:
    """`cmd` inside the namespaced systemd's namespaces, in a session of its own (so that
    killpg ends nsenter and its child together); stdout piped, text."""
    return subprocess.Popen(["nsenter", "-t", str(env.systemd.pid), "-p", "-m", *cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
