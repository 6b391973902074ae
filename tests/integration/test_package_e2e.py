"""End to end: the Debian package. scripts/package.sh packages the test build (no recompile),
dpkg installs it into a namespaced systemd, a deployment runs with the installed programs and
units only, an upgrade lands in the middle of a download (which resumes), and removal and purge
keep what they must.

dpkg writes into /usr, /etc and /var. Here those three are overlays inside the namespace's
private mount namespace: the host's folders are the lower layers and every write goes to an
upper layer in the test's temporary folder, which vanishes with the namespace. The host's
/usr, /etc and /var (its dpkg database included) are left exactly as they were; the last test
checks that.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modeld_env import SOURCE_DIR, Hub, ModeldUnreachable, completion, free_port, model_table, package, wait_for
from nsystemd import OverlaySystemd, unsupported_reason

sys.path.insert(0, str(SOURCE_DIR / "tests" / "fixtures"))
import make_checkpoint  # noqa: E402


def _why_not() -> str | None:
    reason = unsupported_reason()
    if reason:
        return reason
    for tool in ("dpkg", "dpkg-deb", "dpkg-shlibdeps", "cpack", "gzip"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (scripts/install-deps.sh installs it)"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")

SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# A shard of "second" is 2 MiB and each answer runs at 32 KiB/s while throttled: its download
# cannot end (over a minute) before the upgrade restarts modeld a few seconds after it began.
THROTTLE = 32 * 1024
SECOND_SHARD = 2 * 1024 * 1024


def host_fingerprint() -> dict:
    """What a package install on the host would change: the dpkg database, the package's paths,
    the modeld group."""
    status = hashlib.sha256(Path("/var/lib/dpkg/status").read_bytes()).hexdigest()
    paths = ["/usr/bin/modeld", "/usr/bin/modelctl", "/etc/modeld", "/var/lib/modeld",
             "/usr/lib/systemd/system/modeld.service", "/usr/lib/sysusers.d/modeld.conf",
             "/var/lib/dpkg/info/modeld.list"]
    group = subprocess.run(["getent", "group", "modeld"], capture_output=True, text=True).stdout
    return {"dpkg_status": status, "exists": {p: os.path.lexists(p) for p in paths}, "group": group}


class PackageEnv:
    """The packages, the hub, and the overlaid namespaced systemd the package is installed in."""

    def __init__(self, work: Path):
        self.work = work
        self.host_before = host_fingerprint()
        # Both packages first: the upgrade must land while a download runs, not after a cpack.
        v1 = package()
        self.v1 = subprocess.run(["dpkg-deb", "-f", str(v1), "Version"], capture_output=True, text=True,
                                 check=True).stdout.strip()
        self.v2 = f"{self.v1}+upgrade1"
        self.deb1 = work / v1.name
        shutil.copy(v1, self.deb1)
        v2 = package(self.v2)
        self.deb2 = work / v2.name
        shutil.copy(v2, self.deb2)

        self.repos = work / "repos"
        make_checkpoint.make_checkpoint(str(self.repos / "acme/first"), 2, 200_000, 1)
        make_checkpoint.make_checkpoint(str(self.repos / "acme/second"), 4, SECOND_SHARD, 2)
        self.control = work / "hub-control.json"
        self.set_hub({})
        self.hub = Hub(self.repos, work, ["--control", str(self.control)])
        self.ports = {"first": free_port(), "second": free_port()}
        self.systemd = OverlaySystemd(work / "layers", log_path=work / "systemd.log")
        self.systemd.start()
        # Images built like Docker's ship a policy-rc.d that forbids starting services from
        # maintainer scripts (deb-systemd-invoke asks it). This namespace is a machine whose
        # services should start: hide it here (a whiteout in the upper layer; the host keeps it).
        self.ok("rm", "-f", "/usr/sbin/policy-rc.d")

    def set_hub(self, faults: dict) -> None:
        """Replaces the hub's fault settings (atomically: the hub re-reads the file on change)."""
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(faults))
        tmp.rename(self.control)

    def run(self, *cmd: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """A command inside the namespace (so on the overlaid /usr, /etc, /var)."""
        env = dict(os.environ, PATH=SBIN_PATH, DEBIAN_FRONTEND="noninteractive")
        return self.systemd.run(list(cmd), timeout=timeout, env=env)

    def ok(self, *cmd: str, timeout: float = 300) -> str:
        r = self.run(*cmd, timeout=timeout)
        assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}{r.stderr}"
        return r.stdout + r.stderr

    def modelctl(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """The installed modelctl, with its default socket (/run/modeld/modeld.sock)."""
        return self.run("/usr/bin/modelctl", *args, timeout=timeout)

    def status(self) -> dict:
        """`modelctl --json status`; raises ModeldUnreachable when modeld does not answer."""
        r = self.modelctl("--json", "status")
        if r.returncode == 3:
            raise ModeldUnreachable(r.stderr.strip())
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def exists(self, path: str) -> bool:
        return self.run("test", "-e", path).returncode == 0

    def prop(self, unit: str, name: str) -> str:
        return self.ok("systemctl", "show", "-p", name, "--value", unit).strip()

    def stop(self) -> None:
        try:
            self.systemd.stop()
        finally:
            self.hub.stop()
            shutil.rmtree(self.work / "layers", ignore_errors=True)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = PackageEnv(tmp_path_factory.mktemp("package"))
    try:
        yield e
    finally:
        e.stop()


def test_a_fresh_install_enables_the_units_and_starts_with_no_models(env):
    out = env.ok("dpkg", "-i", str(env.deb1))
    assert "error" not in out.lower(), out
    for path in ("/usr/bin/modeld", "/usr/bin/modelctl", "/usr/lib/systemd/system/modeld.service",
                 "/usr/lib/systemd/system/modeld.socket", "/usr/lib/systemd/system/modeld-serve@.service",
                 "/usr/lib/sysusers.d/modeld.conf", "/usr/lib/tmpfiles.d/modeld.conf",
                 "/usr/lib/systemd/catalog/modeld.catalog", "/etc/modeld/modeld.toml",
                 "/usr/share/man/man8/modeld.8.gz", "/usr/share/man/man1/modelctl.1.gz",
                 "/usr/share/doc/modeld/copyright", "/usr/share/doc/modeld/changelog.gz",
                 "/var/lib/modeld/state"):
        assert env.exists(path), path
    # The group of [control] group, from sysusers.d; the catalog, through systemd's trigger.
    assert env.ok("getent", "group", "modeld").startswith("modeld:")
    assert "5a0f4e2d8c9b4d7e9f1a2b3c4d5e6f70" in env.ok("journalctl", "--list-catalog")
    for unit in ("modeld.socket", "modeld.service"):
        assert env.prop(unit, "UnitFileState") == "enabled", unit
        assert env.prop(unit, "ActiveState") == "active", unit
    assert "0 model(s)" in env.ok("/usr/bin/modeld", "--check-config")
    assert json.loads(env.modelctl("--json", "models").stdout)["models"] == []
    # The conffiles, as dpkg recorded them.
    conffiles = env.ok("dpkg-query", "-W", "-f", "${Conffiles}", "modeld")
    assert "/etc/modeld/modeld.toml" in conffiles and "kimi-k2-5.toml.example" in conffiles
    assert "qwen3-235b.toml.example" in conffiles


@pytest.mark.skipif(shutil.which("lintian") is None, reason="lintian is missing (scripts/install-deps.sh)")
def test_lintian_finds_no_errors_in_either_package(env):
    r = subprocess.run(["lintian", "--no-tag-display-limit", str(env.deb1), str(env.deb2)],
                       capture_output=True, text=True, timeout=300)
    errors = [line for line in r.stdout.splitlines() if line.startswith("E:")]
    assert not errors, r.stdout
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_model_examples_are_valid_once_renamed(env, tmp_path):
    (tmp_path / "models.d").mkdir()
    shutil.copy(SOURCE_DIR / "config" / "modeld.toml", tmp_path / "modeld.toml")
    # Kimi-K2.5 on every GPU, MiniMax-M2.5 on GPUs 0-3 and Qwen3 on 4-7 (its own port): valid together.
    for name in ("kimi-k2-5", "minimax-m2-5", "qwen3-235b"):
        text = env.ok("cat", f"/etc/modeld/models.d/{name}.toml.example")
        (tmp_path / "models.d" / f"{name}.toml").write_text(text)
    out = env.ok("/usr/bin/modeld", "--check-config", "--config", str(tmp_path / "modeld.toml"))
    assert "3 model(s)" in out, out


def test_a_deployment_runs_with_the_installed_programs_and_units(env):
    shipped = env.ok("cat", "/etc/modeld/modeld.toml")
    assert '# endpoint = "https://huggingface.co"' in shipped
    # An administrator's edits of the conffile: the fixture hub, no disk reserve on a test host.
    config = (shipped.replace('# endpoint = "https://huggingface.co"', f'endpoint = "{env.hub.endpoint}"')
              .replace('disk_reserve = "20GiB"', 'disk_reserve = "0"'))
    env.systemd.write_file("/etc/modeld/modeld.toml", config)
    env.systemd.write_file("/etc/modeld/models.d/pkgtest.toml",
                           model_table("first", "acme/first", env.ports["first"])
                           + model_table("second", "acme/second", env.ports["second"]))
    env.ok("systemctl", "restart", "modeld.service")
    wait_for("the installed modeld's socket", lambda: env.modelctl("status").returncode == 0, timeout=60)

    r = env.modelctl("deploy", "first", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    st = env.status()
    assert st["active"]["model"] == "first" and st["deployment"]["state"] == "succeeded"
    assert env.prop("modeld-serve@first.service", "ActiveState") == "active"
    assert completion(env.ports["first"], "first")
    assert env.exists("/var/lib/modeld/models/first/model.safetensors.index.json")


def test_an_upgrade_during_a_download_restarts_modeld_and_the_deployment_resumes(env):
    env.set_hub({"throttle": THROTTLE})
    r = env.modelctl("deploy", "second")
    assert r.returncode == 0, r.stdout + r.stderr

    def downloading():
        d = env.status()["deployment"]
        return d if d["phase"] == "downloading" and d["progress"]["bytes_done"] >= 2 * THROTTLE else None

    before = wait_for("the download of 'second' under way", downloading, timeout=60)
    assert before["state"] == "running" and before["progress"]["bytes_done"] < before["progress"]["bytes_total"]
    pid_before = int(env.prop("modeld.service", "MainPID"))
    # The hub goes back to full speed for the requests after the restart; the answers in flight
    # stay throttled until modeld drops them.
    env.set_hub({})
    started = time.time()
    # A Hub token written carelessly (umask 022) before the upgrade: the package's tmpfiles.d line
    # makes it private, and the restarted modeld takes it as the credential the unit loads.
    env.ok("sh", "-c", "echo hf_pkg_token_0123456789 > /etc/modeld/hf-token && chmod 644 /etc/modeld/hf-token")

    out = env.ok("dpkg", "-i", str(env.deb2))
    # No conffile question (the edited modeld.toml is kept as it is), and the package is new.
    assert "Configuration file" not in out, out
    assert env.ok("dpkg-query", "-W", "-f", "${Version}", "modeld") == env.v2
    assert 'disk_reserve = "0"' in env.ok("cat", "/etc/modeld/modeld.toml")
    pid_after = int(env.prop("modeld.service", "MainPID"))
    assert pid_after not in (0, pid_before), "postinst did not restart modeld"
    assert env.ok("stat", "-c", "%a %U", "/etc/modeld/hf-token").strip() == "600 root"

    def ended():
        d = env.status()["deployment"]
        return d if d["state"] != "running" else None

    after = wait_for("the resumed deployment's end", ended, timeout=120)
    assert after["id"] == before["id"], "the upgrade started another deployment instead of resuming"
    assert after["state"] == "succeeded", after
    assert env.status()["active"]["model"] == "second"
    assert completion(env.ports["second"], "second")
    # Resumed from the bytes on disk: after the restart, shards were asked for from an offset.
    resumed = [q for q in env.hub.requests() if q["time"] >= started and q["file"]
               and q["file"].startswith("acme/second/") and (q["range"] or "").startswith("bytes=")
               and not q["range"].startswith("bytes=0-")]
    assert resumed, "no ranged request after the upgrade: the download started over"
    # The credential reached the new modeld (systemd 252's LoadCredential= in the namespace) and
    # the Hub, and no other origin (the CDN the Hub redirects to). The old modeld had no token.
    since = [q for q in env.hub.requests() if q["time"] >= started]
    assert any(q["origin"] == "hub" and q["authorization"] == "Bearer hf_pkg_token_0123456789" for q in since)
    assert {q["authorization"] for q in since if q["origin"] == "hub"} <= {None, "Bearer hf_pkg_token_0123456789"}
    cdn = [q for q in since if q["origin"] == "cdn"]
    assert cdn and not any(q["authorization_present"] for q in cdn), since


def test_removal_stops_modeld_and_keeps_state_models_and_configuration(env):
    env.ok("dpkg", "-r", "modeld")
    assert not env.exists("/usr/bin/modeld") and not env.exists("/usr/lib/systemd/system/modeld.service")
    assert env.prop("modeld.service", "ActiveState") in ("inactive", "failed")
    assert env.prop("modeld.socket", "ActiveState") in ("inactive", "failed")
    for path in ("/etc/modeld/modeld.toml", "/var/lib/modeld/state/state.json",
                 "/var/lib/modeld/models/first/model.safetensors.index.json",
                 "/var/lib/modeld/models/second/model.safetensors.index.json"):
        assert env.exists(path), path
    assert env.ok("ls", "/var/lib/modeld/state/deployments").split()
    # The model in service is not modeld's process: it keeps serving until a purge.
    assert env.prop("modeld-serve@second.service", "ActiveState") == "active"
    assert completion(env.ports["second"], "second")


def test_purge_deletes_state_and_configuration_and_keeps_the_models(env):
    out = env.ok("dpkg", "--purge", "modeld")
    assert "/var/lib/modeld/models" in out, out  # the note naming what was kept
    assert env.run("dpkg-query", "-W", "modeld").returncode != 0
    for gone in ("/var/lib/modeld/state", "/etc/modeld/modeld.toml", "/etc/modeld/models.d/README",
                 "/etc/modeld/models.d/kimi-k2-5.toml.example", "/var/lib/modeld/.dpkg-paths",
                 "/run/systemd/system/modeld-serve@second.service.d/10-modeld.conf"):
        assert not env.exists(gone), gone
    assert env.prop("modeld-serve@second.service", "ActiveState") in ("inactive", "failed")
    # Model files are never deleted, and they are intact.
    for model, repo in (("first", "acme/first"), ("second", "acme/second")):
        for f in (env.repos / repo).iterdir():
            if f.suffix in (".safetensors", ".json"):
                on_disk = env.ok("sha256sum", f"/var/lib/modeld/models/{model}/{f.name}").split()[0]
                assert on_disk == hashlib.sha256(f.read_bytes()).hexdigest(), f"{model}/{f.name}"
    # The administrator's own file stays too (dpkg never deletes what it did not install).
    assert env.exists("/etc/modeld/models.d/pkgtest.toml")


def test_the_host_is_left_as_it_was(env):
    env.stop()
    assert host_fingerprint() == env.host_before
