"""The site cache of config/site-cache/ (nginx) for tests, run as its own nginx instance.

SiteCache renders the shipped files into a work folder, changing only the lines a site edits in
site.conf (addresses, ports, certificates, the cache's disk and logs, the Hub's address and CA)
and the paths of nginx.conf: everything else runs exactly as shipped. nginx runs in the
foreground of its master process (`daemon off`), inside `ip netns exec NETNS` when a network
namespace is given.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import signal
import socket
import subprocess
from pathlib import Path

from modeld_env import SOURCE_DIR, make_ca, make_leaf, wait_for

SHIPPED = SOURCE_DIR / "config" / "site-cache"
NGINX = "/usr/sbin/nginx"

# Variants for negative controls, each with one mechanism of the shipped front server off:
# {file: ((shipped text, replacement), ...)} (SiteCache's `edits`).
LOCK_OFF = {"modeld-hub-front.conf": (("proxy_cache_lock on;\n    proxy_cache_lock_timeout",
                                       "proxy_cache_lock off;\n    proxy_cache_lock_timeout"),)}
NO_SLICES = {"modeld-hub-front.conf": (("    slice 16m;\n", ""),)}


def make_tls(folder: Path, names_and_ips) -> tuple[Path, Path, Path]:
    """A test CA and one server certificate; returns (ca.pem, server.pem, server.key).
    `names_and_ips`: a subjectAltName string ("IP:127.0.0.4,DNS:cache") or an iterable of names
    and addresses (["127.0.0.4", "cache"]); an address is put in both as IP and as DNS entry,
    since nginx checks an upstream's certificate by DNS names only."""
    if isinstance(names_and_ips, str):
        sans = names_and_ips
    else:
        entries = []
        for n in names_and_ips:
            entries += [f"IP:{n}", f"DNS:{n}"] if _is_address(n) else [f"DNS:{n}"]
        sans = ",".join(entries)
    ca = make_ca(folder)
    cert, key = make_leaf(ca, folder, "server", sans)
    return ca[0], cert, key


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def _sub(text: str, old: str, new: str, where: str) -> str:
    """Replaces the one shipped line part `old`; a shipped file that changed fails loudly."""
    if text.count(old) < 1:
        raise AssertionError(f"{where}: the shipped text {old!r} is gone: update tests/integration/site_cache.py")
    return text.replace(old, new)


