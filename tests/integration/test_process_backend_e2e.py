"""End to end on the process backend: modeld runs as a plain child of the test (no systemd, no
D-Bus, no NOTIFY_SOCKET) with [daemon] service_manager = "process", deploys two models from the
bundled hub with the stand-in inference server, rolls a server that dies while loading back, and
re-adopts its server after a restart."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from modeld_env import (BUILD_DIR, ModeldEnv, ProcessModeld, completion, free_port, model_table,
                        process_group_members, wait_for)
from nsystemd import unsupported_reason


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = ProcessModeld(tmp_path_factory.mktemp("process"))
    e.add_repo("acme/a", shards=2, shard_size=200_000, seed=61)
    e.add_repo("acme/b", shards=2, shard_size=200_000, seed=62)
    e.add_repo("acme/dies", shards=1, shard_size=100_000, seed=63)
    e.ports = {"a": free_port(), "b": free_port(), "dies": free_port()}
    # Something of modeld's own environment that must not reach the servers.
    e.extra_environment["MODELD_TEST_ONLY_MODELD"] = "not for servers"
    tables = (model_table("a", "acme/a", e.ports["a"], stop_timeout="10s",
                          extra_serve='environment = { MODELD_TEST_SERVER_VAR = "for the server" }')
              + model_table("b", "acme/b", e.ports["b"], stop_timeout="10s")
              + model_table("dies", "acme/dies", e.ports["dies"], startup_timeout="60s",
                            serve_args=["--die-during-load", "1", "--progress-every", "0.3"]))
    try:
        e.start(tables)
        yield e
    finally:
        e.stop()


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2:].split()[1])


def test_an_unknown_service_manager_is_a_config_error_naming_the_key_and_line(tmp_path):
    config = tmp_path / "modeld.toml"
    config.write_text('[daemon]\nstate_dir = "/tmp/x"\nservice_manager = "launchd"\n')
    r = subprocess.run([str(BUILD_DIR / "modeld"), "--check-config", "--config", str(config)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{config}:3:" in r.stderr and "daemon.service_manager" in r.stderr and "launchd" in r.stderr, r.stderr


def test_the_first_model_runs_as_a_child_of_modeld_in_its_own_process_group(env):
    dep = env.deploy_and_wait("a")
    assert dep["state"] == "succeeded", dep
    assert env.status()["active"]["model"] == "a"
    assert completion(env.ports["a"], "a")
    pid = env.server_pid("a")
    assert pid, "modeld keeps a record of the server it started"
    assert os.getpgid(pid) == pid and os.getsid(pid) == pid
    assert parent_of(pid) == env.proc.pid
    # modeld opened no bus connection: it said which backend it uses, and nothing about a bus.
    log = env.log()
    assert 'service_manager "process"' in log
    assert "system bus" not in log


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_the_server_gets_dev_null_its_environment_and_working_directory(env):
    pid = env.server_pid("a")
    assert pid
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    assert Path(os.readlink(f"/proc/{pid}/cwd")) == (env.models_dir / "a").resolve()
    environ = environ_of(pid)
    assert environ.get("MODELD_TEST_SERVER_VAR") == "for the server", environ
    assert environ.get("PATH") == environ_of(env.proc.pid)["PATH"], environ
    assert re.fullmatch(r"[0-9a-f]{32}", environ.get("INVOCATION_ID", "")), environ
    assert "MODELD_TEST_ONLY_MODELD" not in environ, environ
    assert "MODELD_TEST_ONLY_MODELD" in environ_of(env.proc.pid)


def test_a_second_model_replaces_the_first_whose_process_group_is_gone(env):
    a_pid = env.server_pid("a")
    dep = env.deploy_and_wait("b")
    assert dep["state"] == "succeeded", dep
    assert env.status()["active"]["model"] == "b"
    assert process_group_members(a_pid) == []
    assert env.server_pid("a") is None
    assert completion(env.ports["b"], "b")


def test_a_server_that_dies_while_loading_is_rolled_back_to_the_model_before(env):
    b_pid = env.server_pid("b")
    dep = env.deploy_and_wait("dies", 1)
    assert dep["state"] == "rolled_back", dep
    assert dep["error"]["code"] == "unit_failed", dep["error"]
    assert "modeld-serve@dies.service failed while starting" in dep["error"]["message"], dep["error"]
    assert "exit status 1" in dep["error"]["message"], dep["error"]
    assert_last_lines_of_the_dead_server(env, dep["error"]["message"])
    assert env.status()["active"]["model"] == "b"
    # b was stopped for the switch and started again: a new process group that answers.
    new_b = env.server_pid("b")
    assert new_b and new_b != b_pid
    assert process_group_members(b_pid) == []
    assert completion(env.ports["b"], "b")
    assert env.server_pid("dies") is None


def assert_last_lines_of_the_dead_server(env, message: str) -> None:
    """The server's own last lines come from journald by its identifier (it has no unit of its
    own) where journald runs. Without it (as in CI, whose journald lives in the namespaced
    systemd's private /run) there is no output to read: the error quotes no lines and says where
    they went, and the server's last line is in modeld's output, where the server wrote it."""
    if Path("/run/systemd/journal/stdout").exists():
        assert "its last journal lines:" in message and "CUDA error: out of memory" in message, message
    else:
        assert "last journal lines" not in message and "CUDA error" not in message, message
        assert "its output went to modeld's own standard output (no journald on this host)" in message, message
        assert "CUDA error: out of memory while loading weights" in env.log()


def test_a_restarted_modeld_re_adopts_the_running_server_and_can_replace_it(env):
    b_pid = env.server_pid("b")
    assert env.stop_modeld() == 0
    # The server outlives modeld (a restart must not stop the model) and keeps answering.
    assert completion(env.ports["b"], "b")
    env.start_modeld()
    wait_for("modeld to re-adopt b's server", lambda: "re-adopted PID" in env.log(), timeout=30)
    assert env.status()["active"]["model"] == "b"
    assert env.server_pid("b") == b_pid
    # The re-adopted server is stopped properly when another model replaces it.
    dep = env.deploy_and_wait("a")
    assert dep["state"] == "succeeded", dep
    assert process_group_members(b_pid) == []
    assert completion(env.ports["a"], "a")


# -- the process backend with journald: modeld as a unit of a namespaced systemd -------------------

class ProcessBackendUnderSystemd(ModeldEnv):
    """modeld.service of a namespaced systemd configured with service_manager = "process": its
    servers are its children (in its control group), and journald's stream socket answers."""

    def write_config(self, model_tables: str):
        super().write_config(model_tables)
        text = self.config.read_text()
        self.config.write_text(text.replace("[daemon]\n", '[daemon]\nservice_manager = "process"\n', 1))


@pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")
def test_with_journald_the_servers_lines_go_to_the_journal_under_their_identifier(tmp_path):
    e = ProcessBackendUnderSystemd(workdir=tmp_path / "journald")
    try:
        e.add_repo("acme/j", shards=1, shard_size=100_000, seed=64)
        e.add_repo("acme/jdies", shards=1, shard_size=100_000, seed=65)
        port = free_port()
        e.start(model_table("j", "acme/j", port)
                + model_table("jdies", "acme/jdies", free_port(), serve_args=["--die-during-load", "0.5"]))
        dep = e.deploy_and_wait("j")
        assert dep["state"] == "succeeded", dep
        assert completion(port, "j")
        # No unit: the lines carry the identifier modeld gives them.
        assert not e.systemd.run(["systemctl", "is-active", "modeld-serve@j.service"]).stdout.strip() == "active"
        own = wait_for("the server's lines in the journal", lambda: [
            x for x in e.journal("SYSLOG_IDENTIFIER=modeld-serve@j") if "Uvicorn running" in x.get("MESSAGE", "")],
            timeout=30)
        assert own[0]["_SYSTEMD_UNIT"] == "modeld.service", own[0]
        # A server that dies while loading is quoted from there in the error.
        dep = e.deploy_and_wait("jdies", 1)
        assert dep["state"] == "rolled_back", dep
        assert "CUDA error: out of memory" in dep["error"]["message"], dep["error"]
    finally:
        e.stop()
