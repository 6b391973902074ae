"""The systemd backend of units::ServiceManager against a real systemd (namespaced, see nsystemd.py).

tests/tools/units_driver runs inside the namespace, drives a modeld-serve@ instance through
write_dropin, reload, start, status, pids, stop and wait_inactive, and prints what it saw as JSON.
"""

import json
import os
import uuid
from pathlib import Path

import pytest

from nsystemd import NamespacedSystemd, unsupported_reason

TEMPLATE = """\
[Unit]
Description=modeld test server %i

[Service]
ExecStart=/bin/sleep infinity
"""


def driver_path() -> Path:
    if os.environ.get("MODELD_UNITS_DRIVER"):
        return Path(os.environ["MODELD_UNITS_DRIVER"])
    build = Path(os.environ.get("MODELD_BUILD_DIR", Path(__file__).resolve().parents[2] / "build"))
    for candidate in (build / "tests" / "units_driver", build / "units_driver"):
        if candidate.exists():
            return candidate
    pytest.fail(f"units_driver not built under {build} (target units_driver, or set $MODELD_UNITS_DRIVER)")


@pytest.fixture(scope="module")
def systemd():
    reason = unsupported_reason()
    if reason:
        pytest.skip(reason)
    with NamespacedSystemd() as ns:
        yield ns


@pytest.fixture(scope="module")
def driven(systemd):
    systemd.write_file("/run/systemd/system/modeld-serve@.service", TEMPLATE)
    proc = systemd.run([str(driver_path()), "/run/systemd/system", "x"], timeout=120)
    assert proc.returncode == 0, f"driver failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout)


def test_the_drop_in_reaches_the_started_process(driven, systemd):
    assert driven["write_dropin"] == {"ok": True}
    assert driven["reload"] == {"ok": True}
    assert driven["main_env_has_dropin"] is True
    dropin = systemd.run(["cat", "/run/systemd/system/modeld-serve@x.service.d/50-driver.conf"], check=True)
    assert dropin.stdout == "[Service]\nEnvironment=MODELD_DRIVER=1\n"
    mode = systemd.run(["stat", "-c", "%a %a", "/run/systemd/system/modeld-serve@x.service.d",
                        "/run/systemd/system/modeld-serve@x.service.d/50-driver.conf"], check=True)
    assert mode.stdout.split() == ["755", "755", "644", "644"]


def test_a_started_unit_is_active_with_its_main_pid_among_its_pids(driven):
    assert driven["start"] == {"ok": True}
    st = driven["status_running"]
    assert st["active_state"] == "active"
    assert st["sub_state"] == "running"
    assert st["loaded"] is True
    assert st["main_pid"] > 1
    assert driven["pids"] == [st["main_pid"]]


def test_a_stopped_unit_becomes_inactive_and_leaves_no_process(driven):
    assert driven["stop"] == {"ok": True}
    assert driven["wait_inactive"] == {"ok": True}
    after = driven["status_after"]
    assert after["active_state"] == "inactive"
    assert after["main_pid"] == 0
    assert driven["pids_after"] == []


def test_stopping_or_resetting_a_unit_that_is_not_loaded_succeeds(driven):
    assert driven["stop_unloaded"] == {"ok": True}
    assert driven["reset_failed_unloaded"] == {"ok": True}


def test_starting_a_unit_without_a_unit_file_is_unit_failed_naming_it(driven):
    r = driven["start_missing"]
    assert r["ok"] is False
    assert r["code"] == "unit_failed"
    assert "modeld-no-such-unit.service" in r["message"]
    assert "StartUnit" in r["message"]
    st = driven["status_missing"]
    assert st["loaded"] is False
    assert st["active_state"] == "inactive"


def test_journal_lines_carry_the_structured_fields(driven, systemd):
    entry = systemd.wait_journal(lambda e: e.get("MESSAGE") == "units driver started",
                                 matches=["SYSLOG_IDENTIFIER=modeld"])
    assert entry is not None, "the driver's line never reached the journal"
    assert entry["PRIORITY"] == "5"
    assert entry["MODELD_DEPLOYMENT"] == "d-driver"
    assert entry["MODELD_MODEL"] == "x"
    assert entry["MODELD_PHASE"] == "launching"
    assert entry["MODELD_UNIT"] == "modeld-serve@x.service"
    assert entry["FORGED"] == "x"  # "_forged" may not pose as a trusted journal field
    assert "MODELD_STATE" not in entry



def test_a_service_whose_stderr_is_the_journal_logs_each_line_once_with_its_fields(systemd):
    # systemd-run without --pipe connects the service's stderr to the journal ($JOURNAL_STREAM):
    # the automatic sink then writes to journald directly, and nothing to stderr (no duplicate).
    # (No _SYSTEMD_UNIT check: journald may not attribute a line of a process that has already
    # exited; the unique text says where it came from.)
    text = f"automatic to journal {uuid.uuid4().hex}"
    proc = systemd.run(["systemd-run", "--wait", "-q", "--unit=modeld-logtest",
                        str(driver_path()), "--log", text])
    assert proc.returncode == 0, proc.stderr
    entry = systemd.wait_journal(lambda e: text in str(e.get("MESSAGE", "")))
    assert entry is not None, "the line never reached the journal"
    assert entry["MESSAGE"] == text
    assert entry["SYSLOG_IDENTIFIER"] == "modeld"
    assert entry["MODELD_MODEL"] == "x"
    assert entry["MODELD_PHASE"] == "health_checking"
    assert entry["PRIORITY"] == "4"
    same = [e for e in systemd.journal() if text in str(e.get("MESSAGE", ""))]
    assert len(same) == 1, same


def test_a_process_whose_stderr_is_a_pipe_logs_to_stderr(systemd):
    proc = systemd.run(["systemd-run", "--wait", "-q", "--pipe", "--unit=modeld-logtest-pipe",
                        str(driver_path()), "--log", "automatic to stderr"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "WARNING [x health_checking] automatic to stderr\n"
