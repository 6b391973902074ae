"""End to end, the warming phase on a models_dir that is an ext4 loop image (on tmpfs mincore
shows every page resident): a forced small RAM budget warms a prefix of the checkpoint and says
so (record and journal), and the test's own mincore finds that prefix, and only it, in the page
cache; `plan` says when warming runs; warming cancelled leaves the old model serving, and a
daemon killed during warming continues the deployment in warming, reading from disk no more
than what the test measured missing at the kill; rolling back warms the old revision; a reloaded
`daemon.warm_reserve` sets the next warming's budget. Each measure starts from files whose pages
the test dropped itself (posix_fadvise DONTNEED). Warming is held in its phase by the test-only
read rate MODELD_TEST_WARM_RATE (builds with test hooks), so the test catches it half-way by
waiting for conditions only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from modeld_env import ModeldEnv, ModeldUnreachable, completion, free_port, model_table, wait_for
from nsystemd import unsupported_reason
from page_cache import drop, ext4_models, fs_type, process_io, resident, resident_total, wait_resident

pytestmark = [
    pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or ""),
    pytest.mark.skipif(shutil.which("mkfs.ext4") is None, reason="e2fsprogs (mkfs.ext4) is not installed"),
]

KiB, MiB = 1 << 10, 1 << 20
SHARD = 2 * MiB  # each checkpoint: 3 shards of about 2 MiB
RATE = 512 * KiB  # warming's read rate once the test slows it down: about 12 s per checkpoint
SMALL_BUDGET = {"MODELD_TEST_WARM_BUDGET": str(5 * MiB)}  # the first two shards fit, the third not
WHOLE_BUDGET = {"MODELD_TEST_WARM_BUDGET": str(64 * MiB)}  # a whole checkpoint fits
# modeld's reads besides warming's and its start's (state, manifests), readahead's rounding, and
# pages a reading misses while the kernel migrates them (page_cache.wait_resident)
SLACK = MiB


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with ext4_models(tmp_path_factory.mktemp("warm"), 256 * MiB) as work:
        e = ModeldEnv(workdir=work, environment=SMALL_BUDGET)
        e.ports = {}
        tables = ""
        for n, seed in (("a", 41), ("b", 42), ("c", 43), ("d", 44), ("e", 45)):
            e.add_repo(f"acme/{n}", shards=3, shard_size=SHARD, seed=seed)
            e.ports[n] = free_port()
        # The stand-in servers read only the safetensors headers: what else is resident, warming read.
        for n in ("a", "b", "d", "e"):
            tables += model_table(n, f"acme/{n}", e.ports[n])
        # c never becomes ready: its deployment rolls back.
        tables += model_table("c", "acme/c", e.ports["c"], serve_args=["--fail-health"], startup_timeout="5s")
        e.ports["f"] = free_port()
        tables += model_table("f", "acme/a", e.ports["f"], extra_serve='warm = "off"')
        with e:
            e.start(tables)
            yield e


def messages(env: ModeldEnv, dep_id: str, **fields: str) -> list[str]:
    matches = [f"{k}={v}" for k, v in fields.items()]
    return [x.get("MESSAGE", "") for x in env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}",
                                                        *matches)]


def start_deploy(env: ModeldEnv, model: str) -> str:
    started = env.modelctl("--json", "deploy", model)
    assert started.returncode == 0, started.stdout + started.stderr
    return json.loads(started.stdout)["id"]


def shards(env: ModeldEnv, model: str, commit: str) -> list[Path]:
    return sorted((env.models_dir / ".store" / model / commit).glob("*.safetensors"))


def revision_files(env: ModeldEnv, model: str, commit: str) -> list[Path]:
    """The revision's files (modeld's own .modeld/ folder in it aside)."""
    root = env.models_dir / ".store" / model / commit
    return sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] != ".modeld")


def pulled_and_dropped(env: ModeldEnv, model: str) -> list[Path]:
    """Pulls `model`'s revision (downloaded and verified, no service touched), drops its pages
    from the page cache and checks that they are gone; returns its files, shards first."""
    r = env.modelctl("--json", "pull", model, "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    pull = json.loads(r.stdout)
    assert pull["state"] == "succeeded", pull
    files = revision_files(env, model, pull["commit"])
    assert len(shards(env, model, pull["commit"])) == 3, files
    return dropped(files)


def residency(files: list[Path]) -> list[tuple[str, int, int]]:
    """(name, bytes resident, size) of each file, for failure messages."""
    return [(f.name, resident(f), f.stat().st_size) for f in files]


def dropped(files: list[Path]) -> list[Path]:
    for f in files:
        drop(f)
    assert resident_total(files) <= 64 * KiB, residency(files)
    return sorted(files, key=lambda f: (not f.name.endswith(".safetensors"), f.name))


def warming_read(env: ModeldEnv, dep_id: str, at_least: int):
    d = env.status()["deployment"]
    assert d["id"] == dep_id
    assert d["state"] == "running", d
    return d["phase"] == "warming" and d["warm"] and d["warm"]["bytes_warmed"] >= at_least and d


def test_a_small_budget_warms_a_prefix_and_says_so(env):
    assert fs_type(env.models_dir) == "ext4", "mincore means nothing on a tmpfs"
    files = pulled_and_dropped(env, "a")
    dep = env.deploy_and_wait("a")
    assert dep["state"] == "succeeded", dep
    total = sum(f.stat().st_size for f in files)
    warm = dep["warm"]
    assert warm["bytes_total"] == total, (warm, total)
    assert warm["bytes_resident_before"] <= 64 * KiB, warm
    assert 0 < warm["bytes_warmed"] <= 5 * MiB, warm
    # Between warming and launch the kernel may reclaim or be migrating a few pages (seen: 16 KiB
    # short of bytes_warmed in 2 of 4 runs on a 2-core host); far less than the shard left out.
    assert warm["bytes_resident_at_launch"] >= warm["bytes_warmed"] - 256 * KiB, warm
    assert warm["bytes_resident_at_launch"] < total, warm  # the last shard did not fit
    text = messages(env, dep["id"])
    assert any(m.startswith("warming a at ") for m in text), text
    assert any("RAM budget" in m and files[2].name in m for m in text), text
    # The test's own measure: the budget's prefix (the first two shards) is in the page cache,
    # the third only as far as the server read its header.
    for f in files[:2]:
        wait_resident([f], f.stat().st_size - 64 * KiB)
    assert resident(files[2]) <= MiB, resident(files[2])
    assert resident_total(files) <= warm["bytes_resident_at_launch"] + MiB, warm


def test_plan_says_when_warming_runs(env):
    assert env.status()["active"]["model"] == "a"
    for model, value, line in (("b", "before_stop", "  Warming:    before the old model stops, while it serves"),
                               ("f", "off", "  Warming:    off for this model")):
        plan = env.modelctl("--json", "plan", model)
        assert plan.returncode == 0, plan.stdout + plan.stderr
        assert json.loads(plan.stdout)["warming"] == value, plan.stdout
        text = env.modelctl("plan", model)
        assert text.returncode == 0, text.stdout + text.stderr
        assert line in text.stdout.splitlines(), text.stdout


def test_warming_cancelled_leaves_the_old_model(env):
    env.reconfigure(environment={**WHOLE_BUDGET, "MODELD_TEST_WARM_RATE": str(RATE)})
    pulled_and_dropped(env, "b")
    dep_id = start_deploy(env, "b")
    wait_for("warming to have read some of b", lambda: warming_read(env, dep_id, 1), timeout=120)
    assert env.modelctl("cancel").returncode == 0
    wait_for("the deployment to end", lambda: env.status()["deployment"]["state"] != "running", timeout=60)
    dep = env.status()["deployment"]
    assert dep["state"] == "cancelled" and dep["phase"] == "warming", dep
    assert env.status()["active"]["model"] == "a"
    assert completion(env.ports["a"], "a")


def running_main_pid(env: ModeldEnv) -> int:
    """modeld's main PID, checked to be one: systemd says 0 when the unit has no main process,
    and /proc/0/io is nobody's reads (nor is an old PID's)."""
    pid = env.main_pid()
    assert pid > 0, f"modeld.service has no main PID ({pid})"
    return pid


def killed_while_warming(env: ModeldEnv, dep_id: str, files: list[Path]) -> tuple[int, int]:
    """Waits until warming has read 2 MiB, checks the record is in warming, measures what is
    resident and SIGKILLs modeld; returns (the killed main PID, bytes resident at the kill)."""
    wait_for("warming to have read 2 MiB of b", lambda: warming_read(env, dep_id, 2 * MiB), timeout=120)
    pid = running_main_pid(env)
    before_kill = resident_total(files)
    assert env.status()["deployment"]["phase"] == "warming"  # still warming after the measure
    env.kill_modeld("KILL")
    # Enough was resident that reading it again would exceed the bounds below by far more than SLACK.
    assert before_kill >= 2 * MiB, before_kill
    return pid, before_kill


def new_main_pid(env: ModeldEnv, old: int) -> int:
    pid = env.main_pid()
    return pid if pid not in (0, old) else 0


def reads_of_a_start(env: ModeldEnv, environment: dict[str, str]) -> int:
    """Restarts modeld with `environment` and nothing to continue; returns what its start read
    (rchar: certificates, /proc, state), read once it answers."""
    env.reconfigure(environment=environment)
    return process_io(env.systemd, running_main_pid(env))["rchar"]


def continued_in_warming(env: ModeldEnv, dep_id: str, pid: int) -> None:
    """The journal says process `pid` continued the deployment from a record left in warming,
    and ran warming again (its start and closing lines)."""
    text = messages(env, dep_id)
    assert any(m.startswith(f"continuing deployment {dep_id} of b interrupted in phase warming") for m in text), text
    resumed = messages(env, dep_id, _PID=str(pid), MODELD_PHASE="warming")
    assert any(m.startswith("warming b at ") for m in resumed), resumed
    assert any(m.startswith("warmed ") for m in resumed), resumed


def test_a_daemon_killed_while_warming_continues_it_reading_only_what_is_not_resident(env):
    """docs/interface.md, Warming: "A daemon restart during warming continues the deployment;
    warming then measures again and reads only what is not resident"."""
    assert env.status()["active"]["model"] == "a"
    start_reads = reads_of_a_start(env, {**WHOLE_BUDGET, "MODELD_TEST_WARM_RATE": str(RATE)})
    files = dropped(revision_files(env, "b", env.status()["deployment"]["commit"]))
    total = sum(f.stat().st_size for f in files)
    dep_id = start_deploy(env, "b")
    killed, before_kill = killed_while_warming(env, dep_id, files)
    pid = wait_for("systemd to start modeld again", lambda: new_main_pid(env, killed), timeout=60)
    wait_for("the deployment to end after the restart", lambda: env.status()["deployment"]["state"] != "running",
             timeout=180, retry_on=(ModeldUnreachable,))
    io = process_io(env.systemd, pid)
    assert env.main_pid() == pid
    dep = env.status()["deployment"]
    assert dep["id"] == dep_id and dep["state"] == "succeeded", dep
    continued_in_warming(env, dep_id, pid)
    # The resumed run found what the test measured resident, and read (from disk, and at all)
    # only what was missing; the new process's whole reads bound those of its warming.
    missing = total - before_kill
    assert dep["warm"]["bytes_resident_before"] >= before_kill - SLACK, (dep["warm"], before_kill)
    assert io["read_bytes"] <= missing + SLACK, (io, total, before_kill)
    assert io["rchar"] - start_reads <= missing + SLACK, (io, start_reads, total, before_kill)
    assert io["read_bytes"] >= missing // 2, (io, total, before_kill)  # the counter sees warming's reads
    wait_resident(files, total - 64 * KiB)
    assert env.status()["active"]["model"] == "b"


