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
  - A deployment of the same model, kind and commit already running (a controller that lost its
    connection, or an C(async) task run again) is reattached to by its id instead of starting
    another; any other running record is waited for, up to O(busy_timeout).
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
      - C(rm) deletes that revision (needs O(commit)); the revision in service is refused.
    type: str
    choices: [deploy, pull, rm]
    default: deploy
  allow_downtime:
    description: Passed to C(modelctl deploy --allow-downtime).
    type: bool
    default: false
  busy_timeout:
    description: Seconds to wait while another record runs on the host (HTTP 409), then fail naming it.
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


def running_record(module, name, kind, commit):
    """Waits while another record runs; returns a running record of the same model, kind and
    commit to reattach to, or None when the host is free."""
    deadline = time.monotonic() + module.params["busy_timeout"]
    while True:
        _, status = modelctl(module, "status")
        d = status.get("deployment") or {}
        if d.get("state") != "running":
            return None, status
        if d.get("model") == name and d.get("kind") == kind and (commit is None or d.get("commit") in (None, commit)):
            return d, status
        if time.monotonic() >= deadline:
            module.fail_json(msg="modeld on this host is busy with %s %s of %s for longer than busy_timeout (%ds)"
                             % (d.get("kind", "deploy"), d.get("id"), d.get("model"), module.params["busy_timeout"]))
        time.sleep(module.params["poll_interval"])


def predict(module, name, commit, action, status):
    """Check mode: what the action would change, from modelctl plan and models; changes nothing."""
    if action == "rm":
        return {"changed": commit_on_disk(module, name, commit)}
    args = ["plan", name] + (["--commit", commit] if commit else [])
    _, plan = modelctl(module, *args)
    if action == "pull":
        return {"changed": not plan.get("verified", False), "commit": plan.get("commit")}
    return {"changed": not plan.get("already_serving", False), "already_serving": plan.get("already_serving", False),
            "commit": plan.get("commit")}


def commit_on_disk(module, name, commit):
    _, models = modelctl(module, "models")
    for m in models.get("models", []):
        if m.get("name") == name:
            return any(r.get("commit") == commit for r in m.get("revisions", []))
    return False


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


def remove(module, name, commit, result):
    if not commit_on_disk(module, name, commit):
        module.exit_json(**result)
    modelctl(module, "rm", name, "--commit", commit)
    result["changed"] = True
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


def outcome(record, result):
    """Fills the result from the final record; the message when it did not succeed."""
    result["deployment"] = record
    result["commit"] = record.get("commit")
    result["changed"] = bool(record.get("changed", True)) and record.get("state") == "succeeded"
    switch = record.get("switch") or {}
    result["downtime_s"] = switch.get("downtime_s")
    bench = record.get("benchmark") or {}
    result["decode_tokens_per_s"] = bench.get("decode_tokens_per_s")
    if record.get("state") == "succeeded":
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
            if module.check_mode:
                module.exit_json(**dict(result, changed=commit_on_disk(module, name, commit)))
            remove(module, name, commit, result)
        record, status = run_record(module, name, commit, action)
        result["previous_commit"] = serving_commit(status, name)
        if record is None:
            result.update(predict(module, name, commit, action, status))
            module.exit_json(**result)
        failure = outcome(record, result)
    except ModelctlError as e:
        module.fail_json(msg=str(e), error_code=e.code, **result)
    if failure:
        module.fail_json(msg=failure, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
