"""End to end, the kill -9 sweep (issue 25): modeld killed with SIGKILL at seeded random points
across a deploy (every phase, downloading at several byte offsets, the cleanup of older
revisions), a rollback (a commit whose config.json the server refuses: killed in rolling_back, in
its warming of the previous revision and in its start of it again) and a pull (planning,
downloading, verifying), then started again. Each point must end consistent:

- one record of that id, terminal, with the outcome an uninterrupted run has (a deploy succeeds,
  the broken commit is rolled back, a pull succeeds), its file in state_dir without an
  end_unlogged mark;
- every service state.json lists is active (SubState running) under the namespaced systemd, its
  link points to the commit state.json names, it answers a completion, and no modeld-serve@ unit
  state.json does not list is active or on its way (no orphan);
- nothing half-promoted: every file at its final name in any revision folder hashes to what the
  hub's listing (?blobs=true: lfs sha256, git blob sha1) says for that commit, a verified revision
  (its manifest written) holds every listed file and no partial download, and no temporary link
  lies in models_dir;
- exactly one terminal journal line (catalogued MESSAGE_ID, MODELD_STATE the record's state) for
  that id.

One more point sets the crash point end_recorded (the window between a record saved as ended and
its terminal journal line), which a random kill almost never hits.

The points are drawn with random.Random(seed): their order, the byte fraction of each download
kill and each kill's offset. The seed is printed and named in every assertion message;
MODELD_SWEEP_SEED=N replays a run. Phases are held long enough to be hit by the fixtures, never
by sleeping: the hub's listing_hold (planning) and throttle (downloading), MODELD_TEST_WARM_RATE
(warming, which reads only what the page cache lacks: a new revision downloads with O_DIRECT,
and the test drops the previous revision's pages before a rollback warms it), fake_vllm's
--load-seconds (health_checking and rolling_back's wait for the old server), and shards shared
with the serving revision (verifying hashes the files it did not download). Each wait is a
condition with a deadline; the only timed pause is a kill's own random offset. A table of the
points (phase killed in, offset, outcome, time to the end) is printed at the end."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from contract_helpers import (MESSAGE_ID, answers, ended, hub_commit, journal_mark, link_target,
                              restart_killed_modeld, start_deploy, wait_line)
from modeld_env import ModeldEnv, free_port, model_table, wait_for, write_control
from nsystemd import unsupported_reason
from page_cache import drop
from waiting import NotYet
import make_checkpoint

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

SEED = int(os.environ.get("MODELD_SWEEP_SEED") or int.from_bytes(os.urandom(4), "big"))
print(f"kill sweep seed {SEED} (MODELD_SWEEP_SEED={SEED} replays it)")

MiB = 1 << 20
SHARDS, SHARD = 2, 16 * MiB     # a checkpoint of about 32 MiB
WARM_RATE = 16 * MiB            # warming a new checkpoint takes about 2 s
THROTTLE = 6 * MiB              # bytes/s per answer while a download point is held
LOAD_SECONDS = 1.5              # fake_vllm loads this long before it listens
REPO, MODEL = "acme/m", "m"
PHASES = ["planning", "freeing_disk", "downloading", "verifying", "warming", "stopping_old", "launching",
          "health_checking", "benchmarking", "rolling_back"]
TERMINAL = {"succeeded", "failed", "rolled_back", "cancelled"}
TERMINAL_IDS = {MESSAGE_ID[s]: s for s in TERMINAL}


@dataclass
class Point:
    """One kill: which record (deploy, rollback, pull), where, and the draws of the seeded RNG."""
    kind: str            # "deploy", "rollback" or "pull"
    target: str          # the phase (or step) to kill in
    commit_kind: str     # "reseed" (new shards), "push" (one small file) or "broken" (config.json)
    offset: float = 0.0  # seconds after the target was seen
    fraction: float = 0.0  # downloading: the share of the bytes done at the kill
    n: int = 0

    @property
    def label(self) -> str:
        extra = f"@{self.fraction:.0%}" if self.target == "downloading" else ""
        return f"{self.kind}:{self.target}{extra}"


@dataclass
class Row:
    point: str
    killed_in: str = "-"
    offset: float = 0.0
    outcome: str = "-"
    to_end_s: float = 0.0
    note: str = ""


# (kind, target, commit kind, offset range in seconds)
PLAN = [
    ("deploy", "planning", "reseed", (0.0, 0.4)),
    ("deploy", "planning", "reseed", (0.0, 0.4)),
    ("deploy", "planning_released", "reseed", (0.0, 0.03)),  # planning's end, freeing_disk, downloading's start
    ("deploy", "downloading", "reseed", (0.0, 0.0)),
    ("deploy", "downloading", "reseed", (0.0, 0.0)),
    ("deploy", "downloading", "reseed", (0.0, 0.0)),
    ("deploy", "downloading", "reseed", (0.0, 0.0)),
    ("deploy", "verifying", "push", (0.0, 0.02)),
    ("deploy", "verifying", "push", (0.0, 0.02)),
    ("deploy", "warming", "reseed", (0.0, 1.2)),
    ("deploy", "warming", "reseed", (0.0, 1.2)),
    ("deploy", "stopping_old", "push", (0.0, 0.03)),
    ("deploy", "stopping_old", "push", (0.0, 0.03)),
    ("deploy", "launching", "push", (0.0, 0.01)),
    ("deploy", "launching", "push", (0.0, 0.01)),
    ("deploy", "health_checking", "push", (0.0, 1.2)),
    ("deploy", "health_checking", "push", (0.0, 1.2)),
    ("deploy", "cleanup", "push", (0.0, 0.01)),
    ("deploy", "benchmarking", "push", (0.0, 0.01)),
    ("rollback", "rolling_back", "broken", (0.0, 0.3)),
    ("rollback", "rolling_back:warming", "broken", (0.0, 0.8)),
    ("rollback", "rolling_back:launching", "broken", (0.0, 1.0)),
    ("rollback", "health_checking", "broken", (0.0, 0.02)),
    ("pull", "planning", "reseed", (0.0, 0.4)),
    ("pull", "downloading", "reseed", (0.0, 0.0)),
    ("pull", "downloading", "reseed", (0.0, 0.0)),
    ("pull", "verifying", "push", (0.0, 0.02)),
]


def draw_points(seed: int) -> list[Point]:
    rng = random.Random(seed)
    points = []
    for kind, target, commit_kind, (lo, hi) in PLAN:
        p = Point(kind, target, commit_kind, offset=round(rng.uniform(lo, hi), 3))
        if target == "downloading":
            p.fraction = round(rng.uniform(0.05, 0.9), 2)
        points.append(p)
    rng.shuffle(points)
    for i, p in enumerate(points):
        p.n = i
    return points


POINTS = draw_points(SEED)
assert len(POINTS) >= 20


class SweepEnv(ModeldEnv):
    """ModeldEnv with the hub's listings of every commit the sweep made, and hashes it computed."""
    listings: dict[str, dict[str, dict]]
    hashed: dict[tuple, str]
    rows: list[Row]
    counter: int


