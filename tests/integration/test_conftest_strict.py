"""The strict mode of conftest.py and pytest.ini's xfail_strict, proven on sample tests that a
pytest of their own runs: with MODELD_TESTS_STRICT=1 a skip and an xfail (failing or passing, by
marker or by pytest.xfail()) fail; without it they are skipped and xfailed, and an xfail that
passes fails all the same. The samples run beside copies of this folder's conftest.py and
pytest.ini, started as ctest starts these tests (from their folder, the file by its path)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import conftest

HERE = Path(__file__).resolve().parent

SAMPLES = '''
import pytest

def test_passes():
    pass

@pytest.mark.skip(reason="skipped by a marker")
def test_skip_marker():
    pass

def test_skip_call():
    pytest.skip("skipped by a call")

@pytest.mark.xfail(reason="expected to fail")
def test_xfail_fails():
    assert False

@pytest.mark.xfail(reason="expected to fail, passes")
def test_xfail_passes():
    pass

def test_xfail_call():
    pytest.xfail("xfail by a call")
'''

RESULT = re.compile(r"^test_samples\.py::(\w+) (PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR)\b", re.M)


@pytest.fixture
def samples(tmp_path) -> Path:
    """A folder with the sample tests beside copies of conftest.py and pytest.ini."""
    for name in ("conftest.py", "pytest.ini"):
        shutil.copy(HERE / name, tmp_path / name)
    (tmp_path / "test_samples.py").write_text(SAMPLES)
    return tmp_path


def run_samples(folder: Path, strict: bool) -> tuple[dict[str, str], str]:
    """pytest -v on the samples: ({test: the outcome -v names}, its output)."""
    env = {k: v for k, v in os.environ.items() if k != conftest.STRICT_VARIABLE}
    if strict:
        env[conftest.STRICT_VARIABLE] = "1"
    r = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", str(folder / "test_samples.py")],
                       cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert "configfile: pytest.ini" in r.stdout, r.stdout
    assert r.returncode == 1, r.stdout + r.stderr  # a failed test, never a usage or internal error
    return dict(RESULT.findall(r.stdout)), r.stdout


def test_this_run_reads_pytest_ini_with_xfail_strict(request):
    assert request.config.inipath == HERE / "pytest.ini"
    assert request.config.getini("xfail_strict") is True


def test_without_strict_mode_skips_are_skipped_and_a_passing_xfail_fails(samples):
    results, out = run_samples(samples, strict=False)
    assert results == {"test_passes": "PASSED", "test_skip_marker": "SKIPPED", "test_skip_call": "SKIPPED",
                       "test_xfail_fails": "XFAIL", "test_xfail_passes": "FAILED",
                       "test_xfail_call": "XFAIL"}, out
    assert "[XPASS(strict)] expected to fail, passes" in out, out


def test_strict_mode_fails_every_skip_and_xfail(samples):
    results, out = run_samples(samples, strict=True)
    # A skip marker acts in the setup, so its test fails there: pytest calls that an error.
    assert results == {"test_passes": "PASSED", "test_skip_marker": "ERROR", "test_skip_call": "FAILED",
                       "test_xfail_fails": "FAILED", "test_xfail_passes": "FAILED",
                       "test_xfail_call": "FAILED"}, out
    assert out.count("a skipped test fails the run") == 2, out
    # The two xfails that ran to their expected end; the passing one fails as [XPASS(strict)].
    assert out.count("an expected failure fails the run") == 2, out
    assert "xfail: expected to fail\n" in out and "xfail: reason: xfail by a call\n" in out, out