def test_rolling_back_warms_the_old_revision(env):
    env.reconfigure(environment=SMALL_BUDGET)
    active = env.status()["active"]
    assert active["model"] == "b"
    files = dropped(revision_files(env, "b", active["commit"]))
    dep = env.deploy_and_wait("c", expect_exit=1)
    assert dep["state"] == "rolled_back", dep
    text = messages(env, dep["id"])
    assert any("warming the previous revision of b" in m for m in text), text
    assert any(m.startswith("warming b at ") for m in text), text
    # The budget's prefix of b is back in the page cache (b's stand-in server reads only headers).
    wait_resident(files[:1], files[0].stat().st_size - 64 * KiB)
    assert completion(env.ports["b"], "b")


def set_warm_reserve(env: ModeldEnv, reserve: int) -> None:
    """Writes [daemon] warm_reserve = RESERVE into modeld's configuration and reloads modeld as
    the contract says (systemctl reload: --check-config, then SIGHUP); waits for the reload."""
    lines = [l for l in env.config.read_text().splitlines() if not l.startswith("warm_reserve = ")]
    lines.insert(lines.index("[daemon]") + 1, f"warm_reserve = {reserve}")
    env.config.write_text("\n".join(lines) + "\n")
    reloads = reload_count(env)
    env.systemd.run(["systemctl", "reload", "modeld.service"], check=True)
    wait_for("modeld to reload its configuration", lambda: reload_count(env) > reloads, timeout=60)


