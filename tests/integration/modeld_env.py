"""A whole modeld installation for tests and the demo, on this machine, talking only to loopback.

ModeldEnv puts together:
  * the bundled Hub (tests/fixtures/hub_server.py) serving generated checkpoints,
  * a real systemd booted in a private PID and mount namespace (nsystemd.NamespacedSystemd,
    exactly as ../shared/docs/real-systemd-in-tests.md says),
  * the project's units from systemd/, installed as runtime units inside that systemd, with a
    drop-in that points modeld.service at the built binary and a test configuration,
  * modeld running as that unit, and modelctl run from the host against its socket.

Models, state and the socket live in a temporary folder on the host's file system, which units
inside the namespace see too, so the test can compare files and talk to the socket directly.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE_DIR = Path(os.environ.get("MODELD_SOURCE_DIR", HERE.parent.parent)).resolve()
BUILD_DIR = Path(os.environ.get("MODELD_BUILD_DIR", SOURCE_DIR / "build")).resolve()
FIXTURES = SOURCE_DIR / "tests" / "fixtures"
PYTHON = "/usr/bin/python3"

sys.path.insert(0, str(HERE))
sys.path.insert(0, str(FIXTURES))

from nsystemd import NamespacedSystemd  # noqa: E402
from waiting import NotYet, wait_for  # noqa: E402,F401 - re-exported for tests
import make_checkpoint  # noqa: E402

# What a request to a model server that is starting, restarting or loading can fail with, for
# `wait_for(..., retry_on=SERVER_STARTING)`: a refused or reset connection, an error status
# (urllib's HTTPError is an OSError), a dropped answer (http.client.RemoteDisconnected).
SERVER_STARTING = (OSError, http.client.HTTPException)


class ModeldUnreachable(ConnectionError):
    """modelctl could not reach modeld (its exit status 3): the daemon is starting, restarting or
    down. A wait across a restart says so with `retry_on=(ModeldUnreachable,)`."""


def completion(port: int, model: str, prompt: str = "Hello", max_tokens: int = 4) -> str:
    """Asks the server on 127.0.0.1:`port` for a completion; returns its text (raises on errors)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps({"model": model, "prompt": prompt,
                                                  "max_tokens": max_tokens}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["choices"][0]["text"]


@contextlib.contextmanager
def small_disk(work: Path, size: int, name: str = "modeld-test-small"):
    """WORK/models as a tmpfs of `size` bytes (a disk that fills), unmounted afterwards; yields WORK.
    Mounted before the namespaced systemd boots, so modeld sees it too."""
    models = work / "models"
    models.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", name, str(models)], check=True)
    try:
        yield work
    finally:
        subprocess.run(["umount", "-l", str(models)], check=False)


@contextlib.contextmanager
def fuse_models(work: Path):
    """WORK/models as tests/fixtures/slow_fs.py (a FUSE file system mirroring WORK/models-backing:
    a disk that stalls or has bad sectors, steered through the folder WORK/slow-fs), run by the
    test on the host and mounted before the namespaced systemd boots, so modeld and the model
    servers see it too, and the test reads it at the same path; unmounted afterwards; yields WORK."""
    models, backing, control = work / "models", work / "models-backing", work / "slow-fs"
    for d in (models, backing, control):
        d.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([PYTHON, str(FIXTURES / "slow_fs.py"), str(backing), str(models), str(control)])
    try:
        def mounted() -> bool:
            assert proc.poll() is None, f"slow_fs.py exited with {proc.returncode}"
            return (control / "ready").exists()
        wait_for("the FUSE file system to be mounted", mounted, timeout=30)
        yield work
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(models)], check=False)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def write_control(path: Path, **faults) -> None:
    """Replaces the hub's --control settings at `path` (atomically: the hub never reads half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(faults))
    os.replace(tmp, path)


def free_bytes(path: Path) -> int:
    """Free bytes on the file system of `path` for an unprivileged writer, as modeld counts them."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openssl(*args: str) -> None:
    r = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {r.stderr.strip()}")


