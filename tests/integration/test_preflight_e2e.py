"""End to end, the pre-flight (issue 25 item 9; interface.md "Pre-flight"): mistakes that used to be
found only after the serving model was stopped are found before anything is stopped, under the
namespaced systemd with a fake NVML showing two GPUs:

- a serve command whose program systemd cannot find (a bare name outside its fixed search path),
  a `gpu_ids` index the host lacks, and a port held by a process that is no model service: each
  shows as a failing line of `plan`'s pre-flight (JSON and text, exit 1), and its deploy fails in
  planning naming the key and the file, with the serving model's MainPID unchanged and answering;
- the pre-flight runs again right before stopping_old: a program deleted while the download is
  held fails the deployment in stopping_old, before the stop;
- a program that passes the pre-flight but cannot be executed (its interpreter is missing) still
  fails at the start: the error translates systemd's exit status 203 into words with the path.

Run: cd build && ctest -R test_preflight_e2e --output-on-failure
"""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest

from contract_helpers import ended, in_phase, start_deploy
from modeld_env import (BUILD_DIR, FIXTURES, PYTHON, SERVER_STARTING, ModeldEnv, completion, free_port, model_table,
                        wait_for, write_control)
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

FAKE_NVML = BUILD_DIR / "fake_nvml" / "libnvidia-ml.so.1"
GiB = 1 << 30
MISSING = "no-such-inference-server"  # in none of systemd's search directories


def fake_gpus(path) -> None:
    """Two idle fake H200s: indices 0 and 1."""
    lines = ["init 0"] + [f"gpu GPU-{i}{i}{i}{i}{i}{i}{i}{i}-1616-4000-8000-00000000000{i} {141 * GiB} {615 << 20} "
                          f"{141 * GiB - (615 << 20)} {615 << 20} NVIDIA H200" for i in range(2)]
    path.write_text("\n".join(lines) + "\n")


def command_table(name: str, port: int, program: str) -> str:
    """A model whose serve command runs `program` with the stand-in server's arguments."""
    command = [program, str(FIXTURES / "fake_vllm.py"), "serve", "{model_dir}", "--served-model-name",
               "{served_name}", "--port", "{port}"]
    return f"""
[models.{name}]
repo = "acme/{name}"
[models.{name}.serve]
command = {json.dumps(command)}
port = {port}
startup_timeout = "60s"
stop_timeout = "5s"
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("preflight")
    nvml = work / "nvml-state.txt"
    fake_gpus(nvml)
    control = work / "hub-control.json"
    e = ModeldEnv(workdir=work, hub_args=["--control", str(control)],
                  environment={"MODELD_NVML_LIBRARY": str(FAKE_NVML), "FAKE_NVML_STATE": str(nvml)})
    e.hub_control = control
    # A wrapper the test deletes while its download is held; one whose interpreter does not exist.
    e.wrapper = work / "serve-wrapper.sh"
    e.bad_interpreter = work / "bad-interpreter.sh"
    e.bad_interpreter.write_text("#!/nonexistent/interpreter\n")
    e.bad_interpreter.chmod(0o755)
    e.roots_only = work / "roots-only.sh"  # root's, executable by root alone
    e.roots_only.write_text(f"#!/bin/sh\nexec {PYTHON} \"$@\"\n")
    e.roots_only.chmod(0o700)
    names = ["good", "noexec", "nogpu", "busyport", "vanishing", "badinterp", "asnobody"]
    for i, name in enumerate(names):
        e.add_repo(f"acme/{name}", shards=2, shard_size=200_000, seed=250 + i)
    e.ports = {name: free_port() for name in names}
    tables = (model_table("good", "acme/good", e.ports["good"], stop_timeout="5s")
              + command_table("noexec", e.ports["noexec"], MISSING)
              + model_table("nogpu", "acme/nogpu", e.ports["nogpu"], extra_serve="gpu_ids = [0, 5]")
              + model_table("busyport", "acme/busyport", e.ports["busyport"])
              + command_table("vanishing", e.ports["vanishing"], str(e.wrapper))
              + command_table("badinterp", e.ports["badinterp"], str(e.bad_interpreter))
              + command_table("asnobody", e.ports["asnobody"], str(e.roots_only)))
    try:
        assert FAKE_NVML.exists(), f"{FAKE_NVML} is missing: build the fake_nvml target"
        e.start(tables)
        e.deploy_and_wait("good")
        yield e
    finally:
        e.stop()


@pytest.fixture
def squatter(env):
    """A process that is no model service listening on busyport's port, refusing connections."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", env.ports["busyport"]))
    s.listen()

    def refuse():
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            conn.close()
    threading.Thread(target=refuse, daemon=True).start()
    try:
        yield s
    finally:
        s.shutdown(socket.SHUT_RDWR)
        s.close()


def good_pid(env) -> int:
    return env.main_pid("modeld-serve@good.service")


def plan_json(env, model: str) -> dict:
    r = env.modelctl("--json", "plan", model)
    assert r.returncode == 1, f"exit {r.returncode}:\n{r.stdout}{r.stderr}"
    return json.loads(r.stdout)


def failing(plan: dict, check: str) -> dict:
    """The one failing pre-flight check `check` of `plan`; every other check passed."""
    checks = plan["preflight"]
    assert {c["check"] for c in checks} == {"command", "gpus", "port"}, checks
    bad = [c for c in checks if not c["ok"]]
    assert [c["check"] for c in bad] == [check], checks
    return bad[0]


