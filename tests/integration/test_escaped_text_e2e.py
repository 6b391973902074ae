"""End to end, text a Hub or a model server controls on its way to people (issue 12, item 6): a
file name with a newline and ESC in a Hub listing, and an inference server's last stderr line
with terminal escapes, quoted in a deployment's error. The API's JSON carries them as they are;
the journal's MESSAGE (`journalctl -o cat` included), modelctl's terminal output and STATUS=
carry them escaped, so neither can forge a line or drive a terminal."""

from __future__ import annotations

import time

import pytest

from modeld_env import ModeldEnv, free_port, model_table
from nsystemd import unsupported_reason

pytestmark = pytest.mark.skipif(unsupported_reason() is not None, reason=unsupported_reason() or "")

FORGED = "modeld: deployment d-forged succeeded"
# A file of the listing whose name ends the journal line and starts one that looks like modeld's.
NAME = f"notes\n\x1b[32m{FORGED}\x1b[0m.json"
NAME_ESCAPED = f"notes\\n\\u001b[32m{FORGED}\\u001b[0m.json"
# The last line of a server that dies while loading: turns the text red with a C1 CSI (U+009B,
# ESC [ in one character). ESC and the other C0 controls of a server's journal lines are
# replaced by spaces where modeld reads them; C1 controls were not.
DIE_LINE = "\u009b31mCUDA error: out of memory"
DIE_LINE_ESCAPED = "\\u009b31mCUDA error: out of memory"
FAILED_ID = "5a0f4e2d8c9b4d7e9f1a2b3c4d5e6f72"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    # Every download of the odd file is corrupted: the deployment fails naming it.
    e = ModeldEnv(workdir=tmp_path_factory.mktemp("escaped"), hub_args=["--corrupt", "acme/odd/notes*"])
    odd = e.add_repo("acme/odd", shards=1, shard_size=64 * 1024, seed=71)
    (odd / NAME).write_text("{}\n")
    e.add_repo("acme/dies", shards=1, shard_size=64 * 1024, seed=72)
    tables = (model_table("odd", "acme/odd", free_port())
              + model_table("dies", "acme/dies", free_port(), startup_timeout="60s",
                            serve_args=["--die-during-load", "0.5", "--progress-every", "0.2",
                                        "--die-line", DIE_LINE.encode("unicode_escape").decode()]))
    try:
        e.start(tables)
        yield e
    finally:
        e.stop()


def text(value) -> str:
    """A journal field as `journalctl -o json` gives it: a string, or its bytes as a list of
    numbers when it is not printable."""
    return bytes(value).decode() if isinstance(value, list) else value


def terminal_line(env, deployment: str) -> dict:
    lines = env.journal(f"MODELD_DEPLOYMENT={deployment}", f"MESSAGE_ID={FAILED_ID}")
    assert len(lines) == 1, lines
    return lines[0]


def assert_one_line_each(where: str, output: str, forged: str) -> None:
    """No terminal control in `output`, and no line of it that begins with `forged`."""
    assert output, f"{where}: no output"
    assert not any(c in output for c in "\x1b\r\x07\u009b"), f"{where}: {output!r}"
    assert not any(line.startswith(forged) for line in output.splitlines()), f"{where}: {output!r}"


def journal_cat(env, since: float) -> str:
    """modeld's lines since `since` as `journalctl -o cat` prints them (MESSAGE only)."""
    return env.systemd.run(["journalctl", "--no-pager", "-o", "cat", f"--since=@{since:.6f}",
                            "SYSLOG_IDENTIFIER=modeld"], check=True).stdout


def test_a_file_name_with_a_newline_and_esc_cannot_forge_a_journal_or_terminal_line(env):
    since = time.time()
    r = env.modelctl("deploy", "odd", "--wait")
    assert r.returncode == 1, r.stdout + r.stderr
    dep = env.status()["deployment"]
    assert dep["state"] == "failed", dep
    # The API's JSON names the file exactly as the Hub listed it.
    assert NAME in dep["error"]["message"], dep["error"]

    line = terminal_line(env, dep["id"])
    message = text(line["MESSAGE"])
    assert isinstance(line["MESSAGE"], str), f"MESSAGE is not printable: {message!r}"
    assert NAME_ESCAPED in message, message
    # The structured field keeps the name byte for byte (journalctl MODELD_FILE=... finds it).
    files = line["MODELD_FILE"]
    files = [files] if not isinstance(files, list) or all(isinstance(b, int) for b in files) else files
    assert NAME in [text(f) for f in files], files
    assert_one_line_each("journalctl -o cat", journal_cat(env, since), FORGED)

    assert NAME_ESCAPED in r.stderr, r.stderr
    assert_one_line_each("modelctl deploy --wait", r.stdout + r.stderr, FORGED)
    status = env.modelctl("status")
    assert status.returncode == 0, status.stderr
    assert NAME_ESCAPED in status.stdout, status.stdout
    assert_one_line_each("modelctl status", status.stdout, FORGED)


def test_a_servers_own_words_quoted_in_an_error_are_escaped(env):
    since = time.time()
    r = env.modelctl("deploy", "dies", "--wait")
    assert r.returncode == 1, r.stdout + r.stderr
    dep = env.status()["deployment"]
    assert dep["error"]["code"] == "unit_failed", dep["error"]
    assert DIE_LINE in dep["error"]["message"], dep["error"]

    message = text(terminal_line(env, dep["id"])["MESSAGE"])
    assert DIE_LINE_ESCAPED in message, message
    # The quoted lines are one journal line: "\n  " between them, escaped.
    assert "its last journal lines:\\n  " in message, message
    assert_one_line_each("journalctl -o cat", journal_cat(env, since), "CUDA error")
    assert DIE_LINE_ESCAPED in r.stderr, r.stderr
    assert_one_line_each("modelctl deploy --wait", r.stdout + r.stderr, "CUDA error")
    # systemd's status text (STATUS=) names the failed deployment on one line.
    status_text = env.systemd.run(["systemctl", "show", "-p", "StatusText", "--value", "modeld.service"],
                                  check=True).stdout
    assert dep["id"] in status_text and len(status_text.strip().splitlines()) == 1, status_text
