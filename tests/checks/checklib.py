"""What the source checks in tests/checks share: their command line and the self-test's verdict."""
import pathlib
import sys

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]


def self_test_verdict(failures):
    """Prints the self-test's `failures` (texts) and its verdict; returns the exit status."""
    for f in failures:
        print("self-test: " + f)
    print("self-test: " + ("FAILED" if failures else "ok"))
    return 1 if failures else 0


def main(argv, check, self_test, ok, failed):
    """A check's command line: `--self-test` runs `self_test()`; otherwise `[--root DIR] [ARG...]`
    runs `check(root, args)` (the number of problems it printed) and prints `ok` or
    `failed(problems)`. Returns the exit status: 1 on a problem or an unreadable file."""
    args = argv[1:]
    if args == ["--self-test"]:
        return self_test()
    root = REPOSITORY
    if args[:1] == ["--root"] and len(args) > 1:
        root, args = pathlib.Path(args[1]), args[2:]
    try:
        problems = check(root, args)
    except (OSError, UnicodeError) as e:
        print(e, file=sys.stdout)
        return 1
    if problems:
        print(failed(problems))
        return 1
    print(ok)
    return 0
