#!/usr/bin/python3
# -*- coding: utf-8 -*-
"""Ansible module modeld.fleet.modeld_deploy: one modeld record (deploy, pull, rm) on one host,
driven through `modelctl --json` (docs/ansible.md)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: modeld_deploy
short_description: Deploy, stage (pull) or remove a model revision with modeld
description:
  - Drives modeld on the target host through C(modelctl --json), reading the DEPLOYMENT record
    that modeld writes, never the daemon's status alone.
  - C(changed) is the record's own C(changed) (a model that already serves that commit with the
    same settings changes nothing); check mode asks C(modelctl plan) instead, whose
    C(already_serving) predicts it.
  - A running record is reattached to by its id (a controller that lost its connection, or an
    C(async) task run again) only when it is what this task would start itself - the same model,
    the same kind (C(deploy) or C(pull)) and the same commit. With O(commit), the record's
    C(commit) must be O(commit); a deployment of the branch whose commit is still null (not
    resolved yet) or another commit is someone else's. Without O(commit), a record still
    resolving the configured revision (commit null) is the same, and one with a commit is the
    same when C(modelctl plan) resolves the configured revision to that commit now.
  - Any other running record (modeld runs one at a time and answers 409 C(deployment_running)
    to the next, docs/interface.md) is waited for, polling C(modelctl status) every
    O(poll_interval) seconds; when it has ended, the task starts its own record. After
    O(busy_timeout) seconds the task fails naming the running record (kind, id, model, commit)
    and changes nothing. Waiting, not failing at once, is what a rollout expects of a host where
    someone else's deployment is about to end; the task still ends with what it asked for.
  - Before reporting success, the final record's C(commit) is compared with O(commit) (when
    given); a record that ended on another commit fails the task, naming both.
  - O(action=rm) of a revision that is not on disk changes nothing. A model neither configured
    nor on disk fails (modeld's 404 C(unknown_model)); the revision in service fails with
    modeld's 409 C(model_active); while a running record deploys, replaces or pulls that model
    (409 C(deployment_running)) the task waits as above, then tries again.
  - Check mode changes nothing and asks only read routes (C(modelctl status), C(models),
    C(plan)); it waits for a running record as the real run would, then predicts the real run's
    refusals as failures - O(action=rm) of the commit in service fails as the real run's 409
    C(model_active) does, an unknown model fails - and otherwise its C(changed).
version_added: "0.1.0"
options:
  name:
    description: The model's name, as configured in C(/etc/modeld/models.d/).
    type: str
    required: true
  commit:
    description:
      - The commit (40 lowercase hex digits) to deploy, pull or remove. The rollout playbook
        resolves the revision to one commit on the controller and passes it to every host.
      - Without it, deploy and pull take the model's configured revision (a branch may move).
    type: str
  action:
    description:
      - C(deploy) puts the commit into service (C(modelctl deploy --commit)).
      - C(pull) downloads and verifies it ahead, touching no service; a pull of the commit in
        service keeps it through the next deployment's cleanup (the fleet's rollback revision).
      - C(rm) deletes that revision (needs O(commit)); the revision in service is refused, in
        check mode too.
    type: str
    choices: [deploy, pull, rm]
    default: deploy
  allow_downtime:
    description: Passed to C(modelctl deploy --allow-downtime).
    type: bool
    default: false
  busy_timeout:
    description: Seconds to wait while another record runs on the host (HTTP 409), then fail naming it
      (its kind, id, model and commit).
    type: int
    default: 3600
  poll_interval:
    description: Seconds between two looks at a busy host.
    type: int
    default: 5
  modelctl:
    description: The modelctl program.
    type: str
    default: modelctl
  socket:
    description: modeld's control socket (default modelctl's, C(/run/modeld/modeld.sock)).
    type: str
notes:
  - "Long switches (a 547 GB checkpoint loads for tens of minutes) belong under C(async) with
    C(poll), e.g. C(async: 7200) and C(poll: 15); a re-run reattaches to the running deployment."
  - "The Hub token never passes through this module: modeld reads its own credential."
author:
  - modeld developers
"""

EXAMPLES = r"""
- name: Stage the new commit ahead, touching no service
  modeld.fleet.modeld_deploy:
    name: kimi-k2-5
    commit: "{{ modeld_commit }}"
    action: pull

- name: Switch to it
  modeld.fleet.modeld_deploy:
    name: kimi-k2-5
    commit: "{{ modeld_commit }}"
  async: 7200
  poll: 15
"""

RETURN = r"""
deployment:
  description: The DEPLOYMENT record as modeld reports it at the end (docs/interface.md).
  returned: when a record ran or was predicted from
  type: dict
previous_commit:
  description: The commit of the model in service before the task, or null.
  returned: always
  type: str
commit:
  description: The commit the record ended on.
  returned: when known
  type: str
downtime_s:
  description: The switch's outage in seconds (the record's switch.downtime_s), or null.
  returned: always
  type: float
decode_tokens_per_s:
  description: The new server's benchmark (the record's benchmark.decode_tokens_per_s), or null.
  returned: always
  type: float
already_serving:
  description: In check mode, the plan's answer.
  returned: check mode, action deploy
  type: bool
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule

COMMIT_CHARS = set("0123456789abcdef")


class ModelctlError(Exception):
    """modelctl exited with an error; `code` is the API's error code when it printed one."""

    def __init__(self, message, code=None, rc=None):
        super().__init__(message)
        self.code, self.rc = code, rc