@pytest.fixture(scope="module")
def env(tmp_path_factory, request):
    work = tmp_path_factory.mktemp("kill-sweep")
    control = work / "hub-control.json"
    write_control(control)
    e = SweepEnv(workdir=work, hub_args=["--control", str(control)],
                 environment={"MODELD_TEST_WARM_RATE": str(WARM_RATE)})
    e.hub_control, e.listings, e.hashed, e.rows, e.counter = control, {}, {}, [], 0
    e.port = free_port()
    e.add_repo(REPO, shards=SHARDS, shard_size=SHARD, seed=500)
    e.good_config = (e.repos / REPO / "config.json").read_text()
    t0 = time.monotonic()
    try:
        e.start(model_table(MODEL, REPO, e.port, load_seconds=LOAD_SECONDS, stop_timeout="20s",
                            startup_timeout="60s"))
        remember_listing(e, hub_commit(e, REPO))
        assert e.deploy_and_wait(MODEL)["state"] == "succeeded", f"[seed {SEED}] the first deploy"
        yield e
    finally:
        table = render_table(e.rows, time.monotonic() - t0)
        (work / "kill-sweep-table.txt").write_text(table)
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled():
            print("\n" + table, flush=True)
        e.stop()


def render_table(rows: list[Row], wall: float) -> str:
    out = [f"kill sweep, seed {SEED}: {len(rows)} points, {wall:.0f} s in all",
           f"{'#':>2}  {'point':<52} {'killed in':<26} {'offset':>7}  {'outcome':<12} {'to end':>7}  note"]
    for i, r in enumerate(rows):
        out.append(f"{i:>2}  {r.point:<52} {r.killed_in:<26} {r.offset:>6.3f}s  {r.outcome:<12} "
                   f"{r.to_end_s:>6.1f}s  {r.note}")
    return "\n".join(out)


