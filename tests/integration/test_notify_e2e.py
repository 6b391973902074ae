"""End to end, what modeld tells systemd through sd_notify under a real (namespaced) systemd:
the STATUS= line `systemctl status modeld` shows while a download runs, and the watchdog, which
modeld pets from its event loop: the loop keeps petting through a full-speed download, and a
stopped loop gets the daemon killed and restarted by systemd, after which the deployment
continues from the bytes on disk."""

from __future__ import annotations

import re

import pytest

from modeld_env import ModeldEnv, ModeldUnreachable, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

# "downloading big: 37% of 33.6 MB, 4.2 MB/s, 5 s left" (the wording; the rate and
# time left appear once the engine has measured a rate).
STATUS = re.compile(r"^downloading big: (\d{1,3})% of \d+(\.\d)? [kMG]B, \d+(\.\d)? [kMG]B/s, "
                    r"(\d+ s|\d+ min|\d+ h \d+ min) left")

# A watchdog far shorter than the shipped 60 s (modeld pets every 3 s; a loop late by seconds on
# a loaded host still makes it), and systemd's SIGKILL 1 s after its SIGABRT (a stopped process
# cannot act on the SIGABRT, so the default would wait TimeoutStopSec=).
WATCHDOG_SEC = 6
WATCHDOG_DROPIN = f"[Service]\nWatchdogSec={WATCHDOG_SEC}s\nTimeoutAbortSec=1s\nRestartSec=1s\n"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    # 1 MiB/s per response: 8 shards of 4 MiB take 8 s at least over 4 connections, however fast
    # the host (more than two of modeld's watchdog pets).
    e = ModeldEnv(workdir=tmp_path_factory.mktemp("notify"), hub_args=["--throttle", str(1 << 20)])
    e.add_repo("acme/big", shards=8, shard_size=4 << 20, seed=71)
    e.add_repo("acme/big2", shards=8, shard_size=4 << 20, seed=72)
    tables = (model_table("big", "acme/big", free_port()) + model_table("big2", "acme/big2", free_port()))
    try:
        e.start(tables)
        e.systemd.write_file("/run/systemd/system/modeld.service.d/60-watchdog.conf", WATCHDOG_DROPIN)
        e.systemd.run(["systemctl", "daemon-reload"], check=True)
        e.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
        wait_for("modeld's control socket", lambda: e.modelctl("status").returncode == 0, timeout=60)
        yield e
    finally:
        e.stop()


def show(env, prop: str, unit: str = "modeld.service") -> str:
    return env.systemd.run(["systemctl", "show", "-p", prop, "--value", unit], check=True).stdout.strip()


def downloaded(env) -> int:
    d = env.status()["deployment"]
    return d["progress"]["bytes_done"] if d and d["state"] == "running" and d["phase"] == "downloading" else 0


def test_systemctl_status_shows_the_download_with_percent_size_rate_and_time_left(env):
    pid, restarts = env.main_pid(), show(env, "NRestarts")
    assert env.modelctl("deploy", "big").returncode == 0
    seen: list[str] = []

    def status_with_rate():
        text = show(env, "StatusText")
        seen.append(text)
        return STATUS.match(text)

    m = wait_for("a STATUS= line with the download's percent, size, rate and time left", status_with_rate,
                 timeout=60, interval=0.2)
    assert 0 <= int(m.group(1)) <= 100, m.group(0)
    # What systemctl status prints, for the closing note.
    print(env.systemd.run(["systemctl", "status", "--no-pager", "modeld.service"]).stdout)

    dep, pets = pets_until_the_end(env)
    assert dep["state"] == "succeeded", dep
    wait_for("STATUS= to say big serves", lambda: show(env, "StatusText").startswith("serving big ("), timeout=10)
    # The loop kept petting the watchdog through the whole download: pets while it ran, never
    # further apart than the watchdog allows, and no watchdog restart.
    start, end = phase_span(env, dep["id"], "downloading", "verifying")
    during = [p for p in pets if start < p < end]
    assert len(during) >= 2, (start, end, pets)
    gaps = [b - a for a, b in zip([start, *during], [*during, end])]
    assert max(gaps) < WATCHDOG_SEC * 1e6, gaps
    assert (env.main_pid(), show(env, "NRestarts")) == (pid, restarts), seen


def pets_until_the_end(env) -> tuple[dict, list[int]]:
    """Samples when systemd last saw modeld pet its watchdog (CLOCK_MONOTONIC µs) until the
    deployment ends: (the deployment, every distinct pet time seen)."""
    pets: list[int] = []

    def ended():
        pet = int(show(env, "WatchdogTimestampMonotonic") or 0)
        if not pets or pets[-1] != pet:
            pets.append(pet)
        d = env.status()["deployment"]
        return d["state"] != "running" and d

    return wait_for("the deployment to end", ended, timeout=120, interval=0.1), pets


def phase_span(env, dep_id: str, phase: str, following: str) -> tuple[int, int]:
    """CLOCK_MONOTONIC µs of the deployment's first journal line in `phase` and in `following`."""
    lines = env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}")

    def first(p):
        return min(int(e["__MONOTONIC_TIMESTAMP"]) for e in lines if e.get("MODELD_PHASE") == p)

    return first(phase), first(following)


def test_a_stalled_event_loop_is_killed_by_the_watchdog_and_the_deployment_continues(env):
    pid, restarts = env.main_pid(), int(show(env, "NRestarts"))
    assert env.modelctl("deploy", "big2").returncode == 0
    dep_id = env.status()["deployment"]["id"]
    wait_for("a shard of big2 partly on disk", lambda: downloaded(env) > 1 << 20, timeout=60)
    # SIGSTOP freezes the whole process, its event loop included: the petting stops.
    env.kill_modeld("STOP")
    wait_for("systemd to restart modeld after the watchdog timeout",
             lambda: int(show(env, "NRestarts")) > restarts and env.main_pid() not in (0, pid), timeout=60)
    # A stopped process cannot exit by itself and nobody asked systemd to stop it: the restart
    # can only be the watchdog's (PID 1 logs "Watchdog timeout" to the namespace's console).
    assert env.unit_state("modeld.service") in ("active", "activating", "reloading")

    dep = wait_for("the deployment of big2 to end after the restart",
                   lambda: (d := env.status()["deployment"])["state"] != "running" and d, timeout=180,
                   retry_on=(ModeldUnreachable,))
    assert dep["id"] == dep_id, "\n".join(e.get("MESSAGE", "") for e in env.journal("SYSLOG_IDENTIFIER=modeld"))
    assert dep["state"] == "succeeded", dep
    assert env.status()["active"]["model"] == "big2"
    # The restarted modeld watched big, the model in service, while big2's download went on, and
    # stopped watching it only when the deployment came to stop it.
    lines = [e["MESSAGE"] for e in env.journal("SYSLOG_IDENTIFIER=modeld")]
    cont = next(i for i, m in enumerate(lines) if m.startswith(f"continuing deployment {dep_id}"))
    watching = [i for i, m in enumerate(lines) if m.startswith("watchdog: watching modeld-serve@big.service")]
    stopping = next(i for i, m in enumerate(lines) if i > cont and "stopping modeld-serve@big.service" in m)
    assert any(cont < i < stopping for i in watching), "\n".join(lines[cont:stopping + 1])