def modelctl(module, *args):
    """Runs `modelctl --json ARGS`; returns its JSON output (raises ModelctlError)."""
    argv = [module.params["modelctl"], "--json"]
    if module.params["socket"]:
        argv += ["--socket", module.params["socket"]]
    rc, out, err = module.run_command(argv + list(args))
    try:
        body = json.loads(out) if out.strip() else None
    except ValueError:
        body = None
    if rc == 3:
        raise ModelctlError("modeld is unreachable: " + (err.strip() or out.strip()), "unreachable", rc)
    # An API error is {"error": {...}} alone; a DEPLOYMENT record that failed has an "error" too.
    if isinstance(body, dict) and "id" not in body and isinstance(body.get("error"), dict):
        e = body["error"]
        raise ModelctlError("modelctl %s: %s" % (" ".join(args[:2]), e.get("message", "")), e.get("code"), rc)
    if body is None:
        raise ModelctlError("modelctl %s exited %d: %s" % (" ".join(args[:2]), rc, err.strip()), None, rc)
    return rc, body


def serving_commit(status, name):
    """The commit `name` serves according to GET /v1/status, or None."""
    for s in status.get("services") or []:
        if s.get("model") == name:
            return s.get("commit")
    return None


def describe(d):
    """A running record in words: "deploy ID of MODEL at commit C" (or "commit not resolved yet")."""
    at = "at commit %s" % d["commit"] if d.get("commit") else "with its commit not resolved yet"
    return "%s %s of %s %s" % (d.get("kind", "deploy"), d.get("id"), d.get("model"), at)


def watch_host(module, settles, task):
    """Looks at the host's running record every poll_interval until none runs or `settles(record)`
    is true; returns (that record or None, the status). Fails after busy_timeout naming the
    running record and `task` (what this task waits to do)."""
    deadline = time.monotonic() + module.params["busy_timeout"]
    while True:
        _, status = modelctl(module, "status")
        d = status.get("deployment") or {}
        if d.get("state") != "running":
            return None, status
        if settles(d):
            return d, status
        if time.monotonic() >= deadline:
            module.fail_json(msg="modeld on this host is busy with %s for longer than busy_timeout (%ds); "
                                 "%s waited for it to end and changed nothing"
                                 % (describe(d), module.params["busy_timeout"], task))
        time.sleep(module.params["poll_interval"])


def planned_commit(module, name):
    """The commit `modelctl plan NAME` resolves the model's configured revision to now, or None."""
    _, plan = modelctl(module, "plan", name)
    return plan.get("commit")


def is_same_request(module, d, name, kind, commit, resolved):
    """Whether running record `d` is what this task would start: same model, kind and commit.
    Without `commit`, a record still resolving the configured revision is the same, and one with
    a commit when the configured revision resolves to it now (`resolved` caches that by record id)."""
    if d.get("model") != name or d.get("kind", "deploy") != kind:
        return False
    if commit is not None:
        return d.get("commit") == commit
    if d.get("commit") is None:
        return True
    if d.get("id") not in resolved:
        resolved[d.get("id")] = planned_commit(module, name)
    return d.get("commit") == resolved[d.get("id")]


def running_record(module, name, kind, commit):
    """Waits while another record runs; returns (a running record that is this task's own request
    to reattach to, or None when the host is free; the status)."""
    resolved = {}
    task = "this %s of %s%s" % (kind, name, " at commit %s" % commit if commit else "")
    return watch_host(module, lambda d: is_same_request(module, d, name, kind, commit, resolved), task)


def predict(module, name, commit, action, status):
    """Check mode: what the action would change, from modelctl plan; changes nothing."""
    args = ["plan", name] + (["--commit", commit] if commit else [])
    _, plan = modelctl(module, *args)
    if action == "pull":
        return {"changed": not plan.get("verified", False), "commit": plan.get("commit")}
    return {"changed": not plan.get("already_serving", False), "already_serving": plan.get("already_serving", False),
            "commit": plan.get("commit")}


def commit_on_disk(module, name, commit):
    """Whether revision `commit` of model `name` is on disk (modelctl models); fails the task when
    the model is neither configured nor on disk, as modeld's rm would (404 unknown_model)."""
    _, models = modelctl(module, "models")
    for m in models.get("models", []):
        if m.get("name") == name:
            return any(r.get("commit") == commit for r in m.get("revisions") or [])
    module.fail_json(msg="no model named %s is configured or on disk (modeld would answer 404 unknown_model)" % name)


