"""End to end, modeld under the sandbox systemd/modeld.service ships (issue 7): the test drop-in
only adds this run's folder to ReadWritePaths= (and PrivateTmp=no when it lies in /tmp), so
every phase here runs with the capability set, seccomp filter and read-only file system that
production gets. docs/hardening.md says what each setting is for."""

from __future__ import annotations

import filecmp
import os
import shutil
from pathlib import Path

import pytest

from modeld_env import ModeldEnv, completion, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

CAP_DAC_OVERRIDE = 1
OTHER_UID = 4242  # an operator's account: owns the folder that modeld adopts


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = ModeldEnv(workdir=tmp_path_factory.mktemp("hardening"))
    names = ["plain", "theirs", "later"]
    for i, n in enumerate(names):
        e.add_repo(f"acme/{n}", shards=2, shard_size=200_000, seed=70 + i)
    e.ports = {n: free_port() for n in names}
    e.tables = {n: model_table(n, f"acme/{n}", e.ports[n]) for n in names}
    try:
        e.start(e.tables["plain"] + e.tables["theirs"])
        yield e
    finally:
        e.stop()


def in_namespace(env: ModeldEnv, *cmd: str) -> str:
    return env.systemd.run(list(cmd), check=True).stdout


def proc_status(env: ModeldEnv) -> dict[str, str]:
    pid = env.main_pid()
    assert pid > 0
    text = in_namespace(env, "cat", f"/proc/{pid}/status")
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def mount_options(env: ModeldEnv) -> dict[str, set[str]]:
    """modeld's mounts as it sees them: mount point -> per-mount options (mountinfo field 6)."""
    text = in_namespace(env, "cat", f"/proc/{env.main_pid()}/mountinfo")
    out = {}
    for line in text.splitlines():
        fields = line.split()
        out[fields[4].replace("\\040", " ")] = set(fields[5].split(","))
    return out


def repo_files(env: ModeldEnv, name: str) -> list[str]:
    root = env.repos / "acme" / name
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and not {".git", ".hub"} & set(p.relative_to(root).parts))


def test_modeld_runs_with_only_cap_dac_override_no_new_privileges_and_a_seccomp_filter(env):
    status = proc_status(env)
    assert int(status["CapBnd"], 16) == 1 << CAP_DAC_OVERRIDE, status["CapBnd"]
    assert int(status["CapEff"], 16) == 1 << CAP_DAC_OVERRIDE, status["CapEff"]
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"  # filter mode


def test_the_file_system_is_read_only_except_the_paths_modeld_writes(env):
    mounts = mount_options(env)
    assert "ro" in mounts["/"], mounts["/"]
    for writable in (str(env.workdir.resolve()), "/run/systemd/system", "/run/modeld", "/var/lib/modeld"):
        assert "rw" in mounts[writable], (writable, mounts.get(writable))
    assert "ro" in mounts["/proc/sys"]
    cgroups = {m: o for m, o in mounts.items() if m.startswith("/sys/fs/cgroup")}
    assert cgroups and all("ro" in o for o in cgroups.values()), cgroups
    # A write from inside modeld's mount namespace, next to the test's folder but outside it.
    probe = env.workdir.resolve().parent / f"{env.workdir.name}-outside-probe"
    r = env.systemd.run(["nsenter", "-t", str(env.main_pid()), "-m", "touch", str(probe)])
    assert r.returncode != 0 and "Read-only file system" in r.stderr, (r.returncode, r.stderr)
    assert not probe.exists()


def test_a_deployment_runs_from_plan_to_health_under_the_sandbox(env):
    r = env.modelctl("--json", "plan", "plain")
    assert r.returncode == 0, r.stdout + r.stderr
    dep = env.deploy_and_wait("plain")
    assert dep["state"] == "succeeded" and dep["phase"] in ("health_checking", "benchmarking"), dep
    assert completion(env.ports["plain"], "plain")
    # The model service's drop-in went into /run/systemd/system, and it runs as a unit of its own.
    assert env.unit_state("modeld-serve@plain.service") == "active"
    dropin = in_namespace(env, "cat", "/run/systemd/system/modeld-serve@plain.service.d/10-modeld.conf")
    assert "ExecStart=" in dropin


