"""pytest hooks shared by the integration tests.

MODELD_TESTS_STRICT=1 (.ci/run exports it): a test that is skipped FAILS instead, whatever
skipped it (a module-level `pytestmark = skipif`, a skip marker, `pytest.skip()` in a test or a
fixture, a module that skips itself while being collected), and so does an expected failure (an
`xfail` marker or `pytest.xfail()`, whether the test then fails or passes). CI has every tool and
privilege these tests need, so a skip there means a test that could not fail, and an xfail one
whose result nobody reads; a developer's run without the switch still skips, with the reason
shown by `pytest -rsx`. pytest.ini beside this file sets xfail_strict, so an xfail that passes
fails even without the switch. test_conftest_strict.py runs pytest on sample tests to prove both.
"""

from __future__ import annotations

import os

import pytest

STRICT_VARIABLE = "MODELD_TESTS_STRICT"


def strict() -> bool:
    return os.environ.get(STRICT_VARIABLE, "") not in ("", "0")


def _reason(report) -> str:
    """The skip's reason from a report's longrepr ((path, line, "Skipped: why") for skips)."""
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def _fail_skip(report) -> None:
    report.outcome = "failed"
    report.longrepr = (f"{_reason(report)}\n{STRICT_VARIABLE}=1: a skipped test fails the run "
                       "(CI runs every test; see ARCHITECTURE.md, Tests)")


def _fail_xfail(report) -> None:
    reason = report.wasxfail
    del report.wasxfail  # else pytest still reports it as an expected failure
    report.outcome = "failed"
    report.longrepr = (f"xfail: {reason or '(no reason given)'}\n{STRICT_VARIABLE}=1: an expected failure "
                       "fails the run (CI runs every test; see ARCHITECTURE.md, Tests)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not strict():
        return
    if hasattr(report, "wasxfail"):
        _fail_xfail(report)
    elif report.skipped:
        _fail_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if strict() and report.skipped:
        _fail_skip(report)
