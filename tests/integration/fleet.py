"""Several simulated hosts on one machine, for the fleet tests (docs/fleet.md), as
shared/docs/real-systemd-in-tests.md ("Several simulated hosts") says.

Fleet(workdir, n_hosts) makes, all in namespaces of its own (names "mdf<pid>-..."):
  * a controller namespace holding a bridge with 10.231.0.1/24: Ansible runs there;
  * a hub namespace (10.231.0.2 and 10.231.0.3: the Hub and its CDN) and a cache namespace
    (10.231.0.4), plain network namespaces where the test starts the hub fixture and nginx;
  * N hosts host1..hostN (10.231.0.11...): each a namespaced systemd (nsystemd.OverlaySystemd:
    tmp.conf hidden, private /run, sysinit.target) with its own network and UTS namespace, its own
    overlays of /usr, /etc, /var and /root (dpkg database, /etc/modeld, /var/lib/modeld, its own
    /etc/machine-id and hostname), and sshd on its address: root by key only, host keys per host.
Only these addresses and loopback are ever a target. Teardown powers the hosts off, then removes
the namespaces (their links go with them) and the layers; a leftover of a killed run is removed
at the next start, found by the name prefix.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from nsystemd import CGROUP_ROOTS, OverlaySystemd, remove_cgroup, unsupported_reason
from waiting import wait_for

NET = "10.231.0"
PREFIX = "mdf"
HUB, CDN, CACHE = f"{NET}.2", f"{NET}.3", f"{NET}.4"
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SSHD_CONFIG = """ListenAddress {address}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
HostKey /etc/ssh/fleet_host_ed25519_key
AuthorizedKeysFile /etc/ssh/fleet_authorized_keys
PidFile none
Subsystem sftp /usr/lib/openssh/sftp-server
"""


def why_not() -> str | None:
    """Why the fleet cannot run here, or None."""
    reason = unsupported_reason()
    if reason:
        return reason
    for tool in ("ip", "sshd", "ssh", "ssh-keygen", "ansible-playbook", "dpkg"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} is missing (scripts/install-deps.sh installs it)"
    return None


def ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def remove_leftovers() -> None:
    """Network namespaces and hosts' control groups of earlier runs whose process is gone (a run
    killed before teardown)."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        m = re.match(rf"({PREFIX}(\d+)-\S+)", line)
        if m and not Path(f"/proc/{m.group(2)}").exists():
            subprocess.run(["ip", "netns", "delete", m.group(1)], capture_output=True)
    for root in CGROUP_ROOTS:
        for cg in Path(root).glob("nsystemd-*-*"):
            if not Path(f"/proc/{cg.name.split('-')[1]}").exists():
                remove_cgroup(cg)


