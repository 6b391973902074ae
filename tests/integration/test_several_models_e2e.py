"""End to end: several models on one host (issue 16). Under the namespaced systemd, with the fake
NVML showing eight GPUs whose memory follows the stand-in servers (each fake_vllm reports its
memory on the GPUs of its CUDA_VISIBLE_DEVICES in a `procs` folder, --gpu-procs), on a models_dir
small enough that a new model needs room:

- A on GPUs 0-3 and B on 4-7 serve together (status `services`, `modeld_service_info`); deploying
  C on 0-3 stops only A (B keeps its MainPID and a client sending completions to B all along sees
  none fail); B's memory on 4-7 never delays it, a leftover worker of A on GPU 2 does, by name,
  and C starts once it is gone;
- a failing C rolls back to A with B untouched; a failing D on 0-7 stops A and B and brings both
  back; D stops both; when B cannot come back the rollback fails naming B, and A serves again;
- B's main process killed during C's switch is restarted by B's model watcher, and C succeeds;
- `modelctl stop B` leaves A serving and B on disk (a record of kind stop); a restart of modeld
  and a reboot of the namespace bring back exactly the services in service;
- eviction for a new model (on no GPU, beside A and B) takes only models not in service.

Run: cd build && ctest -R test_several_models_e2e --output-on-failure
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

import modeld_env
from contract_helpers import MESSAGE_ID, deployment, ended, in_phase, journal_mark, reload, start_deploy
from modeld_env import (BUILD_DIR, SERVER_STARTING, ModeldEnv, completion, free_bytes, free_port, model_table,
                        wait_for)
from nsystemd import unsupported_reason

import make_checkpoint  # noqa: E402 - on sys.path through modeld_env

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

MiB = 1 << 20
GiB = 1 << 30
FAKE_NVML = BUILD_DIR / "fake_nvml" / "libnvidia-ml.so.1"
UUIDS = [f"GPU-{i}{i}{i}{i}{i}{i}{i}{i}-1616-4000-8000-00000000000{i}" for i in range(8)]
TOTAL = 141 * GiB
IDLE = 615 * MiB
HELD = 20 * GiB  # what each stand-in server reports on each of its GPUs
# A's leftover worker keeps GPU 2's memory this long after it is gone: longer than the 10 s after
# which a switch's wait names the GPUs it waits for, shorter than the wait's limit (the stopped
# services' longest stop_timeout, 3 s, plus 15 s), so C proceeds once it is gone.
LINGER = 12.0
DISK = 8 * MiB  # models_dir: every model here fits, and E (made to size) needs room

GPUS = {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7], "c": [0, 1, 2, 3], "c-bad": [0, 1, 2, 3],
        "d": list(range(8)), "d-bad": list(range(8)), "e": []}
RESTART_MESSAGE_ID = MESSAGE_ID["watchdog"]


def nvml_state(path: Path, procs: Path) -> None:
    """Eight idle fake H200s whose used memory adds what the servers report in `procs`."""
    lines = ["init 0", f"procs {procs}"]
    lines += [f"gpu {u} {TOTAL} {IDLE} {TOTAL - IDLE} {IDLE} NVIDIA H200" for u in UUIDS]
    path.write_text("\n".join(lines) + "\n")


def unit(model: str) -> str:
    return f"modeld-serve@{model}.service"


def tables(e: ModeldEnv, a_leftover: bool, b_startup: str = "120s") -> str:
    """The models' TOML; with `a_leftover` A's server leaves a worker holding GPU 2 for LINGER s.
    B's server fails its health checks when it starts while e.b_fails exists, and B's readiness
    wait lasts `b_startup`."""
    def table(name: str, *args: str, extra_serve: str = "", startup: str = "120s") -> str:
        serve_args = ["--gpu-procs", str(e.procs), "--gpu-memory", str(HELD), *args]
        return model_table(name, f"acme/{name}", e.ports[name], stop_timeout="3s", serve_args=serve_args,
                           extra_serve=f"gpu_ids = {json.dumps(GPUS[name])}\n{extra_serve}", startup_timeout=startup)

    return (table("a", *(["--leftover-worker", f"2:{LINGER:g}"] if a_leftover else []))
            + table("b", "--fail-health-file", str(e.b_fails), startup=b_startup)
            + '\n[models.b.health]\nwatch_interval = "1s"\n'
            # C loads until c_loaded exists: a test holds its switch in health_checking.
            + table("c", "--load-until", str(e.c_loaded))
            + table("c-bad", "--die-during-load", "0")
            + table("d")
            + table("d-bad", "--die-during-load", "0")
            + table("e"))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("several")
    with modeld_env.small_disk(work, DISK, "modeld-test-several") as work:
        procs = work / "gpu-procs"
        procs.mkdir()
        state = work / "nvml-state.txt"
        nvml_state(state, procs)
        e = ModeldEnv(workdir=work, environment={"MODELD_NVML_LIBRARY": str(FAKE_NVML),
                                                 "FAKE_NVML_STATE": str(state)})
        e.procs = procs
        e.c_loaded = work / "c-loaded"
        e.c_loaded.touch()
        e.b_fails = work / "b-fails"
        for i, name in enumerate(GPUS):
            e.add_repo(f"acme/{name}", shards=2, shard_size=64 * 1024, seed=160 + i)
        e.ports = {name: free_port() for name in GPUS}
        try:
            assert FAKE_NVML.exists(), f"{FAKE_NVML} is missing: build the fake_nvml target"
            e.start(tables(e, a_leftover=True))
            yield e
        finally:
            e.stop()


# -- helpers ----------------------------------------------------------------------------------

def services(env: ModeldEnv) -> list[str]:
    """The models of GET /v1/status "services", in order."""
    return [s["model"] for s in env.status()["services"]]


def messages(env: ModeldEnv, dep_id: str) -> list[dict]:
    return env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}")


def gpu_waits(env: ModeldEnv, dep_id: str) -> list[str]:
    return [e["MESSAGE"] for e in messages(env, dep_id) if e["MESSAGE"].startswith("waiting for GPU memory")]


def reported_gpus(env: ModeldEnv, pid: int) -> list[str]:
    """The GPU UUIDs the server `pid` reports in the procs folder, in its order."""
    text = (env.procs / str(pid)).read_text()
    return [line.split()[1] for line in text.splitlines() if line.startswith("gpu ")]


def service_info(env: ModeldEnv) -> set[tuple[str, str, str, str]]:
    """(model, unit, port, gpu_ids) of each modeld_service_info series of /metrics."""
    out = set()
    for line in env.metrics().splitlines():
        if line.startswith("modeld_service_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line[:line.rindex("}")]))
            assert line.endswith("} 1"), line
            out.add((labels["model"], labels["unit"], labels["port"], labels["gpu_ids"]))
    return out


def serving(env: ModeldEnv, model: str) -> str:
    """Waits until `model`'s server answers a completion (it may be starting); returns the text."""
    return wait_for(f"{model} to answer", lambda: completion(env.ports[model], model), timeout=60,
                    retry_on=SERVER_STARTING)


