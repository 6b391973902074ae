"""End to end: socket activation of modeld by systemd/modeld.socket in a namespaced systemd.

The shipped modeld.socket is installed as a runtime unit with a drop-in that moves its
ListenStream= to the test's work folder (the shipped path /run/modeld/modeld.sock would be the
namespace's private /run, out of the host's reach); modeld.service gets modeld_env's usual
drop-in. Only the socket unit is started: the first request starts the daemon, which takes the
socket from systemd (sd_listen_fds) and says so in the journal, also when its configuration names
another path. While the socket unit holds the socket, requests made while the daemon is stopped
or restarting wait for it instead of failing; a removal queued while modeld is down is refused
until the deployment modeld's restart interrupted has continued (it never runs before recovery).
Without the socket unit the daemon listens itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess

import pytest

from contract_helpers import ended, in_phase, start_deploy
from modeld_env import SOURCE_DIR, ModeldEnv, free_port, model_table, wait_for, write_control
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

ACTIVATED = "passed by systemd (socket activation)"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("sockact")
    control = work / "hub-control.json"
    write_control(control)
    e = ModeldEnv(workdir=work, hub_args=["--control", str(control)])
    e.hub_control = control
    e.add_repo("acme/model-a", shards=2, shard_size=200_000, seed=1)
    e.add_repo("acme/model-b", shards=2, shard_size=200_000, seed=2)
    e.ports = {"model-a": free_port(), "model-b": free_port()}
    try:
        # Not modeld.service: the socket unit starts it.
        e.boot(model_table("model-a", "acme/model-a", e.ports["model-a"])
               + model_table("model-b", "acme/model-b", e.ports["model-b"]))
        sd = e.systemd
        sd.run(["cp", str(SOURCE_DIR / "systemd" / "modeld.socket"), "/run/systemd/system/modeld.socket"],
               check=True)
        sd.write_file("/run/systemd/system/modeld.socket.d/50-test.conf",
                      f"[Socket]\nListenStream=\nListenStream={e.socket}\n")
        sd.run(["systemctl", "daemon-reload"], check=True)
        sd.run(["systemctl", "start", "modeld.socket"], check=True)
        yield e
    finally:
        e.stop()


def activation_lines(env: ModeldEnv) -> list[str]:
    return [m for m in (e.get("MESSAGE", "") for e in env.journal(unit="modeld.service")) if ACTIVATED in m]


def status_ok(env: ModeldEnv, timeout: float = 60) -> subprocess.CompletedProcess:
    r = env.modelctl("--json", "status", timeout=timeout)
    assert r.returncode == 0, f"status: exit {r.returncode}\n{r.stdout}{r.stderr}"
    return r


def test_before_any_request_only_the_socket_unit_runs(env):
    assert env.unit_state("modeld.socket") == "active"
    assert env.unit_state("modeld.service") == "inactive"
    st = os.stat(env.socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o666


def test_the_first_request_starts_modeld_which_takes_the_socket_from_systemd(env):
    status_ok(env)
    assert env.unit_state("modeld.service") == "active"
    entry = env.systemd.wait_journal(lambda e: ACTIVATED in e.get("MESSAGE", ""), unit="modeld.service")
    assert entry, "modeld did not say it took the socket from systemd"
    assert str(env.socket) in entry["MESSAGE"]
    # The configuration names the same path: nothing to warn about.
    assert "not used" not in entry["MESSAGE"]


def test_a_deployment_runs_over_the_activated_socket(env):
    r = env.modelctl("deploy", "model-a", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    assert env.status()["active"]["model"] == "model-a"


def test_a_request_while_modeld_is_stopped_waits_for_systemd_to_start_it(env):
    old_pid = env.main_pid()
    env.systemd.run(["systemctl", "stop", "modeld.service"], check=True)
    assert env.unit_state("modeld.service") == "inactive"
    assert env.unit_state("modeld.socket") == "active"
    # systemd still listens: the connection is queued, and it starts the daemon to answer it.
    status_ok(env)
    assert env.unit_state("modeld.service") == "active"
    assert env.main_pid() not in (0, old_pid)


@contextlib.contextmanager
def start_gate(env: ModeldEnv):
    """Holds modeld.service's next start in ExecStartPre (no daemon runs then) until the test
    creates the file this yields; the drop-in is removed again afterwards."""
    gate = env.workdir / "start-gate"
    gate.unlink(missing_ok=True)
    dropin = "/run/systemd/system/modeld.service.d/60-start-gate.conf"
    env.systemd.write_file(dropin, f"[Service]\nExecStartPre=/bin/sh -c "
                                   f"'while [ ! -e {gate} ]; do sleep 0.05; done'\n")
    env.systemd.run(["systemctl", "daemon-reload"], check=True)
    try:
        yield gate
    finally:
        gate.touch()
        env.systemd.run(["rm", "-f", dropin], check=True)
        env.systemd.run(["systemctl", "daemon-reload"], check=True)


def queued(path) -> int:
    """Connections waiting in the accept queue of the listening Unix socket at `path` (ss's Recv-Q)."""
    out = subprocess.run(["ss", "-xlnH"], capture_output=True, text=True, check=True).stdout
    return sum(int(f[2]) for f in (line.split() for line in out.splitlines()) if len(f) > 4 and f[4] == str(path))


def test_requests_while_modeld_restarts_wait_for_it_and_all_get_answers(env):
    old_pid = env.main_pid()
    with start_gate(env) as gate:
        env.systemd.run(["systemctl", "restart", "--no-block", "modeld.service"], check=True)
        wait_for("the restart to wait at the gate with no daemon running", lambda: env.systemd.run(
            ["systemctl", "show", "-p", "SubState", "--value", "modeld.service"]).stdout.strip() == "start-pre",
            timeout=60)
        assert env.main_pid() == 0
        clients = [subprocess.Popen([str(env.modelctl_bin), "--socket", str(env.socket), "--json", "status"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
        try:
            # Sent while no daemon runs: systemd's socket holds them until the new daemon accepts.
            wait_for("the 3 requests to wait on the socket", lambda: queued(env.socket) >= 3, timeout=30)
            gate.touch()
            answers = [(c.communicate(timeout=60), c.returncode) for c in clients]
        finally:
            for c in clients:
                if c.poll() is None:
                    c.kill()
    for (out, err), rc in answers:
        assert rc == 0, f"status: exit {rc}\n{out}{err}"
        assert json.loads(out)["active"]["model"] == "model-a", out
    assert env.main_pid() not in (0, old_pid) and env.unit_state("modeld.service") == "active"
    # Two daemon starts so far, each announcing the socket it took.
    assert len(activation_lines(env)) >= 3


def test_an_rm_queued_while_modeld_is_down_waits_for_the_interrupted_deployment_and_deletes_nothing(env):
    write_control(env.hub_control, hold="acme/model-b/*.safetensors")
    try:
        dep_id = start_deploy(env, "model-b")
        commit = in_phase(env, dep_id, "downloading")["commit"]
        revision = env.models_dir / ".store" / "model-b" / commit
        assert revision.is_dir(), revision
        with start_gate(env) as gate:
            env.kill_modeld()
            wait_for("modeld's restart to wait at the gate with no daemon running", lambda: env.systemd.run(
                ["systemctl", "show", "-p", "SubState", "--value", "modeld.service"]).stdout.strip() == "start-pre",
                timeout=60)
            rm = subprocess.Popen([str(env.modelctl_bin), "--socket", str(env.socket), "rm", "model-b", "--commit",
                                   commit], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                # Queued on systemd's socket before the daemon starts: the first request it accepts.
                wait_for("the rm to wait on the socket", lambda: queued(env.socket) >= 1, timeout=30)
                gate.touch()
                out, err = rm.communicate(timeout=60)
            finally:
                if rm.poll() is None:
                    rm.kill()
        # Refused (409) whether it came before the interrupted deployment continued or after.
        assert rm.returncode != 0, out + err
        assert "deployment_running" in err or "is running" in err or "interrupted by modeld's restart" in err, err
        assert revision.is_dir(), "the rm deleted the interrupted deployment's revision"
    finally:
        write_control(env.hub_control)
    dep = ended(env, dep_id)
    assert dep["state"] == "succeeded", dep
    assert "model-b" in [x["model"] for x in env.status()["services"]]


def test_a_configuration_naming_another_socket_is_told_it_is_not_used(env):
    other = env.workdir / "other.sock"
    text = env.config.read_text()
    try:
        env.config.write_text(text.replace(f'socket = "{env.socket}"', f'socket = "{other}"'))
        assert str(other) in env.config.read_text()
        before = len(activation_lines(env))
        env.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
        status_ok(env)
        wait_for("the journal line of the restarted daemon", lambda: len(activation_lines(env)) > before)
        line = activation_lines(env)[-1]
        assert str(env.socket) in line
        assert f"daemon.socket {other} in the configuration is not used" in line
        assert not other.exists()
    finally:
        env.config.write_text(text)


def test_without_the_socket_unit_modeld_listens_itself(env):
    env.systemd.run(["systemctl", "stop", "modeld.socket", "modeld.service"], check=True)
    assert env.unit_state("modeld.socket") == "inactive"
    assert not env.socket.exists(), "RemoveOnStop=yes should have removed the socket"
    before = len(activation_lines(env))
    env.systemd.run(["systemctl", "start", "modeld.service"], check=True)
    wait_for("modeld's own socket", lambda: env.modelctl("status").returncode == 0, timeout=60)
    assert env.unit_state("modeld.socket") == "inactive"
    st = os.stat(env.socket)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
    assert len(activation_lines(env)) == before