class Host:
    """One simulated host: its name, address and namespaced systemd."""

    def __init__(self, name: str, address: str, systemd: OverlaySystemd):
        self.name, self.address, self.systemd = name, address, systemd

    def run(self, *cmd: str, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess:
        """A command on the host (its mounts, network and PID namespace)."""
        env = dict(os.environ, PATH=SBIN_PATH, DEBIAN_FRONTEND="noninteractive")
        return self.systemd.run(list(cmd), timeout=timeout, check=check, env=env)

    def ok(self, *cmd: str, timeout: float = 300) -> str:
        r = self.run(*cmd, timeout=timeout)
        assert r.returncode == 0, f"{self.name}: {' '.join(cmd)}: exit {r.returncode}\n{r.stdout}{r.stderr}"
        return r.stdout


class Fleet:
    """The controller, hub and cache namespaces, and N hosts reachable over SSH."""

    def __init__(self, workdir: Path, n_hosts: int = 4):
        self.dir = Path(workdir)
        self.n = n_hosts
        tag = f"{PREFIX}{os.getpid()}"
        self.controller_ns, self.hub_ns, self.cache_ns = f"{tag}-ctl", f"{tag}-hub", f"{tag}-cache"
        self.hosts: list[Host] = []
        self.key = self.dir / "ssh" / "id_ed25519"
        self.known_hosts = self.dir / "ssh" / "known_hosts"

    # -- set-up ---------------------------------------------------------------------------------

    def start(self) -> "Fleet":
        remove_leftovers()
        (self.dir / "ssh").mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        try:
            self._network()
            for i in range(self.n):
                self.hosts.append(self._boot(f"host{i + 1}", f"{NET}.{11 + i}"))
            self.known_hosts.write_text("".join(self._sshd(h) for h in self.hosts))
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        for ns in (self.controller_ns, self.hub_ns, self.cache_ns):
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", self.controller_ns, "link", "add", "br0", "type", "bridge")
        ip("-n", self.controller_ns, "addr", "add", f"{NET}.1/24", "dev", "br0")
        ip("-n", self.controller_ns, "link", "set", "br0", "up")
        self._link(self.hub_ns, "vhub", [HUB, CDN])
        self._link(self.cache_ns, "vcache", [CACHE])

    def _link(self, target: str, port: str, addresses: list[str]) -> None:
        """A veth from the bridge into network namespace `target` (a name, or a PID), as eth0."""
        ip("-n", self.controller_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", target)
        ip("-n", self.controller_ns, "link", "set", port, "master", "br0", "up")
        where = ["-n", target] if not target.isdigit() else None
        for a in addresses:
            self._in_ns(target, where, "addr", "add", f"{a}/24", "dev", "eth0")
        self._in_ns(target, where, "link", "set", "eth0", "up")
        self._in_ns(target, where, "link", "set", "lo", "up")

    @staticmethod
    def _in_ns(target: str, where, *args: str) -> None:
        if where:
            ip(*where, *args)
        else:
            r = subprocess.run(["nsenter", "-t", target, "-n", "ip", *args], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"ip {' '.join(args)} in {target}: {r.stderr.strip()}")

    def _boot(self, name: str, address: str) -> Host:
        layers = self.dir / name
        hosts = "".join(f"{NET}.{11 + i} host{i + 1}\n" for i in range(self.n))
        etc = (f"echo {name} > /etc/hostname && echo {uuid.uuid4().hex} > /etc/machine-id && "
               f"printf '127.0.0.1 localhost\\n{hosts}' > /etc/hosts")
        sd = OverlaySystemd(layers, overlaid=("usr", "etc", "var", "root"), network=True,
                            log_path=self.dir / f"{name}-systemd.log", pre_boot=[])
        # After the overlays (OverlaySystemd puts its mounts first): the host's own identity.
        sd.pre_boot = [etc]
        sd.start()
        host = Host(name, address, sd)
        self._link(str(sd.pid), f"v{name}", [address])
        # Images built like Docker's forbid starting services from maintainer scripts; a host
        # starts them (a whiteout in the upper layer, the machine keeps its file).
        host.run("rm", "-f", "/usr/sbin/policy-rc.d")
        return host

    def _sshd(self, h: Host) -> str:
        """Starts sshd on host `h` with its own host key; returns its known_hosts line."""
        h.ok("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", "/etc/ssh/fleet_host_ed25519_key")
        h.systemd.write_file("/etc/ssh/fleet-sshd.conf", SSHD_CONFIG.format(address=h.address))
        h.systemd.write_file("/etc/ssh/fleet_authorized_keys", self.key.with_suffix(".pub").read_text())
        h.ok("chmod", "600", "/etc/ssh/fleet_authorized_keys")
        h.ok("systemd-run", "--unit=fleet-sshd", "-p", "RuntimeDirectory=sshd", "-p", "RuntimeDirectoryMode=0755",
             "/usr/sbin/sshd", "-D", "-e", "-f", "/etc/ssh/fleet-sshd.conf")
        pub = h.ok("cat", "/etc/ssh/fleet_host_ed25519_key.pub").split()
        wait_for(f"sshd on {h.name}", lambda: self.in_ns(self.controller_ns, ["bash", "-c", f"exec 3<>/dev/tcp/{h.address}/22"],
                                                         timeout=5).returncode == 0, timeout=30)
        return f"{h.address} {pub[0]} {pub[1]}\n{h.name} {pub[0]} {pub[1]}\n"

    # -- use ------------------------------------------------------------------------------------

    def in_ns(self, ns: str, argv: list[str], timeout: float = 600, env: dict | None = None,
              input: str | None = None) -> subprocess.CompletedProcess:
        """Runs `argv` in network namespace `ns` (ip netns exec); output captured as text."""
        return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=timeout,
                              env=env, input=input)

    def popen_in(self, ns: str, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", ns, *argv], **kwargs)

    def inventory(self, path: Path, host_vars: dict | None = None) -> Path:
        """An INI inventory of group modeld_hosts with each host's address and the SSH settings."""
        ssh = f"-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes"
        lines = ["[modeld_hosts]"]
        for h in self.hosts:
            lines.append(f"{h.name} ansible_host={h.address}")
        lines += ["", "[modeld_hosts:vars]", "ansible_user=root", f"ansible_ssh_private_key_file={self.key}",
                  f"ansible_ssh_common_args='{ssh}'", "ansible_python_interpreter=/usr/bin/python3"]
        path.write_text("\n".join(lines) + "\n")
        return path

    def ansible_env(self, collections: Path) -> dict:
        """The environment Ansible runs with: this collection, a config of its own, no colors."""
        cfg = self.dir / "ansible.cfg"
        cfg.write_text("[defaults]\nhost_key_checking = True\nforks = 20\nretry_files_enabled = False\n"
                       "interpreter_python = /usr/bin/python3\n[ssh_connection]\npipelining = True\n")
        # ssh's control sockets need a short path (108 bytes at most).
        self.control_dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-cp-"))
        return dict(os.environ, ANSIBLE_CONFIG=str(cfg), ANSIBLE_COLLECTIONS_PATH=str(collections),
                    ANSIBLE_NOCOLOR="1", HOME=str(self.dir), ANSIBLE_LOCAL_TEMP=str(self.dir / "ansible-tmp"),
                    ANSIBLE_SSH_CONTROL_PATH_DIR=str(self.control_dir))

    def ansible(self, argv: list[str], env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
        """ansible or ansible-playbook ARGV in the controller namespace."""
        return self.in_ns(self.controller_ns, argv, timeout=timeout, env=env)

    # -- teardown -------------------------------------------------------------------------------

    def stop(self) -> None:
        for h in reversed(self.hosts):
            try:
                h.systemd.stop()
            except Exception:  # noqa: BLE001 - tear the rest down anyway
                pass
        for ns in (self.cache_ns, self.hub_ns, self.controller_ns):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        for h in self.hosts:
            shutil.rmtree(self.dir / h.name, ignore_errors=True)
        self.hosts = []
        if getattr(self, "control_dir", None):
            shutil.rmtree(self.control_dir, ignore_errors=True)

    def __enter__(self) -> "Fleet":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
