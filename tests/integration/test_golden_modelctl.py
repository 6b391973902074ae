"""Golden tests of modelctl's output (tests/fixtures/golden/README.md): the real modelctl binary
talks to a fake daemon on a Unix socket that answers with the API's golden JSON and SSE files
(made by tests/unit/control/golden_*_test.cpp from fixed records), and what modelctl asks, prints
on stdout and stderr, and exits with is compared byte for byte with tests/fixtures/golden/modelctl/.

Taken before issue 26 moves the API's JSON into one stage and modelctl onto typed structs; these
must pass unchanged after it. No systemd, no root, nothing volatile: every input is a file.
MODELD_UPDATE_GOLDEN=1 rewrites the transcripts instead of comparing them.
"""

from __future__ import annotations

import difflib
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from modeld_env import BUILD_DIR, FIXTURES

MODELCTL = str(BUILD_DIR / "modelctl")
GOLDEN = FIXTURES / "golden"
A1 = "a" * 20 + "1" * 20
B1 = "b" * 20 + "1" * 20
RUNNING = "20260301T150000Z-gamma"  # the rich engine's running deployment, whose run sse/run.txt holds


def api(name: str) -> bytes:
    return (GOLDEN / "api" / name).read_bytes()


class FakeDaemon:
    """Answers HTTP/1.1 on a Unix socket from `routes`: (method, target) -> a list of (status,
    body); each request takes the first answer of its list, the last one stays. GET /v1/events
    streams `events` (SSE text) and closes. Every request is recorded as "METHOD TARGET [BODY]"."""

    def __init__(self, path: Path, routes: dict, events: bytes = b""):
        self.routes = {k: list(v) for k, v in routes.items()}
        self.events = events
        self.requests: list[str] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_request(conn: socket.socket) -> tuple[str, str, bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                raise ConnectionError("closed before a request")
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        length = 0
        for line in lines[1:]:
            key, _, value = line.partition(":")
            if key.strip().lower() == "content-length":
                length = int(value.strip())
        while len(body) < length:
            body += conn.recv(65536)
        return method, target, body

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            method, target, body = self._read_request(conn)
            with self.lock:
                self.requests.append(f"{method} {target}" + (f" {body.decode()}" if body else ""))
                answers = self.routes.get((method, target))
                answer = (answers.pop(0) if len(answers) > 1 else answers[0]) if answers else None
            if (method, target) == ("GET", "/v1/events"):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                             + self.events)
                return
            status, payload = answer or (404, b'{"error":{"code":"not_found","message":"no golden answer"}}')
            conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}"
                         "\r\nConnection: close\r\n\r\n".encode() + payload)

    def close(self) -> None:
        self.sock.close()


def deployments(*ids: str) -> dict:
    return {("GET", f"/v1/deployments/{i}"): [(200, api(f"deployment_{i}.json"))] for i in ids}


HISTORY = ["20260301T150000Z-gamma", "20260301T140000Z-gamma", "20260301T130000Z-alpha", "20260301T120000Z-gamma",
           "20260301T110000Z-beta", "20260301T100000Z-alpha", "20260301T090000Z-beta", "20260301T080000Z-alpha"]
STATE_DIR_API = GOLDEN / "state_dir_api"

