"""End to end, following deployments as they run: a raw Server-Sent Events client on the control
socket (download and warming progress), systemd's status text while warming, `modelctl deploy
--wait` and its exit codes, `modelctl watch` (plain lines, NDJSON, a terminal) until modeld goes
away, and the bash completion of modelctl with the real daemon."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path

import pytest

from modeld_env import BUILD_DIR, SOURCE_DIR, ModeldEnv, free_port, model_table, wait_for
from nsystemd import unsupported_reason
from page_cache import drop, ext4_models, no_readahead, resident_total, wait_resident

PHASES = ["planning", "freeing_disk", "downloading", "verifying", "warming", "stopping_old", "launching",
          "health_checking", "benchmarking"]
COMPLETION = SOURCE_DIR / "packaging" / "bash-completion" / "modelctl"
MODELCTL = str(BUILD_DIR / "modelctl")

needs_systemd = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

# Each file body at most this many bytes/s: a 400 kB shard takes about 3 s, long enough for
# several progress events (the fetch engine reports every 500 ms) and for a watcher to see them.
THROTTLE = 150_000
MiB = 1 << 20


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    # models_dir on an ext4 loop image: warming has pages to read there (on a tmpfs every page
    # is resident and warming ends before anyone sees it).
    with ext4_models(tmp_path_factory.mktemp("follow"), 64 * MiB) as work:
        control = work / "hub-control.json"
        control.write_text("{}")
        e = ModeldEnv(workdir=work, hub_args=["--control", str(control)])
        e.hub_control = control
        fresh = ["base", "streamed", "waited", "watched", "shown", "drawn", "cached"]
        for seed, name in enumerate(fresh, start=40):
            e.add_repo(f"acme/{name}", shards=3, shard_size=400_000, seed=seed)
        # The index names a shard the repository lacks: the plan fails (state failed, exit 1).
        holey = e.add_repo("acme/holey", shards=3, shard_size=100_000, seed=50)
        (holey / "model-00002-of-00003.safetensors").unlink()
        e.add_repo("acme/broken", shards=1, shard_size=100_000, seed=51)
        names = fresh + ["holey", "broken"]
        e.ports = {n: free_port() for n in names}
        tables = "".join(model_table(n, f"acme/{n}", e.ports[n]) for n in fresh + ["holey"])
        # Starts, then exits 1 at once: rolled back to the model that served before.
        tables += model_table("broken", "acme/broken", e.ports["broken"], serve_args=["--exit-after", "0"])
        try:
            e.start(tables)
            e.deploy_and_wait("base")
            yield e
        finally:
            e.stop()


def throttled(env):
    """Context: the hub sends file bodies slowly until the block ends."""
    class Throttled:
        def __enter__(self):
            env.hub_control.write_text(json.dumps({"throttle": THROTTLE}))

        def __exit__(self, *exc):
            env.hub_control.write_text("{}")
    return Throttled()


class SseClient:
    """GET /v1/events over the Unix socket, parsed by hand as any client would: the head, then
    events separated by blank lines, "event:" and "data:" fields, ':' comments skipped."""

    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(path))
        self.sock.sendall(b"GET /v1/events HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n")
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        self.head = head.decode()

    def _read(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("modeld closed the event stream")
        self.buffer += chunk

    def next_event(self, deadline: float) -> tuple[str, dict]:
        while True:
            if b"\n\n" in self.buffer:
                block, self.buffer = self.buffer.split(b"\n\n", 1)
                kind, data = "message", []
                for line in block.decode().split("\n"):
                    if not line or line.startswith(":"):
                        continue
                    field, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if field == "event":
                        kind = value
                    elif field == "data":
                        data.append(value)
                if data:
                    return kind, json.loads("\n".join(data))
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no complete event before the deadline")
            self.sock.settimeout(left)
            self._read()

    def close(self):
        self.sock.close()


def start_deployment(env, model: str) -> str:
    r = env.modelctl("--json", "deploy", model)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)["id"]


def api_get(env, target: str) -> tuple[int, dict]:
    """GET `target` from the control API over the Unix socket: (status, JSON body)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(env.socket))
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def text_of(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


# -- the raw event stream -------------------------------------------------------------------------

@needs_systemd
def test_a_raw_sse_client_follows_one_deployment_from_start_to_its_terminal_event(env):
    stream = SseClient(env.socket)
    try:
        assert stream.head.startswith("HTTP/1.1 200")
        assert "content-type: text/event-stream" in stream.head.lower()
        with throttled(env):
            dep_id = start_deployment(env, "streamed")
            events: list[tuple[str, dict]] = []
            deadline = time.monotonic() + 120
            while True:
                kind, data = stream.next_event(deadline)
                if data.get("id") != dep_id:
                    continue
                events.append((kind, data))
                if kind == "state" and data["state"] != "running":
                    break
    finally:
        stream.close()

    assert events
    assert all(d["model"] == "streamed" for _, d in events)
    phases = [d["phase"] for k, d in events if k == "phase"]
    assert phases == PHASES, phases

    # Progress arrives while downloading, each event carrying at least the bytes of the one
    # before, and the bytes grow from the first to the last. (Warming's progress events carry
    # "warm" besides them and come in its own phase.)
    download = [i for i, (k, d) in enumerate(events) if k == "phase"]
    start, end = download[PHASES.index("downloading")], download[PHASES.index("verifying")]
    downloading = [(i, d["progress"]) for i, (k, d) in enumerate(events) if k == "progress" and "warm" not in d]
    assert len(downloading) >= 3, f"only {len(downloading)} progress events"
    assert all(start < i < end for i, _ in downloading), downloading
    progress = [p for _, p in downloading]
    # Warming reports its own progress, in its phase, before the old model is stopped.
    warming, stopping = download[PHASES.index("warming")], download[PHASES.index("stopping_old")]
    warm = [(i, d) for i, (k, d) in enumerate(events) if k == "progress" and "warm" in d]
    assert warm, "no progress event while warming"
    assert all(warming < i < stopping and d["phase"] == "warming" for i, d in warm), warm
    assert all(d["warm"]["bytes_total"] > 0 for _, d in warm), warm
    warmed = [d["warm"]["bytes_warmed"] for _, d in warm]
    assert warmed == sorted(warmed), warmed
    done = [p["bytes_done"] for p in progress]
    assert done == sorted(done), done
    assert done[0] < done[-1] == progress[-1]["bytes_total"], done
    assert progress[-1]["files_done"] == progress[-1]["files_total"] > 0

    # The stream's last event of the deployment is its terminal state, as the API records it.
    kind, last = events[-1]
    assert kind == "state"
    status, recorded = api_get(env, f"/v1/deployments/{dep_id}")
    assert status == 200 and recorded["id"] == dep_id
    assert (last["state"], last["phase"]) == (recorded["state"], recorded["phase"]) == ("succeeded", "benchmarking")
    assert last["error"] is None and recorded["error"] is None


# -- the STATUS= line while warming --------------------------------------------------------------

def format_bytes(n: int) -> str:
    """modeld's way of writing a size (util::format_bytes): decimal units, 3 significant digits."""
    names = ["B", "kB", "MB", "GB", "TB", "PB"]
    v, i = float(n), 0
    while v >= 1000 and i < len(names) - 1:
        v, i = v / 1000, i + 1
    if i == 0:
        return f"{n} B"
    return f"{v:.0f} {names[i]}" if v >= 99.95 else f"{v:.1f} {names[i]}"


def status_text(env) -> str:
    return env.systemd.run(["systemctl", "show", "-p", "StatusText", "--value", "modeld.service"],
                           check=True).stdout.strip()


def revision_files(env, model: str, commit: str) -> list[Path]:
    """The revision's files, what warming reads (modeld's own .modeld/ folder in it aside)."""
    root = env.models_dir / ".store" / model / commit
    return sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] != ".modeld")


