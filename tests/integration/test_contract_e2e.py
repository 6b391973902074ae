"""End to end, contract behaviours that no other test covers (issue 13), against one modeld under
a namespaced systemd and the bundled hub:

- a redeploy of the serving model at a new commit, and a new commit that fails readiness rolled
  back to the old commit (the old commit serves again, the link points back; MESSAGE_ID ...73);
- rollback_failed: neither the new model nor the old one comes up;
- cancel: `modelctl cancel` with nothing running, a cancel before stopping_old (MESSAGE_ID ...74);
- configuration reloads: the model in service removed (it keeps running, unwatched), and
  hub.parallel_files, hub.max_bytes_per_s and daemon.disk_reserve taking effect for the next
  deployment;
- the watchdog refusing to restart a model whose files changed since their verification;
- a process that left the old service's control group and holds the port delays the new server;
- `modelctl logs [-f] [NAME]`;
- deployment ids of deployments started in the same second, and a history of over 100.

Every wait is a condition with a generous deadline; phases are held open by the hub's "hold" and
fake_vllm's --load-until, never by timing."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time

import pytest

from contract_helpers import (MESSAGE_ID, answers, deployment, ended, hub_commit, in_phase, journal_mark,
                              lines, link_target, ns_popen, push, reload, start_deploy, try_status, wait_line)
from modeld_env import ModeldEnv, free_port, model_table, wait_for, write_control
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")


class ContractEnv(ModeldEnv):
    """ModeldEnv whose [hub] parallel_files is a setting of the test (the base writes 4)."""

    parallel_files = 1

    def write_config(self, model_tables: str):
        super().write_config(model_tables)
        text = self.config.read_text()
        self.config.write_text(text.replace("parallel_files = 4", f"parallel_files = {self.parallel_files}"))


def watched(name: str) -> str:
    return f'\n[models.{name}.health]\nwatch_interval = "1s"\n'


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("contract")
    control = work / "hub-control.json"
    e = ContractEnv(workdir=work, hub_args=["--control", str(control)])
    e.hub_control = control
    write_control(control)
    e.add_repo("acme/m", shards=2, shard_size=100_000, seed=71)
    e.add_repo("acme/flaky", shards=1, shard_size=50_000, seed=72)
    e.add_repo("acme/w", shards=1, shard_size=50_000, seed=73)
    e.add_repo("acme/big", shards=4, shard_size=200_000, seed=74)
    e.add_repo("acme/rated", shards=3, shard_size=200_000, seed=75)
    e.add_repo("acme/fresh", shards=1, shard_size=50_000, seed=76)
    e.add_repo("acme/escaper", shards=1, shard_size=50_000, seed=77)
    e.add_repo("acme/after", shards=1, shard_size=50_000, seed=78)
    e.ports = {n: free_port() for n in ("m", "flaky", "w", "big", "rated", "fresh", "escaper")}
    e.ports["after"] = e.ports["escaper"]
    e.flaky_loaded = work / "flaky-loaded"
    e.tables = {
        "m": model_table("m", "acme/m", e.ports["m"], stop_timeout="10s"),
        # Loads until the test creates flaky-loaded, then listens and exits 1 at once.
        "flaky": model_table("flaky", "acme/flaky", e.ports["flaky"],
                             serve_args=["--load-until", str(e.flaky_loaded), "--exit-after", "0"]),
        "w": model_table("w", "acme/w", e.ports["w"]) + watched("w"),
        "big": model_table("big", "acme/big", e.ports["big"]),
        "rated": model_table("rated", "acme/rated", e.ports["rated"]),
        "fresh": model_table("fresh", "acme/fresh", e.ports["fresh"]),
        # On SIGTERM leaves a child (ignoring SIGTERM) that keeps the listening socket for 10 min.
        "escaper": model_table("escaper", "acme/escaper", e.ports["escaper"], stop_timeout="60s",
                               serve_args=["--hold-port-after-exit", "600"]),
        "after": model_table("after", "acme/after", e.ports["after"]),
        # The hub has no such repository: its deployments fail in planning, quickly.
        "missing": model_table("missing", "acme/does-not-exist", free_port()),
    }
    try:
        e.start("".join(e.tables.values()))
        yield e
    finally:
        e.stop()


def reconfigure(env: ContractEnv, *, drop: tuple[str, ...] = (), parallel_files: int | None = None,
                max_bytes_per_s: str | None = None, disk_reserve: str | None = None) -> int:
    """Rewrites the configuration (models but `drop`; the [hub] and [daemon] settings given) and
    reloads modeld; returns the journal mark from before the reload."""
    if parallel_files is not None:
        env.parallel_files = parallel_files
    if max_bytes_per_s is not None:
        env.config_extra = f'max_bytes_per_s = "{max_bytes_per_s}"'
    if disk_reserve is not None:
        env.disk_reserve = disk_reserve
    env.write_config("".join(t for n, t in env.tables.items() if n not in drop))
    return reload(env)


def held(env) -> int:
    return env.hub.stats()["held"]


# -- cancel with nothing running ------------------------------------------------------------------

def test_cancel_with_nothing_running_exits_1_and_an_ended_deployment_cannot_be_cancelled(env):
    r = env.modelctl("cancel")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "no deployment is running" in r.stderr, r.stderr
    dep = env.deploy_and_wait("missing", 1)
    assert dep["state"] == "failed", dep
    r = env.modelctl("cancel")
    assert r.returncode == 1 and "no deployment is running" in r.stderr, r.stdout + r.stderr
    status, _, body = env.api("POST", f"/v1/deployments/{dep['id']}/cancel")
    assert status == 409 and json.loads(body)["error"]["code"] == "deployment_ended", (status, body)
    assert env.status()["deployment"]["state"] == "failed"


# -- a new commit of the serving model ------------------------------------------------------------

def test_a_redeploy_of_the_serving_model_at_a_new_commit_switches_the_link(env):
    first = env.deploy_and_wait("m")
    assert first["state"] == "succeeded", first
    c1 = first["commit"]
    assert c1 == hub_commit(env, "acme/m") and link_target(env, "m") == c1

    # Push a new revision: one small file changes, so the commit does.
    c2 = push(env, "acme/m", 77)
    assert c2 != c1
    before = len(env.hub.requests())
    dep = env.deploy_and_wait("m")
    assert dep["state"] == "succeeded" and dep["commit"] == c2, dep
    st = env.status()
    assert st["active"]["model"] == "m" and st["active"]["commit"] == c2
    assert link_target(env, "m") == c2
    assert json.loads((env.models_dir / "m" / "generation_config.json").read_text())["max_new_tokens"] == 77
    # Only the changed file was fetched (planning reads the index besides): the rest was
    # hard-linked from the old revision.
    fetched = {x["file"] for x in env.hub.requests()[before:] if x.get("file")} - {"acme/m/model.safetensors.index.json"}
    assert fetched == {"acme/m/generation_config.json"}, fetched
    # The old revision is gone once the new one serves.
    assert not (env.models_dir / ".store" / "m" / c1).exists()
    assert answers(env.ports["m"], "m")


def test_a_new_commit_that_fails_readiness_is_rolled_back_to_the_old_commit(env):
    c_old = env.status()["active"]["commit"]
    unit = "modeld-serve@m.service"
    # A config.json that parses (modeld's checks pass) but names no architecture: the server
    # refuses to load it, as vLLM does.
    cfg_path = env.repos / "acme" / "m" / "config.json"
    good = cfg_path.read_text()
    cfg = json.loads(good)
    cfg.pop("model_type", None)
    cfg.pop("architectures", None)
    cfg_path.write_text(json.dumps(cfg))
    try:
        c_new = hub_commit(env, "acme/m")
        dep = env.deploy_and_wait("m", 1)
    finally:
        cfg_path.write_text(good)
    assert dep["commit"] == c_new != c_old
    assert dep["state"] == "rolled_back" and dep["phase"] == "rolling_back", dep
    assert dep["error"]["code"] == "unit_failed", dep["error"]
    assert "has neither model_type nor architectures" in dep["error"]["message"], dep["error"]
    assert "rolled back: m serves again" in dep["error"]["message"], dep["error"]
    # The old commit serves again, and the link points back to it.
    st = env.status()
    assert st["active"]["model"] == "m" and st["active"]["commit"] == c_old, st["active"]
    assert link_target(env, "m") == c_old
    assert env.unit_state(unit) == "active"
    assert answers(env.ports["m"], "m")
    # The terminal line is the catalogued "rolled back" one.
    terminal = lines(env, f"MODELD_DEPLOYMENT={dep['id']}", f"MESSAGE_ID={MESSAGE_ID['rolled_back']}")
    assert len(terminal) == 1 and terminal[0]["MODELD_STATE"] == "rolled_back", terminal
    assert terminal[0]["MODELD_PHASE"] == "rolling_back"


def test_a_rollback_whose_old_model_cannot_come_back_ends_rollback_failed(env):
    unit = "modeld-serve@m.service"
    dep_id = start_deploy(env, "flaky")
    # flaky loads until the test says so; m is stopped by now and its port free.
    in_phase(env, dep_id, "health_checking")
    assert env.unit_state(unit) in ("inactive", "failed")
    # Someone takes m's port: m cannot listen when the rollback starts it again.
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT, not a listener
    squatter.bind(("127.0.0.1", env.ports["m"]))
    squatter.listen()

    def refuse():  # closes every connection at once, so that no probe waits on it
        while True:
            try:
                conn, _ = squatter.accept()
            except OSError:
                return
            conn.close()
    threading.Thread(target=refuse, daemon=True).start()
    try:
        env.flaky_loaded.touch()  # flaky listens, then dies: rolling back
        dep = ended(env, dep_id)
    finally:
        squatter.shutdown(socket.SHUT_RDWR)
        squatter.close()
        env.flaky_loaded.unlink(missing_ok=True)
    assert dep["state"] == "failed" and dep["phase"] == "rolling_back", dep
    assert dep["error"]["code"] == "rollback_failed", dep["error"]
    msg = dep["error"]["message"]
    assert "modeld-serve@flaky.service" in msg and "rollback failed too" in msg, msg
    assert "the previous model did not become ready again" in msg, msg
    assert env.unit_state("modeld-serve@flaky.service") in ("inactive", "failed")
    assert env.unit_state(unit) in ("inactive", "failed")
    # Nothing known to work serves: no watchdog restarts m behind the operator's back.
    w = env.status()["watchdog"]
    assert w is None or w["state"] == "stopped", w
    terminal = lines(env, f"MODELD_DEPLOYMENT={dep_id}", f"MESSAGE_ID={MESSAGE_ID['failed']}")
    assert len(terminal) == 1 and terminal[0]["MODELD_STATE"] == "failed", terminal


def test_a_cancel_before_stopping_old_ends_cancelled_with_its_message_id(env):
    # parallel_files = 1 (the configuration at start): one file downloads at a time.
    write_control(env.hub_control, hold="acme/big/*.safetensors")
    try:
        mark = journal_mark()
        dep_id = start_deploy(env, "big")
        wait_for("a held download", lambda: held(env) >= 1, timeout=60)
        assert "1 at once" in wait_line(env, "downloading ", mark, f"MODELD_DEPLOYMENT={dep_id}")["MESSAGE"]
        assert held(env) == 1
        r = env.modelctl("cancel")
        assert r.returncode == 0, r.stdout + r.stderr
        dep = ended(env, dep_id)
    finally:
        write_control(env.hub_control)
    assert dep["state"] == "cancelled" and dep["phase"] == "downloading", dep
    assert dep["error"]["code"] == "cancelled", dep
    terminal = lines(env, f"MODELD_DEPLOYMENT={dep_id}", f"MESSAGE_ID={MESSAGE_ID['cancelled']}")
    assert len(terminal) == 1 and terminal[0]["MODELD_STATE"] == "cancelled", terminal
    assert terminal[0]["MODELD_PHASE"] == "downloading"


# -- reloads ----------------------------------------------------------------------------------------

def test_a_reload_that_removes_the_model_in_service_leaves_it_running_unwatched(env):
    dep = env.deploy_and_wait("w")
    assert dep["state"] == "succeeded", dep
    wait_for("the watchdog watching w", lambda: ((try_status(env) or {}).get("watchdog") or {}).get("state")
             == "watching", timeout=30)
    pid = env.main_pid("modeld-serve@w.service")

    mark = reconfigure(env, drop=("w",))
    line = wait_line(env, "configuration reloaded", mark)
    assert "removed: w" in line["MESSAGE"], line["MESSAGE"]
    wait_line(env, "active model w is no longer configured", mark)
    st = wait_for("the watchdog to stop watching w", lambda: (
        (s := try_status(env)) and (s["watchdog"] is None or s["watchdog"]["state"] == "stopped") and s), timeout=30)
    assert st["active"]["model"] == "w"
    assert env.unit_state("modeld-serve@w.service") == "active"
    assert env.main_pid("modeld-serve@w.service") == pid
    assert answers(env.ports["w"], "w")
    r = env.modelctl("deploy", "w")
    assert r.returncode == 2, r.stdout + r.stderr

    # Configured again: watched again, the same server.
    mark = reconfigure(env)
    wait_line(env, "watching modeld-serve@w.service every 1.0 s", mark)
    assert env.main_pid("modeld-serve@w.service") == pid


def test_a_reload_of_parallel_files_max_bytes_per_s_and_disk_reserve_applies_to_the_next_deployment(env):
    # parallel_files 1 -> 3: three files in flight at once, which one connection cannot do.
    mark = reconfigure(env, parallel_files=3)
    write_control(env.hub_control, hold="acme/big/*.safetensors")
    try:
        dep_id = start_deploy(env, "big")
        wait_for("three held downloads", lambda: held(env) >= 3, timeout=60)
        assert "3 at once" in wait_line(env, "downloading ", mark, f"MODELD_DEPLOYMENT={dep_id}")["MESSAGE"]
        assert env.modelctl("cancel").returncode == 0
        assert ended(env, dep_id)["state"] == "cancelled"
    finally:
        write_control(env.hub_control)

    # max_bytes_per_s: the download cannot be faster than the limit (the bucket starts empty and
    # holds at most one second of bytes).
    rate = 200_000
    reconfigure(env, max_bytes_per_s="200kB")
    dep_id = start_deploy(env, "rated")
    dep = ended(env, dep_id)
    assert dep["state"] == "succeeded", dep
    total = dep["progress"]["bytes_total"]
    assert total > 2 * rate, total
    stamps = {}
    for e in lines(env, f"MODELD_DEPLOYMENT={dep_id}", "MODELD_PHASE=downloading"):
        if m := re.match(r"(downloading|downloaded) \d+ files", e["MESSAGE"]):
            stamps[m.group(1)] = int(e["__REALTIME_TIMESTAMP"])
    seconds = (stamps["downloaded"] - stamps["downloading"]) / 1e6
    assert seconds >= total / rate - 1.0, (seconds, total)

    # disk_reserve: more than any disk has; the next deployment does not fit.
    reconfigure(env, max_bytes_per_s="0", disk_reserve="1000TB")
    try:
        dep = env.deploy_and_wait("fresh", 1)
        assert dep["state"] == "failed" and dep["phase"] == "freeing_disk", dep
        assert dep["error"]["code"] == "disk_full" and "disk_reserve" in dep["error"]["message"], dep["error"]
    finally:
        reconfigure(env, disk_reserve="0")
    assert env.deploy_and_wait("fresh")["state"] == "succeeded"


# -- the watchdog and changed files -------------------------------------------------------------------

def test_the_watchdog_does_not_restart_a_model_whose_files_changed(env):
    dep = env.deploy_and_wait("w")
    assert dep["state"] == "succeeded", dep
    unit = "modeld-serve@w.service"
    wait_for("the watchdog watching w", lambda: ((try_status(env) or {}).get("watchdog") or {}).get("model") == "w"
             and try_status(env)["watchdog"]["state"] == "watching", timeout=30)
    # A verified file is touched while the server runs (its identity changes), then the server dies.
    touched = env.models_dir / ".store" / "w" / dep["commit"] / "config.json"
    touched.write_text(touched.read_text())
    mark = journal_mark()
    env.systemd.run(["systemctl", "kill", "-s", "KILL", unit], check=True)

    def outcome():
        s = try_status(env)
        if s and s["watchdog"] and s["watchdog"]["restarts"] > 0:
            return "restarted"
        hit = [e for e in lines(env, "MODELD_MODEL=w") if int(e["__REALTIME_TIMESTAMP"]) >= mark
               and "not restarting it" in e.get("MESSAGE", "")]
        return hit[0] if hit else None
    line = wait_for("the watchdog's decision", outcome, timeout=60)
    assert line != "restarted", "the watchdog restarted a model whose files changed since their verification"
    assert "changed since their verification" in line["MESSAGE"] and unit in line["MESSAGE"], line["MESSAGE"]
    assert line["PRIORITY"] == "3"
    w = wait_for("the watchdog to stop", lambda: (
        (s := try_status(env)) and s["watchdog"] and s["watchdog"]["state"] == "stopped" and s["watchdog"]), timeout=30)
    assert w["restarts"] == 0, w
    assert env.unit_state(unit) == "failed"
    assert not lines(env, "MODELD_MODEL=w", f"MESSAGE_ID={MESSAGE_ID['watchdog']}")


# -- a leftover outside the old service's control group ------------------------------------------------

def test_a_process_that_left_the_old_control_group_holding_the_port_delays_the_new_server(env):
    """The new server (same port) starts only once nothing listens on the port any more, even when
    the listener is no longer in the old unit's control group (systemd calls that unit inactive)."""
    assert env.deploy_and_wait("escaper")["state"] == "succeeded"
    old = "modeld-serve@escaper.service"
    mark = journal_mark()
    dep_id = start_deploy(env, "after")
    hold = wait_for("the port-holding child", lambda: next(
        (e for e in env.journal(unit=old) if int(e["__REALTIME_TIMESTAMP"]) >= mark and " held by " in e["MESSAGE"]),
        None), timeout=60)
    pid = int(re.search(r" held by (\d+) ", hold["MESSAGE"]).group(1))
    # The child leaves the unit's control group (in every hierarchy systemd tracks it by).
    escape = f"modeld-test-escape-{env.systemd.pid}"
    moved = env.systemd.run(["sh", "-c", f"""
        set -e
        for h in /sys/fs/cgroup/unified /sys/fs/cgroup/systemd /sys/fs/cgroup; do
          if [ -f "$h/cgroup.procs" ] && grep -q "^[0-9]*:[^:]*:/.*escaper" /proc/{pid}/cgroup; then
            mkdir -p "$h/{escape}" && echo {pid} > "$h/{escape}/cgroup.procs"
          fi
        done
        cat /proc/{pid}/cgroup"""])
    assert moved.returncode == 0, moved.stdout + moved.stderr
    try:
        wait_for("the old unit to be stopped", lambda: env.unit_state(old) in ("inactive", "failed"), timeout=60)

        def waiting_or_ended():
            d = deployment(env)
            if d and d["id"] == dep_id and d["state"] != "running":
                return d
            hit = [e for e in lines(env, f"MODELD_DEPLOYMENT={dep_id}") if "waiting for what" in e["MESSAGE"]]
            return hit[0] if hit else None
        seen = wait_for("modeld waiting for what the old unit left", waiting_or_ended, timeout=60)
        assert "MESSAGE" in seen, f"the deployment went on while the old server's port was held: {seen}"
        assert f"port {env.ports['after']} still listened on" in seen["MESSAGE"], seen["MESSAGE"]
        d = deployment(env)
        assert d["id"] == dep_id and d["phase"] == "stopping_old" and d["state"] == "running", d
        assert env.unit_state("modeld-serve@after.service") in ("inactive", "")
    finally:
        env.systemd.run(["kill", "-KILL", str(pid)])
    dep = ended(env, dep_id)
    assert dep["state"] == "succeeded", dep
    assert answers(env.ports["after"], "after")
    env.systemd.run(["sh", "-c", f"for h in /sys/fs/cgroup/unified /sys/fs/cgroup/systemd /sys/fs/cgroup; do "
                                 f"rmdir $h/{escape} 2>/dev/null; done; true"])