# -- commits ----------------------------------------------------------------------------------------

def remember_listing(env: SweepEnv, commit: str) -> None:
    """The hub's listing of `commit` with blobs: path -> {"size", "sha256" (LFS) or "sha1" (git)}."""
    url = f"{env.hub.endpoint}/api/models/{REPO}/revision/{commit}?blobs=true"
    with urllib.request.urlopen(url, timeout=10) as r:
        info = json.loads(r.read())
    assert info["sha"] == commit, f"[seed {SEED}] the hub listed {info['sha']} for {commit}"
    env.listings[commit] = {s["rfilename"]: {"size": s["size"], "sha256": (s.get("lfs") or {}).get("sha256"),
                                             "sha1": s["blobId"]} for s in info["siblings"]}


def replace_file(path: Path, text: str) -> None:
    """Written aside and renamed over, as git does: the hub keeps serving the old commit's bytes."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def new_commit(env: SweepEnv, kind: str) -> str:
    """A new commit of the repository: "reseed" makes every shard anew, "push" changes only
    generation_config.json (the shards are shared, so verifying hashes them), "broken" a
    config.json the server refuses (no model_type, no architectures) that modeld's checks pass."""
    env.counter += 1
    root = env.repos / REPO
    if kind == "reseed":
        make_checkpoint.make_checkpoint(str(root), SHARDS, SHARD, 1000 * SEED % 100_000 + env.counter)
    else:
        replace_file(root / "config.json", env.good_config)
        gen = json.loads((root / "generation_config.json").read_text())
        gen["max_new_tokens"] = 10_000 + env.counter
        replace_file(root / "generation_config.json", json.dumps(gen))
        if kind == "broken":
            cfg = json.loads(env.good_config)
            cfg.pop("model_type", None)
            cfg.pop("architectures", None)
            replace_file(root / "config.json", json.dumps(cfg))
    commit = hub_commit(env, REPO)
    remember_listing(env, commit)
    return commit


# -- reading the record ----------------------------------------------------------------------------

def record_file(env: SweepEnv, dep_id: str) -> dict | None:
    try:
        return json.loads((env.state_dir / "deployments" / f"{dep_id}.json").read_text())
    except (FileNotFoundError, ValueError):
        return None


def api_record(env: SweepEnv, dep_id: str) -> dict | None:
    status, _, body = env.api("GET", f"/v1/deployments/{dep_id}")
    return json.loads(body) if status == 200 else None


def reached(env: SweepEnv, dep_id: str, target: str) -> dict:
    """Waits (polling state_dir's record) until the record is in `target` or past it, or ended."""
    want = PHASES.index(target)

    def check():
        d = record_file(env, dep_id)
        if d is None:
            raise NotYet("no record yet")
        if d["state"] != "running":
            return d
        if d["phase"] == "rolling_back" and target != "rolling_back":
            return d
        if PHASES.index(d["phase"]) >= want:
            return d
        raise NotYet(f"in {d['phase']}")
    return wait_for(f"deployment {dep_id} in {target}", check, timeout=120, interval=0.003)