class Client:
    """Sends completions to one server on a thread of its own, one after the other with a short
    pause, until stopped or `limit` requests (a bounded loop); keeps every failure."""

    def __init__(self, port: int, model: str, limit: int = 3000):
        self.port, self.model, self.limit = port, model, limit
        self.answered = 0
        self.failures: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        for _ in range(self.limit):
            if self.stopping.is_set():
                return
            try:
                completion(self.port, self.model, max_tokens=1)
                self.answered += 1
            except SERVER_STARTING as e:
                self.failures.append(f"{type(e).__name__}: {e}")
            self.stopping.wait(0.05)  # the client's pace between two requests

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.thread.join(timeout=30)


# -- A and B side by side; C replaces A only ----------------------------------------------------

def test_a_on_gpus_0_to_3_and_b_on_4_to_7_serve_together(env):
    for name in ("a", "b"):
        assert env.deploy_and_wait(name)["state"] == "succeeded"
    st = env.status()
    assert [(s["model"], s["unit"], s["port"], s["gpu_ids"]) for s in st["services"]] == [
        ("a", unit("a"), env.ports["a"], [0, 1, 2, 3]), ("b", unit("b"), env.ports["b"], [4, 5, 6, 7])]
    assert st["active"]["model"] == "b"
    assert service_info(env) == {("a", unit("a"), str(env.ports["a"]), "0,1,2,3"),
                                 ("b", unit("b"), str(env.ports["b"]), "4,5,6,7")}
    # The drop-ins gave each server its GPUs by UUID, in gpu_ids' order: the fake NVML shows them.
    assert reported_gpus(env, env.main_pid(unit("a"))) == UUIDS[0:4]
    assert reported_gpus(env, env.main_pid(unit("b"))) == UUIDS[4:8]
    assert completion(env.ports["a"], "a") and completion(env.ports["b"], "b")


