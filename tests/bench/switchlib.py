"""The switch measurement shared by tests/bench/switch (stand-in server, this kind of machine) and
tests/device/switch_gpu.py (serve_hf.py on the H200): modeld serves one of two models, and each
run switches to the other one in the order that puts the page-cache drop before warming:

  1. pull the other model (POST /v1/models/NAME/pull: download and verify while the first serves)
     and wait for the pull's record to end; its `commit` is what the deploy asks for;
  2. drop the page cache: posix_fadvise(DONTNEED) on every file of the pulled revision, and
     `sync; echo 3 > /proc/sys/vm/drop_caches` where that is allowed (root, not in a container
     that forbids it);
  3. deploy it at that commit (POST /v1/deployments {"model", "commit"}) and wait for its end;
  4. collect: the record's `switch` and `warm`, the warming phase's wall time (from the event
     stream's phase events), the new server's own weight-load time, an independent prober's outage
     (GET /health on the models' shared port every 20 ms: first failure to first 200 after it),
     and, with NVML (pynvml) present, how long after the stop was asked the old server's GPU memory
     was back at the baseline measured before anything ran.

With `plain=True` (a modeld without pull, as on main before issue 15 landed) step 1 is skipped and
step 3 deploys by name; the record's `switch` and `warm` are then reported as missing.

A modeld that lacks what a step needs (the pull route, the commit field, the record's fields)
fails with a message naming the missing piece (SwitchError), never with a traceback.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import EventStream

TERMINAL = ("succeeded", "failed", "cancelled", "rolled_back")
SWITCH_KEYS = ("downtime_s", "stop_s", "launch_s", "start_to_port_s", "port_to_ready_s")


class SwitchError(RuntimeError):
    """A step of the protocol could not be done; the message says which and why."""


# --- the control API ---------------------------------------------------------------------------

def api(socket_path: Path, method: str, path: str, body: dict | None = None, timeout: float = 30) -> tuple[int, dict]:
    """One request over modeld's Unix socket: (status, JSON answer or {})."""
    from modeld_env import UnixHTTPConnection  # noqa: E402 - on sys.path once benchlib.use_build ran

    conn = UnixHTTPConnection(str(socket_path), timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        r = conn.getresponse()
        text = r.read().decode(errors="replace")
        try:
            return r.status, json.loads(text) if text else {}
        except ValueError:
            return r.status, {"raw": text}
    finally:
        conn.close()


def start_record(socket_path: Path, path: str, body: dict, what: str) -> dict:
    status, answer = api(socket_path, "POST", path, body)
    if status in (404, 405) and "unknown_model" not in json.dumps(answer):
        raise SwitchError(f"{what}: modeld answered {status} to POST {path}: this build lacks it ({answer})")
    if status not in (200, 202):
        raise SwitchError(f"{what}: POST {path} {json.dumps(body)} answered {status}: {answer}")
    return answer


def wait_record(socket_path: Path, record_id: str, timeout: float) -> dict:
    """Polls GET /v1/deployments/ID until its state is terminal; returns the record."""
    from waiting import wait_for  # noqa: E402

    def ended():
        status, record = api(socket_path, "GET", f"/v1/deployments/{record_id}")
        return record if status == 200 and record.get("state") in TERMINAL else None

    return wait_for(f"record {record_id} to end", ended, timeout=timeout, interval=0.1)


# --- the page cache ----------------------------------------------------------------------------

def drop_page_cache(files: list[Path]) -> str:
    """Drops `files` from the page cache (fadvise) and, where allowed, the whole cache; says which."""
    os.sync()
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        return "fadvise"


def revision_files(models_dir: Path, model: str, commit: str | None) -> list[Path]:
    """Every regular file of store revision models_dir/.store/MODEL/COMMIT (all revisions when
    commit is None)."""
    base = models_dir / ".store" / model
    roots = [base / commit] if commit else ([p for p in base.iterdir() if p.is_dir()] if base.is_dir() else [])
    return [p for root in roots for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


# --- independent observers ---------------------------------------------------------------------

class Prober:
    """GET http://127.0.0.1:PORT/health every `period` seconds on a thread; outage() is the time
    from the first failed probe to the first 200 after it (None while there was none)."""

    def __init__(self, port: int, period: float = 0.02):
        self.url, self.period = f"http://127.0.0.1:{port}/health", period
        self.first_down: float | None = None
        self.back_up: float | None = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _ok(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=1) as r:
                return r.status == 200
        except (OSError, urllib.error.HTTPError):
            return False

    def _run(self):
        while not self.stopped.wait(self.period):
            ok, now = self._ok(), time.monotonic()
            if not ok and self.first_down is None:
                self.first_down = now
            elif ok and self.first_down is not None and self.back_up is None:
                self.back_up = now

    def outage(self) -> float | None:
        self.stopped.set()
        self.thread.join()
        return None if self.first_down is None or self.back_up is None else self.back_up - self.first_down


class GpuMemory:
    """NVML's used memory of GPU 0 sampled every 10 ms on a thread (pynvml), against a baseline
    taken at construction (no model server running then). Inert where pynvml or a GPU is absent."""

    SLACK = 256 << 20  # bytes above the baseline still counted as "back"

    def __init__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
            self.baseline = self.used()
        except Exception:  # noqa: BLE001 - no pynvml, no driver, no GPU: measure nothing
            self.nvml = None
            self.baseline = None

    def used(self) -> int:
        return self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used

    def back_after(self, since: float, timeout: float) -> float | None:
        """Seconds from `since` (monotonic) until used memory is at the baseline; None without NVML
        or when it is not back within `timeout`. Call it once the stop has been asked."""
        if self.nvml is None:
            return None
        while time.monotonic() - since < timeout:
            if self.used() <= self.baseline + self.SLACK:
                return time.monotonic() - since
            time.sleep(0.01)  # NVML's sampling period
        return None


# --- one switch --------------------------------------------------------------------------------

@dataclass
class Setup:
    """What a switch needs to know about the running modeld and its models."""
    socket: Path
    models_dir: Path
    port: int                      # the port both models serve on
    load_time: callable            # load_time(model) -> the new server's own weight-load seconds, or None
    plain: bool = False            # a modeld without pull/commit: deploy by name
    timeout: float = 1800          # seconds a pull or a deployment may take
    gpu: GpuMemory = field(default_factory=GpuMemory)


def phase_times(events: list[tuple[float, str, dict]], record_id: str) -> dict[str, float]:
    """{phase: seconds} of one record from the event stream's phase events (the last phase has none)."""
    marks = [(t, d.get("phase")) for t, kind, d in events if kind == "phase" and d.get("id") == record_id]
    return {phase: round(t2 - t1, 3) for (t1, phase), (t2, _) in zip(marks, marks[1:])}


def pull(setup: Setup, model: str) -> str | None:
    """Pulls `model` and returns the commit its record names (None in plain mode)."""
    if setup.plain:
        return None
    record = start_record(setup.socket, f"/v1/models/{model}/pull", {}, f"pull {model}")
    record = wait_record(setup.socket, record["id"], setup.timeout)
    if record.get("kind") != "pull":
        raise SwitchError(f"pull {model}: the record's kind is {record.get('kind')!r}, not 'pull'")
    if record["state"] != "succeeded" or not record.get("commit"):
        raise SwitchError(f"pull {model} ended {record['state']} with commit {record.get('commit')}: {record.get('error')}")
    return record["commit"]


def watch_stop(setup: Setup, stream_events: list, record_id: str, result: dict) -> threading.Thread:
    """A thread that waits for the record's stopping_old phase event, then measures when NVML shows
    the GPU memory back at the baseline (result["gpu_back_s"], from the stop's event)."""
    def run():
        deadline = time.monotonic() + setup.timeout
        while time.monotonic() < deadline:
            stop = next((t for t, kind, d in list(stream_events)
                         if kind == "phase" and d.get("id") == record_id and d.get("phase") == "stopping_old"), None)
            if stop is not None:
                result["gpu_back_s"] = setup.gpu.back_after(stop, timeout=300)
                return
            time.sleep(0.005)  # the event reader's latest events, polled

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def switch_to(setup: Setup, model: str) -> dict:
    """One measured switch to `model` (pull, drop, deploy at the commit); returns its figures."""
    commit = pull(setup, model)
    files = revision_files(setup.models_dir, model, commit)
    dropped = drop_page_cache(files)
    events: list = []
    stream = EventStream(setup.socket, on_event=lambda kind, data: events.append((time.monotonic(), kind, data)))
    prober = Prober(setup.port)
    result: dict = {"model": model, "commit": commit, "dropped": dropped}
    try:
        body = {"model": model} if setup.plain else {"model": model, "commit": commit}
        record = start_record(setup.socket, "/v1/deployments", body, f"deploy {model}")
        watcher = watch_stop(setup, events, record["id"], result)
        record = wait_record(setup.socket, record["id"], setup.timeout)
        watcher.join(timeout=310)
    finally:
        result["probe_outage_s"] = prober.outage()
        stream.close()
    return collect(setup, record, events, result)


def collect(setup: Setup, record: dict, events: list, result: dict) -> dict:
    """Adds the record's figures to `result` and checks that it ended well."""
    if record["state"] != "succeeded":
        raise SwitchError(f"deploy {result['model']} ended {record['state']}: {record.get('error')}")
    if not setup.plain and record.get("commit") != result["commit"]:
        raise SwitchError(f"deploy --commit {result['commit']} deployed {record.get('commit')}: "
                          "this build ignores the body's commit")
    if not setup.plain and record.get("switch") is None:
        raise SwitchError("the record's 'switch' is missing or null after a switch: this build does not measure "
                          "the outage (issue 15 item 2)")
    phases = phase_times(events, record["id"])
    result.update({"id": record["id"], "state": record["state"], "switch": record.get("switch"),
                   "warm": record.get("warm"), "phases": phases, "warm_s": phases.get("warming"),
                   "load_s": setup.load_time(result["model"])})
    return result


def start_env(env, tables: str) -> None:
    """env.start(tables) (a modeld_env.ProcessModeld), its failure turned into a SwitchError that
    says when the build does not know serve.warm."""
    try:
        env.start(tables)
    except RuntimeError as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        hint = (" (this build does not know serve.warm: issue 15's warming is not in it; --plain runs without it)"
                if "unknown key 'warm'" in str(e) else "")
        raise SwitchError(f"modeld did not start: {lines[-1] if lines else e}{hint}") from None


def measure(setup: Setup, models: tuple[str, str], settings: list[str], runs: int, use_setting) -> dict[str, list[dict]]:
    """Deploys models[0] (unmeasured), then for each setting calls use_setting(setting) (which
    rewrites the configuration and restarts modeld; servers keep running) and switches `runs`
    times, each time to the model that is not serving; returns {setting: [result, ...]}."""
    record = start_record(setup.socket, "/v1/deployments", {"model": models[0]}, f"deploy {models[0]}")
    record = wait_record(setup.socket, record["id"], setup.timeout)
    if record["state"] != "succeeded":
        raise SwitchError(f"the first deploy of {models[0]} ended {record['state']}: {record.get('error')}")
    serving, out = models[0], {}
    for setting in settings:
        use_setting(setting)
        out[setting] = []
        for i in range(runs):
            target = models[1] if serving == models[0] else models[0]
            r = switch_to(setup, target)
            r["setting"], r["run"] = setting, i + 1
            print(f"warm={setting} run {i + 1}: -> {target} " + json.dumps(
                {k: r.get(k) for k in ("switch", "warm", "warm_s", "load_s", "probe_outage_s", "gpu_back_s", "dropped")}),
                flush=True)
            out[setting].append(r)
            serving = target
    return out


# --- the report --------------------------------------------------------------------------------

COLUMNS = [  # (heading, how to read it from one run's result, format)
    ("downtime", lambda r: (r.get("switch") or {}).get("downtime_s"), "{:.2f}"),
    ("stop", lambda r: (r.get("switch") or {}).get("stop_s"), "{:.2f}"),
    ("launch", lambda r: (r.get("switch") or {}).get("launch_s"), "{:.2f}"),
    ("start>port", lambda r: (r.get("switch") or {}).get("start_to_port_s"), "{:.2f}"),
    ("port>ready", lambda r: (r.get("switch") or {}).get("port_to_ready_s"), "{:.2f}"),
    ("probe outage", lambda r: r.get("probe_outage_s"), "{:.2f}"),
    ("server load", lambda r: r.get("load_s"), "{:.2f}"),
    ("warm time", lambda r: r.get("warm_s"), "{:.2f}"),
    ("GB warmed", lambda r: gb((r.get("warm") or {}).get("bytes_warmed")), "{:.2f}"),
    ("GPU mem back", lambda r: r.get("gpu_back_s"), "{:.2f}"),
]


def gb(n: int | None) -> float | None:
    return None if n is None else n / 1e9


def spread(values: list, fmt: str) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return "/".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def median_of(runs: list[dict], read) -> float | None:
    values = [read(r) for r in runs if read(r) is not None]
    return statistics.median(values) if values else None


def print_table(by_setting: dict[str, list[dict]], baseline: str = "off") -> dict:
    """Prints min/median/max (seconds) per setting and column, then each setting's medians as a
    ratio to the baseline setting's; returns {setting: {column: median}} and the ratios."""
    print("\nseconds, min/median/max over runs (GB = 10^9 bytes)")
    print(f"{'warm':<6}{'runs':>5}  " + "  ".join(f"{h:>17}" for h, _, _ in COLUMNS))
    medians: dict[str, dict] = {}
    for setting, runs in by_setting.items():
        cells = [spread([read(r) for r in runs], fmt) for _, read, fmt in COLUMNS]
        print(f"{setting:<6}{len(runs):>5}  " + "  ".join(f"{c:>17}" for c in cells))
        medians[setting] = {h: median_of(runs, read) for h, read, _ in COLUMNS}
    ratios: dict[str, dict] = {}
    if baseline in medians:
        print(f"\nmedian ratio to warm = {baseline!r}")
        for setting, m in medians.items():
            if setting == baseline:
                continue
            base = medians[baseline]
            ratios[setting] = {h: (m[h] / base[h] if m[h] is not None and base[h] else None) for h, _, _ in COLUMNS[:7]}
            print(f"{setting:<6}       " + "  ".join(f"{h}={'-' if v is None else f'{v:.2f}'}" for h, v in ratios[setting].items()))
    return {"medians": medians, "ratios": ratios}