def wait_target(env: SweepEnv, p: Point, dep_id: str, mark: int) -> None:
    """Waits for the point's target (which ends the wait at once if the record got past it)."""
    tag = f"[seed {SEED}, point {p.n} {p.label}]"
    if p.target in ("planning", "planning_released"):
        wait_for(f"{tag} the held listing", lambda: env.hub.stats()["held"] >= 1, timeout=60)
        if p.target == "planning_released":
            write_control(env.hub_control)
    elif p.target == "downloading":
        def far_enough():
            d = api_record(env, dep_id)
            if d is None or d["state"] != "running" or PHASES.index(d["phase"]) > PHASES.index("downloading"):
                return d
            prog = d["progress"]
            if d["phase"] == "downloading" and prog["bytes_total"] and \
                    prog["bytes_done"] >= p.fraction * prog["bytes_total"]:
                return d
            raise NotYet(f"{d['phase']}, {prog['bytes_done']} of {prog['bytes_total']} bytes")
        wait_for(f"{tag} {p.fraction:.0%} downloaded", far_enough, timeout=120, interval=0.01)
    elif p.target == "cleanup":
        def begun():
            d = record_file(env, dep_id)
            if d and (d.get("cleanup_begun") or d["state"] != "running" or d["phase"] == "benchmarking"):
                return d
            raise NotYet("cleanup not begun")
        wait_for(f"{tag} cleanup begun", begun, timeout=120, interval=0.003)
    elif p.target in ("rolling_back:warming", "rolling_back:launching"):
        text = dict((step, t) for t, step in ROLLBACK_STEPS)[p.target.split(":")[1]]

        def step_or_end():  # the step's line, or the record ended (the outcome check says how)
            d = record_file(env, dep_id)
            if d and d["state"] != "running":
                return d
            if any(int(e["__REALTIME_TIMESTAMP"]) >= mark and text in e.get("MESSAGE", "")
                   for e in env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}")):
                return True
            raise NotYet(f"in {d and d['phase']}")
        wait_for(f"{tag} a journal line with {text!r}", step_or_end, timeout=120)
    else:
        reached(env, dep_id, p.target)


ROLLBACK_STEPS = [("warming the previous revision", "warming"), (f"starting modeld-serve@{MODEL}.service again",
                                                                  "launching"), ("serves again", "ready")]


def killed_in(env: SweepEnv, d: dict | None, dep_id: str, at: int) -> str:
    """What the durable record says at the kill (journal mark `at`); in rolling_back, the last
    step of it the journal shows before the kill."""
    if d is None:
        return "no record"
    if d["state"] != "running":
        return f"ended {d['state']}"
    if d["phase"] == "rolling_back":
        steps = [step for e in env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}")
                 if int(e["__REALTIME_TIMESTAMP"]) <= at
                 for text, step in ROLLBACK_STEPS if text in e.get("MESSAGE", "")]
        return f"rolling_back:{steps[-1]}" if steps else "rolling_back"
    return f"{d['phase']}+cleanup" if d.get("cleanup_begun") else d["phase"]


def host_pid(env: SweepEnv) -> int:
    """modeld's PID as this (the host's) PID namespace sees it, checked against the namespaced
    systemd's MainPID: the kill is then one kill(2), with no systemctl between the moment the
    test sees the target and the SIGKILL (the phases launching and verifying last milliseconds)."""
    ns_pid = env.main_pid()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            status = (proc / "status").read_text()
        except OSError:
            continue
        if argv[0] != str(env.modeld).encode() or b"--check-config" in argv or str(env.config).encode() not in argv:
            continue
        nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        if int(nspid[-1]) == ns_pid:
            return int(proc.name)
    raise AssertionError(f"[seed {SEED}] modeld (MainPID {ns_pid} in the namespace) not found in /proc")


# -- one point -------------------------------------------------------------------------------------

def start_record(env: SweepEnv, p: Point) -> str:
    if p.kind == "pull":
        status, _, body = env.api("POST", f"/v1/models/{MODEL}/pull")
        assert status == 202, f"[seed {SEED}, point {p.n} {p.label}] pull: {status} {body}"
        return json.loads(body)["id"]
    return start_deploy(env, MODEL)


def drop_serving_pages(env: SweepEnv) -> None:
    """Drops the page cache of the revision in service, so rolling back warms it from disk."""
    commit = link_target(env, MODEL)
    rev = env.models_dir / ".store" / MODEL / commit
    for f in rev.rglob("*.safetensors"):
        drop(f)