def leftover_worker_pid(env: ModeldEnv) -> int:
    """The PID of A's leftover worker on GPU 2, from A's server's journal."""
    found = [e["MESSAGE"] for e in env.journal("SYSLOG_IDENTIFIER=modeld-serve@a")
             if "leftover worker" in e.get("MESSAGE", "")]
    assert found, "A's server started no leftover worker"
    m = re.search(r"leftover worker (\d+) holds GPU (\S+)", found[-1])
    assert m and m.group(2) == UUIDS[2], found[-1]
    return int(m.group(1))


def test_c_on_gpus_0_to_3_stops_only_a_and_waits_for_as_leftover_on_gpu_2_not_for_b(env):
    b_pid = env.main_pid(unit("b"))
    worker = leftover_worker_pid(env)
    plan = json.loads(env.modelctl("--json", "plan", "c").stdout)
    assert plan["stops"] == ["a"], plan
    with Client(env.ports["b"], "b") as client:
        wait_for("the client's first answer from B", lambda: client.answered, timeout=30)
        dep = env.deploy_and_wait("c")
        seen = client.answered
        wait_for("more answers from B after the switch", lambda: client.answered >= seen + 3, timeout=30)
    assert dep["state"] == "succeeded", dep
    assert client.failures == [], client.failures[:5]
    assert env.main_pid(unit("b")) == b_pid
    assert reported_gpus(env, b_pid) == UUIDS[4:8]  # B held its memory on 4-7 all along
    assert services(env) == ["b", "c"]
    assert env.unit_state(unit("a")) in ("inactive", "failed")

    lines = messages(env, dep["id"])
    text = [e["MESSAGE"] for e in lines]
    assert any("(replacing a)" in m for m in text), text
    # The wait names GPU 2 and the worker holding it, and no other GPU: B's memory on 4-7 is
    # never waited for.
    waits = gpu_waits(env, dep["id"])
    assert waits, text
    for w in waits:
        assert re.findall(r"GPU (\d+) \(", w) == ["2"], w
        assert str(worker) in w, (worker, w)
    stamp = {}
    for e in lines:
        if " stopped: " in e["MESSAGE"]:
            stamp["stopped"] = int(e["__REALTIME_TIMESTAMP"])
        if e["MESSAGE"].startswith("GPU memory is back at its baseline"):
            assert e["MESSAGE"] == "GPU memory is back at its baseline on GPU 0,1,2,3", e["MESSAGE"]
            stamp["back"] = int(e["__REALTIME_TIMESTAMP"])
    # C proceeded once the worker's memory was gone, not before.
    assert (stamp["back"] - stamp["stopped"]) / 1e6 >= LINGER - 0.5, stamp
    assert reported_gpus(env, env.main_pid(unit("c"))) == UUIDS[0:4]
    assert completion(env.ports["c"], "c")
    # From here on A's server leaves no worker behind (no switch waits LINGER s again).
    env.write_config(tables(env, a_leftover=False))
    reload(env)


# -- failures roll back exactly what they stopped -------------------------------------------------

def test_a_failing_c_rolls_back_to_a_with_b_untouched(env):
    b_pid = env.main_pid(unit("b"))
    assert env.deploy_and_wait("a")["state"] == "succeeded"
    assert sorted(services(env)) == ["a", "b"]
    dep = env.deploy_and_wait("c-bad", expect_exit=1)
    assert dep["state"] == "rolled_back", dep
    assert env.main_pid(unit("b")) == b_pid
    assert sorted(services(env)) == ["a", "b"]
    assert env.unit_state(unit("c-bad")) != "active"
    assert gpu_waits(env, dep["id"]) == []  # B's memory never delayed it
    assert completion(env.ports["a"], "a") and completion(env.ports["b"], "b")


