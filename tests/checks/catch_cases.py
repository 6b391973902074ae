#!/usr/bin/env python3
"""Fails when a Catch2 case in tests/unit could pass unseen: a case that may or should fail
(`[!mayfail]`, `[!shouldfail]`: a failure counts as a pass) or a hidden case (`[.]`, `[.tag]`,
`[!hide]`, `[!benchmark]`: never listed, so catch_discover_tests never registers it), or a case
whose name starts with "./" (hidden in Catch 1; refused so that none reads as hidden or not).

    catch_cases.py [--root DIR]   check DIR (default: this repository)
    catch_cases.py --self-test    break copies of tests/unit and expect each break to be found

Reads every TEST_CASE-like macro (TEST_CASE, TEST_CASE_METHOD, SCENARIO, TEMPLATE_TEST_CASE, ...,
with or without CATCH_) of tests/unit/**/*.cpp and *.hpp: its first string argument is the name,
the argument after it the tags. Tags that are not string literals cannot be read and are refused.
Exit status 1 on a problem.
"""
import io
import pathlib
import re
import shutil
import sys
import tempfile

import checklib

UNIT = pathlib.Path("tests/unit")
MACRO = re.compile(r"\b(?:CATCH_)?(TEST_CASE(?:_METHOD)?|SCENARIO(?:_METHOD)?|TEMPLATE_\w*TEST_CASE\w*|"
                   r"METHOD_AS_TEST_CASE|REGISTER_TEST_CASE)\s*\(")
# Comments, raw and plain string literals, numbers (with ' separators), character literals,
# identifiers, single characters.
TOKEN = re.compile(r'//[^\n]*|/\*.*?\*/|(?:u8|[uUL])?R"([^(\s]*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|'
                   r"\d(?:'?\w)*|'(?:\\.|[^'\\\n])*'|\w+|[^\s\w]", re.S)
REFUSED = {"!mayfail": "may fail (a failure passes)", "!shouldfail": "should fail (a failure passes)",
           "!hide": "is hidden (never registered)", "!benchmark": "is hidden (never registered)"}


def arguments(tokens, start):
    """The top-level arguments of the call whose "(" is tokens[start], each a list of tokens."""
    args, current, depth = [], [], 0
    for tok in tokens[start:]:
        if tok == "(":
            depth += 1
            if depth == 1:
                continue
        elif tok == ")":
            depth -= 1
            if depth == 0:
                return args + [current]
        elif tok == "," and depth == 1:
            args.append(current)
            current = []
            continue
        current.append(tok)
    return args + [current]


RAW = re.compile(r'(?:u8|[uUL])?R"([^(\s]*)\((.*)\)\1"', re.S)


def literal(arg):
    """The text of an argument made of string literals only (adjacent ones joined); else None."""
    texts = []
    for t in arg:
        raw = RAW.fullmatch(t)
        if not raw and not t.startswith('"'):
            return None
        texts.append(raw.group(2) if raw else t[1:-1])
    return "".join(texts) if texts else None


def tag_problem(tag):
    """Why the Catch2 tag `tag` (without brackets) is refused, or None."""
    tag = tag.lower()
    if tag.startswith("."):
        return "is hidden (never registered)"
    return REFUSED.get(tag)


def case_problems(macro, args):
    """The problems of one case: `macro` with its top-level `args`."""
    texts = [literal(a) for a in args]
    named = next((i for i, t in enumerate(texts) if t is not None), None)
    if named is None:
        return [f"{macro} without a string literal for its name cannot be checked"]
    name, problems = texts[named], []
    if name.startswith("./"):
        problems.append(f"case {name!r} starts with './' (hidden in Catch 1)")
    if named + 1 < len(args):
        tags = texts[named + 1]
        if tags is None and not macro.startswith("TEMPLATE_"):
            problems.append(f"case {name!r}: its tags are not a string literal and cannot be checked")
        for tag in re.findall(r"\[([^\]]*)\]", tags or ""):
            why = tag_problem(tag)
            if why:
                problems.append(f"case {name!r} [{tag}] {why}")
    return problems