# STATUS= is rewritten on warming's progress (every 250 ms) at most once a second: what it says may
# be that much older than the page cache; the rest of STATUS_LAG is for a loaded host.
STATUS_LAG = 3.0
# Bytes warming's readers may hold read but not yet counted: a block each (4 readers, blocks of a
# quarter of WARM_RATE, 24 KiB), rounded up.
IN_FLIGHT = 128 * 1024


class StatusAgainstPageCache:
    """The STATUS= percentages read while warming, each checked at once against the test's own
    mincore of the checkpoint (readahead off: what is resident is what was read):
      * at most what is resident now: warming counts a byte once its read returned it, into the
        page cache. Within 1 s, for a reading that missed pages being migrated to see them again
        (page_cache.wait_resident); warming reads under a tenth of the checkpoint meanwhile;
      * at least what was resident STATUS_LAG s before, less IN_FLIGHT: STATUS= follows
        warming's count within about a second.
    A constant, or a made-up percentage ahead of the page cache or far behind it, fails."""

    def __init__(self, files: list[Path], total: int):
        self.files, self.total = files, total
        self.history: list[tuple[float, int]] = []  # (time.monotonic(), bytes resident)
        self.percents: list[int] = []

    def measure(self) -> None:
        self.history.append((time.monotonic(), resident_total(self.files)))

    def check(self, percent: int, text: str) -> None:
        try:
            wait_resident(self.files, percent * self.total // 100, timeout=1)
        except TimeoutError as e:
            raise AssertionError(f"{text!r}: ahead of the page cache ({self.total} bytes): {e}") from e
        now = time.monotonic()
        older = [n for t, n in self.history if t <= now - STATUS_LAG]
        if older:
            assert (percent + 1) * self.total // 100 >= older[-1] - IN_FLIGHT, \
                (text, f"{older[-1]} of {self.total} bytes resident {STATUS_LAG} s before")
        self.percents.append(percent)


def status_percents_while_warming(env, dep_id: str, model: str, files: list[Path], total: int) -> list[int]:
    """Polls STATUS= until the deployment has left warming: the percentage of each warming line
    seen, each checked against the page cache as soon as it is read (StatusAgainstPageCache)."""
    watch = StatusAgainstPageCache(files, total)

    def warming_over() -> bool:
        d = env.status()["deployment"]
        assert d["id"] == dep_id, d
        if d["state"] != "running" or PHASES.index(d["phase"]) > PHASES.index("warming"):
            return True
        watch.measure()
        text = status_text(env)
        m = re.fullmatch(rf"warming the page cache for {model}: (\d+)% of (.+) in memory", text)
        if m:
            assert m.group(2) == format_bytes(total), (text, total)
            watch.check(int(m.group(1)), text)
        return False

    wait_for("warming to end", warming_over, timeout=120)
    return watch.percents


def follow_in_background(stream: SseClient, dep_id: str, events: list, errors: list) -> threading.Thread:
    """A thread appending the (kind, data) events of deployment `dep_id` to `events` until its
    terminal state event; an exception is appended to `errors`."""
    def follow():
        try:
            deadline = time.monotonic() + 180
            while True:
                kind, data = stream.next_event(deadline)
                if data.get("id") == dep_id:
                    events.append((kind, data))
                    if kind == "state" and data["state"] != "running":
                        return
        except Exception as e:  # noqa: BLE001: reported by the test's thread
            errors.append(e)
    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread


# Warming's read rate in this test: about 12 s for the checkpoint (3 shards of 400 kB).
WARM_RATE = 100_000


def pulled_and_dropped(env, model: str) -> tuple[list[Path], int]:
    """Pulls `model` and drops its revision's pages from the page cache (checked by mincore), so
    that warming has the whole checkpoint to read; returns its files and their bytes."""
    r = env.modelctl("--json", "pull", model, "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    files = revision_files(env, model, json.loads(r.stdout)["commit"])
    for f in files:
        drop(f)
    assert resident_total(files) <= 64 * 1024, resident_total(files)
    return files, sum(f.stat().st_size for f in files)


def deploy_following_warming(env, model: str, files: list[Path], total: int) -> tuple[list[int], list[dict]]:
    """Deploys `model` with an event stream open; returns the STATUS= percentages seen while it
    warmed (status_percents_while_warming) and the "warm" objects of its warming progress events."""
    stream = SseClient(env.socket)
    events: list[tuple[str, dict]] = []
    errors: list[BaseException] = []
    try:
        dep_id = start_deployment(env, model)
        follower = follow_in_background(stream, dep_id, events, errors)
        percents = status_percents_while_warming(env, dep_id, model, files, total)
        wait_for("the deployment to end", lambda: env.status()["deployment"]["state"] != "running", timeout=120)
        follower.join(timeout=30)
        assert not follower.is_alive() and not errors, errors
    finally:
        stream.close()
    dep = env.status()["deployment"]
    assert dep["id"] == dep_id and dep["state"] == "succeeded", dep
    assert dep["warm"]["bytes_total"] == total, (dep["warm"], total)
    return percents, [d["warm"] for k, d in events if k == "progress" and "warm" in d and d["phase"] == "warming"]


@needs_systemd
def test_warming_progress_moves_on_the_event_stream_and_in_status_text_within_the_page_cache(env):
    """docs/interface.md, Warming: SSE `event: progress` in the phase warming carries "warm";
    `STATUS=` "warming the page cache for NAME: 40% of 8.6 GB in memory"."""
    files, total = pulled_and_dropped(env, "cached")
    # Slow warming within a budget that holds it all.
    env.reconfigure(environment={"MODELD_TEST_WARM_RATE": str(WARM_RATE),
                                 "MODELD_TEST_WARM_BUDGET": str(64 * MiB)})
    try:
        # Readahead off: the pages resident are those warming (or verifying) read, so mincore
        # keeps close to what STATUS= should say, and warming reads every page of the checkpoint.
        with no_readahead(env.models_dir):
            percents, warm = deploy_following_warming(env, "cached", files, total)
    finally:
        env.reconfigure(environment={})
    # STATUS= moved while warming, each percentage within the page cache (checked as it was read):
    # percentages that never fall, at least three of them, from below 100.
    assert percents and percents[0] < 100, percents
    assert percents == sorted(percents) and len(set(percents)) >= 3, percents
    # The event stream's warming progress moved too: bytes that never fall and grew at least twice.
    assert len(warm) >= 3, warm
    warmed = [w["bytes_warmed"] for w in warm]
    assert sum(1 for a, b in zip(warmed, warmed[1:]) if b > a) >= 2, warmed
    assert warmed == sorted(warmed), warmed
    assert all(w["bytes_total"] == total for w in warm), warm


# -- deploy --wait --------------------------------------------------------------------------------

def plain_lines_only(text: str):
    assert "\x1b" not in text and "\r" not in text, repr(text)


@needs_systemd
def test_deploy_wait_exits_0_on_success_with_plain_lines_for_each_phase_and_progress(env):
    with throttled(env):
        r = env.modelctl("deploy", "waited", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    plain_lines_only(r.stdout)
    lines = r.stdout.splitlines()
    assert lines[0].startswith("Deploying waited (deployment ")
    assert [l.removeprefix("phase: ") for l in lines if l.startswith("phase: ")] == PHASES
    progress = [l for l in lines if l.startswith("  ") and "% of " in l]
    assert progress and progress[-1].startswith("  100% of ") and "files)" in progress[-1], lines
    assert lines[-1].startswith("Deployment ") and lines[-1].endswith(" succeeded")
    assert env.status()["active"]["model"] == "waited"


@needs_systemd
def test_deploy_wait_exits_1_on_a_deployment_that_fails_and_names_the_error(env):
    r = env.modelctl("deploy", "holey", "--wait")
    assert r.returncode == 1, r.stdout + r.stderr
    plain_lines_only(r.stdout + r.stderr)
    assert "phase: planning" in r.stdout
    assert " failed in phase planning" in r.stdout.splitlines()[-1]
    assert "checkpoint_incomplete" in r.stderr and "model-00002-of-00003.safetensors" in r.stderr
    assert env.status()["deployment"]["state"] == "failed"


@needs_systemd
def test_deploy_wait_exits_1_on_a_deployment_that_is_rolled_back(env):
    active = env.status()["active"]["model"]
    r = env.modelctl("deploy", "broken", "--wait")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "phase: rolling_back" in r.stdout
    assert " rolled_back in phase rolling_back" in r.stdout.splitlines()[-1]
    assert env.status()["active"]["model"] == active


@needs_systemd
def test_deploy_wait_json_prints_only_the_final_deployment(env):
    r = env.modelctl("--json", "deploy", "holey", "--wait")
    assert r.returncode == 1, r.stdout + r.stderr
    dep = json.loads(r.stdout)
    assert (dep["state"], dep["phase"], dep["error"]["code"]) == ("failed", "planning", "checkpoint_incomplete")


# -- bash completion ------------------------------------------------------------------------------

def complete(words: list[str], env_vars: dict[str, str] | None = None) -> tuple[list[str], str]:
    """Sources the completion in a plain bash and asks it to complete `words` (the last one is
    the word under the cursor); returns the candidates and what bash wrote to stderr."""
    script = (f'source "{COMPLETION}"\n'
              'COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))\n'
              '_modelctl\n'
              'printf "%s\\n" "${COMPREPLY[@]}"\n')
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", script, "bash", *words], capture_output=True,
                       text=True, timeout=30, env={"PATH": "/usr/bin:/bin", **(env_vars or {})})
    assert r.returncode == 0, r.stderr
    return [l for l in r.stdout.splitlines() if l], r.stderr


def test_completion_offers_commands_and_each_commands_options(tmp_path: Path):
    commands, _ = complete(["modelctl", ""])
    assert commands == ["status", "deploy", "pull", "stop", "plan", "deployment", "cancel", "models", "verify", "rm",
                        "logs", "watch"]
    assert complete(["modelctl", "w"])[0] == ["watch"]
    assert complete(["modelctl", "--json", "depl"])[0] == ["deploy", "deployment"]
    assert set(complete(["modelctl", "deployment", "--"])[0]) == {"--wait", "--socket", "--json", "--help"}
    assert set(complete(["modelctl", "deploy", "--"])[0]) == {"--wait", "--allow-downtime", "--restart", "--commit",
                                                              "--socket", "--json", "--help"}
    assert set(complete(["modelctl", "pull", "--"])[0]) == {"--wait", "--commit", "--socket", "--json", "--help"}
    assert set(complete(["modelctl", "stop", "--"])[0]) == {"--wait", "--socket", "--json", "--help"}
    assert set(complete(["modelctl", "rm", "--"])[0]) == {"--commit", "--socket", "--json", "--help"}
    assert set(complete(["modelctl", "plan", "--"])[0]) == {"--allow-downtime", "--commit", "--socket", "--json",
                                                            "--help"}
    assert set(complete(["modelctl", "logs", "-"])[0]) == {"-f", "--follow", "--socket", "--json", "--help"}
    assert complete(["modelctl", "deploy", "--w"])[0] == ["--wait"]
    assert set(complete(["modelctl", "status", "--"])[0]) == {"--socket", "--json", "--help"}
    (tmp_path / "modeld.sock").touch()
    assert complete(["modelctl", "--socket", str(tmp_path / "mod")])[0] == [str(tmp_path / "modeld.sock")]


def test_completion_of_model_names_is_quietly_empty_when_the_daemon_is_unreachable(tmp_path: Path):
    fake_path = f"{BUILD_DIR}:/usr/bin:/bin"
    for words in (["modelctl", "deploy", ""], ["modelctl", "--socket", str(tmp_path / "none.sock"), "watch", "a"]):
        names, err = complete(words, {"PATH": fake_path, "MODELD_SOCKET": str(tmp_path / "none.sock")})
        assert names == [] and err == "", (words, names, err)


def test_completion_asks_modelctl_for_model_names_on_the_socket_given(tmp_path: Path):
    fake = tmp_path / "bin" / "modelctl"
    fake.parent.mkdir()
    log = tmp_path / "args"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n'
                    'echo \'{"models": [{"name": "kimi-k2-5", "repo": "a/b"}, {"name":"k2.base","repo":"c/d"}]}\'\n')
    fake.chmod(0o755)
    path = {"PATH": f"{fake.parent}:/usr/bin:/bin"}
    assert complete(["modelctl", "--socket", "/x/y.sock", "verify", "k"], path)[0] == ["kimi-k2-5", "k2.base"]
    assert complete(["modelctl", "plan", "k2"], path)[0] == ["k2.base"]
    assert log.read_text().splitlines() == ["--socket /x/y.sock --json models", "--json models"]
    # One model per command: nothing after the name, and nothing for commands without one.
    assert complete(["modelctl", "deploy", "kimi-k2-5", ""], path)[0] == []
    assert complete(["modelctl", "status", ""], path)[0] == []


@needs_systemd
def test_completion_lists_the_real_daemons_models(env):
    names, err = complete(["modelctl", "--socket", str(env.socket), "deploy", ""], {"PATH": f"{BUILD_DIR}:/usr/bin:/bin"})
    assert err == ""
    assert sorted(names) == sorted(env.ports)
    names, _ = complete(["modelctl", "watch", "wa"], {"PATH": f"{BUILD_DIR}:/usr/bin:/bin",
                                                     "MODELD_SOCKET": str(env.socket)})
    assert names == ["waited", "watched"]
    assert complete(["modelctl", "--socket", str(env.socket), "logs", "-f", "dr"],
                    {"PATH": f"{BUILD_DIR}:/usr/bin:/bin"})[0] == ["drawn"]


# -- watch ----------------------------------------------------------------------------------------

def watch_process(env, out: Path, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([MODELCTL, "--socket", str(env.socket), "watch", *args], stdout=open(out, "wb"),
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, **kw)


def ended(proc: subprocess.Popen, timeout: float = 30) -> tuple[int, str]:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return rc, proc.stderr.read().decode()


@needs_systemd
def test_watch_refuses_a_model_that_is_not_configured(env):
    r = env.modelctl("watch", "no-such-model", timeout=30)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no-such-model" in r.stderr


@needs_systemd
def test_watch_ends_with_exit_0_on_ctrl_c(env, tmp_path: Path):
    out = tmp_path / "watch.txt"
    proc = watch_process(env, out)
    try:
        wait_for("watch's first lines", lambda: "active: " in text_of(out), timeout=30)
        proc.send_signal(signal.SIGINT)
        rc, err = ended(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0 and err == "", (rc, err)


class Terminal:
    """A program on a pseudo-terminal of 120 columns and 30 rows; what it writes is collected by
    a thread into `received`."""

    def __init__(self, argv: list[str], env_vars: dict[str, str]):
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
        self.received = bytearray()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                                     env={**os.environ, "TERM": "xterm", **env_vars})
        os.close(slave)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        while not self.stop.is_set():
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the program and every copy of the terminal are gone
                    return
                if not chunk:
                    return
                self.received.extend(chunk)

    def text(self) -> str:
        return bytes(self.received).decode(errors="replace")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stop.set()
        self.thread.join(timeout=5)
        os.close(self.master)


def check_terminal_output(text: str):
    """Bars for the whole download and for each file, redrawn in place, within 120 columns."""
    assert "A\r\x1b[J" in text, "the view is redrawn in place"
    visible = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert visible
    bars = [l for l in visible.splitlines() if "[" in l and "] " in l and "% of " in l]
    assert any("model-0000" in l and ".safetensors" in l for l in bars), "a bar per file"
    assert any(l.startswith("  [") and "files)" in l for l in bars), "a bar for the whole download"
    assert all(len(l.rstrip("\r")) < 120 for l in visible.split("\n")), "lines fit the terminal"


@needs_systemd
def test_watch_on_a_terminal_redraws_bars_in_place_and_honours_no_color(env):
    term = Terminal([MODELCTL, "--socket", str(env.socket), "watch"], {"NO_COLOR": "1"})
    try:
        wait_for("the first view", lambda: "Ctrl-C to quit" in term.text(), timeout=30)
        with throttled(env):
            r = env.modelctl("deploy", "shown", "--wait")
        assert r.returncode == 0, r.stdout + r.stderr
        wait_for("the view of the finished deployment",
                 lambda: "Active:      shown" in term.text() and
                 "Result:    succeeded" in term.text().rsplit("Last deployment: ", 1)[-1], timeout=30)
        term.proc.send_signal(signal.SIGINT)
        assert term.proc.wait(timeout=30) == 0
    finally:
        term.close()
    text = term.text()
    check_terminal_output(text)
    assert "\x1b[3" not in text and "\x1b[1m" not in text, "NO_COLOR: no colors, no bold"
    assert "  Phase:     downloading, running" in text


@needs_systemd
def test_deploy_wait_on_a_terminal_draws_bars_under_the_phases_in_color(env):
    with throttled(env):
        term = Terminal([MODELCTL, "--socket", str(env.socket), "deploy", "drawn", "--wait"], {})
        try:
            assert term.proc.wait(timeout=120) == 0, term.text()
            wait_for("the last line", lambda: "succeeded" in term.text(), timeout=10)
        finally:
            term.close()
    text = term.text()
    check_terminal_output(text)
    visible = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "")
    assert [l.removeprefix("phase: ") for l in visible.splitlines() if l.startswith("phase: ")] == PHASES
    assert "\x1b[32msucceeded\x1b[0m" in text, "the result in color"


@needs_systemd
def test_watch_plain_and_json_show_the_phases_and_exit_3_when_modeld_stops(env, tmp_path: Path):
    plain, ndjson, filtered = tmp_path / "watch.txt", tmp_path / "watch.ndjson", tmp_path / "watch-base.txt"
    before = env.status()
    procs = [watch_process(env, plain), watch_process(env, ndjson, "--json"),
             watch_process(env, filtered, "base")]
    try:
        wait_for("each watch's first lines",
                 lambda: "active: " in text_of(plain) and '"event":"status"' in text_of(ndjson)
                 and "active: " in text_of(filtered), timeout=30)
        with throttled(env):
            dep_id = start_deployment(env, "watched")
            wait_for("the end of the deployment in both watches",
                     lambda: f"{dep_id} of watched succeeded" in text_of(plain)
                     and '"state":"succeeded"' in text_of(ndjson), timeout=120)
        env.systemd.run(["systemctl", "stop", "modeld.service"], check=True)
        results = [ended(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        env.systemd.run(["systemctl", "start", "modeld.service"], check=True)
        wait_for("modeld after its start", lambda: env.modelctl("status").returncode == 0, timeout=60)

    for rc, err in results:
        assert rc == 3, (rc, err)
        assert err.count("\n") == 1 and f"cannot reach modeld at {env.socket}: " in err, err

    # Plain lines: a clock, then the snapshot, each phase in order, progress, the result and the
    # new active model; nothing for a terminal.
    text = text_of(plain)
    plain_lines_only(text)
    assert text, "watch printed nothing"
    lines = [l.split(" ", 1)[1] for l in text.splitlines()]
    assert all(len(l.split(" ", 1)[0]) == 8 and l[2] == ":" for l in text.splitlines())
    assert lines[0] == f"modeld {env.status()['daemon']['version']} at {env.socket}"
    assert lines[1].startswith(f"active: {before['active']['model']} (commit ")
    last = before["deployment"]
    assert lines[2] == f"last deployment {last['id']} of {last['model']} succeeded"
    phases = [l.rsplit(" ", 1)[1] for l in lines if l.startswith(f"{dep_id} watched phase ")]
    assert phases == PHASES, lines
    progress = [l for l in lines if l.startswith(f"{dep_id} watched progress ")]
    assert progress and progress[-1].startswith(f"{dep_id} watched progress 100% of "), lines
    i_result = lines.index(f"{dep_id} of watched succeeded")
    assert any(l.startswith("active: watched (commit ") for l in lines[lines.index(
        f"{dep_id} watched phase health_checking"):]), lines
    assert i_result > lines.index(f"{dep_id} watched phase benchmarking")

    # NDJSON: the status first, then every event of the deployment, each line one object.
    records = [json.loads(l) for l in text_of(ndjson).splitlines()]
    assert records[0]["event"] == "status" and records[0]["data"]["active"]["model"] == before["active"]["model"]
    mine = [r for r in records[1:] if r["data"]["id"] == dep_id]
    assert [r["data"]["phase"] for r in mine if r["event"] == "phase"] == PHASES
    done = [r["data"]["progress"]["bytes_done"] for r in mine if r["event"] == "progress"]
    assert len(done) >= 3 and done == sorted(done)
    assert mine[-1]["event"] == "state" and mine[-1]["data"]["state"] == "succeeded"

    # A watch of another model saw none of it, and began with that model's last deployment.
    assert "watched" not in text_of(filtered), text_of(filtered)
    assert " last deployment " in text_of(filtered) and " of base succeeded" in text_of(filtered)
