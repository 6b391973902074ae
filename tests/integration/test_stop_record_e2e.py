"""End to end, `modelctl stop` as docs/interface.md fixes it ("Stop." under "Several models on one
host" and "Several models in service: status, stop, metrics"), under a namespaced systemd with a
fake NVML showing one GPU: its output lines and exit codes, a model no longer configured but in
service stopped (unwatched from the reload that removed it, and watched by no watcher after the
stop, configured again or not), and a stop that cannot finish ending `failed` naming what is left."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from contract_helpers import journal_mark, reload
from modeld_env import BUILD_DIR, ModeldEnv, completion, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

MiB = 1 << 20
GiB = 1 << 30
FAKE_NVML = BUILD_DIR / "fake_nvml" / "libnvidia-ml.so.1"
UUID = "GPU-24242424-2424-4242-8424-242424242424"
TOTAL = 141 * GiB
IDLE = 615 * MiB
LEFTOVER_PID = 4646  # a worker the fake NVML shows on GPU 0 after the unit stopped


def nvml_state(path: Path, procs: list[tuple[int, int]] = ()) -> None:
    """One fake H200, idle but for compute processes (pid, bytes)."""
    used = IDLE + sum(n for _, n in procs)
    lines = ["init 0", f"gpu {UUID} {TOTAL} {used} {TOTAL - used} {IDLE} NVIDIA H200"]
    lines += [f"proc 0 {pid} {n}" for pid, n in procs]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)


def tables(e: ModeldEnv, names: list[str]) -> str:
    """"held" uses every GPU (so its stop waits for GPU 0's memory); the others none, so they
    serve beside it, each watched every second."""
    return "".join(model_table(n, f"acme/{n}", e.ports[n], stop_timeout="3s",
                               extra_serve="" if n == "held" else "gpu_ids = []")
                   + ("" if n == "held" else f'\n[models.{n}.health]\nwatch_interval = "1s"\n') for n in names)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("stop-record")
    state = work / "nvml-state.txt"
    nvml_state(state)
    e = ModeldEnv(workdir=work, environment={"MODELD_NVML_LIBRARY": str(FAKE_NVML), "FAKE_NVML_STATE": str(state)})
    e.nvml = state
    e.names = ["plain", "gone", "held"]
    for i, n in enumerate(e.names):
        e.add_repo(f"acme/{n}", shards=2, shard_size=64 * 1024, seed=240 + i)
    e.ports = {n: free_port() for n in e.names}
    try:
        assert FAKE_NVML.exists(), f"{FAKE_NVML} is missing: build the fake_nvml target"
        e.start(tables(e, e.names))
        yield e
    finally:
        e.stop()


def unit(model: str) -> str:
    return f"modeld-serve@{model}.service"


def services(env: ModeldEnv) -> list[str]:
    return [s["model"] for s in env.status()["services"]]


def watchdog_state(env: ModeldEnv, model: str) -> str | None:
    """The state of `model`'s watcher as its entry of GET /v1/status "services" has it."""
    entry = next(s for s in env.status()["services"] if s["model"] == model)
    return (entry["watchdog"] or {}).get("state")


def probed(env: ModeldEnv, model: str, times: int) -> None:
    """Waits until the watcher of `model` (in service) has finished `times` probes from now on:
    `times` + 1 values of its last_probe_at (whole seconds; the first may be older than now)."""
    seen: set[str] = set()

    def enough() -> bool:
        entry = next(s for s in env.status()["services"] if s["model"] == model)
        seen.add((entry["watchdog"] or {}).get("last_probe_at") or "")
        return len(seen - {""}) > times
    wait_for(f"{times} probes of {model}'s watcher", enough, timeout=30)


def watchdog_lines(env: ModeldEnv, model: str, since: int) -> list[str]:
    """modeld's "watchdog: ..." lines about `model` since the journal mark `since`."""
    return [e["MESSAGE"] for e in env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_MODEL={model}")
            if int(e["__REALTIME_TIMESTAMP"]) >= since and e.get("MESSAGE", "").startswith("watchdog: ")]


def stop(env: ModeldEnv, *args: str) -> tuple[int, list[str], str]:
    """`modelctl stop ARGS`: exit code, stdout's lines, stderr."""
    r = env.modelctl("stop", *args)
    return r.returncode, r.stdout.splitlines(), r.stderr


def stop_id(first_line: str, model: str) -> str:
    """The record id of the line "Stopping MODEL (stop ID)"."""
    m = re.fullmatch(rf"Stopping {re.escape(model)} \(stop (\S+)\)", first_line)
    assert m, first_line
    return m.group(1)


def test_stop_prints_pulls_lines_and_exits_as_deploy_does(env):
    assert env.deploy_and_wait("plain")["state"] == "succeeded"
    # In service: the start, its one phase, the result.
    rc, out, err = stop(env, "plain", "--wait")
    assert rc == 0, (out, err)
    dep_id = stop_id(out[0], "plain")
    assert out == [f"Stopping plain (stop {dep_id})", "phase: stopping_old", f"Stop {dep_id} succeeded"], out
    assert env.unit_state(unit("plain")) in ("inactive", "failed")
    # Not in service: the record ends at once, and says so.
    rc, out, err = stop(env, "plain", "--wait")
    assert rc == 0, (out, err)
    again = stop_id(out[0], "plain")
    assert again != dep_id
    assert out == [f"Stopping plain (stop {again})",
                   f"Stop {again} succeeded: plain was not in service, nothing to do"], out
    # Without --wait: one line naming the record.
    rc, out, err = stop(env, "plain")
    assert rc == 0 and len(out) == 1, (out, err)
    assert re.fullmatch(r"Started stop \S+ of plain", out[0]), out
    # An unknown model is refused as deploy refuses it: exit 2, nothing on stdout.
    rc, out, err = stop(env, "no-such-model", "--wait")
    assert rc == 2 and out == [] and "no-such-model" in err, (rc, out, err)


def test_a_model_no_longer_configured_but_in_service_can_be_stopped(env):
    assert env.deploy_and_wait("gone")["state"] == "succeeded"
    # plain serves beside it, watched every second as gone was: the yardstick of how soon a
    # watcher acts.
    assert env.deploy_and_wait("plain")["state"] == "succeeded"
    assert services(env) == ["gone", "plain"]
    wait_for("gone watched", lambda: watchdog_state(env, "gone") == "watching", timeout=30)
    env.write_config(tables(env, [n for n in env.names if n != "gone"]))
    reload(env)
    # Still in service and serving after the reload, unwatched.
    assert "gone" in services(env)
    wait_for("gone's watcher to stop", lambda: watchdog_state(env, "gone") == "stopped", timeout=30)
    assert completion(env.ports["gone"], "gone")
    mark = journal_mark()
    rc, out, err = stop(env, "gone", "--wait")
    assert rc == 0, (out, err)
    dep_id = stop_id(out[0], "gone")
    assert out[-1] == f"Stop {dep_id} succeeded", out
    dep = json.loads(env.modelctl("--json", "deployment", dep_id).stdout)
    assert (dep["kind"], dep["state"], dep["changed"]) == ("stop", "succeeded", True), dep
    assert env.unit_state(unit("gone")) in ("inactive", "failed")
    assert "gone" not in services(env)
    # Configured again, out of service: no watcher watches it. By plain's third probe after the
    # reload a watcher of gone (every second too) would have looked at its stopped unit twice,
    # said "watchdog: watching" and restarted it.
    env.write_config(tables(env, env.names))
    reload(env)
    probed(env, "plain", 3)
    assert watchdog_lines(env, "gone", mark) == [], watchdog_lines(env, "gone", mark)
    assert env.unit_state(unit("gone")) in ("inactive", "failed")
    assert "gone" not in services(env)
    assert watchdog_state(env, "plain") == "watching"  # the yardstick was watched throughout
    rc, out, err = stop(env, "plain", "--wait")
    assert rc == 0, (out, err)


def test_a_stop_that_cannot_finish_ends_failed_naming_what_is_left(env):
    assert env.deploy_and_wait("held")["state"] == "succeeded"
    # A worker of held's server keeps 20 GiB of GPU 0 after its unit stopped, past the wait's
    # limit (stop_timeout 3 s plus 15 s).
    nvml_state(env.nvml, [(LEFTOVER_PID, 20 * GiB)])
    try:
        rc, out, err = stop(env, "held", "--wait")
    finally:
        nvml_state(env.nvml)
    assert rc == 1, (rc, out, err)
    dep_id = stop_id(out[0], "held")
    assert out[1:] == ["phase: stopping_old", f"Stop {dep_id} failed in phase stopping_old"], out
    dep = json.loads(env.modelctl("--json", "deployment", dep_id).stdout)
    assert (dep["kind"], dep["state"], dep["phase"]) == ("stop", "failed", "stopping_old"), dep
    msg = dep["error"]["message"]
    # What is left, by GPU, holder and amount; stderr carries the same.
    assert "GPU 0 (NVIDIA H200)" in msg and f"pid {LEFTOVER_PID}" in msg and "20.0 GiB above the baseline" in msg, msg
    assert msg in err, err
    # It never rolls back: the unit stays stopped and the model out of service.
    assert env.unit_state(unit("held")) in ("inactive", "failed")
    assert "held" not in services(env)
