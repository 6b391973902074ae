"""End to end, serve.drain_timeout (issue 27, item 2): with engine "vllm" and a drain, the drop-in
sets KillMode=mixed and the command gains --shutdown-timeout; a request in flight when the stop
begins completes with its whole answer, at the server's pace, before the service is gone."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

from modeld_env import ModeldEnv, free_port, model_table, wait_for
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

TOKEN_SECONDS = 0.25
MAX_TOKENS = 12  # 3 s of generation


def ask(port: int, out: dict) -> None:
    """One completion of MAX_TOKENS tokens; its text (or the exception) and how long it took."""
    t0 = time.monotonic()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps({"model": "d", "prompt": "Hello",
                                                  "max_tokens": MAX_TOKENS}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            body = json.loads(r.read())
        out["text"] = body["choices"][0]["text"]
        out["finish_reason"] = body["choices"][0]["finish_reason"]
    except Exception as e:  # noqa: BLE001 - reported by the test
        out["error"] = repr(e)
    out["took"] = time.monotonic() - t0


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = ModeldEnv(workdir=tmp_path_factory.mktemp("drain"))
    e.add_repo("acme/d", shards=2, shard_size=64 * 1024, seed=91)
    e.port = free_port()
    tables = model_table("d", "acme/d", e.port, stop_timeout="5s",
                         serve_args=["--token-seconds", str(TOKEN_SECONDS)],
                         extra_serve='engine = "vllm"\ndrain_timeout = "20s"')
    try:
        e.start(tables)
        e.deploy_and_wait("d")
        yield e
    finally:
        e.stop()


def test_the_drop_in_drains_with_kill_mode_mixed_and_the_vllm_flag(env):
    dropin = env.systemd.run(["cat", "/run/systemd/system/modeld-serve@d.service.d/10-modeld.conf"],
                             check=True).stdout
    assert "KillMode=mixed\nTimeoutStopSec=25s\n" in dropin, dropin
    assert '"--shutdown-timeout" "20"\n' in dropin, dropin


def test_a_request_in_flight_when_the_stop_begins_completes_whole(env):
    whole: dict = {}
    ask(env.port, whole)  # the answer as it is when nothing stops
    assert "text" in whole, whole
    since = time.time() * 1e6
    out: dict = {}
    t = threading.Thread(target=ask, args=(env.port, out))
    t.start()
    wait_for("the request to be in flight", lambda: any(
        "request in flight: POST" in e.get("MESSAGE", "") and int(e["__REALTIME_TIMESTAMP"]) >= since
        for e in env.journal(unit="modeld-serve@d.service")), timeout=10)
    r = env.modelctl("stop", "d")
    t.join(30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert out.get("text") == whole["text"] and out["finish_reason"] == "length", out
    # Generated at the server's pace, not cut short by the SIGTERM.
    assert out["took"] >= TOKEN_SECONDS * MAX_TOKENS * 0.9, out
    wait_for("the service to be stopped", lambda: env.unit_state("modeld-serve@d.service") == "inactive",
             timeout=30)
    lines = [e.get("MESSAGE", "") for e in env.journal(unit="modeld-serve@d.service")
             if int(e["__REALTIME_TIMESTAMP"]) >= since]
    assert any("Draining 1 request(s) in flight (--shutdown-timeout 20)" in m for m in lines), lines
    assert any(m.endswith(" Drained") for m in lines), lines