def make_ca(folder: Path, name: str = "modeld test CA") -> tuple[Path, Path]:
    """Creates a self-signed CA (RSA 2048, valid 2 days) in `folder`; returns (cert.pem, key.pem)."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "ca.pem", folder / "ca.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
             "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return cert, key


def make_leaf(ca: tuple[Path, Path], folder: Path, stem: str,
              sans: str = "DNS:localhost,IP:127.0.0.1") -> tuple[Path, Path]:
    """Creates a server certificate signed by `ca` for the subjectAltName list `sans`;
    returns (stem.pem, stem.key) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key, csr, ext = (folder / f"{stem}.pem", folder / f"{stem}.key", folder / f"{stem}.csr",
                           folder / f"{stem}.ext")
    ext.write_text(f"subjectAltName={sans}\nbasicConstraints=CA:FALSE\n"
                   "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
             "-subj", f"/CN={sans.split(',')[0].split(':', 1)[1]}")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return cert, key


def package(version: str | None = None) -> Path:
    """Runs scripts/package.sh on the test build; returns the .deb it wrote."""
    args = [str(SOURCE_DIR / "scripts" / "package.sh"), str(BUILD_DIR)] + ([version] if version else [])
    r = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"package.sh failed ({r.returncode}):\n{r.stderr[-4000:]}"
    return Path(r.stdout.strip().splitlines()[-1])


class Hub:
    """The bundled Hub fixture serving repositories from a folder."""

    def __init__(self, repos: Path, workdir: Path, extra_args: list[str] | None = None):
        self.repos = repos
        self.ready_file = workdir / "hub-ready.json"
        self.request_log = workdir / "hub-requests.jsonl"
        self.log = open(workdir / "hub.log", "wb")
        # A ready file left by an earlier hub in a reused folder names ports nobody listens on.
        self.ready_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [PYTHON, str(FIXTURES / "hub_server.py"), "--repos", str(repos), "--ready-file", str(self.ready_file),
             "--request-log", str(self.request_log), *(extra_args or [])],
            stdout=self.log, stderr=subprocess.STDOUT)
        ports = wait_for("the hub's ready file", self._ports, timeout=120)
        self.port, self.cdn_port = ports["hub_port"], ports["cdn_port"]
        self.cdn_host = ports.get("cdn_host", "127.0.0.1")  # --cdn-host, where Location points
        self.tls = "--tls-cert" in (extra_args or [])
        args = extra_args or []
        self.host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"  # both listeners
        self.endpoint = f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def _ports(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"hub exited with {self.proc.returncode}")
        if self.ready_file.exists():
            return json.loads(self.ready_file.read_text())
        return None

    def requests(self) -> list[dict]:
        if not self.request_log.exists():
            return []
        return [json.loads(line) for line in self.request_log.read_text().splitlines() if line.strip()]

    def stats(self) -> dict:
        """The hub's byte counter (GET /_fixture/stats): {"hub_body_bytes", "cdn_body_bytes",
        "by_path": {"ORG/NAME/PATH": bytes}, "requests"}."""
        # The test reads its own fixture: no need to verify the fixture's certificate here.
        ctx = ssl._create_unverified_context() if self.tls else None  # noqa: S323
        with urllib.request.urlopen(f"{self.endpoint}/_fixture/stats", timeout=10, context=ctx) as r:
            return json.loads(r.read())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def model_table(name: str, repo: str, port: int, *, load_seconds: float = 0.0, extra_serve: str = "",
                extra: str = "", serve_args: list[str] | None = None, stop_timeout: str = "30s",
                startup_timeout: str = "120s") -> str:
    """The TOML of one model served by the stand-in inference server (fake_vllm.py)."""
    command = [PYTHON, str(FIXTURES / "fake_vllm.py"), "serve", "{model_dir}", "--served-model-name",
               "{served_name}", "--port", "{port}", "--load-seconds", str(load_seconds), *(serve_args or [])]
    return f"""
[models.{name}]
repo = "{repo}"
revision = "main"
{extra}
[models.{name}.serve]
command = {json.dumps(command)}
port = {port}
startup_timeout = "{startup_timeout}"
stop_timeout = "{stop_timeout}"
{extra_serve}
"""