def test_a_failing_d_on_every_gpu_brings_back_a_and_b_and_d_stops_both(env):
    before = {m: env.main_pid(unit(m)) for m in ("a", "b")}
    dep = env.deploy_and_wait("d-bad", expect_exit=1)
    assert dep["state"] == "rolled_back", dep
    start = [e["MESSAGE"] for e in messages(env, dep["id"]) if "(replacing " in e["MESSAGE"]]
    assert len(start) == 1 and re.search(r"\(replacing (a, b|b, a)\)", start[0]), start
    assert sorted(services(env)) == ["a", "b"]
    for m in ("a", "b"):
        assert env.unit_state(unit(m)) == "active"
        assert env.main_pid(unit(m)) not in (0, before[m])  # stopped and started again
        assert completion(env.ports[m], m)

    dep = env.deploy_and_wait("d")
    assert dep["state"] == "succeeded", dep
    assert services(env) == ["d"]
    assert all(env.unit_state(unit(m)) in ("inactive", "failed") for m in ("a", "b"))
    assert reported_gpus(env, env.main_pid(unit("d"))) == UUIDS
    assert completion(env.ports["d"], "d")


def test_a_rollback_that_brings_back_a_but_not_b_fails_naming_b_and_says_a_serves_again(env):
    for name in ("a", "b"):
        assert env.deploy_and_wait(name)["state"] == "succeeded"
    assert services(env) == ["a", "b"]
    # B's server, started again by the rollback, answers /health 503 until its readiness wait
    # (10 s) gives up; A comes back.
    env.b_fails.touch()
    env.write_config(tables(env, a_leftover=False, b_startup="10s"))
    reload(env)
    try:
        dep = env.deploy_and_wait("d-bad", expect_exit=1)
    finally:
        env.b_fails.unlink()
        env.write_config(tables(env, a_leftover=False))
        reload(env)
    assert (dep["state"], dep["error"]["code"]) == ("failed", "rollback_failed"), dep
    msg = dep["error"]["message"]
    assert "; rollback failed for b: the previous model did not become ready again: " in msg, msg
    assert msg.endswith("; a serves again"), msg
    assert completion(env.ports["a"], "a")
    # B stays in service (the next start of modeld tries it again), unwatched.
    st = env.status()
    assert [s["model"] for s in st["services"]] == ["a", "b"], st["services"]
    b = st["services"][1]
    assert b["watchdog"] is None or b["watchdog"]["state"] != "watching", b
    # Deployed again, B serves.
    assert env.deploy_and_wait("b")["state"] == "succeeded"
    assert services(env) == ["a", "b"]
    serving(env, "b")


# -- B's watcher during C's switch -------------------------------------------------------------

def test_b_killed_during_cs_switch_is_restarted_by_its_watcher_and_c_succeeds(env):
    for name in ("a", "b"):
        assert env.deploy_and_wait(name)["state"] == "succeeded"
    assert services(env) == ["a", "b"]
    env.c_loaded.unlink()
    dep_id = start_deploy(env, "c")
    in_phase(env, dep_id, "health_checking")
    killed = env.main_pid(unit("b"))
    mark = journal_mark()
    env.systemd.run(["kill", "-9", str(killed)], check=True)
    wait_for("B's watcher to restart it", lambda: env.main_pid(unit("b")) not in (0, killed), timeout=60)
    serving(env, "b")
    restarts = [e for e in env.journal(f"MESSAGE_ID={RESTART_MESSAGE_ID}", "MODELD_MODEL=b")
                if int(e["__REALTIME_TIMESTAMP"]) >= mark]
    assert len(restarts) == 1, restarts
    # C is still held loading: B came back during its switch.
    d = deployment(env)
    assert d["id"] == dep_id and d["state"] == "running" and d["phase"] == "health_checking", d
    env.c_loaded.touch()
    end = ended(env, dep_id)
    assert end["state"] == "succeeded", end
    assert any("(replacing a)" in e["MESSAGE"] for e in messages(env, dep_id))
    assert services(env) == ["b", "c"]
    assert completion(env.ports["b"], "b") and completion(env.ports["c"], "c")


# -- stop, restart, reboot ---------------------------------------------------------------------

