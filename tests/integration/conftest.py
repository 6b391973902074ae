"""pytest hooks shared by the integration tests.

MODELD_TESTS_STRICT=1 (.ci/run exports it): a test that is skipped FAILS instead, whatever
skipped it (a module-level `pytestmark = skipif`, a skip marker, `pytest.skip()` in a test or a
fixture, a module that skips itself while being collected). CI has every tool and privilege
these tests need, so a skip there means a test that could not fail; a developer's run without
the switch still skips, with the reason shown by `pytest -rs`.
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if strict() and report.skipped and not hasattr(report, "wasxfail"):
        _fail_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if strict() and report.skipped:
        _fail_skip(report)