class SiteCache:
    """nginx with the shipped site cache configuration, for the test's own addresses.

    hub_url: the Hub as scheme://host[:port], no path (may be set until start()); the front
    server listens on listen_host:listen_port with cert/key; upstream_ca: the CA trusted for the
    Hub and its CDN (default: the system's); netns: run nginx in that network namespace;
    allow: the addresses allowed to read the cache (site.conf's allow lines); edits: changes to
    the shipped modeld-hub-*.conf files, for a variant (LOCK_OFF, NO_SLICES)."""

    def __init__(self, workdir: Path, hub_url: str, listen_host: str, listen_port: int,
                 cert: Path, key: Path, upstream_ca: Path | None = None, netns: str | None = None,
                 inner_port: int | None = None, allow: tuple[str, ...] = ("127.0.0.0/8",),
                 edits: dict[str, tuple[tuple[str, str], ...]] | None = None):
        self.dir = Path(workdir)
        self.hub_url, self.host, self.port = hub_url, listen_host, listen_port
        self.cert, self.key, self.upstream_ca, self.netns = cert, key, upstream_ca, netns
        self.inner = f"{listen_host if listen_host.startswith('127.') else '127.0.0.1'}:{inner_port or 0}"
        self.allow = allow
        self.edits = edits or {}
        self.logs = self.dir / "logs"
        self.upstream_log = self.logs / "modeld-hub-upstream.log"
        self.access_log = self.logs / "modeld-hub-access.log"
        self.error_log = self.logs / "modeld-hub-error.log"
        self.url = f"https://{listen_host}:{listen_port}"
        self.proc: subprocess.Popen | None = None

    def render(self) -> Path:
        """Writes the configuration into the work folder; returns nginx.conf's path."""
        conf = self.dir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.dir / "cache").mkdir(exist_ok=True)
        for name in ("modeld-hub-cache.conf", "modeld-hub-front.conf", "modeld-hub-inner.conf"):
            text = (SHIPPED / name).read_text()
            for old, new in self.edits.get(name, ()):
                text = _sub(text, old, new, name)
            (conf / name).write_text(text)
        if self.inner.endswith(":0"):
            self.inner = self.inner[:-1] + str(_free_port(self.inner.split(":")[0]))
        (conf / "site.conf").write_text(self._site())
        top = (SHIPPED / "nginx.conf").read_text()
        for old, new in (("user www-data;", "user root;"),
                         ("pid /run/nginx-modeld-cache.pid;", f"pid {self.dir / 'nginx.pid'};"),
                         ("/var/log/nginx/modeld-hub-error.log", str(self.error_log))):
            top = _sub(top, old, new, "nginx.conf")
        (conf / "nginx.conf").write_text(top)
        return conf / "nginx.conf"

    def _site(self) -> str:
        site = (SHIPPED / "site.conf").read_text()
        allow = "".join(f"allow {a};\n    " for a in self.allow)
        for old, new in (
                ("/var/cache/nginx/modeld-hub", str(self.dir / "cache")),
                ('default "https://huggingface.co";', f'default "{self.hub_url}";'),
                ("server 127.0.0.1:8079;", f"server {self.inner};"),
                ("listen 127.0.0.1:8079;", f"listen {self.inner};"),
                ("/var/log/nginx/", f"{self.logs}/"),
                ("proxy_ssl_trusted_certificate /etc/ssl/certs/ca-certificates.crt;",
                 f"proxy_ssl_trusted_certificate {self.upstream_ca or '/etc/ssl/certs/ca-certificates.crt'};"),
                ("listen 443 ssl;", f"listen {self.host}:{self.port} ssl;"),
                ("/etc/modeld-cache/tls/cache.pem", str(self.cert)),
                ("/etc/modeld-cache/tls/cache.key", str(self.key)),
                ("allow 10.0.0.0/8;\n    ", allow)):
            site = _sub(site, old, new, "site.conf")
        return site

    def _argv(self, *extra: str) -> list[str]:
        argv = [NGINX, "-p", str(self.dir), "-c", str(self.dir / "conf" / "nginx.conf"),
                "-e", str(self.error_log), *extra]
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else argv

    def check(self) -> subprocess.CompletedProcess:
        """`nginx -t` of the rendered configuration."""
        self.render()
        return subprocess.run(self._argv("-t"), capture_output=True, text=True, timeout=60)

    def start(self) -> "SiteCache":
        """Renders, starts nginx and waits until the front server accepts connections."""
        self.render()
        self.proc = subprocess.Popen(self._argv("-g", "daemon off;"), stdout=subprocess.DEVNULL,
                                     stderr=open(self.dir / "nginx.out", "ab"))
        wait_for("the site cache's port", self._listening, timeout=30)
        return self

    def _listening(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"nginx exited with {self.proc.returncode}: {self._tail()}")
        if self.netns:
            r = subprocess.run(["ip", "netns", "exec", self.netns, "ss", "-Htln", f"sport = :{self.port}"],
                               capture_output=True, text=True)
            return bool(r.stdout.strip())
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def _tail(self) -> str:
        return self.error_log.read_text()[-2000:] if self.error_log.exists() else ""

    def stop(self) -> None:
        """Stops nginx at once (SIGTERM: fast shutdown, answers in flight are cut)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def entry(self, key: str) -> list[Path]:
        """The files on disk for cache key `key` (the answer, or a temporary file of one being
        written): nginx names them by the key's MD5, in folders of levels=1:2."""
        md5 = hashlib.md5(key.encode()).hexdigest()  # noqa: S324 (nginx's naming, not security)
        folder = self.dir / "cache" / md5[-1] / md5[-3:-1]
        return sorted(folder.glob(f"{md5}*")) if folder.is_dir() else []

    def stored(self, key: str) -> tuple[dict[str, str], bytes] | None:
        """The answer stored under cache key `key`: (its header fields, lower-case names; its
        body), as nginx wrote it after its own binary header and the "KEY: ..." line; None when
        nothing (or only a temporary file) is stored."""
        for f in self.entry(key):
            data = f.read_bytes()
            mark = b"\nKEY: " + key.encode() + b"\n"
            at = data.find(mark)
            if "." in f.name or at < 0:
                continue  # a temporary file of an answer being written
            head, _, body = data[at + len(mark):].partition(b"\r\n\r\n")
            fields = {}
            for line in head.decode("latin-1").split("\r\n")[1:]:
                name, _, value = line.partition(":")
                fields[name.strip().lower()] = value.strip()
            return fields, body
        return None

    def upstream(self) -> list[dict]:
        """The upstream log: one object per fetch from the Hub or its CDN."""
        if not self.upstream_log.exists():
            return []
        return [json.loads(line) for line in self.upstream_log.read_text().splitlines() if line.strip()]

    def access(self) -> list[dict]:
        """The front server's access log: one object per answer to a host."""
        if not self.access_log.exists():
            return []
        return [json.loads(line) for line in self.access_log.read_text().splitlines() if line.strip()]

    def upstream_bytes(self) -> int:
        """Body bytes fetched from upstream so far (the sum of the upstream log's body_bytes)."""
        return sum(int(e["body_bytes"]) for e in self.upstream())

    def __enter__(self) -> "SiteCache":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