def phases_of(env, dep_id: str) -> set[str]:
    return {e.get("MODELD_PHASE") for e in env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}")}


def assert_refused_in_planning(env, model: str, key: str, pid_before: int) -> dict:
    """Deploys `model`: it fails in planning naming `key` and the configuration file, before
    anything is stopped; the serving model keeps its MainPID and answers."""
    dep = env.deploy_and_wait(model, 1)
    assert dep["model"] == model and dep["state"] == "failed" and dep["phase"] == "planning", dep
    assert dep["error"]["code"] == "unit_failed", dep["error"]
    assert key in dep["error"]["message"] and str(env.config) in dep["error"]["message"], dep["error"]
    assert "stopping_old" not in phases_of(env, dep["id"])
    assert good_pid(env) == pid_before != 0
    assert env.status()["active"]["model"] == "good"
    assert completion(env.ports["good"], "good")
    return dep


def test_a_program_systemd_cannot_find_is_refused_in_planning_and_good_keeps_serving(env):
    before = good_pid(env)
    plan = plan_json(env, "noexec")
    bad = failing(plan, "command")
    assert "models.noexec.serve.command[0]" in bad["message"] and MISSING in bad["message"], bad
    assert "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in bad["message"], bad
    text = env.modelctl("plan", "noexec")
    assert text.returncode == 1
    assert "Pre-flight:" in text.stdout, text.stdout
    assert any("FAILED" in line and "command" in line for line in text.stdout.splitlines()), text.stdout
    assert_refused_in_planning(env, "noexec", "models.noexec.serve.command[0]", before)


def test_a_gpu_index_the_host_lacks_is_refused_in_planning_and_good_keeps_serving(env):
    before = good_pid(env)
    bad = failing(plan_json(env, "nogpu"), "gpus")
    assert "models.nogpu.serve.gpu_ids" in bad["message"] and "GPU 5 is not visible: 2 GPUs" in bad["message"], bad
    dep = assert_refused_in_planning(env, "nogpu", "models.nogpu.serve.gpu_ids", before)
    assert "GPU 5" in dep["error"]["message"], dep["error"]


def test_a_port_held_by_a_foreign_process_is_refused_in_planning_before_any_download(env, squatter):
    before = good_pid(env)
    bad = failing(plan_json(env, "busyport"), "port")
    assert "models.busyport.serve.port" in bad["message"] and str(env.ports["busyport"]) in bad["message"], bad
    assert_refused_in_planning(env, "busyport", "models.busyport.serve.port", before)
    fetched = list(env.hub.stats()["by_path"])
    assert fetched, "the hub counts what it sends: good's files at least"
    assert not any(p.startswith("acme/busyport/") and p.endswith(".safetensors") for p in fetched), fetched


def test_a_program_the_units_user_may_not_execute_is_refused_in_planning(env):
    # An operator's drop-in runs the service as nobody, a real unprivileged user.
    dropin = "/run/systemd/system/modeld-serve@asnobody.service.d"
    env.systemd.run(["mkdir", "-p", dropin], check=True)
    env.systemd.run(["sh", "-c", f"printf '[Service]\\nUser=nobody\\n' > {dropin}/20-local.conf"], check=True)
    env.systemd.run(["systemctl", "daemon-reload"], check=True)
    assert env.systemd.run(["systemctl", "show", "-p", "User", "--value", "modeld-serve@asnobody.service"],
                           check=True).stdout.strip() == "nobody"
    before = good_pid(env)
    bad = failing(plan_json(env, "asnobody"), "command")
    assert "models.asnobody.serve.command[0]" in bad["message"] and "for user nobody" in bad["message"], bad
    assert_refused_in_planning(env, "asnobody", "models.asnobody.serve.command[0]", before)


def test_a_plan_whose_checks_pass_lists_them_all_ok(env):
    r = env.modelctl("--json", "plan", "busyport")  # the port is free again
    assert r.returncode == 0, r.stdout + r.stderr
    checks = json.loads(r.stdout)["preflight"]
    assert len(checks) == 3 and all(c["ok"] for c in checks), checks


def test_the_preflight_runs_again_right_before_stopping_old(env):
    env.wrapper.write_text(f"#!/bin/sh\nexec {PYTHON} \"$@\"\n")
    env.wrapper.chmod(0o755)
    before = good_pid(env)
    write_control(env.hub_control, hold="acme/vanishing/*.safetensors")
    try:
        dep_id = start_deploy(env, "vanishing")
        in_phase(env, dep_id, "downloading")
        wait_for("a held download", lambda: env.hub.stats()["held"] >= 1, timeout=60)
        os.unlink(env.wrapper)  # gone after planning checked it
    finally:
        write_control(env.hub_control)
    dep = ended(env, dep_id)
    assert dep["state"] == "failed" and dep["phase"] == "stopping_old", dep
    assert "models.vanishing.serve.command[0]" in dep["error"]["message"], dep["error"]
    assert str(env.wrapper) in dep["error"]["message"], dep["error"]
    assert good_pid(env) == before
    assert completion(env.ports["good"], "good")


def test_an_exec_failure_past_the_preflight_names_systemds_exit_status_and_the_program(env):
    dep = env.deploy_and_wait("badinterp", 1)
    assert dep["state"] == "rolled_back", dep
    msg = dep["error"]["message"]
    assert "exit status 203" in msg and "EXEC" in msg, msg
    assert str(env.bad_interpreter) in msg, msg
    wait_for("good to answer again", lambda: completion(env.ports["good"], "good"), timeout=60,
             retry_on=SERVER_STARTING)
