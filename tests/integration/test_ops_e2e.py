"""End to end, the operator's side of modeld under a real (namespaced) systemd: `systemctl reload`
during a running deployment (the deployment goes on, a new model becomes deployable, an invalid
file is refused and the old configuration stays), the journal catalog behind `journalctl -x`,
and /metrics over TCP ([metrics] listen) checked by promtool like the socket's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from modeld_env import SOURCE_DIR, ModeldEnv, free_port, model_table, wait_for
from nsystemd import unsupported_reason
from waiting import poll

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

STARTED, SUCCEEDED, FAILED = ("5a0f4e2d8c9b4d7e9f1a2b3c4d5e6f70", "5a0f4e2d8c9b4d7e9f1a2b3c4d5e6f71",
                              "5a0f4e2d8c9b4d7e9f1a2b3c4d5e6f72")
ALL_IDS = [f"5a0f4e2d8c9b4d7e9f1a2b3c4d5e6f7{n}" for n in range(6)]
CATALOG = SOURCE_DIR / "packaging" / "modeld.catalog"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("ops")
    e = ModeldEnv(workdir=work)
    e.add_repo("acme/slow", shards=2, shard_size=200_000, seed=61)
    e.add_repo("acme/late", shards=2, shard_size=150_000, seed=62)
    e.ports = {"slow": free_port(), "late": free_port(), "metrics": free_port()}
    # [metrics] follows the [hub] lines config_extra is written into.
    e.config_extra = f'\n[metrics]\nlisten = "127.0.0.1:{e.ports["metrics"]}"\n'
    e.tables = (
        # Loads until the test creates the file: the deployment sits in health_checking meanwhile
        # (and at least 8 s, which the phase-duration metrics check).
        model_table("slow", "acme/slow", e.ports["slow"], load_seconds=8,
                    serve_args=["--load-until", str(work / "slow-loaded")])
        # A repository the hub does not have: its deployment fails in planning.
        + model_table("missing", "acme/does-not-exist", free_port()))
    try:
        e.start(e.tables)
        yield e
    finally:
        e.stop()


def reload(env) -> None:
    """systemctl reload modeld, which must succeed and leave the unit active."""
    r = env.systemd.run(["systemctl", "reload", "modeld.service"])
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for("modeld.service to be active after the reload", lambda: env.unit_state("modeld.service") == "active",
             timeout=30)


def wait_line(env, text: str, since: int = 0, timeout: float = 30) -> dict:
    """The first modeld journal line stored at or after `since` (journal_mark()) whose MESSAGE
    contains `text`; on a timeout the error quotes the lines since then."""
    def lines():
        return [e for e in env.journal("SYSLOG_IDENTIFIER=modeld") if int(e["__REALTIME_TIMESTAMP"]) >= since]

    found = poll(lambda: next((e for e in lines() if text in e.get("MESSAGE", "")), None), timeout, 0.2)
    if found is None:
        seen = "\n".join(e.get("MESSAGE", "") for e in lines())
        raise TimeoutError(f"no journal line with {text!r} within {timeout:.0f} s; since the mark:\n{seen}")
    return found


def journal_mark() -> int:
    """Now, as __REALTIME_TIMESTAMP counts (µs since the epoch; the namespace shares the clock)."""
    return time.time_ns() // 1000


def tcp_get(env, path: str, method: str = "GET") -> tuple[int, str, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{env.ports['metrics']}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    # scripts/install-deps.sh installs the Debian package prometheus for it: missing is a failure.
    assert promtool, "promtool is missing: run scripts/install-deps.sh (Debian package prometheus)"
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"promtool check metrics:\n{r.stdout}{r.stderr}\n---\n{text}"


def series(text: str) -> dict[str, float]:
    """sample name with labels -> value."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def shape(text: str) -> list[str]:
    """Comment lines and sample names without their values: what two scrapes share."""
    return [line if line.startswith("#") else line.rsplit(" ", 1)[0] for line in text.splitlines()]


