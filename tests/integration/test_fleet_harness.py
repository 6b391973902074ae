"""The multi-host harness itself (tests/integration/fleet.py): hosts boot in namespaces of their
own, Ansible reaches each over real SSH with host keys checked, each host has its own identity and
its own /etc, a package install on a host leaves the machine's dpkg database alone, a host reaches
the hub namespace, and nothing of the fleet is left afterwards."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from fleet import HUB, PREFIX, Fleet, why_not
from waiting import wait_for

pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")


def dpkg_status() -> str:
    return hashlib.sha256(Path("/var/lib/dpkg/status").read_bytes()).hexdigest()


def test_four_hosts_over_real_ssh_each_its_own(tmp_path):
    before = dpkg_status()
    with Fleet(tmp_path / "fleet", 4) as fleet:
        inventory = fleet.inventory(tmp_path / "inventory.ini")
        env = fleet.ansible_env(tmp_path / "collections")
        r = fleet.ansible(["ansible", "modeld_hosts", "-i", str(inventory), "-m", "ansible.builtin.ping"], env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.count("SUCCESS") == 4, r.stdout
        names = {h.ok("hostname").strip() for h in fleet.hosts}
        ids = {h.ok("cat", "/etc/machine-id").strip() for h in fleet.hosts}
        assert names == {"host1", "host2", "host3", "host4"} and len(ids) == 4
        assert Path("/etc/machine-id").read_text().strip() not in ids
        # /etc is each host's own: a file on one is on no other host, nor on the machine.
        fleet.hosts[0].systemd.write_file("/etc/fleet-probe", "host1\n")
        assert fleet.hosts[1].run("test", "-e", "/etc/fleet-probe").returncode != 0
        assert not Path("/etc/fleet-probe").exists()
        # An unknown host key is refused (StrictHostKeyChecking): no silent trust.
        fleet.known_hosts.write_text(fleet.known_hosts.read_text().replace("ssh-ed25519 A", "ssh-ed25519 B"))
        fresh = dict(env, ANSIBLE_SSH_ARGS="-o ControlMaster=no")  # not the connection already open
        bad = fleet.ansible(["ansible", "host1", "-i", str(inventory), "-m", "ansible.builtin.ping"], fresh)
        assert bad.returncode != 0 and "UNREACHABLE" in bad.stdout, bad.stdout
        # A host reaches a server in the hub namespace, on the hub's address only.
        server = fleet.popen_in(fleet.hub_ns, ["python3", "-m", "http.server", "--bind", HUB, "8080"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
        try:
            def fetched():
                r = fleet.hosts[2].run("python3", "-c", "import urllib.request,sys; sys.stdout.write(str("
                                       f"urllib.request.urlopen('http://{HUB}:8080/', timeout=5).status))", timeout=30)
                return r.stdout == "200"

            wait_for("host3 reaching the hub namespace", fetched, timeout=30)
        finally:
            server.terminate()
            server.wait(timeout=10)
        # dpkg on a host writes its own database.
        fleet.hosts[3].ok("dpkg-query", "-W", "bash")
    assert dpkg_status() == before
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{PREFIX}{os.getpid()}-" not in left, left
    assert not list(Path("/sys/fs/cgroup/systemd").glob(f"nsystemd-{os.getpid()}-*")), "a host's control group is left"