def run_point(env: SweepEnv, p: Point) -> None:
    tag = f"[seed {SEED}, point {p.n} {p.label}]"
    row = Row(p.label, offset=p.offset)
    env.rows.append(row)
    commit = new_commit(env, p.commit_kind)
    serving = link_target(env, MODEL)
    if p.target in ("planning", "planning_released"):
        write_control(env.hub_control, listing_hold=f"{REPO}/*")
    elif p.target == "downloading":
        write_control(env.hub_control, throttle=THROTTLE)
    mark = journal_mark()
    dep_id = start_record(env, p)
    row.point = f"{p.label} {dep_id}"
    try:
        if p.kind == "rollback" and p.target == "rolling_back:warming":
            # verifying read the shared shards again: drop them once the new server is on its way.
            reached(env, dep_id, "launching")
            drop_serving_pages(env)
        pid, host = env.main_pid(), host_pid(env)
        wait_target(env, p, dep_id, mark)
        time.sleep(p.offset)  # the kill's random offset, drawn from the seeded RNG
        os.kill(host, signal.SIGKILL)  # kill -9 of modeld's main process
        at = journal_mark()
        wait_for(f"{tag} modeld killed", lambda: env.main_pid() != pid, timeout=30)
        durable = record_file(env, dep_id)
        row.killed_in = killed_in(env, durable, dep_id, at)
        server = env.main_pid(f"modeld-serve@{MODEL}.service")
    finally:
        write_control(env.hub_control)  # no hold, no throttle: the next start runs freely
    t_kill = time.monotonic()
    restart_killed_modeld(env, pid)
    dep = ended(env, dep_id, timeout=180)
    row.to_end_s = time.monotonic() - t_kill
    row.outcome = dep["state"]
    if dep["state"] != {"rollback": "rolled_back"}.get(p.kind, "succeeded"):
        row.note = f"{(dep.get('error') or {}).get('code')}: {(dep.get('error') or {}).get('message', '')[:80]}"
    check_consistent(env, p, dep_id, dep, commit, serving, tag)
    check_resumed(env, dep_id, durable, at, tag)
    if durable and durable["state"] == "running" and durable.get("cleanup_begun"):
        # The new model served at the kill: the next start never restarts it.
        assert env.main_pid(f"modeld-serve@{MODEL}.service") == server, \
            f"{tag} the server that served at the kill (PID {server}) was restarted"


def check_resumed(env: SweepEnv, dep_id: str, durable: dict | None, at: int, tag: str) -> None:
    """The next start continued the record once, from what it had durably recorded: "interrupted
    in phase" its phase at the kill; a record killed rolling back continues rolling back (it never
    starts the new model again), one killed in the cleanup of older revisions finishes that
    cleanup (interface.md: it is not cancellable and finishes, also after a restart)."""
    lines = [e["MESSAGE"] for e in env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}")
             if int(e["__REALTIME_TIMESTAMP"]) >= at and "continuing deployment" in e.get("MESSAGE", "")]
    if durable is None or durable["state"] != "running":
        assert lines == [], f"{tag} an ended record continued: {lines}"
        return
    assert len(lines) == 1, f"{tag} {len(lines)} 'continuing deployment' lines after the kill: {lines}"
    assert f"interrupted in phase {durable['phase']}," in lines[0], \
        f"{tag} killed in {durable['phase']}, the next start said: {lines[0]}"
    if durable["phase"] == "rolling_back":
        assert lines[0].endswith("from phase rolling_back"), f"{tag} a rollback did not continue: {lines[0]}"
    elif durable.get("cleanup_begun"):
        assert "from phase health_checking (the cleanup" in lines[0], f"{tag} the cleanup did not continue: {lines[0]}"


def journal_excerpt(env: SweepEnv, dep_id: str, n: int = 25) -> str:
    """The last `n` journal lines of modeld for `dep_id`, for an assertion message."""
    lines = [e.get("MESSAGE", "") for e in env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}")]
    return "\n  journal: " + "\n  journal: ".join(lines[-n:])