def cases(text):
    """(line, problems) for each case of a C++ source `text`."""
    matches = [(m.start(), m.group(0)) for m in TOKEN.finditer(text)]
    tokens = [t for _, t in matches]
    for i, tok in enumerate(tokens[:-1]):
        m = MACRO.fullmatch(tok + "(")
        if m and tokens[i + 1] == "(":
            yield text.count("\n", 0, matches[i][0]) + 1, case_problems(m.group(1), arguments(tokens, i + 1))


def check(root, out=sys.stdout):
    """Checks tests/unit under `root`; returns the number of problems (printed to `out`)."""
    count = found = 0
    for f in sorted(p for p in (root / UNIT).rglob("*") if p.suffix in (".cpp", ".hpp") and p.is_file()):
        for line, problems in cases(f.read_text(encoding="utf-8")):
            found += 1
            for problem in problems:
                print(f"{f.relative_to(root)}:{line}: {problem}", file=out)
                count += 1
    if not found:
        print(f"no Catch2 case found under {root / UNIT}", file=out)
        return 1
    print(f"{found} Catch2 cases read", file=out)
    return count


BREAKS = {
    "mayfail": ('TEST_CASE("passes whatever happens", "[!mayfail]") { CHECK(1 == 2); }\n', "[!mayfail] may fail"),
    "shouldfail": ('TEST_CASE("inverted", "[x][!shouldfail]") { CHECK(1 == 2); }\n', "[!shouldfail] should fail"),
    "hidden": ('TEST_CASE("never registered", "[.]") { CHECK(1 == 2); }\n', "[.] is hidden"),
    "hidden tag": ('TEST_CASE_METHOD(Fixture,\n  "never run"\n  " either", "[.slow]") {}\n', "[.slow] is hidden"),
    "hide": ('SCENARIO("hidden scenario", "[!HIDE]") {}\n', "[!HIDE] is hidden"),
    "dot slash": ('TEST_CASE("./old style") {}\n', "starts with './'"),
    "raw string": ('int n = 1\'000;\nTEST_CASE(R"(a "raw" name)", R"x([!mayfail])x") {}\n', "[!mayfail] may fail"),
    "unreadable tags": ('TEST_CASE("tags from a macro", SOME_TAGS) {}\n', "not a string literal"),
}


def broken_copy(tmp, key, addition):
    """A copy of tests/unit under `tmp`/`key` with `addition` appended to one test source."""
    root = pathlib.Path(tmp) / key.replace(" ", "_")
    shutil.copytree(checklib.REPOSITORY / UNIT, root / UNIT)
    victim = root / UNIT / "warm" / "warm_test.cpp"
    victim.write_text(victim.read_text() + "\n" + addition)
    return root


def self_test():
    """Each break of a copy of tests/unit must be found, and nothing else; the copy unbroken passes."""
    failures = []
    with tempfile.TemporaryDirectory(prefix="modeld-catch-cases-") as tmp:
        for key, (addition, expected) in BREAKS.items():
            report = io.StringIO()
            problems = check(broken_copy(tmp, key, addition), report)
            if problems != 1 or expected not in report.getvalue():
                failures.append(f"{key}: expected one problem naming {expected!r}, got {problems}:\n{report.getvalue()}")
        clean = ('TEST_CASE("a name with [.] in it", "[tag][!throws]") { CHECK(1 == 1); }\n'
                 '// TEST_CASE("commented out", "[!mayfail]")\nconst char* s = "TEST_CASE(\\"x\\", \\"[.]\\")";\n')
        report = io.StringIO()
        if check(broken_copy(tmp, "clean", clean), report) != 0:
            failures.append(f"a name, a comment and a string that only look like refused cases were refused:\n"
                            f"{report.getvalue()}")
    return checklib.self_test_verdict(failures)


def main(argv):
    return checklib.main(
        argv, lambda root, args: check(root), self_test,
        "Catch2 cases ok: none hidden, none may or should fail, none named ./",
        lambda n: f"{n} Catch2 case(s) that could pass unseen")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