def start(module, name, commit, action):
    """Starts the record; returns its id, or None when the host became busy meanwhile (409)."""
    args = [action, name] + (["--commit", commit] if commit else [])
    if action == "deploy" and module.params["allow_downtime"]:
        args.append("--allow-downtime")
    try:
        _, record = modelctl(module, *args)
    except ModelctlError as e:
        if e.code == "deployment_running":
            return None
        raise
    return record["id"]


def follow(module, record_id):
    """Follows the record to its end (modelctl deployment ID --wait); returns the final record."""
    _, record = modelctl(module, "deployment", record_id, "--wait")
    return record


def may_touch(d, name):
    """Whether running record `d` may deploy, replace or pull model `name` (modeld then refuses an
    rm of it, 409 deployment_running): a record of that model, or a deploy, which may replace it."""
    return d.get("model") == name or d.get("kind", "deploy") == "deploy"


def predict_rm(module, name, commit, result):
    """Check mode of rm: fails as the real run would be refused (the commit in service: 409
    model_active), else predicts the removal; changes nothing."""
    _, status = watch_host(module, lambda d: not may_touch(d, name), "this rm of %s at commit %s" % (name, commit))
    if not commit_on_disk(module, name, commit):
        module.exit_json(**result)
    if serving_commit(status, name) == commit:
        module.fail_json(msg="revision %s of model %s is in service: rm would be refused (409 model_active); "
                             "deploy another revision or model before removing it" % (commit, name), **result)
    module.exit_json(**dict(result, changed=True))


def remove(module, name, commit, result):
    """rm of one revision: nothing when it is not on disk; waits while a running record touches
    the model (409 deployment_running), up to busy_timeout."""
    deadline = time.monotonic() + module.params["busy_timeout"]
    while commit_on_disk(module, name, commit):
        try:
            modelctl(module, "rm", name, "--commit", commit)
            module.exit_json(**dict(result, changed=True))
        except ModelctlError as e:
            if e.code != "deployment_running" or time.monotonic() >= deadline:
                raise
        time.sleep(module.params["poll_interval"])
    module.exit_json(**result)


def run_record(module, name, commit, action):
    """Reattaches to or starts the record and follows it; returns (final record, status before)."""
    while True:
        attach, status = running_record(module, name, action, commit)
        if attach:
            return follow(module, attach["id"]), status
        if module.check_mode:
            return None, status
        record_id = start(module, name, commit, action)
        if record_id:
            return follow(module, record_id), status


def outcome(record, result, commit):
    """Fills the result from the final record; the message when it did not succeed, or ended on
    another commit than `commit` (when one was asked)."""
    result["deployment"] = record
    result["commit"] = record.get("commit")
    result["changed"] = bool(record.get("changed", True)) and record.get("state") == "succeeded"
    switch = record.get("switch") or {}
    result["downtime_s"] = switch.get("downtime_s")
    bench = record.get("benchmark") or {}
    result["decode_tokens_per_s"] = bench.get("decode_tokens_per_s")
    if record.get("state") == "succeeded":
        if commit is not None and record.get("commit") != commit:
            return "%s %s of %s ended on commit %s, not on the commit asked for, %s" % (
                record.get("kind", "deploy"), record.get("id"), record.get("model"), record.get("commit"), commit)
        return None
    err = record.get("error") or {}
    # A rolled-back deployment changed the host twice and left the old model serving.
    result["changed"] = record.get("state") == "rolled_back"
    return "%s %s of %s ended %s in phase %s: %s: %s" % (
        record.get("kind", "deploy"), record.get("id"), record.get("model"), record.get("state"),
        record.get("phase"), err.get("code", "?"), err.get("message", ""))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            commit=dict(type="str"),
            action=dict(type="str", default="deploy", choices=["deploy", "pull", "rm"]),
            allow_downtime=dict(type="bool", default=False),
            busy_timeout=dict(type="int", default=3600),
            poll_interval=dict(type="int", default=5),
            modelctl=dict(type="str", default="modelctl"),
            socket=dict(type="str"),
        ),
        required_if=[("action", "rm", ["commit"])],
        supports_check_mode=True,
    )
    name, commit, action = module.params["name"], module.params["commit"], module.params["action"]
    if commit is not None and (len(commit) != 40 or not set(commit) <= COMMIT_CHARS):
        module.fail_json(msg="commit must be 40 lowercase hex digits, not %r" % commit)
    result = dict(changed=False, previous_commit=None, downtime_s=None, decode_tokens_per_s=None)
    try:
        if action == "rm":
            (predict_rm if module.check_mode else remove)(module, name, commit, result)
        record, status = run_record(module, name, commit, action)
        result["previous_commit"] = serving_commit(status, name)
        if record is None:
            result.update(predict(module, name, commit, action, status))
            module.exit_json(**result)
        failure = outcome(record, result, commit)
    except ModelctlError as e:
        module.fail_json(msg=str(e), error_code=e.code, **result)
    if failure:
        module.fail_json(msg=failure, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
