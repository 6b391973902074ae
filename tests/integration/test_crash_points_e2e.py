"""End to end: modeld dies at once (a test build's crash point, util/test_hooks.hpp) right after
each decision a deployment makes durable, and the next start continues the deployment to the end
an uninterrupted run has: the same terminal state, the same model and commit in service, older
revisions removed, one deployment in the history. The points: commit_chosen (planning recorded
the commit, the revision folder not made yet), order_decided (planning's result recorded),
old_stopped_recorded (stopping_old recorded that the old model may go, StopUnit not sent yet) and
cleanup_begun (the new model serves, the cleanup of older revisions recorded and not started).
One more point, end_recorded, lies between a record saved as ended and its terminal journal line:
the next start writes that line, once, saying it was logged late.

modeld.service restarts on failure after RestartSec=, still with MODELD_CRASH_POINT set: the test
waits for the crash line, then rewrites the test drop-in without the variable and restarts modeld
itself (an automatic restart in between would only die at the same point again)."""

from __future__ import annotations

import json

import pytest

from contract_helpers import ended, journal_mark, link_target, push, start_deploy, wait_line
from modeld_env import ModeldEnv, free_port, model_table
from nsystemd import unsupported_reason
from waiting import wait_for

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

POINTS = ["commit_chosen", "order_decided", "old_stopped_recorded", "cleanup_begun"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    work = tmp_path_factory.mktemp("crash-points")
    e = ModeldEnv(workdir=work)
    e.add_repo("acme/one", shards=1, shard_size=64 * 1024, seed=90)
    try:
        e.start(model_table("one", "acme/one", free_port()))
        assert e.deploy_and_wait("one")["state"] == "succeeded"
        yield e
    finally:
        e.stop()


def history_ids(env: ModeldEnv) -> list[str]:
    status, _, body = env.api("GET", "/v1/deployments")
    assert status == 200, body
    return [d["id"] for d in json.loads(body)["deployments"]]


def revisions(env: ModeldEnv, model: str) -> list[str]:
    return sorted(p.name for p in (env.models_dir / ".store" / model).iterdir() if p.is_dir())


@pytest.mark.parametrize("point", POINTS)
def test_a_crash_after_a_decision_resumes_to_the_end_of_an_uninterrupted_run(env, point):
    base = {k: v for k, v in env.environment.items() if k != "MODELD_CRASH_POINT"}
    env.reconfigure(environment={**base, "MODELD_CRASH_POINT": point})
    before = history_ids(env)
    old_commit = env.status()["active"]["commit"]
    new_commit = push(env, "acme/one", 100 + POINTS.index(point))
    assert new_commit != old_commit

    mark = journal_mark()
    dep_id = start_deploy(env, "one")
    wait_line(env, f"crash point {point} reached", mark, timeout=60)
    env.reconfigure(environment=base)  # without the variable; restarts modeld
    wait_line(env, "continuing deployment", mark, f"MODELD_DEPLOYMENT={dep_id}", timeout=60)

    dep = ended(env, dep_id)
    assert dep["state"] == "succeeded" and dep["phase"] == "benchmarking" and dep["error"] is None, dep
    assert dep["commit"] == new_commit, dep
    active = env.status()["active"]
    assert active["model"] == "one" and active["commit"] == new_commit, active
    assert link_target(env, "one") == new_commit
    assert revisions(env, "one") == [new_commit]  # the older one is gone, cleaned up once
    after = history_ids(env)
    assert after.count(dep_id) == 1 and after[0] == dep_id, after
    assert after[1:] == before, (before, after)


def terminal_lines(env: ModeldEnv, dep_id: str, since: int) -> list[str]:
    """The messages of modeld's terminal journal lines for `dep_id` since `since`."""
    return [e["MESSAGE"] for e in env.journal("SYSLOG_IDENTIFIER=modeld", f"MODELD_DEPLOYMENT={dep_id}")
            if int(e["__REALTIME_TIMESTAMP"]) >= since
            and e.get("MESSAGE", "").startswith(f"deployment {dep_id} succeeded")]


def test_a_kill_between_an_ended_record_and_its_journal_line_logs_the_line_at_the_next_start(env):
    # end_recorded: the record is saved as succeeded, its terminal journal line not written yet.
    base = {k: v for k, v in env.environment.items() if k != "MODELD_CRASH_POINT"}
    env.reconfigure(environment={**base, "MODELD_CRASH_POINT": "end_recorded"})
    new_commit = push(env, "acme/one", 200)
    mark = journal_mark()
    dep_id = start_deploy(env, "one")
    wait_line(env, "crash point end_recorded reached", mark, timeout=60)
    assert terminal_lines(env, dep_id, mark) == []  # killed before the line
    env.reconfigure(environment=base)  # without the variable; restarts modeld

    line = wait_line(env, "logged at modeld's start", mark, f"MODELD_DEPLOYMENT={dep_id}", timeout=60)
    assert line["MESSAGE"].startswith(f"deployment {dep_id} succeeded: model one at {new_commit[:12]} serves"), line
    dep = ended(env, dep_id)
    assert dep["state"] == "succeeded" and dep["commit"] == new_commit, dep
    assert "end_unlogged" not in dep, dep
    assert env.status()["active"]["commit"] == new_commit
    # The record on disk loses its mark once the line is written, so no later start logs it again.
    record = env.state_dir / "deployments" / f"{dep_id}.json"
    wait_for("the record's end_unlogged mark cleared on disk",
             lambda: "end_unlogged" not in json.loads(record.read_text()), timeout=30)
    assert len(terminal_lines(env, dep_id, mark)) == 1, terminal_lines(env, dep_id, mark)
