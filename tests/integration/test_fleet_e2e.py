"""End to end, the fleet (docs/fleet.md): four simulated hosts (tests/integration/fleet.py), each a
namespaced systemd with its own network, overlay root and sshd, get modeld from its .deb through
the collection's role over real SSH, then roll a model with the rollout playbook through the site
cache (config/site-cache/, nginx in its own namespace) in front of the hub fixture (TLS, a token,
a CDN on another address with a nonce in every signed URL, throttled so that hosts overlap).

Checked: every host serves the pinned commit with byte-identical files; the Hub sent at most
1.1 x the checkpoint's file bytes for all four hosts, whose requests overlapped; a second run
changes and restarts nothing; the rollback playbook returns the hosts to the old commit without a
download; a canary that fails health, one that decodes too slowly and one whose decode speed was
not measured stop the rollout after the canary switched to the new commit (its deployment history
and MainPID), with every other host untouched and serving the old model; the slow one's failure
names the speed modeld measured and the baseline, the unmeasured one's says no speed was measured;
the token is in no output, log or CDN request."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet import CACHE, CDN, HUB, Fleet, why_not
from modeld_env import FIXTURES, PYTHON, SOURCE_DIR, package, wait_for
from site_cache import SiteCache, make_tls

sys.path.insert(0, str(FIXTURES))
import make_checkpoint  # noqa: E402

pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")

TOKEN = "hf_fleet_0123456789abcdefFLEET"
MODEL, REPO = "kimi", "acme/kimi"
SHARDS, SHARD_SIZE = 4, 3 * 1024 * 1024
THROTTLE = 4 * 1024 * 1024  # bytes/s per answer of the Hub's CDN: a shard takes most of a second
UNIT = f"modeld-serve@{MODEL}.service"


class Site:
    """The fleet, the hub fixture, the cache and the Ansible set-up of one test module."""

    def __init__(self, work: Path):
        self.work = work
        self.outputs: list[str] = []
        self.fleet = Fleet(work / "fleet", 4).start()
        try:
            self._hub_and_cache()
            self._ansible()
        except BaseException:
            self.stop()
            raise

    def _hub_and_cache(self) -> None:
        sans = ",".join(f"IP:{a},DNS:{a}" for a in (HUB, CDN, CACHE))
        self.ca, cert, key = make_tls(self.work / "pki", sans)
        self.repos = self.work / "repos"
        make_checkpoint.make_checkpoint(str(self.repos / REPO), SHARDS, SHARD_SIZE, 1)
        self.control = self.work / "hub-control.json"
        self.control.write_text(json.dumps({"throttle": THROTTLE}))
        self.requests = self.work / "hub-requests.jsonl"
        ready = self.work / "hub-ready.json"
        self.hub = self.fleet.popen_in(self.fleet.hub_ns, [
            PYTHON, str(FIXTURES / "hub_server.py"), "--repos", str(self.repos), "--host", HUB, "--cdn-host", CDN,
            "--port", "443", "--cdn-port", "443", "--tls-cert", str(cert), "--tls-key", str(key),
            "--token", TOKEN, "--request-log", str(self.requests), "--ready-file", str(ready),
            "--control", str(self.control)], stdout=open(self.work / "hub.log", "wb"), stderr=subprocess.STDOUT)
        wait_for("the hub fixture", lambda: ready.exists() or self.hub.poll() is not None, timeout=120)
        assert self.hub.poll() is None, (self.work / "hub.log").read_text()
        self.cache = SiteCache(self.work / "cache", f"https://{HUB}", CACHE, 443, cert, key, upstream_ca=self.ca,
                               netns=self.fleet.cache_ns, allow=("10.231.0.0/24",)).start()

    def _ansible(self) -> None:
        ns = self.work / "collections" / "ansible_collections" / "modeld"
        ns.mkdir(parents=True)
        (ns / "fleet").symlink_to(SOURCE_DIR / "ansible")
        self.env = self.fleet.ansible_env(self.work / "collections")
        self.inventory = self.fleet.inventory(self.work / "inventory.ini")
        deb = self.work / "modeld.deb"
        shutil.copy(package(), deb)
        stand_in = [PYTHON, str(FIXTURES / "fake_vllm.py"), "serve", "{model_dir}", "--served-model-name",
                    "{served_name}", "--port", "{port}", "--host", "127.0.0.1",
                    # 100 tokens/s, steady enough for a gate at half the baseline; the slow
                    # commit's file makes it 5 tokens/s.
                    "--token-seconds", "0.01",
                    "--token-seconds-file", "{model_dir}/stand_in_token_seconds.txt",
                    "--fail-health-file", "{model_dir}/stand_in_fail_health.txt"]
        self.vars = self.work / "fleet-vars.json"
        self.vars.write_text(json.dumps({
            "modeld_deb": str(deb), "modeld_hub_endpoint": f"https://{CACHE}", "modeld_hub_ca_file": str(self.ca),
            "modeld_hub_token": TOKEN, "modeld_disk_reserve": "0",
            "modeld_models": {MODEL: {"repo": REPO, "revision": "main",
                                      "serve": {"command": stand_in, "port": 8000, "startup_timeout": "60s",
                                                "stop_timeout": "10s"},
                                      "benchmark": {"enabled": True, "max_tokens": 8}}},
            "modeld_model": MODEL, "modeld_repo": REPO, "modeld_revision": "main",
            "modeld_canary_min_ratio": 0.5, "modeld_serial": [1, "50%", "100%"],
            "modeld_cache_upstream_log": str(self.cache.upstream_log)}))

    def playbook(self, name: str, *extra: str, expect_rc: int | None = 0) -> subprocess.CompletedProcess:
        r = self.fleet.ansible(["ansible-playbook", "-i", str(self.inventory), f"modeld.fleet.{name}",
                                "-e", f"@{self.vars}", *extra], self.env, timeout=900)
        self.outputs.append(r.stdout + r.stderr)
        if expect_rc is not None:
            assert r.returncode == expect_rc, f"{name}: exit {r.returncode}\n{r.stdout[-6000:]}{r.stderr[-3000:]}"
        return r

    def hub_stats(self) -> dict:
        r = self.fleet.in_ns(self.fleet.controller_ns, ["curl", "-s", "--cacert", str(self.ca),
                                                        f"https://{HUB}/_fixture/stats"], timeout=30)
        return json.loads(r.stdout)

    def file_bytes(self) -> int:
        """Checkpoint bytes the Hub and its CDN sent so far (file bodies; listings apart)."""
        return sum(self.hub_stats()["by_path"].values())

    def serving(self) -> dict[str, str]:
        """host -> the commit its modeld serves the model at ("" for none)."""
        out = {}
        for h in self.fleet.hosts:
            status = json.loads(h.ok("modelctl", "--json", "status"))
            commits = [s["commit"] for s in status["services"] if s["model"] == MODEL]
            out[h.name] = commits[0] if commits else ""
        return out

    def history(self) -> dict[str, list[dict]]:
        """host -> its modeld's deployment records, oldest first (GET /v1/deployments)."""
        out = {}
        for h in self.fleet.hosts:
            text = h.ok("curl", "-sf", "--unix-socket", "/run/modeld/modeld.sock", "http://modeld/v1/deployments")
            out[h.name] = list(reversed(json.loads(text)["deployments"]))
        return out

    def main_pids(self) -> dict[str, str]:
        return {h.name: h.ok("systemctl", "show", "-p", "MainPID", "--value", UNIT).strip() for h in self.fleet.hosts}

    def stop(self) -> None:
        try:
            if getattr(self, "cache", None):
                self.cache.stop()
            if getattr(self, "hub", None) and self.hub.poll() is None:
                self.hub.terminate()
                self.hub.wait(timeout=20)
        finally:
            self.fleet.stop()


