"""A private systemd, booted as PID 1 of its own PID and mount namespace, for integration tests.

Follows shared/docs/real-systemd-in-tests.md exactly; every part of the recipe is needed:
- /usr/lib/tmpfiles.d/tmp.conf is hidden by a bind mount of /dev/null, or the boot's
  `systemd-tmpfiles --remove --boot` empties the host's /tmp (the file system is the host's);
- a private tmpfs on /run keeps the inner systemd's sockets, runtime units and D-Bus apart;
- --unit=sysinit.target starts journald only, not every service the image has enabled.
Two additions the recipe does not have, both inside the namespace only: `mount --make-rshared /`
(systemd's LoadCredential= needs shared propagation, and PID 1 with $container set leaves it
private) and, unless the demo asks for the host's, a private tmpfs journal.
It is refused on a host whose PID 1 is systemd (shared cgroup hierarchy): `Unsupported` is raised.

Use:
    with NamespacedSystemd() as ns:
        ns.run(["systemctl", "start", "foo.service"], check=True)
        ns.write_file("/run/systemd/system/foo.service", "...")
        entries = ns.journal(unit="foo.service")
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

from waiting import poll

SYSTEMD = "/lib/systemd/systemd"

# The inner shell: the mounts each recipe step needs, then systemd as PID 1 (hence exec).
_BOOT_SCRIPT = (
    "mount --bind /dev/null /usr/lib/tmpfiles.d/tmp.conf && "
    "mount -t tmpfs tmpfs /run && "
    "{journal}"
    # Shared propagation inside this namespace only (its mounts have no peers outside after
    # unshare's --propagation private): LoadCredential= mounts a credentials folder in a helper's
    # namespace and moves it into PID 1's, which needs it; a PID 1 that believes it runs in a
    # container does not set it up itself.
    "mount --make-rshared / && "
    f"exec {SYSTEMD} --system --unit=sysinit.target --log-target=console"
)
# With a private journal, a tmpfs over /var/log/journal: the inner journald's files are its own,
# so a query can never see another run's entries (the host's journal and every namespaced boot
# share the machine and boot IDs, and another test may be running at the same time).
_PRIVATE_JOURNAL = "if [ -d /var/log/journal ]; then mount -t tmpfs tmpfs /var/log/journal; fi && "


# The hierarchies a namespaced systemd of this machine's systemd (252, hybrid cgroups) tracks its
# units in: the named v1 hierarchy and the unified one.
CGROUP_ROOTS = ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified")
# Inside a cgroup namespace: a writable /sys/fs/cgroup with both hierarchies mounted anew, each
# rooted at the namespace's own control group.
_CGROUP_MOUNTS = ("mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd /sys/fs/cgroup/unified && "
                  "mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd && "
                  "mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified")


def remove_cgroup(cg: Path) -> None:
    """Removes control group `cg` and what is left below it, deepest first (a group that still
    holds a process stays)."""
    for d in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [cg]:
        try:
            d.rmdir()
        except OSError:
            pass


class Unsupported(Exception):
    """This host cannot run a namespaced systemd safely (not root, or PID 1 is systemd)."""


class BootFailed(Exception):
    """The namespaced systemd did not come up; the message holds the tail of its console log."""


def unsupported_reason() -> str | None:
    """Why a namespaced systemd cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "a namespaced systemd needs root"
    try:
        if Path("/proc/1/comm").read_text().strip() == "systemd":
            return ("PID 1 is systemd: a namespaced systemd would share its cgroup hierarchy; "
                    "run these tests against the host's systemd instead")
    except OSError as e:
        return f"cannot read /proc/1/comm: {e}"
    for tool in (SYSTEMD, "/usr/bin/unshare", "/usr/bin/nsenter", "/usr/bin/setsid"):
        if not os.access(tool, os.X_OK):
            return f"{tool} is missing"
    return None


