#!/usr/bin/env python3
"""Fails when a C++ file under lib/ or daemon/ is too long: over 1,100 lines, or over its own
lower limit in LIMITS (the deployment driver, which should stay a driver).

    file_size.py [--root DIR] [PATH...]   check PATH... (files or folders; default: lib daemon)
    file_size.py --self-test             check the checker on sample files

A file's length is its number of lines, comments included: a reader scrolls through them too.
Exit status 1 on a file over its limit, a limit naming a file that does not exist, or an
unreadable path.
"""
import io
import pathlib
import sys
import tempfile

import checklib
from function_length import source_files

MAX_LINES = 1100

# Files with a limit of their own, each with its reason; a listed file that no longer exists
# fails the check, so the table stays true.
LIMITS = {
    # A ratchet: issue 26 wanted the driver under 700 lines once a run of one record is its own
    # object (it is 329 since); lower this as it shrinks.
    "lib/deploy/deployer.cpp": (340, "the Deployer: the run of a record, the phases, the store requests, boot and queries live in their own files"),
    # Issue 26: the run of one record under 700 lines; its phases are rows of the phase table.
    "lib/deploy/record_run.cpp": (700, "the run of one record: a phase's work is its file, its application its row (phase_table.cpp, a switch strategy's file: restart_switch.cpp)"),
}


def line_count(path):
    """The number of lines in the file at `path` (a last line without a newline counts)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def limit_for(rel):
    """The most lines the file `rel` (relative to the checkout) may have."""
    return LIMITS[rel][0] if rel in LIMITS else MAX_LINES


def check(root, paths, out=sys.stdout):
    """Checks the files under `paths` (relative to `root`); returns the number of problems."""
    problems = 0
    for f in source_files(root, paths):
        rel = f.relative_to(root).as_posix()
        n = line_count(f)
        if n > limit_for(rel):
            problems += 1
            why = f" ({LIMITS[rel][1]})" if rel in LIMITS else ""
            print(f"{rel}: {n} lines, over its limit of {limit_for(rel)}{why}: split it by what "
                  f"each part is for", file=out)
    for rel in sorted(LIMITS):
        if not (root / rel).is_file() and any(pathlib.PurePosixPath(rel).is_relative_to(p) for p in paths):
            problems += 1
            print(f"{rel}: listed in tests/checks/file_size.py's LIMITS but not there: update the "
                  f"entry", file=out)
    return problems


def self_test():
    """Checks the checker on sample files; returns the process's exit status."""
    failures = []
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        (root / "lib" / "deploy").mkdir(parents=True)
        (root / "lib" / "ok.cpp").write_text("int x;\n" * MAX_LINES)
        (root / "lib" / "long.hpp").write_text("int x;\n" * MAX_LINES + "int y;")  # no last newline
        driver = root / "lib" / "deploy" / "deployer.cpp"
        driver.write_text("int x;\n" * (LIMITS["lib/deploy/deployer.cpp"][0] + 1))
        # Every other file with a limit of its own is there, within it.
        for rel in LIMITS:
            if rel != "lib/deploy/deployer.cpp":
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_text("int x;\n")
        report = io.StringIO()
        if check(root, ["lib/ok.cpp"], report):
            failures.append(f"ok.cpp ({MAX_LINES} lines): expected no problem, got:\n{report.getvalue()}")
        report = io.StringIO()
        if check(root, ["lib/long.hpp"], report) != 1 or f"lib/long.hpp: {MAX_LINES + 1} lines" not in report.getvalue():
            failures.append(f"long.hpp: expected {MAX_LINES + 1} lines over the limit, got:\n{report.getvalue()}")
        report = io.StringIO()
        if check(root, ["lib"], report) != 2 or f"lib/deploy/deployer.cpp: {LIMITS['lib/deploy/deployer.cpp'][0] + 1} lines, over its limit" not in report.getvalue():
            failures.append(f"lib: expected long.hpp and the driver over its limit, got:\n{report.getvalue()}")
        driver.unlink()
        report = io.StringIO()
        if check(root, ["lib/deploy"], report) != 1 or "not there" not in report.getvalue():
            failures.append(f"a LIMITS entry for a missing file: expected a problem, got:\n{report.getvalue()}")
    return checklib.self_test_verdict(failures)


def main(argv):
    return checklib.main(
        argv, lambda root, args: check(root, args or ["lib", "daemon"]), self_test,
        f"file sizes ok (limit {MAX_LINES} lines; {len(LIMITS)} file(s) with a lower limit)",
        lambda n: f"{n} file size problem(s) (limit {MAX_LINES} lines)")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