def commit_now(site: Site) -> str:
    r = site.fleet.in_ns(site.fleet.controller_ns, [
        "curl", "-s", "--cacert", str(site.ca), "-H", f"Authorization: Bearer {TOKEN}",
        f"https://{HUB}/api/models/{REPO}/revision/main?expand=sha"], timeout=30)
    return json.loads(r.stdout)["sha"]


def checkpoint_bytes(site: Site) -> int:
    return sum(p.stat().st_size for p in (site.repos / REPO).iterdir() if p.is_file())


def push_checkpoint(site: Site, seed: int, extra: dict[str, str] | None = None) -> str:
    """A new commit of the model: new shards (seed), plus `extra` files; returns its commit."""
    folder = site.repos / REPO
    for f in folder.glob("stand_in_*.txt"):
        f.unlink()
    make_checkpoint.make_checkpoint(str(folder), SHARDS, SHARD_SIZE, seed)
    for name, text in (extra or {}).items():
        tmp = folder / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, folder / name)
    return commit_now(site)


def summary(output: str) -> str:
    m = re.search(r'"msg": \[(.*?)\]', output, re.S)
    return m.group(1) if m else ""


def recap(output: str) -> dict[str, dict[str, int]]:
    out = {}
    for m in re.finditer(r"^(host\d+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", output, re.M):
        out[m.group(1)] = {"ok": int(m.group(2)), "changed": int(m.group(3)), "failed": int(m.group(5))}
    return out


def same_files(site: Site, host, commit: str) -> None:
    """The host's files of the model at `commit` are byte for byte the repository's."""
    folder = f"/var/lib/modeld/models/.store/{MODEL}/{commit}"
    for f in sorted((site.repos / REPO).iterdir()):
        if f.is_file() and not f.name.startswith("."):
            got = host.ok("sha256sum", f"{folder}/{f.name}").split()[0]
            assert got == hashlib.sha256(f.read_bytes()).hexdigest(), f"{host.name}: {f.name}"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    s = Site(tmp_path_factory.mktemp("fleet"))
    try:
        yield s
    finally:
        s.stop()


