#!/usr/bin/python3
"""Checks the Ansible collection in ansible/ (modeld.fleet): `ansible-lint --offline` passes with
the production profile, every playbook passes `ansible-playbook --syntax-check`, and every task
that names the Hub token has `no_log: true` (and no diff).

    ansible_collection.py [--self-test]

The collection is linked as DIR/ansible_collections/modeld/fleet in a temporary folder named by
ANSIBLE_COLLECTIONS_PATH, as docs/fleet.md tells users to install it. --self-test breaks copies
of the collection (a task without a name; the token in a task without no_log) and expects each
check to fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

SOURCE = Path(__file__).resolve().parents[2] / "ansible"
TOKEN_VAR = "modeld_hub_token"


def tasks_of(doc) -> list[dict]:
    """Every task (and block member) in a task file or playbook document."""
    out: list[dict] = []
    items = doc if isinstance(doc, list) else []
    for item in items:
        if not isinstance(item, dict):
            continue
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            out += tasks_of(item.get(key) or [])
        if "hosts" not in item:
            out.append(item)
    return out


def token_problems(root: Path) -> list[str]:
    """Tasks that name the token but may print it."""
    problems = []
    for path in sorted(root.rglob("*.yml")):
        if "meta" in path.parts or path.name == "galaxy.yml" or "defaults" in path.parts:
            continue
        for task in tasks_of(yaml.safe_load(path.read_text()) or []):
            body = {k: v for k, v in task.items() if k not in ("block", "rescue", "always")}
            if TOKEN_VAR in yaml.safe_dump(body) and task.get("no_log") is not True:
                problems.append(f"{path.relative_to(root)}: task {task.get('name', '?')!r} names {TOKEN_VAR} without no_log: true")
            if TOKEN_VAR in yaml.safe_dump(body) and "copy" in str(task) and task.get("diff") is not False:
                problems.append(f"{path.relative_to(root)}: task {task.get('name', '?')!r} writes {TOKEN_VAR} without diff: false")
    return problems


def linked(collection: Path, tmp: Path) -> tuple[Path, dict]:
    """The collection linked into a collections path under tmp; (its folder, the environment)."""
    ns = tmp / "ansible_collections" / "modeld"
    ns.mkdir(parents=True)
    (ns / "fleet").symlink_to(collection)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(tmp), ANSIBLE_NOCOLOR="1", NO_COLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"), HOME=str(tmp))
    return ns / "fleet", env


def check(collection: Path) -> list[str]:
    """Every problem of the collection at `collection`; [] when it passes."""
    problems = token_problems(collection)
    with tempfile.TemporaryDirectory(prefix="modeld-ansible-check-") as t:
        where, env = linked(collection, Path(t))
        lint = subprocess.run(["ansible-lint", "--offline", "--profile", "production", "--nocolor"],
                              cwd=where, env=env, capture_output=True, text=True, timeout=600)
        if lint.returncode != 0:
            problems.append("ansible-lint --offline --profile production failed:\n" + lint.stdout + lint.stderr)
        for playbook in sorted((collection / "playbooks").glob("*.yml")):
            syntax = subprocess.run(["ansible-playbook", "--syntax-check", "-i", "localhost,",
                                     f"modeld.fleet.{playbook.stem}"], cwd=t, env=env,
                                    capture_output=True, text=True, timeout=120)
            if syntax.returncode != 0:
                problems.append(f"ansible-playbook --syntax-check {playbook.name}:\n{syntax.stderr}")
    return problems


def self_test() -> int:
    with tempfile.TemporaryDirectory(prefix="modeld-ansible-selftest-") as t:
        unnamed = Path(t) / "unnamed"
        shutil.copytree(SOURCE, unnamed)
        tasks = unnamed / "roles" / "modeld" / "tasks" / "main.yml"
        tasks.write_text(tasks.read_text() + "\n- ansible.builtin.command: modelctl status\n")
        if not any("ansible-lint" in p for p in check(unnamed)):
            print("self-test: a task without a name passed ansible-lint", file=sys.stderr)
            return 1
        leaky = Path(t) / "leaky"
        shutil.copytree(SOURCE, leaky)
        tasks = leaky / "roles" / "modeld" / "tasks" / "main.yml"
        tasks.write_text(tasks.read_text() + "\n- name: Show the token\n  ansible.builtin.debug:\n"
                         "    msg: \"{{ modeld_hub_token }}\"\n")
        if not any("without no_log" in p for p in token_problems(leaky)):
            print("self-test: a task printing the token was not found", file=sys.stderr)
            return 1
    print("self-test: ok")
    return 0


def main() -> int:
    if "--self-test" in sys.argv:
        return self_test()
    for tool in ("ansible-lint", "ansible-playbook"):
        if shutil.which(tool) is None:
            print(f"{tool} is missing (scripts/install-deps.sh installs it)", file=sys.stderr)
            return 1
    problems = check(SOURCE)
    for p in problems:
        print(p, file=sys.stderr)
    if not problems:
        print(f"{SOURCE}: ansible-lint (production profile), syntax checks and no_log on the token: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