def expected_outcome(env: SweepEnv, p: Point, dep: dict, commit: str, serving: str, tag: str) -> None:
    tag += journal_excerpt(env, dep["id"]) if dep["state"] != {"rollback": "rolled_back"}.get(p.kind, "succeeded") else ""
    assert dep["commit"] == commit, f"{tag} the record's commit {dep['commit']}, the hub's {commit}"
    if p.kind == "deploy":
        assert dep["state"] == "succeeded", f"{tag} a deploy killed and continued did not succeed: {dep}"
        assert link_target(env, MODEL) == commit, f"{tag} the link after a succeeded deploy"
    elif p.kind == "rollback":
        assert dep["state"] == "rolled_back", f"{tag} the broken commit was not rolled back: {dep}"
        assert link_target(env, MODEL) == serving, f"{tag} the link after a rollback"
    else:
        assert dep["state"] == "succeeded" and dep["kind"] == "pull", f"{tag} a pull did not succeed: {dep}"
        assert link_target(env, MODEL) == serving, f"{tag} a pull moved the link"
        assert (env.models_dir / ".store" / MODEL / commit / ".modeld" / "manifest.json").is_file(), \
            f"{tag} the pulled revision has no manifest"


# -- consistency -----------------------------------------------------------------------------------

def check_consistent(env: SweepEnv, p: Point, dep_id: str, dep: dict, commit: str, serving: str, tag: str) -> None:
    check_record(env, dep_id, dep, tag)
    expected_outcome(env, p, dep, commit, serving, tag)
    check_services(env, tag)
    check_store(env, tag)
    check_terminal_line(env, dep_id, dep, tag)


def check_record(env: SweepEnv, dep_id: str, dep: dict, tag: str) -> None:
    assert dep["state"] in TERMINAL, f"{tag} not terminal: {dep}"
    status, _, body = env.api("GET", "/v1/deployments?limit=1000")
    assert status == 200, f"{tag} {status} {body}"
    ids = [d["id"] for d in json.loads(body)["deployments"]]
    assert ids.count(dep_id) == 1, f"{tag} {ids.count(dep_id)} records of {dep_id} in the history"
    assert [d for d in json.loads(body)["deployments"] if d["state"] == "running"] == [], \
        f"{tag} a record still running after {dep_id} ended"
    files = list((env.state_dir / "deployments").glob(f"{dep_id}*.json"))
    assert [f.name for f in files] == [f"{dep_id}.json"], f"{tag} state_dir's records of {dep_id}: {files}"
    wait_for(f"{tag} the record on disk ended as the API says, without end_unlogged",
             lambda: (d := record_file(env, dep_id)) and d["state"] == dep["state"] and not d.get("end_unlogged"),
             timeout=30)


def unit_props(env: SweepEnv, unit: str) -> tuple[str, str]:
    out = env.systemd.run(["systemctl", "show", "-p", "ActiveState", "-p", "SubState", unit], check=True).stdout
    props = dict(line.split("=", 1) for line in out.strip().splitlines() if "=" in line)
    return props.get("ActiveState", ""), props.get("SubState", "")


def check_services(env: SweepEnv, tag: str) -> None:
    state = json.loads((env.state_dir / "state.json").read_text())
    services = state.get("services") or ([state["active"]] if state.get("active") else [])
    assert services, f"{tag} state.json lists no service: {state}"
    listed = set()
    for s in services:
        unit = f"modeld-serve@{s['model']}.service"
        listed.add(unit)
        assert unit_props(env, unit) == ("active", "running"), f"{tag} {unit} in state.json is {unit_props(env, unit)}"
        assert link_target(env, s["model"]) == s["commit"], \
            f"{tag} {s['model']}'s link is {link_target(env, s['model'])}, state.json says {s['commit']}"
    assert answers(env.port, MODEL), f"{tag} {MODEL} does not answer a completion"
    out = env.systemd.run(["systemctl", "list-units", "--all", "--plain", "--no-legend", "modeld-serve@*"],
                          check=True).stdout
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 3 and cols[0] not in listed:
            assert cols[2] in ("inactive", "failed"), f"{tag} orphaned unit {cols[0]}: {line.strip()}"


def digest(env: SweepEnv, path: Path, lfs: bool) -> str:
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, lfs)
    if key not in env.hashed:
        h = hashlib.sha256() if lfs else hashlib.sha1(b"blob %d\0" % st.st_size)
        with open(path, "rb") as f:
            while chunk := f.read(MiB):
                h.update(chunk)
        env.hashed[key] = h.hexdigest()
    return env.hashed[key]