def test_the_role_installs_modeld_on_every_host_and_a_rollout_puts_one_commit_into_service(site):
    site.playbook("install")
    for h in site.fleet.hosts:
        assert h.ok("stat", "-c", "%a %U", "/etc/modeld/hf-token").strip() == "600 root"
    first = commit_now(site)
    before = site.file_bytes()
    r = site.playbook("rollout")
    assert set(site.serving().values()) == {first}, site.serving()
    for h in site.fleet.hosts:
        same_files(site, h, first)
    fetched = site.file_bytes() - before
    size = checkpoint_bytes(site)
    print(f"first rollout: upstream file bytes {fetched} for 4 hosts, checkpoint {size} ({fetched / size:.3f} x)")
    assert fetched <= 1.1 * size, f"the Hub sent {fetched} bytes for a {size}-byte checkpoint and 4 hosts"
    assert "hosts switched: 4 of 4" in summary(r.stdout), summary(r.stdout)


def test_a_new_commit_is_staged_once_through_the_cache_and_switched_canary_first(site):
    old = set(site.serving().values()).pop()
    new = push_checkpoint(site, 2)
    before = site.file_bytes()
    started = time.time()
    r = site.playbook("rollout")
    assert set(site.serving().values()) == {new}, site.serving()
    for h in site.fleet.hosts:
        same_files(site, h, new)
        kept = json.loads(h.ok("modelctl", "--json", "models"))["models"][0]["revisions"]
        assert any(k["commit"] == old and k["state"] == "verified" for k in kept), kept
    fetched = site.file_bytes() - before
    size = checkpoint_bytes(site)
    print(f"rollout: upstream file bytes {fetched} for 4 hosts, checkpoint {size} ({fetched / size:.3f} x)")
    assert fetched <= 1.1 * size
    # The four hosts' staging requests overlapped at the cache (the cache lock was exercised).
    spans = [(e["msec"] - e["request_time"], e["msec"], e["client"]) for e in site.cache.access()
             if e["msec"] >= started and "/resolve/" in e["uri"] and e["uri"].endswith(".safetensors")]
    first_end = min(s[1] for s in spans)
    assert len({s[2] for s in spans if s[0] < first_end}) == 4, spans
    text = summary(r.stdout)
    print("summary:", text)
    assert "hosts switched: 4 of 4" in text and "downtime" in text and "upstream bytes (site cache):" in text
    # The canary switched alone, before the others.
    batches = re.findall(r"TASK \[Deploy the pinned commit\].*?\n((?:.*\n)*?)\n", r.stdout)
    assert batches and len(set(re.findall(r"host\d", batches[0]))) == 1, batches[:2]


def test_a_second_run_changes_nothing_and_restarts_nothing(site):
    pids = site.main_pids()
    r = site.playbook("rollout")
    assert {h: v["changed"] for h, v in recap(r.stdout).items()} == {f"host{i}": 0 for i in range(1, 5)}, recap(r.stdout)
    assert site.main_pids() == pids
    check = site.playbook("rollout", "--check")
    predicted = {h: v["changed"] for h, v in recap(check.stdout).items()}
    assert predicted == {f"host{i}": 0 for i in range(1, 5)}, check.stdout[-3000:]


def test_the_rollback_playbook_returns_every_host_without_a_download(site):
    record = json.loads(site.fleet.hosts[0].ok("cat", f"/var/lib/modeld-fleet/rollout-{MODEL}.json"))
    before = site.file_bytes()
    site.playbook("rollback")
    assert set(site.serving().values()) == {record["old_commit"]}, site.serving()
    assert site.file_bytes() == before, "the rollback downloaded"


def stopped_at_the_canary(site: Site, seed: int, extra: dict[str, str]) -> tuple[str, list[dict], str, str]:
    """Rolls out a new commit (new shards and `extra` files) that the canary must refuse; checks
    that the rollout failed, every host serves the old commit again, the canary's server was
    restarted and no host past the canary was touched (same MainPID, no deploy record: only the
    staging pulls). Returns (the playbook's output, the canary's new deploy records, the new
    commit, the old one)."""
    old = set(site.serving().values()).pop()
    pids, seen = site.main_pids(), {h: {d["id"] for d in ds} for h, ds in site.history().items()}
    new = push_checkpoint(site, seed, extra)
    r = site.playbook("rollout", expect_rc=None)
    assert r.returncode != 0
    assert set(site.serving().values()) == {old}, site.serving()
    now, records = site.main_pids(), {h: [d for d in ds if d["id"] not in seen[h]] for h, ds in site.history().items()}
    assert now["host1"] != pids["host1"], "the canary's server was never restarted"
    for h in ("host2", "host3", "host4"):
        assert now[h] == pids[h], f"{h}, past the canary, was restarted"
        assert records[h] and {d["kind"] for d in records[h]} == {"pull"}, f"{h}, past the canary: {records[h]}"
    return r.stdout, [d for d in records["host1"] if d["kind"] == "deploy"], new, old