class ModelctlClient:
    """What both ways of running modeld share: the hub's repositories under `self.repos`, and
    modelctl against `self.socket` (`self.modelctl_bin`)."""

    repos: Path
    socket: Path
    modelctl_bin: Path

    def add_repo(self, repo: str, *, shards: int = 3, shard_size: int = 256 * 1024, seed: int = 0) -> Path:
        """Generates a checkpoint as repository `repo` (ORG/NAME) of the hub."""
        out = self.repos / repo
        make_checkpoint.make_checkpoint(str(out), shards, shard_size, seed)
        return out

    def modelctl(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.modelctl_bin), "--socket", str(self.socket), *args],
                              capture_output=True, text=True, timeout=timeout)

    def deploy_and_wait(self, model: str, expect_exit: int = 0) -> dict:
        """Runs `modelctl deploy MODEL --wait`, checks its exit code, and returns the deployment
        as the daemon reports it afterwards."""
        r = self.modelctl("deploy", model, "--wait")
        assert r.returncode == expect_exit, f"exit {r.returncode}, expected {expect_exit}:\n{r.stdout}{r.stderr}"
        return self.status()["deployment"]

    def status(self) -> dict:
        """`modelctl --json status`; raises ModeldUnreachable when modeld does not answer."""
        r = self.modelctl("--json", "status")
        if r.returncode == 3:
            raise ModeldUnreachable(r.stderr.strip())
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def api(self, method: str, path: str, timeout: float = 10,
            body: str | None = None) -> tuple[int, dict[str, str], str]:
        """One request to the daemon's socket without modelctl: (status, headers, body)."""
        conn = UnixHTTPConnection(str(self.socket), timeout)
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read().decode()
        finally:
            conn.close()

    def metrics(self) -> str:
        """GET /metrics on the socket, which must answer 200 in Prometheus' text format 0.0.4."""
        status, headers, body = self.api("GET", "/metrics")
        assert status == 200, (status, body)
        assert headers.get("Content-Type", "").startswith("text/plain; version=0.0.4"), headers
        return body


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix socket (the daemon's control socket)."""

    def __init__(self, path: str, timeout: float = 10):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


class ModeldEnv(ModelctlClient):
    """modeld under a namespaced systemd with the bundled hub; use as a context manager."""

    def __init__(self, workdir: Path | None = None, models: dict[str, dict] | None = None,
                 hub_args: list[str] | None = None, config_extra: str = "", keep: bool = False,
                 environment: dict[str, str] | None = None, control_group: str = "root",
                 journal_to_host: bool = False, disk_reserve: str = "0"):
        """`config_extra` goes into the [hub] table of the configuration; `environment` becomes
        Environment= lines of modeld.service's test drop-in (e.g. HTTPS_PROXY, NO_PROXY);
        `control_group` is [control] group (who besides root may call mutating routes);
        `journal_to_host` keeps the journal in the host's /var/log/journal (the demo) instead of
        one private to this run (tests); `disk_reserve` is [daemon] disk_reserve."""
        self.disk_reserve = disk_reserve
        self.journal_to_host = journal_to_host
        self.own_workdir = workdir is None
        self.control_group = control_group
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="modeld-test-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.repos = self.workdir / "repos"
        self.models_dir = self.workdir / "models"
        self.state_dir = self.workdir / "state"
        self.socket = self.workdir / "modeld.sock"
        self.config = self.workdir / "modeld.toml"
        self.models = models or {}
        self.hub_args = hub_args or []
        self.config_extra = config_extra
        self.environment = dict(environment or {})
        self.endpoint: str | None = None  # [hub] endpoint; None: the bundled hub's
        self.model_tables = ""
        self.keep = keep
        self.hub: Hub | None = None
        self.systemd: NamespacedSystemd | None = None
        self.modeld = BUILD_DIR / "modeld"
        self.modelctl_bin = BUILD_DIR / "modelctl"

    # -- set-up -------------------------------------------------------------------------------

    def write_config(self, model_tables: str):
        self.model_tables = model_tables
        self.config.write_text(f"""
[daemon]
models_dir = "{self.models_dir}"
state_dir = "{self.state_dir}"
socket = "{self.socket}"
unit_dir = "/run/systemd/system"
disk_reserve = "{self.disk_reserve}"

[control]
group = "{self.control_group}"

[hub]
endpoint = "{self.endpoint or self.hub.endpoint}"
parallel_files = 4
{self.config_extra}
{model_tables}
""")

    def boot(self, model_tables: str, check_config: bool = True):
        """Everything start() does but starting modeld.service: the hub, the configuration (with
        `check_config`, refused when `modeld --check-config` finds a problem), the namespaced
        systemd and the units. For tests that start modeld their own way, or expect it to fail."""
        self.repos.mkdir(parents=True, exist_ok=True)
        self.hub = Hub(self.repos, self.workdir, self.hub_args)
        self.write_config(model_tables)
        if check_config:
            check = subprocess.run([str(self.modeld), "--check-config", "--config", str(self.config)],
                                   capture_output=True, text=True)
            if check.returncode != 0:
                raise RuntimeError(f"test configuration is invalid:\n{check.stderr}")
        self.systemd = NamespacedSystemd(log_path=self.workdir / "systemd.log",
                                         private_journal=not self.journal_to_host)
        self.systemd.start()
        self.install_units()
        return self

    def start(self, model_tables: str):
        self.boot(model_tables)
        self.systemd.run(["systemctl", "start", "modeld.service"])
        wait_for("modeld's control socket", lambda: self.modelctl("status").returncode == 0, timeout=60)
        return self

    def install_units(self):
        """Installs systemd/*.service as runtime units, plus a drop-in pointing modeld at this build.

        The shipped sandbox stays on: the drop-in only adds this run's folder to ReadWritePaths=
        (models, state, socket; one entry, so adoption's hard links stay on one mount), turns
        PrivateTmp= off when that folder or the build lies under /tmp, and takes the "hf-token"
        credential from WORKDIR/credentials/hf-token instead of the host's /etc/modeld/hf-token
        (with the shipped unit's empty fallback when that file is absent)."""
        sd = self.systemd
        for unit in ("modeld.service", "modeld-serve@.service"):
            sd.run(["cp", str(SOURCE_DIR / "systemd" / unit), f"/run/systemd/system/{unit}"])
        dropin = self.workdir / "modeld-test.conf"
        extra_env = "".join(f'Environment="{k}={v}"\n' for k, v in self.environment.items())
        in_tmp = any(p == Path(t) or Path(t) in p.parents
                     for p in (self.workdir.resolve(), BUILD_DIR, SOURCE_DIR) for t in ("/tmp", "/var/tmp"))
        dropin.write_text(f"""[Service]
ExecStart=
ExecStart={self.modeld} --config {self.config}
ExecReload=
ExecReload={self.modeld} --check-config --config {self.config}
ExecReload=/bin/kill -HUP $MAINPID
Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
{extra_env}ReadWritePaths={self.workdir.resolve()}
{"PrivateTmp=no" if in_tmp else ""}
LoadCredential=
SetCredential=
LoadCredential=hf-token:{self.workdir.resolve()}/credentials/hf-token
SetCredential=hf-token:\\n
""")
        sd.run(["mkdir", "-p", "/run/systemd/system/modeld.service.d"])
        sd.run(["cp", str(dropin), "/run/systemd/system/modeld.service.d/50-test.conf"])
        sd.run(["systemctl", "daemon-reload"])

    def reconfigure(self, *, config_extra: str | None = None, environment: dict[str, str] | None = None,
                    endpoint: str | None = None) -> None:
        """Rewrites the configuration ([hub] extra lines, endpoint) and the drop-in's environment
        (None: unchanged), then restarts modeld and waits for its socket."""
        if config_extra is not None:
            self.config_extra = config_extra
        if environment is not None:
            self.environment = dict(environment)
        if endpoint is not None:
            self.endpoint = endpoint
        self.write_config(self.model_tables)
        self.install_units()
        self.systemd.run(["systemctl", "restart", "modeld.service"], check=True)
        wait_for("modeld's control socket after a restart", lambda: self.modelctl("status").returncode == 0,
                 timeout=60)

    def reboot(self) -> None:
        """Reboots the namespace: powers the namespaced systemd off (every unit stops as at a
        host's shutdown, modeld and the model services included; /run, the runtime units and
        drop-ins and the private journal go with it), boots a new one, installs the units again
        and starts modeld.service, as the host's boot would; waits for modeld's socket. Files
        under the work folder (models, state, configuration) stay. The new systemd's console
        output goes to systemd-boot-N.log; journal() then reads the new boot's journal only."""
        self.systemd.stop()
        self.boots = getattr(self, "boots", 1) + 1
        self.systemd = NamespacedSystemd(log_path=self.workdir / f"systemd-boot-{self.boots}.log",
                                         private_journal=not self.journal_to_host)
        self.systemd.start()
        self.install_units()
        self.systemd.run(["systemctl", "start", "modeld.service"], check=True)
        wait_for("modeld's control socket after the reboot", lambda: self.modelctl("status").returncode == 0,
                 timeout=60)

    # -- use ----------------------------------------------------------------------------------

    def journal(self, *match: str, unit: str | None = None) -> list[dict]:
        """Journal entries of this run's systemd (FIELD=value matches), oldest first."""
        return self.systemd.journal(unit=unit, matches=match)

    def unit_timestamp(self, unit: str, prop: str) -> int:
        """A monotonic timestamp property of a unit in microseconds, e.g.
        InactiveEnterTimestampMonotonic; systemd records these itself at each state change."""
        out = self.systemd.run(["systemctl", "show", "-p", prop, "--value", unit], check=True).stdout
        return int(out.strip() or 0)

    def main_pid(self, unit: str = "modeld.service") -> int:
        """The unit's main PID as the namespace sees it (0 when it is not running)."""
        out = self.systemd.run(["systemctl", "show", "-p", "MainPID", "--value", unit], check=True).stdout
        return int(out.strip() or 0)

    def kill_modeld(self, signal_name: str = "KILL") -> None:
        """Sends a signal to modeld's main process through the namespaced systemd."""
        self.systemd.run(["systemctl", "kill", "-s", signal_name, "--kill-who=main", "modeld.service"],
                         check=True)

    def unit_state(self, unit: str) -> str:
        return self.systemd.run(["systemctl", "show", "-p", "ActiveState", "--value", unit], check=False).stdout.strip()

    # -- tear-down ----------------------------------------------------------------------------

    def stop(self):
        try:
            if self.systemd:
                self.systemd.stop()
        finally:
            if self.hub:
                self.hub.stop()
            if self.own_workdir and not self.keep:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class ProcessModeld(ModelctlClient):
    """modeld run directly as a child of the test (no systemd: no NOTIFY_SOCKET, no D-Bus) with
    [daemon] service_manager = "process", the bundled hub, and its model servers as modeld's own
    children; use as a context manager. Its output (and, without journald, its servers') goes to
    WORKDIR/modeld.log."""

    def __init__(self, workdir: Path, hub_args: list[str] | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.repos = self.workdir / "repos"
        self.models_dir = self.workdir / "models"
        self.state_dir = self.workdir / "state"
        self.records = self.state_dir / "processes"
        self.socket = self.workdir / "modeld.sock"
        self.config = self.workdir / "modeld.toml"
        self.log_path = self.workdir / "modeld.log"
        self.hub_args = hub_args or []
        self.extra_environment: dict[str, str] = {}  # added to modeld's environment at each start_modeld()
        self.hub: Hub | None = None
        self.proc: subprocess.Popen | None = None
        self.modeld = BUILD_DIR / "modeld"
        self.modelctl_bin = BUILD_DIR / "modelctl"

    def write_config(self, model_tables: str, service_manager: str = "process") -> None:
        self.config.write_text(f"""
[daemon]
models_dir = "{self.models_dir}"
state_dir = "{self.state_dir}"
socket = "{self.socket}"
disk_reserve = "0"
service_manager = "{service_manager}"

[control]
group = "root"

[hub]
endpoint = "{self.hub.endpoint}"
parallel_files = 4
{model_tables}
""")

    def start(self, model_tables: str):
        self.repos.mkdir(parents=True, exist_ok=True)
        self.hub = Hub(self.repos, self.workdir, self.hub_args)
        self.write_config(model_tables)
        self.start_modeld()
        return self

    def start_modeld(self) -> None:
        """Starts modeld (again) and waits until its control socket answers."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
                            "JOURNAL_STREAM", "INVOCATION_ID", "HF_TOKEN")}
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        env.update(self.extra_environment)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([str(self.modeld), "--config", str(self.config)], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        log.close()

        def answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"modeld exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            return self.modelctl("status").returncode == 0

        wait_for("modeld's control socket", answers, timeout=60)

    def stop_modeld(self) -> int:
        """SIGTERM to modeld; returns its exit status (its servers keep running, by design)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def server_pid(self, model: str) -> int | None:
        """The PID (= process group) of model's server from modeld's record, None without one."""
        record = self.records / f"modeld-serve@{model}.service"
        try:
            return int(record.read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def stop(self):
        try:
            self.stop_modeld()
        finally:
            # The servers outlive modeld by design: end every group modeld recorded.
            if self.records.is_dir():
                for record in self.records.iterdir():
                    try:
                        os.killpg(int(record.read_text().split()[0]), signal.SIGKILL)
                    except (ValueError, IndexError, ProcessLookupError, PermissionError):
                        pass
            if self.hub:
                self.hub.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def process_group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes whose process group is `pgid`, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(entry))
    return out