def test_systemctl_reload_rereads_the_configuration_under_the_sandbox(env):
    assert "later" not in env.modelctl("models").stdout
    env.write_config(env.tables["plain"] + env.tables["theirs"] + env.tables["later"])
    before = env.main_pid()
    env.systemd.run(["systemctl", "reload", "modeld.service"], check=True)
    wait_for("the reloaded configuration", lambda: "later" in env.modelctl("models").stdout, timeout=30)
    assert env.main_pid() == before, "reload restarted modeld"
    assert env.deploy_and_wait("later")["state"] == "succeeded"


def test_a_folder_written_by_another_user_is_adopted_through_hard_links(env):
    name = "theirs"
    folder = env.models_dir / name
    for rel in repo_files(env, name):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(env.repos / "acme" / name / rel, folder / rel)
    # Private to that user: only CAP_DAC_OVERRIDE lets root read, link and later move them.
    for p in [folder, *folder.rglob("*")]:
        os.chown(p, OTHER_UID, OTHER_UID)
        p.chmod(0o700 if p.is_dir() else 0o600)
    inodes = {rel: (folder / rel).stat().st_ino for rel in repo_files(env, name)}

    dep = env.deploy_and_wait(name)
    assert dep["state"] == "succeeded", dep
    cdn = [r["file"] for r in env.hub.requests() if r["origin"] == "cdn" and (r.get("file") or "").startswith(f"acme/{name}/")]
    assert cdn == [], f"adopted files were downloaded again: {cdn}"
    served = env.models_dir / name
    assert served.is_symlink()
    assert inodes, f"acme/{name} has no files"
    for rel, ino in inodes.items():
        assert (served / rel).stat().st_ino == ino, f"{rel} is not the operator's file (hard link)"
        assert filecmp.cmp(served / rel, env.repos / "acme" / name / rel, shallow=False), rel
    assert completion(env.ports[name], name)


def test_a_models_dir_outside_read_write_paths_is_refused_naming_it_until_a_drop_in_adds_it(tmp_path):
    env = ModeldEnv(workdir=tmp_path / "env")
    env.models_dir = tmp_path / "elsewhere" / "models"  # not under the test's ReadWritePaths=
    env.add_repo("acme/moved", shards=1, shard_size=100_000, seed=80)
    port = free_port()
    try:
        # modeld is expected not to come up: no waiting for its socket.
        env.boot(model_table("moved", "acme/moved", port))
        assert env.systemd.run(["systemctl", "start", "modeld.service"]).returncode != 0
        line = wait_for("modeld's models_dir error", lambda: next(
            (e["MESSAGE"] for e in env.journal(unit="modeld.service")
             if "models_dir" in e.get("MESSAGE", "")), None), timeout=20)
        assert str(env.models_dir) in line and "Read-only file system" in line, line
        assert "ReadWritePaths=" in line and "hardening.md" in line, line
        assert not env.models_dir.exists()

        # Made by hand, it exists but stays read-only for modeld: still refused at start, not at
        # the first deployment.
        env.models_dir.mkdir(parents=True)
        env.systemd.run(["systemctl", "reset-failed", "modeld.service"])
        assert env.systemd.run(["systemctl", "restart", "modeld.service"]).returncode != 0
        line = wait_for("modeld's models_dir error for the existing folder", lambda: next(
            (e["MESSAGE"] for e in env.journal(unit="modeld.service")
             if "models_dir is not writable" in e.get("MESSAGE", "")), None), timeout=20)
        assert str(env.models_dir) in line and "ReadWritePaths=" in line, line

        # The drop-in docs/hardening.md gives operators who move models_dir.
        env.systemd.write_file("/run/systemd/system/modeld.service.d/60-models-dir.conf",
                               f"[Service]\nReadWritePaths={env.models_dir.parent}\n")
        env.systemd.run(["systemctl", "daemon-reload"], check=True)
        env.systemd.run(["systemctl", "reset-failed", "modeld.service"])
        env.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
        wait_for("modeld's control socket", lambda: env.modelctl("status").returncode == 0, timeout=60)
        assert env.deploy_and_wait("moved")["state"] == "succeeded"
        assert (env.models_dir / "moved").is_symlink()
        assert completion(port, "moved")
    finally:
        env.stop()