def test_a_canary_that_fails_health_stops_the_rollout(site):
    out, deploys, new, _ = stopped_at_the_canary(site, 3, {"stand_in_fail_health.txt": "1\n"})
    assert "rolled_back" in out, out[-3000:]
    # modeld switched the canary to the new commit and rolled it back itself.
    assert [(d["commit"], d["state"]) for d in deploys] == [(new, "rolled_back")], deploys


def test_a_canary_that_decodes_too_slowly_goes_back_and_stops_the_rollout(site):
    baseline = json.loads(site.fleet.hosts[0].ok("cat", f"/var/lib/modeld-fleet/{MODEL}.json"))["decode_tokens_per_s"]
    out, deploys, new, old = stopped_at_the_canary(site, 4, {"stand_in_token_seconds.txt": "0.2\n"})
    # The canary served the new commit (a succeeded deploy, benchmarked), then the gate deployed
    # the old one back.
    assert [(d["commit"], d["state"]) for d in deploys] == [(new, "succeeded"), (old, "succeeded")], deploys
    measured = deploys[0]["benchmark"]["decode_tokens_per_s"]
    # The stand-in was told to take 0.2 s a token: 5 tokens/s (the time between tokens), slower under load.
    assert 3.5 <= measured <= 5.5, deploys[0]["benchmark"]
    m = re.search(r"host1 failed the decode speed gate on (\w+) and serves (\w+) again: host1 decodes ([\d.]+) "
                  r"tokens/s, below 0.5 x the baseline ([\d.]+) tokens/s", out)
    assert m, out[-3000:]
    assert (m.group(1), m.group(2)) == (new, old), m.group(0)
    assert float(m.group(3)) == pytest.approx(measured, rel=1e-6), m.group(0)
    assert float(m.group(4)) == pytest.approx(baseline, rel=1e-6) and baseline > 2 * 5.5, (m.group(0), baseline)


def vars_without_benchmark(site: Site) -> Path:
    """The site's variables with the model's benchmark off: an extra-vars file for one host."""
    variables = json.loads(site.vars.read_text())
    variables["modeld_models"][MODEL]["benchmark"] = {"enabled": False}
    path = site.work / "fleet-vars-no-benchmark.json"
    path.write_text(json.dumps(variables))
    return path


def test_a_canary_whose_decode_speed_was_not_measured_goes_back_and_stops_the_rollout(site):
    # The gate's other refusal: host1's model has its benchmark off (installed for host1 only, and
    # left so), so its deploy records no speed; a baseline is known (host1's last switch).
    assert json.loads(site.fleet.hosts[0].ok("cat", f"/var/lib/modeld-fleet/{MODEL}.json"))["decode_tokens_per_s"]
    site.playbook("install", "--limit", "host1", "-e", f"@{vars_without_benchmark(site)}")
    out, deploys, new, old = stopped_at_the_canary(site, 5, {})
    # The canary served the new commit, unbenchmarked, then the gate deployed the old one back.
    assert [(d["commit"], d["state"]) for d in deploys] == [(new, "succeeded"), (old, "succeeded")], deploys
    assert deploys[0]["benchmark"] is None, deploys[0]
    m = re.search(r"host1 failed the decode speed gate on (\w+) and serves (\w+) again: host1: no decode speed "
                  r"was measured on commit (\w+)", out)
    assert m, out[-3000:]
    assert m.groups() == (new, old, new), m.group(0)


def test_the_token_reaches_the_hub_only_and_no_output_or_log(site):
    assert site.outputs, "no playbook ran before this test"
    for out in site.outputs:
        assert TOKEN not in out
    requests = [json.loads(line) for line in site.requests.read_text().splitlines() if line.strip()]
    assert any(q["origin"] == "hub" and q["authorization_present"] for q in requests)
    cdn = [q for q in requests if q["origin"] == "cdn"]
    assert cdn and not any(q["authorization_present"] for q in cdn), "no CDN request, or one with the token"
    for log in (site.cache.access_log, site.cache.upstream_log, site.cache.error_log):
        assert TOKEN not in log.read_text(), log
    for h in site.fleet.hosts:
        assert TOKEN not in h.ok("journalctl", "--no-pager", "-o", "cat"), h.name
        assert TOKEN not in h.ok("sh", "-c", "cat /run/systemd/system/modeld-serve@*.service.d/*.conf")