def reload_count(env: ModeldEnv) -> int:
    return sum(1 for x in env.journal("SYSLOG_IDENTIFIER=modeld")
               if x.get("MESSAGE", "").startswith("configuration reloaded: "))


def test_warm_reserve_reloaded_by_sighup_sets_the_next_warmings_budget(env):
    """docs/interface.md, Warming: the RAM budget is MemAvailable minus daemon.warm_reserve,
    "Reloadable with SIGHUP"."""
    env.reconfigure(environment={})  # the budget from MemAvailable and the reserve, no test budget
    set_warm_reserve(env, 0)
    files = pulled_and_dropped(env, "d")
    dep = env.deploy_and_wait("d")
    assert dep["state"] == "succeeded", dep
    warm, text = dep["warm"], messages(env, dep["id"])
    assert warm["bytes_resident_before"] + warm["bytes_warmed"] >= warm["bytes_total"], warm
    closing = [m for m in text if m.startswith("warmed ")]
    assert len(closing) == 1 and "RAM budget" not in closing[0], text
    wait_resident(files, warm["bytes_total"] - 64 * KiB)

    set_warm_reserve(env, 1 << 50)  # 1 PiB: more than any MemAvailable, a budget of 0
    files = pulled_and_dropped(env, "e")
    dep = env.deploy_and_wait("e")
    assert dep["state"] == "succeeded", dep
    warm, text = dep["warm"], messages(env, dep["id"])
    assert warm["bytes_warmed"] == 0, warm
    assert any("RAM budget (0 B for warming)" in m and files[0].name in m for m in text), text
    assert resident(files[0]) <= MiB, resident(files[0])  # only the header the server read