def test_a_reload_during_a_deployment_lets_it_finish_and_makes_a_new_model_deployable(env):
    pid = env.main_pid()
    r = env.modelctl("deploy", "slow")
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for("the deployment of slow to reach health_checking",
             lambda: env.status()["deployment"]["phase"] == "health_checking", timeout=60)
    dep_id = env.status()["deployment"]["id"]
    assert env.modelctl("deploy", "late").returncode != 0  # not configured yet

    mark = journal_mark()
    models_d = env.workdir / "models.d"
    models_d.mkdir(exist_ok=True)
    (models_d / "late.toml").write_text(model_table("late", "acme/late", env.ports["late"]) + """
[models.late.health]
watch_interval = "1s"
""")
    reload(env)
    line = wait_line(env, "configuration reloaded", mark)
    assert "added: late" in line["MESSAGE"], line["MESSAGE"]
    goes_on = wait_line(env, "continues with the configuration it started with", mark)
    assert goes_on.get("MODELD_DEPLOYMENT") == dep_id
    assert env.main_pid() == pid, "the reload restarted modeld"
    # systemd saw RELOADING=1 and READY=1 (the reload's STATUS= text).
    assert wait_line(env, "SIGHUP: reloading the configuration", mark)

    # The deployment was not interrupted: it ends succeeded, same id, never restarted.
    assert env.status()["deployment"]["phase"] == "health_checking"
    (env.workdir / "slow-loaded").touch()
    st = wait_for("the deployment of slow to end",
                  lambda: (s := env.status())["deployment"]["state"] != "running" and s, timeout=120)
    assert st["deployment"]["id"] == dep_id
    assert st["deployment"]["state"] == "succeeded", st["deployment"]
    assert st["active"]["model"] == "slow"
    started = env.journal("SYSLOG_IDENTIFIER=modeld", f"MESSAGE_ID={STARTED}", "MODELD_MODEL=slow")
    assert len(started) == 1
    assert not [e for e in env.journal("SYSLOG_IDENTIFIER=modeld")
                if int(e["__REALTIME_TIMESTAMP"]) >= mark and "interrupted" in e.get("MESSAGE", "")]

    # The model added by the reload deploys, and the watchdog watches it every second.
    dep = env.deploy_and_wait("late")
    assert dep["state"] == "succeeded", dep
    wait_line(env, "watching modeld-serve@late.service every 1.0 s", mark)
    models = json.loads(env.modelctl("--json", "models").stdout)["models"]
    assert {m["name"] for m in models} == {"slow", "late", "missing"}


def test_a_reload_of_the_active_model_rewatches_it_with_the_new_interval(env):
    assert env.status()["active"]["model"] == "late"
    mark = journal_mark()
    (env.workdir / "models.d" / "late.toml").write_text(model_table("late", "acme/late", env.ports["late"]) + """
[models.late.health]
watch_interval = "2s"
""")
    reload(env)
    assert "changed: late" in wait_line(env, "configuration reloaded", mark)["MESSAGE"]
    wait_line(env, "rewrote the drop-in of modeld-serve@late.service", mark)
    wait_line(env, "watching modeld-serve@late.service every 2.0 s", mark)
    assert env.unit_state("modeld-serve@late.service") == "active"


def test_an_invalid_configuration_on_reload_is_refused_and_the_old_one_stays(env):
    pid = env.main_pid()
    mark = journal_mark()
    bad = env.workdir / "models.d" / "zz-bad.toml"
    bad.write_text('[models.broken]\nrepo = "acme/x"\nrevsion = "main"\n[models.broken.serve]\ncommand = ["x"]\n')
    try:
        # systemctl reload checks the file first (ExecReload=modeld --check-config): the reload
        # fails, says why in the journal, and modeld never sees the file.
        r = env.systemd.run(["systemctl", "reload", "modeld.service"])
        assert r.returncode != 0, "systemctl reload succeeded with an invalid configuration"
        wait_line(env, f"{bad}:3:1: unknown key 'revsion'", mark)
        assert env.unit_state("modeld.service") == "active" and env.main_pid() == pid
        assert series(env.metrics()).get('modeld_config_reloads_total{result="failure"}', 0) == 0

        # A SIGHUP sent by hand meets the same check inside modeld.
        mark = journal_mark()
        env.kill_modeld("HUP")
        refused = wait_line(env, "is invalid: 1 problem(s); keeping the configuration in use", mark)
        assert refused["PRIORITY"] == "3"
        problem = wait_line(env, f"{bad}:3:1: unknown key 'revsion'", mark)
        assert problem["PRIORITY"] == "3"
        assert env.main_pid() == pid
        assert env.unit_state("modeld.service") == "active"
        # Still the old configuration: late is there, broken is not.
        r = env.modelctl("deploy", "broken")
        assert r.returncode != 0 and "broken" in (r.stdout + r.stderr)
        text = env.metrics()
        assert series(text)['modeld_config_reloads_total{result="failure"}'] == 1
        assert series(text)["modeld_config_last_reload_successful"] == 0
    finally:
        bad.unlink()

    # A setting that needs a restart is reported and kept; the rest of the file is taken over.
    mark = journal_mark()
    env.write_config(env.tables.replace("acme/does-not-exist", "acme/still-missing"))
    text = env.config.read_text().replace("parallel_files = 4", "parallel_files = 4\nread_timeout = \"7s\"")
    env.config.write_text(text)
    reload(env)
    kept = wait_line(env, "hub.read_timeout changed from 30000 ms to 7000 ms", mark)
    assert "takes effect when modeld restarts" in kept["MESSAGE"]
    assert "changed: missing" in wait_line(env, "configuration reloaded", mark)["MESSAGE"]
    assert series(env.metrics())["modeld_config_last_reload_successful"] == 1


