#!/usr/bin/env python3
"""Fails when a deployment phase file includes the driver or the state store.

    phase_includes.py [--root DIR]   check DIR's lib/deploy (default: this repository's)
    phase_includes.py --self-test    check the checker on sample trees

A phase gets what it needs through deploy/phase.hpp's context (and the headers of the phases it
uses) and reports through it; it never drives the deployment (deploy/deployer.hpp) nor writes its
record (deploy/state_store.hpp). The
check follows quoted includes transitively inside lib/deploy ("deploy/x.hpp", or "x.hpp" beside
the including file) and prints each offending chain. Exit status 1 on a violation or a phase
file that is missing.
"""
import io
import pathlib
import re
import sys
import tempfile

import checklib

# The phase files: one per phase of ARCHITECTURE.md's table (lib/deploy/<name>.cpp, required),
# with their headers when they have one (<name>.hpp), a benchmark.cpp should benchmarking get its
# own file, and anything under lib/deploy/phases/ should the phases move there.
PHASES = ["plan", "free_disk", "download", "verify", "stop_old", "launch", "health_check", "cleanup", "rollback"]
OPTIONAL_PHASES = ["benchmark"]
PHASE_FOLDER = "phases"

FORBIDDEN = {"deploy/deployer.hpp": "the driver", "deploy/state_store.hpp": "the state store"}

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def phase_files(deploy):
    """The phase files under the folder `deploy` (lib/deploy), and the required ones missing."""
    files, missing = [], []
    for name in PHASES + OPTIONAL_PHASES:
        for suffix in (".cpp", ".hpp"):
            f = deploy / (name + suffix)
            if f.is_file():
                files.append(f)
            elif suffix == ".cpp" and name in PHASES:
                missing.append(f)
    if (deploy / PHASE_FOLDER).is_dir():
        files += sorted(f for f in (deploy / PHASE_FOLDER).rglob("*") if f.suffix in (".cpp", ".hpp"))
    return files, missing


def included(deploy, f):
    """The lib/deploy files that `f` includes, as (include text, path) pairs."""
    for name in INCLUDE.findall(f.read_text(encoding="utf-8", errors="replace")):
        if name.startswith("deploy/"):
            target = deploy / name[len("deploy/"):]
        elif "/" not in name:
            target = f.parent / name
        else:
            continue  # another stage's header
        yield name if name.startswith("deploy/") else "deploy/" + target.relative_to(deploy).as_posix(), target


def forbidden_chains(deploy, start):
    """Each shortest include chain from `start` to a forbidden header, as a list of names."""
    chains, seen = [], {start.resolve()}
    queue = [(start, [])]
    while queue:
        f, chain = queue.pop(0)
        for name, target in included(deploy, f):
            if name in FORBIDDEN:
                chains.append(chain + [name])
                continue
            if target.is_file() and target.resolve() not in seen:
                seen.add(target.resolve())
                queue.append((target, chain + [name]))
    return chains


def check(root, out=sys.stdout):
    """Checks the phase files under `root`/lib/deploy; returns the number of problems."""
    deploy = root / "lib" / "deploy"
    files, missing = phase_files(deploy)
    problems = 0
    for f in missing:
        problems += 1
        print(f"{f.relative_to(root)}: phase file missing: update PHASES in tests/checks/phase_includes.py",
              file=out)
    for f in files:
        for chain in forbidden_chains(deploy, f):
            problems += 1
            print(f"{f.relative_to(root)} -> {' -> '.join(chain)}: a phase file includes "
                  f"{FORBIDDEN[chain[-1]]}", file=out)
    return problems


def self_test():
    """Checks the checker on sample trees; returns the process's exit status."""
    failures = []
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        deploy = root / "lib" / "deploy"
        deploy.mkdir(parents=True)
        (deploy / "phase.hpp").write_text('#include "deploy/control.hpp"\n#include "util/error.hpp"\n')
        (deploy / "control.hpp").write_text("#pragma once\n")
        for name in PHASES:
            (deploy / (name + ".cpp")).write_text('#include "deploy/phase.hpp"\n')
        report = io.StringIO()
        if check(root, report) != 0:
            failures.append(f"clean tree: expected no problem, got:\n{report.getvalue()}")

        (deploy / "plan.cpp").write_text('#include "deploy/phase.hpp"\n  #  include "deploy/deployer.hpp"\n')
        (deploy / "gpu_watch.hpp").write_text('#include "state_store.hpp"\n')
        (deploy / "launch.cpp").write_text('#include "deploy/gpu_watch.hpp"\n')
        (deploy / "deployer.cpp").write_text('#include "deploy/deployer.hpp"\n')  # the driver may
        (deploy / "rollback.cpp").unlink()
        report = io.StringIO()
        problems = check(root, report)
        expected = ["lib/deploy/plan.cpp -> deploy/deployer.hpp: a phase file includes the driver",
                    "lib/deploy/launch.cpp -> deploy/gpu_watch.hpp -> deploy/state_store.hpp: a phase file "
                    "includes the state store",
                    "lib/deploy/rollback.cpp: phase file missing"]
        if problems != 3 or any(e not in report.getvalue() for e in expected):
            failures.append(f"bad tree: expected {expected}, got:\n{report.getvalue()}")
    return checklib.self_test_verdict(failures)


def main(argv):
    return checklib.main(
        argv, lambda root, args: check(root), self_test,
        "phase includes ok: no phase file includes " + " or ".join(FORBIDDEN),
        lambda n: f"{n} phase include problem(s): phases reach the deployment through deploy/phase.hpp only")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