# name -> (modelctl arguments, routes, SSE text of GET /v1/events)
SCENARIOS: dict[str, tuple[list[str], dict, bytes]] = {
    "status": (["status"], {("GET", "/v1/status"): [(200, api("status.json"))]}, b""),
    "status_failed": (["status"], {("GET", "/v1/status"): [(200, api("status_failed.json"))]}, b""),
    "status_finished": (["status"], {("GET", "/v1/status"): [(200, api("status_finished.json"))]}, b""),
    "status_idle": (["status"], {("GET", "/v1/status"): [(200, api("status_idle.json"))]}, b""),
    "status_state_dir": (["status"], {("GET", "/v1/status"): [(200, (STATE_DIR_API / "status.json").read_bytes())]},
                         b""),
    "models": (["models"], {("GET", "/v1/models"): [(200, api("models.json"))]}, b""),
    "models_empty": (["models"], {("GET", "/v1/models"): [(200, api("models_empty.json"))]}, b""),
    **{f"deployment_{i}": (["deployment", i], deployments(i), b"") for i in HISTORY},
    "deployment_unknown": (["deployment", "nope"],
                           {("GET", "/v1/deployments/nope"): [(404, api("error_deployment_not_found.json"))]}, b""),
    "plan": (["plan", "gamma"], {("GET", "/v1/models/gamma/plan"): [(200, api("plan.json"))]}, b""),
    "plan_short": (["plan", "beta"], {("GET", "/v1/models/beta/plan"): [(200, api("plan_short.json"))]}, b""),
    "plan_serving": (["plan", "alpha", "--allow-downtime", "--commit", A1],
                     {("GET", f"/v1/models/alpha/plan?allow_downtime=true&commit={A1}"):
                      [(200, api("plan_serving.json"))]}, b""),
    "plan_unknown": (["plan", "omega"], {("GET", "/v1/models/omega/plan"): [(404, api("error_unknown_model.json"))]},
                     b""),
    "verify_problems": (["verify", "alpha"], {("POST", "/v1/models/alpha/verify"): [(200, api("verify_problems.json"))]},
                        b""),
    "verify_clean": (["verify", "beta"], {("POST", "/v1/models/beta/verify"): [(200, api("verify_clean.json"))]}, b""),
    "rm": (["rm", "gamma"], {("DELETE", "/v1/models/gamma"): [(200, api("rm.json"))]}, b""),
    "rm_commit": (["rm", "beta", "--commit", B1], {("DELETE", f"/v1/models/beta?commit={B1}"):
                                                  [(200, api("rm_commit.json"))]}, b""),
    "rm_active": (["rm", "alpha"], {("DELETE", "/v1/models/alpha"): [(409, api("error_rm_active.json"))]}, b""),
    "deploy": (["deploy", "alpha", "--allow-downtime"], {("POST", "/v1/deployments"): [(202, api("deploy_accepted.json"))]},
               b""),
    "deploy_running": (["deploy", "alpha"], {("POST", "/v1/deployments"): [(409, api("error_deploy_running.json"))]},
                       b""),
    "deploy_forbidden": (["deploy", "alpha"], {("POST", "/v1/deployments"): [(403, api("error_forbidden.json"))]}, b""),
    "deploy_wait": (["deploy", "gamma", "--wait"],
                    {("POST", "/v1/deployments"): [(202, api(f"deployment_{RUNNING}.json"))],
                     ("GET", f"/v1/deployments/{RUNNING}"): [(200, api(f"deployment_{RUNNING}_finished.json"))]},
                    (GOLDEN / "sse" / "run.txt").read_bytes()),
    "deployment_wait": (["deployment", RUNNING, "--wait"],
                        {("GET", f"/v1/deployments/{RUNNING}"): [(200, api(f"deployment_{RUNNING}.json")),
                                                                 (200, api(f"deployment_{RUNNING}_finished.json"))]},
                        (GOLDEN / "sse" / "run.txt").read_bytes()),
    "pull": (["pull", "beta", "--commit", B1], {("POST", "/v1/models/beta/pull"): [(202, api("pull_accepted.json"))]},
             b""),
    "stop": (["stop", "gamma"], {("POST", "/v1/models/gamma/stop"): [(202, api("stop_accepted.json"))]}, b""),
    "cancel": (["cancel"], {("GET", "/v1/status"): [(200, api("status.json"))],
                            ("POST", f"/v1/deployments/{RUNNING}/cancel"): [(200, api("cancel.json"))]}, b""),
    "cancel_nothing": (["cancel"], {("GET", "/v1/status"): [(200, api("status_idle.json"))]}, b""),
}


def transcript(args: list[str], daemon: FakeDaemon, r: subprocess.CompletedProcess) -> str:
    return (f"$ modelctl {' '.join(args)}\n--- requests\n" + "".join(f"{q}\n" for q in daemon.requests)
            + f"--- stdout\n{r.stdout}--- stderr\n{r.stderr}--- exit {r.returncode}\n")


def check_golden(path: Path, actual: str) -> None:
    """Compares `actual` with the golden file at `path` byte for byte (MODELD_UPDATE_GOLDEN=1 writes it)."""
    if os.environ.get("MODELD_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(actual.encode())
        return
    assert path.exists(), f"golden file {path} is missing (MODELD_UPDATE_GOLDEN=1 writes it; README.md)"
    expected = path.read_bytes().decode()
    if expected != actual:
        diff = "".join(difflib.unified_diff(expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                                            str(path), "made now"))
        pytest.fail(f"output differs from golden file {path}\n{diff}"
                    "(MODELD_UPDATE_GOLDEN=1 rewrites it, if the change is intended)", pytrace=False)


@pytest.mark.parametrize("json_output", [False, True], ids=["human", "json"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_modelctl_prints_the_golden_answers(tmp_path: Path, name: str, json_output: bool):
    args, routes, events = SCENARIOS[name]
    args = (["--json"] if json_output else []) + args
    path = tmp_path / "modeld.sock"
    daemon = FakeDaemon(path, routes, events)
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "MODELD_SOCKET")}
        r = subprocess.run([MODELCTL, "--socket", str(path), *args], capture_output=True, text=True, timeout=30,
                           env=env, stdin=subprocess.DEVNULL)
    finally:
        daemon.close()
    check_golden(GOLDEN / "modelctl" / f"{name}{'.json' if json_output else ''}.txt", transcript(args, daemon, r))