class NamespacedSystemd:
    """One private systemd: start() boots it and starts the system bus, stop() powers it off."""

    def __init__(self, log_path: str | os.PathLike | None = None, boot_timeout: float = 60.0,
                 stop_timeout: float = 60.0, keep_log: bool = False, private_journal: bool = True,
                 pre_boot: Iterable[str] = (), network: bool = False):
        """The systemd's console output goes to `log_path`, which is kept; without one, to a
        temporary file removed by stop() unless `keep_log`. Errors quote the log's tail. With
        `private_journal` (tests) the journal lives and dies with this systemd; without it (the
        demo) it is flushed into the host's /var/log/journal, where the operator can read it later.
        `pre_boot`: shell commands run in the new mount namespace before the recipe's own mounts
        (e.g. overlay mounts over /usr, /etc and /var for a package install); all must succeed.
        `network`: a network and UTS namespace of its own too (a simulated host: only loopback
        until the test gives it a link; run() enters them), and a cgroup namespace rooted at a
        control group of its own (CGROUP_ROOTS/NAME), so that several such systemds on one
        machine never share a unit's control group (same unit names on every host)."""
        self.network = network
        self.cgroups = [Path(r) / f"nsystemd-{os.getpid()}-{id(self):x}" for r in CGROUP_ROOTS] if network else []
        self.private_journal = private_journal
        self.pre_boot = list(pre_boot)
        self.boot_timeout = boot_timeout
        self.stop_timeout = stop_timeout
        self.keep_log = keep_log or log_path is not None
        self.pid: int | None = None  # the inner systemd's PID as the host sees it
        self.started_at: float | None = None  # wall-clock time of start(), for journal()
        self._proc: subprocess.Popen | None = None  # the unshare process
        if log_path is not None:
            self.log_path = Path(log_path)
            self._log = open(self.log_path, "wb")
        else:
            self._log = tempfile.NamedTemporaryFile(prefix="nsystemd-", suffix=".log", delete=False)
            self.log_path = Path(self._log.name)

    # -- lifetime -------------------------------------------------------------------------------

    def start(self) -> "NamespacedSystemd":
        """Boots the systemd, waits until it is running, and starts dbus.socket.

        Raises Unsupported on a host where this is unsafe, BootFailed when it does not come up
        within boot_timeout (the systemd is stopped again first)."""
        reason = unsupported_reason()
        if reason:
            raise Unsupported(reason)
        self.started_at = time.time()
        env = dict(os.environ, container="other")
        wrap: list[str] = []
        if self.cgroups:
            # Into a control group of its own first (per hierarchy), then a cgroup namespace
            # rooted there, whose hierarchies are mounted anew inside: the systemd sees and manages
            # only its own subtree.
            for cg in self.cgroups:
                cg.mkdir(exist_ok=True)
            wrap = ["sh", "-c", 'for g; do [ "$g" = -- ] && break; echo $$ > "$g/cgroup.procs"; shift; done; shift; exec "$@"',
                    "sh", *[str(c) for c in self.cgroups], "--"]
            self.pre_boot = [_CGROUP_MOUNTS] + self.pre_boot
        # Popen's child is not a process group leader, so setsid(1) makes the new session
        # without forking and self._proc.pid is unshare's PID.
        self._proc = subprocess.Popen(
            [*wrap, "setsid", "unshare", "--pid", "--mount", "--fork", "--mount-proc",
             *(["--net", "--uts", "--cgroup"] if self.network else []),
             "--propagation", "private", "sh", "-c",
             "".join(f"{step} && " for step in self.pre_boot)
             + _BOOT_SCRIPT.format(journal=_PRIVATE_JOURNAL if self.private_journal else "")],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            self.pid = poll(self._find_systemd, 10.0, 0.02)
            if not self.pid:
                raise BootFailed(f"systemd did not start under unshare\n{self.console_log()}")
            state = poll(self._booted, self.boot_timeout)
            if not state:
                raise BootFailed(f"systemd did not reach running or degraded within "
                                 f"{self.boot_timeout:.0f} s\n{self.console_log()}")
            self.run(["systemctl", "start", "dbus.socket"], check=True)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Powers the systemd off and waits for the unshare process to end; SIGKILLs that
        systemd (only it, by PID) if it does not end within stop_timeout."""
        if self._proc is None:
            return
        if self._proc.poll() is None and self.pid:
            # The reply may never come: the bus goes away as the system powers off.
            subprocess.run(self._nsenter(["systemctl", "poweroff", "--no-block"]),
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        try:
            self._proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            if self.pid:
                os.kill(self.pid, 9)  # PID 1 of the namespace: the kernel ends all of it
            self._proc.wait(timeout=30)
        self._proc = None
        for cg in self.cgroups:
            remove_cgroup(cg)
        self._log.close()
        if not self.keep_log:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> "NamespacedSystemd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- use ------------------------------------------------------------------------------------

    def run(self, cmd: Iterable[str], check: bool = False, timeout: float = 120,
            input: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
        """Runs `cmd` inside the namespaces (nsenter -t PID -p -m); text output captured."""
        proc = subprocess.run(self._nsenter(list(cmd)), input=input, capture_output=True,
                              text=True, timeout=timeout, env=env,
                              stdin=None if input is not None else subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        return proc

    def write_file(self, path: str, content: str) -> None:
        """Writes `content` to `path` as seen inside the namespace (e.g. under its private /run)."""
        self.run(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path],
                 input=content, check=True)

    def journal(self, unit: str | None = None, matches: Iterable[str] = ()) -> list[dict]:
        """The inner journal's entries since start() (journalctl -o json), for `unit` and
        FIELD=value matches.

        Only entries since start(): without a private journal the inner journald flushes into the
        host's /var/log/journal, and every namespaced boot shares the host's machine and boot
        IDs, so earlier runs' entries are there too."""
        cmd = ["journalctl", "--no-pager", "-o", "json", f"--since=@{self.started_at:.6f}"]
        if unit:
            cmd += ["-u", unit]
        cmd += list(matches)
        out = self.run(cmd, check=True).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def wait_journal(self, predicate: Callable[[dict], bool], timeout: float = 20.0,
                     unit: str | None = None, matches: Iterable[str] = ()) -> dict | None:
        """The first journal entry satisfying `predicate`, waiting up to `timeout` seconds for
        journald to store it; None when none did."""
        matches = list(matches)

        def find():
            return next((e for e in self.journal(unit, matches) if predicate(e)), None)

        return poll(find, timeout, 0.2)

    def console_log(self, tail: int = 4000) -> str:
        """The last `tail` characters of the systemd's console output."""
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    # -- internals ------------------------------------------------------------------------------

    def _nsenter(self, cmd: list[str]) -> list[str]:
        return ["nsenter", "-t", str(self.pid), "-p", "-m", *(["-n", "-u"] if self.network else []), *cmd]

    def _find_systemd(self) -> int | None:
        """unshare's child once it has exec'd systemd."""
        if self._proc.poll() is not None:
            raise BootFailed(f"unshare exited with {self._proc.returncode}\n{self.console_log()}")
        try:
            children = Path(f"/proc/{self._proc.pid}/task/{self._proc.pid}/children").read_text().split()
            for child in children:
                if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                    return int(child)
        except OSError:
            pass
        return None

    def _booted(self) -> str | None:
        if self._proc.poll() is not None:
            raise BootFailed(f"systemd exited with {self._proc.returncode}\n{self.console_log()}")
        # Right after the fork this fails with "Failed to connect to bus": poll it.
        out = self.run(["systemctl", "is-system-running"], timeout=30).stdout.strip()
        return out if out in ("running", "degraded") else None


class OverlaySystemd(NamespacedSystemd):
    """A NamespacedSystemd whose `overlaid` folders (default /usr, /etc and /var) are overlayfs
    mounts over the host's, with their upper layers under `layers` (made before systemd boots, in
    its mount namespace): what dpkg or the test writes there stays in `layers`, the host's folders
    stay as they were."""

    def __init__(self, layers: Path, overlaid: Iterable[str] = ("usr", "etc", "var"), **kwargs):
        super().__init__(**kwargs)
        self.layers = layers
        self.overlaid = tuple(overlaid)

    def start(self) -> "OverlaySystemd":
        steps = []
        for d in self.overlaid:
            upper, work = shlex.quote(str(self.layers / "upper" / d)), shlex.quote(str(self.layers / "work" / d))
            steps.append(f"mkdir -p {upper} {work} && mount -t overlay overlay "
                         f"-o lowerdir=/{d},upperdir={upper},workdir={work} /{d}")
        self.pre_boot = steps + self.pre_boot
        return super().start()