def test_stop_b_leaves_a_serving_and_b_on_disk(env):
    assert env.deploy_and_wait("a")["state"] == "succeeded"  # replaces C
    assert services(env) == ["b", "a"]
    a_pid = env.main_pid(unit("a"))
    r = env.modelctl("stop", "b", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    dep = env.status()["deployment"]
    assert (dep["kind"], dep["model"], dep["state"], dep["changed"]) == ("stop", "b", "succeeded", True), dep
    assert services(env) == ["a"]
    assert env.unit_state(unit("b")) in ("inactive", "failed")
    assert env.main_pid(unit("a")) == a_pid
    models = {m["name"]: m for m in json.loads(env.modelctl("--json", "models").stdout)["models"]}
    assert models["b"]["state"] == "verified" and models["b"]["active"] is False, models["b"]
    assert completion(env.ports["a"], "a")


def restart_modeld(env: ModeldEnv) -> None:
    env.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
    wait_for("modeld after its restart", lambda: env.modelctl("status").returncode == 0, timeout=60)


def test_a_restart_and_a_reboot_bring_back_exactly_the_services_in_service(env):
    a_pid = env.main_pid(unit("a"))
    restart_modeld(env)
    assert services(env) == ["a"]
    assert env.main_pid(unit("a")) == a_pid  # a restart of modeld leaves the server alone
    assert env.unit_state(unit("b")) == "inactive"

    env.reboot()
    assert services(env) == ["a"]
    wait_for("A's service to be started at boot", lambda: env.unit_state(unit("a")) == "active", timeout=60)
    serving(env, "a")
    assert env.unit_state(unit("b")) == "inactive"

    assert env.deploy_and_wait("b")["state"] == "succeeded"
    assert services(env) == ["a", "b"]
    pids = {m: env.main_pid(unit(m)) for m in ("a", "b")}
    restart_modeld(env)
    assert services(env) == ["a", "b"]
    assert {m: env.main_pid(unit(m)) for m in ("a", "b")} == pids

    env.reboot()
    assert services(env) == ["a", "b"]
    for m in ("a", "b"):
        wait_for(f"{m}'s service to be started at boot", lambda: env.unit_state(unit(m)) == "active", timeout=60)
        serving(env, m)
    assert reported_gpus(env, env.main_pid(unit("b"))) == UUIDS[4:8]


# -- eviction --------------------------------------------------------------------------------------

def allocated(folder: Path) -> int:
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*"))


def repo_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_eviction_for_a_new_model_takes_only_models_not_in_service(env):
    assert services(env) == ["a", "b"]
    pids = {m: env.main_pid(unit(m)) for m in ("a", "b")}
    store = env.models_dir / ".store"
    evictable = {m: allocated(store / m) for m in ("c", "c-bad", "d", "d-bad")}
    assert all(evictable.values()), evictable
    free = free_bytes(env.models_dir)
    # E needs more than the free space and less than that plus every model out of service.
    target = free + sum(evictable.values()) // 2
    repo = env.repos / "acme" / "e"
    overhead = repo_size(repo) - 2 * 64 * 1024
    make_checkpoint.make_checkpoint(str(repo), 2, (target - overhead) // 2, 169)
    assert free < repo_size(repo) < free + sum(evictable.values()), (free, evictable, repo_size(repo))

    plan = json.loads(env.modelctl("--json", "plan", "e").stdout)
    assert plan["fits"] and plan["stops"] == [], plan
    planned = [e["name"] for e in plan["evictions"]]
    assert planned and set(planned) <= set(evictable), planned

    dep = env.deploy_and_wait("e")
    assert dep["state"] == "succeeded", dep
    evicted = [e["MODELD_EVICTED"] for e in messages(env, dep["id"]) if "MODELD_EVICTED" in e]
    assert evicted and set(evicted) <= set(evictable), evicted
    assert (store / "a").is_dir() and (store / "b").is_dir()
    models = {m["name"]: m for m in json.loads(env.modelctl("--json", "models").stdout)["models"]}
    assert models["a"]["state"] == "verified" and models["b"]["state"] == "verified"
    assert all(models[m]["state"] == "absent" for m in evicted)
    # E uses no GPU: it conflicts with neither, and both kept serving.
    assert services(env) == ["a", "b", "e"]
    assert {m: env.main_pid(unit(m)) for m in ("a", "b")} == pids
    assert completion(env.ports["a"], "a") and completion(env.ports["b"], "b")
    assert completion(env.ports["e"], "e")