def test_journalctl_x_explains_the_catalogued_deployment_lines(env):
    # Fails in planning: the hub has no such repository.
    r = env.modelctl("deploy", "missing", "--wait")
    assert r.returncode != 0
    failed_id = env.status()["deployment"]["id"]
    assert env.status()["deployment"]["state"] == "failed"

    # The catalog goes where the package puts it, inside the namespace only (private mounts over
    # the host's folders), and the database is rebuilt there.
    work = env.workdir / "catalog"
    usr, var = work / "usr", work / "var"
    usr.mkdir(parents=True, exist_ok=True)
    var.mkdir(parents=True, exist_ok=True)
    for f in Path("/usr/lib/systemd/catalog").glob("systemd.catalog"):
        shutil.copy(f, usr / f.name)
    shutil.copy(CATALOG, usr / "modeld.catalog")
    env.systemd.run(["mount", "--bind", str(usr), "/usr/lib/systemd/catalog"], check=True)
    env.systemd.run(["mkdir", "-p", "/var/lib/systemd/catalog"], check=True)
    env.systemd.run(["mount", "--bind", str(var), "/var/lib/systemd/catalog"], check=True)
    upd = env.systemd.run(["journalctl", "--update-catalog"])
    assert upd.returncode == 0, upd.stderr
    assert "modeld.catalog" not in upd.stderr, upd.stderr  # no parse complaint about our file
    listed = env.systemd.run(["journalctl", "--list-catalog"], check=True).stdout
    for mid in ALL_IDS:
        assert mid in listed, f"{mid} not in the catalog:\n{listed}"

    def explained(*match: str) -> str:
        out = env.systemd.run(["journalctl", "-x", "--no-pager", f"--since=@{env.systemd.started_at:.6f}",
                               "SYSLOG_IDENTIFIER=modeld", *match], check=True).stdout
        return out

    def prose(out: str) -> str:
        """The explanation's text as one line (journalctl wraps it as the catalog does)."""
        return " ".join(line[3:].strip() for line in out.splitlines() if line.startswith(("░░ ", "-- ")))

    out = explained(f"MESSAGE_ID={FAILED}", f"MODELD_DEPLOYMENT={failed_id}")
    # systemd 252 starts explanation lines with "░░ " (older ones with "-- ").
    assert re.search(rf"^(░░|--) Subject: Deployment {failed_id} of model missing failed$", out, re.M), out
    assert re.search(r"^(░░|--) Defined-By: modeld$", out, re.M), out
    assert "ended in state failed during phase planning" in prose(out), out
    assert "hub_not_found (check repo and revision in the configuration)" in prose(out), out

    out = explained(f"MESSAGE_ID={SUCCEEDED}", "MODELD_MODEL=late")
    assert "succeeded: model late serves" in prose(out), out
    assert "launched as modeld-serve@late.service" in prose(out), out
    out = explained(f"MESSAGE_ID={STARTED}", "MODELD_MODEL=slow")
    assert "of model slow started" in prose(out) and "modelctl cancel" in prose(out), out
    print(f"journalctl -x sample:\n{explained(f'MESSAGE_ID={FAILED}', f'MODELD_DEPLOYMENT={failed_id}')}")


def test_metrics_over_tcp_match_the_socket_and_pass_promtool(env):
    # Quiet now (no deployment runs): both scrapes describe the same state.
    assert env.status()["deployment"]["state"] != "running"
    status, ctype, tcp_text = tcp_get(env, "/metrics")
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4"), (status, ctype)
    sock_text = env.metrics()
    assert shape(tcp_text) == shape(sock_text)
    promtool_check(tcp_text)
    promtool_check(sock_text)

    s = series(tcp_text)
    assert s['modeld_deployments_total{result="succeeded"}'] >= 2
    assert s['modeld_deployments_total{result="failed"}'] >= 1
    assert s['modeld_active_model_info{model="late",commit="%s",unit="modeld-serve@late.service"}'
             % env.status()["active"]["commit"]] == 1
    for phase in ("planning", "downloading", "verifying", "launching", "health_checking"):
        assert s[f'modeld_phase_runs_total{{phase="{phase}"}}'] >= 2, phase
        assert s[f'modeld_phase_duration_seconds{{phase="{phase}"}}'] >= 0, phase
    # slow's health_checking waited for its 8 s of loading; late's, the last one, was quick.
    total = s['modeld_phase_seconds_total{phase="health_checking"}']
    assert total >= 8, total
    assert s['modeld_phase_duration_seconds{phase="health_checking"}'] < total
    downloaded = sum(p.stat().st_size for repo in ("acme/slow", "acme/late")
                     for p in (env.repos / repo).rglob("*.safetensors"))
    assert s["modeld_download_bytes_total"] >= downloaded
    assert s["modeld_download_rate_bytes_per_second"] == 0
    assert 'modeld_verification_failures_total{source="deployment"}' in s
    assert s['modeld_config_reloads_total{result="success"}'] >= 2
    wait_for("a watchdog probe of late", lambda: 'modeld_readiness_probe_seconds{model="late"}' in
             series(tcp_get(env, "/metrics")[2]), timeout=30)

    # Read-only, one route.
    assert tcp_get(env, "/v1/status")[0] == 404
    assert tcp_get(env, "/metrics", method="POST")[0] == 405
    print(f"metrics sample:\n{tcp_text}")
