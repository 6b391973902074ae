"""End to end, /metrics over TCP ([metrics] listen) against clients that hold connections without
asking (issue 12, item 4): connections that send a request line and stop, reopened whenever
modeld closes them, from the scraper's own address and from another one. A scrape must always
get through, one address must hold at most metrics.per_address_connections, and modeld must say
so in the journal, at most one line per 10 s."""

from __future__ import annotations

import math
import select
import socket
import threading
import time
import urllib.request

import pytest

from modeld_env import ModeldEnv, free_port, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

REQUEST_LINE = b"GET /metrics HTTP/1.1\r\n"  # and then nothing: the request never ends


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = ModeldEnv(workdir=tmp_path_factory.mktemp("metrics-limits"))
    e.metrics_port = free_port()
    # [metrics] follows the [hub] lines config_extra is written into. The limits are the defaults.
    e.config_extra = f'\n[metrics]\nlisten = "127.0.0.1:{e.metrics_port}"\n'
    try:
        e.start("")
        yield e
    finally:
        e.stop()


class Staller:
    """Keeps `count` connections from `source` to 127.0.0.1:`port` that have sent a request line
    and nothing more, opening a new one whenever modeld closes one (at most `max_opens` in all),
    on a thread of its own until stop()."""

    def __init__(self, port: int, source: str, count: int, max_opens: int = 400):
        self.port, self.source, self.count, self.max_opens = port, source, count, max_opens
        self.opened = 0
        self.closed_by_modeld = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        for _ in range(self.count):
            self._socks.append(self._open())
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=30)
        for s in self._socks:
            s.close()

    def _open(self) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((self.source, 0))
        s.settimeout(10)
        s.connect(("127.0.0.1", self.port))
        s.sendall(REQUEST_LINE)
        self.opened += 1
        return s

    def _run(self) -> None:
        # select()'s timeout is how often the stop flag is looked at, not a wait for anything.
        while not self._stop.is_set():
            readable, _, _ = select.select(self._socks, [], [], 0.1)
            for s in readable:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if data:
                    self.failures.append(f"modeld answered a request that never ended: {data[:80]!r}")
                    continue
                self.closed_by_modeld += 1
                self._socks.remove(s)
                s.close()
                if self.opened < self.max_opens:
                    try:
                        self._socks.append(self._open())
                    except OSError as e:
                        self.failures.append(f"connect: {e}")


def scrape(env, source: str = "127.0.0.1") -> str:
    """GET /metrics over TCP from `source`, which must answer 200 with the exposition."""
    with socket.create_connection(("127.0.0.1", env.metrics_port), timeout=10, source_address=(source, 0)) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n"), f"scrape from {source} answered: {data[:300]!r}"
    assert b"modeld_up 1" in body, body[:300]
    return body.decode()


def metrics_lines(env, since: float) -> list[str]:
    """modeld's journal lines about its metrics listener's connections since `since` (time.time())."""
    out = []
    for e in env.journal("SYSLOG_IDENTIFIER=modeld"):
        if int(e["__REALTIME_TIMESTAMP"]) < since * 1e6:
            continue
        message = e.get("MESSAGE", "")
        if isinstance(message, str) and message.startswith(f"metrics on 127.0.0.1:{env.metrics_port}:"):
            out.append(message)
    return out


def test_stalled_connections_from_the_scrapers_address_do_not_keep_scrapes_out(env):
    # The attack as found: 16 connections (the old limit) that send a request line and stop,
    # reopened as soon as they are closed; every scrape was closed unanswered.
    since = time.time()
    with Staller(env.metrics_port, "127.0.0.1", 16) as attacker:
        for _ in range(5):
            scrape(env)
        wait_for("modeld to close stalled connections", lambda: attacker.closed_by_modeld >= 12, timeout=60)
        assert not attacker.failures, attacker.failures
    line = wait_for("a journal line about the closed connections", lambda: metrics_lines(env, since), timeout=30)[0]
    assert "closed a connection from 127.0.0.1 that had waited" in line, line
    assert "metrics.per_address_connections" in line, line
    # Rate-limited: one line per 10 s at most, however many connections were closed.
    elapsed = time.time() - since
    lines = metrics_lines(env, since)
    assert len(lines) <= 1 + math.ceil(elapsed / 10), (elapsed, attacker.closed_by_modeld, lines)
    assert attacker.closed_by_modeld > len(lines)
    print(f"\n{attacker.closed_by_modeld} connections closed by modeld in {elapsed:.1f} s, "
          f"{len(lines)} journal line(s): {lines[0]}")


def test_one_address_holds_at_most_its_share_and_others_are_served(env):
    env.config_extra = (f'\n[metrics]\nlisten = "127.0.0.1:{env.metrics_port}"\n'
                        "max_connections = 8\nper_address_connections = 2\n")
    env.reconfigure()
    since = time.time()
    with Staller(env.metrics_port, "127.0.0.2", 10, max_opens=10) as one, \
            Staller(env.metrics_port, "127.0.0.3", 2, max_opens=2) as other:
        # 127.0.0.2 opened 10 and may keep 2: modeld closes the 8 that waited longest.
        wait_for("modeld to close 127.0.0.2's connections beyond 2",
                 lambda: one.closed_by_modeld >= 8, timeout=60)
        for source in ("127.0.0.1", "127.0.0.4", "127.0.0.2"):
            scrape(env, source)
        # The other address's two were never touched: the room came from 127.0.0.2's own.
        assert other.closed_by_modeld == 0
        assert not one.failures and not other.failures, one.failures + other.failures
    line = wait_for("a journal line naming 127.0.0.2", lambda: metrics_lines(env, since), timeout=30)[0]
    assert "from 127.0.0.2" in line and "127.0.0.2 has 2 connections open" in line, line
    print(f"\n{line}")