# -- modelctl logs -------------------------------------------------------------------------------------

def test_modelctl_logs_shows_the_daemons_journal_or_a_models_and_follows_it(env):
    ctl = [str(env.modelctl_bin), "--socket", str(env.socket)]
    daemon = env.systemd.run([*ctl, "logs"])
    assert daemon.returncode == 0, daemon.stdout + daemon.stderr
    assert "deployment " in daemon.stdout and "of model m started" in daemon.stdout, daemon.stdout[-2000:]
    # Only modeld's own lines (a server's lines it quotes in an error are inside them).
    assert " modeld[" in daemon.stdout and not re.search(r" modeld-serve@\S+\[\d+\]: ", daemon.stdout)
    model = env.systemd.run([*ctl, "logs", "after"])
    assert model.returncode == 0, model.stdout + model.stderr
    assert "Uvicorn running" in model.stdout and "fake vLLM API server" in model.stdout, model.stdout[-2000:]
    assert " modeld-serve@after[" in model.stdout and " modeld[" not in model.stdout, model.stdout[-2000:]
    bad = env.modelctl("logs", "Not/A/Name")
    assert bad.returncode == 2, bad.stdout + bad.stderr

    # -f: a line written after it started shows up while it runs.
    follow = ns_popen(env, [*ctl, "logs", "-f"])
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(follow.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for("journalctl -f to print the last lines", lambda: len(seen) > 0, timeout=30)
        dep_id = start_deploy(env, "missing")
        wait_for("the new deployment's line in the followed journal",
                 lambda: any(dep_id in line and "started" in line for line in seen), timeout=30)
        assert follow.poll() is None, "modelctl logs -f ended by itself"
    finally:
        os.killpg(follow.pid, signal.SIGTERM)
        follow.wait(timeout=30)
    ended(env, dep_id)


# -- ids and history -------------------------------------------------------------------------------------

def test_ids_of_deployments_in_the_same_second_and_a_history_of_over_100(env):
    n = 105
    t0 = time.monotonic()
    ours = []
    for _ in range(n):
        dep_id = start_deploy(env, "missing")
        ours.append(ended(env, dep_id))
    elapsed = time.monotonic() - t0
    ids = [d["id"] for d in ours]
    assert len(set(ids)) == n, ids

    def listed(query: str = "") -> list[dict]:
        status, _, body = env.api("GET", f"/v1/deployments{query}")
        assert status == 200, (status, body)
        return json.loads(body)["deployments"]

    # Each id is the UTC start second and the model, then -2, -3 ... for the second, third ...
    # deployment of that model started in that second (earlier tests' ones included).
    by_second: dict[str, list[str]] = {}
    for d in reversed(listed("?limit=1000")):
        if d["model"] != "missing":
            continue
        m = re.fullmatch(r"(\d{8}T\d{6}Z)-missing(?:-(\d+))?", d["id"])
        assert m, d["id"]
        assert m.group(1) == d["started_at"][:19].replace("-", "").replace(":", "") + "Z", d
        by_second.setdefault(m.group(1), []).append(m.group(2) or "1")
    assert by_second, "no deployment of missing listed"
    for second, suffixes in by_second.items():
        assert suffixes == [str(i) for i in range(1, len(suffixes) + 1)], (second, suffixes)
    # n deployments in fewer than n seconds: some second saw two of them (pigeonhole).
    assert elapsed < n - 1, f"{n} deployments took {elapsed:.0f} s: too slow to meet in one second"
    assert any(len(s) > 1 for s in by_second.values()), by_second

    # Newest first; the last 100 by default; more on request, all that modeld keeps.
    newest = listed()
    assert [d["id"] for d in newest] == ids[::-1][:100]
    everything = listed("?limit=1000")
    assert [d["id"] for d in everything[:n]] == ids[::-1]
    assert len(everything) >= n
    starts = [d["started_at"] for d in everything]
    assert starts == sorted(starts, reverse=True)
    status, _, body = env.api("GET", "/v1/deployments?limit=0")
    assert status == 400 and json.loads(body)["error"]["code"] == "bad_request", (status, body)
    assert len(list((env.state_dir / "deployments").glob("*.json"))) == len(everything) <= 200

    # The history is the same after a restart of modeld (read back from state_dir).
    env.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
    wait_for("modeld after its restart", lambda: try_status(env) is not None, timeout=60)
    assert [d["id"] for d in listed("?limit=1000")] == [d["id"] for d in everything]
    assert env.status()["deployment"]["id"] == ids[-1]
    started = lines(env, f"MESSAGE_ID={MESSAGE_ID['started']}", "MODELD_MODEL=missing")
    assert {e["MODELD_DEPLOYMENT"] for e in started} >= set(ids)