def check_store(env: SweepEnv, tag: str) -> None:
    strays = [p.name for p in env.models_dir.iterdir() if ".link-" in p.name]
    assert not strays, f"{tag} temporary links left in models_dir: {strays}"
    for rev in sorted((env.models_dir / ".store" / MODEL).iterdir()):
        commit = rev.name
        if commit not in env.listings:
            remember_listing(env, commit)
        listing = env.listings[commit]
        on_disk = set()
        for f in sorted(rev.rglob("*")):
            rel = f.relative_to(rev).as_posix()
            if rel == ".modeld" or rel.startswith(".modeld/") or not f.is_file():
                continue
            on_disk.add(rel)
            assert rel in listing, f"{tag} {rev.name[:12]}/{rel} is no file of the commit (a temporary file?)"
            want = listing[rel]
            lfs = want["sha256"] is not None
            assert f.stat().st_size == want["size"] and digest(env, f, lfs) == (want["sha256"] or want["sha1"]), \
                f"{tag} {rev.name[:12]}/{rel} does not hash to the hub's listing"
        if (rev / ".modeld" / "manifest.json").is_file():
            assert on_disk == set(listing), f"{tag} verified {commit[:12]} lacks {set(listing) - on_disk}"
            partial = [x.name for x in (rev / ".modeld" / "partial").rglob("*") if x.is_file()]
            assert not partial, f"{tag} partial downloads in the verified revision {commit[:12]}: {partial}"


def check_terminal_line(env: SweepEnv, dep_id: str, dep: dict, tag: str) -> None:
    def terminal():
        found = [e for e in env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}")
                 if e.get("MESSAGE_ID") in TERMINAL_IDS]
        if not found:
            raise NotYet("no terminal line")
        return found
    found = wait_for(f"{tag} the terminal journal line of {dep_id}", terminal, timeout=30)
    assert len(found) == 1, f"{tag} {len(found)} terminal lines for {dep_id}: " + \
        " | ".join(e["MESSAGE"] for e in found)
    assert found[0].get("MODELD_STATE") == dep["state"] == TERMINAL_IDS[found[0]["MESSAGE_ID"]], \
        f"{tag} terminal line {found[0].get('MODELD_STATE')} / {found[0]['MESSAGE']}, record {dep['state']}"


# -- the tests -------------------------------------------------------------------------------------

@pytest.mark.parametrize("point", POINTS, ids=[f"{p.n:02d}-{p.label}" for p in POINTS])
def test_a_kill_at_a_random_point_ends_consistent(env, point):
    run_point(env, point)


def test_a_kill_between_an_ended_record_and_its_journal_line_ends_consistent(env):
    # end_recorded: the record is saved as ended, its terminal journal line not written yet.
    p = Point("deploy", "end_recorded", "push", n=len(POINTS))
    tag = f"[seed {SEED}, point {p.n} {p.label}]"
    row = Row(p.label, killed_in="end_recorded (crash point)")
    env.rows.append(row)
    base = {k: v for k, v in env.environment.items() if k != "MODELD_CRASH_POINT"}
    env.reconfigure(environment={**base, "MODELD_CRASH_POINT": "end_recorded"})
    commit = new_commit(env, "push")
    serving = link_target(env, MODEL)
    mark = journal_mark()
    dep_id = start_deploy(env, MODEL)
    row.point = f"{p.label} {dep_id}"
    wait_line(env, "crash point end_recorded reached", mark, timeout=120)
    t_kill = time.monotonic()
    env.reconfigure(environment=base)  # without the variable; restarts modeld
    dep = ended(env, dep_id, timeout=120)
    row.to_end_s, row.outcome = time.monotonic() - t_kill, dep["state"]
    check_consistent(env, p, dep_id, dep, commit, serving, tag)
    late = wait_line(env, "logged at modeld's start", mark, f"MODELD_DEPLOYMENT={dep_id}", timeout=30)
    assert late["MESSAGE"].startswith(f"deployment {dep_id} succeeded"), f"{tag} {late['MESSAGE']}"
