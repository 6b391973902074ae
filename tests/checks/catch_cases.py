#!/usr/bin/env python3
"""Fails when a Catch2 case in tests/unit could pass unseen: a case that may or should fail
(`[!mayfail]`, `[!shouldfail]`: a failure counts as a pass) or a hidden case (`[.]`, `[.tag]`,
`[!hide]`, `[!benchmark]`: never listed, so catch_discover_tests never registers it), or a case
whose name starts with "./" (hidden in Catch 1; refused so that none reads as hidden or not);
and when a catch_discover_tests() call of tests/CMakeLists.txt no longer passes `-w NoAssertions`
in its EXTRA_ARGS (without it a case, or a leaf section, that ends without an assertion passes),
or there is no such call.

    catch_cases.py [--root DIR]   check DIR (default: this repository)
    catch_cases.py --self-test    break copies of tests/unit and tests/CMakeLists.txt and expect
                                  each break to be found

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
CMAKE = pathlib.Path("tests/CMakeLists.txt")
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


# catch_discover_tests' keywords (Catch2 2.13): each ends the arguments of the keyword before it.
DISCOVER_KEYWORDS = {"TEST_PREFIX", "TEST_SUFFIX", "WORKING_DIRECTORY", "TEST_SPEC", "EXTRA_ARGS", "PROPERTIES",
                     "REPORTER", "OUTPUT_DIR", "OUTPUT_PREFIX", "OUTPUT_SUFFIX", "TEST_LIST", "DISCOVERY_MODE"}
CMAKE_TOKEN = re.compile(r'#[^\n]*|"(?:\\.|[^"\\])*"|[()]|[^\s()#"]+')


def cmake_calls(text, command):
    """The arguments (unquoted words, comments dropped) of each call of `command` in CMake `text`,
    with the line it starts on."""
    tokens = [(m.start(), m.group(0)) for m in CMAKE_TOKEN.finditer(text) if not m.group(0).startswith("#")]
    for i, (pos, tok) in enumerate(tokens[:-1]):
        if tok.lower() != command or tokens[i + 1][1] != "(":
            continue
        args, depth = [], 1
        for _, t in tokens[i + 2:]:
            depth += {"(": 1, ")": -1}.get(t, 0)
            if depth == 0:
                break
            if t not in ("(", ")"):
                args.append(t[1:-1] if t.startswith('"') else t)
        yield text.count("\n", 0, pos) + 1, args


def keyword_values(args, keyword):
    """The words after `keyword` in `args`, up to the next keyword."""
    out, inside = [], False
    for a in args:
        if a in DISCOVER_KEYWORDS:
            inside = a == keyword
        elif inside:
            out.append(a)
    return out


def discovery_problems(root):
    """The problems of tests/CMakeLists.txt's catch_discover_tests() calls under `root`."""
    calls = list(cmake_calls((root / CMAKE).read_text(encoding="utf-8"), "catch_discover_tests"))
    if not calls:
        return [f"{CMAKE}: no catch_discover_tests() call: the unit cases are not registered with -w NoAssertions"]
    problems = []
    for line, args in calls:
        extra = keyword_values(args, "EXTRA_ARGS")
        if not any(a in ("-w", "--warn") and b == "NoAssertions" for a, b in zip(extra, extra[1:])):
            problems.append(f"{CMAKE}:{line}: catch_discover_tests() without -w NoAssertions in its EXTRA_ARGS: a "
                            "case or leaf section that ends without an assertion would pass")
    return problems


def check(root, out=sys.stdout):
    """Checks tests/unit and tests/CMakeLists.txt under `root`; returns the number of problems
    (printed to `out`)."""
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
    for problem in discovery_problems(root):
        print(problem, file=out)
        count += 1
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


DISCOVER = "EXTRA_ARGS -w NoAssertions"
# Breaks of tests/CMakeLists.txt: (the text that replaces `DISCOVER`, or a function of the whole
# text; what the one problem found must name).
CMAKE_BREAKS = {
    "flag dropped": ("", "without -w NoAssertions"),
    "flag commented out": (f"# {DISCOVER}\n", "without -w NoAssertions"),
    "-w alone": ("EXTRA_ARGS -w", "without -w NoAssertions"),
    "flag in PROPERTIES": ("PROPERTIES -w NoAssertions", "without -w NoAssertions"),
    "no discovery": (lambda text: text.replace("catch_discover_tests(", "add_test("), "no catch_discover_tests()"),
    "a second call without it": (lambda text: text + "\ncatch_discover_tests(unit_extra TEST_PREFIX \"extra: \")\n",
                                 "without -w NoAssertions"),
}


def broken_copy(tmp, key, addition, cmake_break=None):
    """A copy of tests/unit and tests/CMakeLists.txt under `tmp`/`key`, with `addition` appended
    to one test source and the CMake file broken by `cmake_break` (see CMAKE_BREAKS)."""
    root = pathlib.Path(tmp) / key.replace(" ", "_")
    shutil.copytree(checklib.REPOSITORY / UNIT, root / UNIT)
    victim = root / UNIT / "warm" / "warm_test.cpp"
    victim.write_text(victim.read_text() + "\n" + addition)
    text = (checklib.REPOSITORY / CMAKE).read_text(encoding="utf-8")
    if callable(cmake_break):
        text = cmake_break(text)
    elif cmake_break is not None:
        assert DISCOVER in text, f"{CMAKE} lacks {DISCOVER!r}: the self-test's CMake breaks cannot apply"
        text = text.replace(DISCOVER, cmake_break)
    (root / CMAKE).write_text(text, encoding="utf-8")
    return root


def one_problem_failure(root, key, expected):
    """A failure text unless checking `root` finds exactly one problem, naming `expected`."""
    report = io.StringIO()
    problems = check(root, report)
    if problems != 1 or expected not in report.getvalue():
        return [f"{key}: expected one problem naming {expected!r}, got {problems}:\n{report.getvalue()}"]
    return []


def self_test():
    """Each break of a copy of tests/unit or tests/CMakeLists.txt must be found, and nothing
    else; the copy unbroken passes."""
    failures = []
    with tempfile.TemporaryDirectory(prefix="modeld-catch-cases-") as tmp:
        for key, (addition, expected) in BREAKS.items():
            failures += one_problem_failure(broken_copy(tmp, key, addition), key, expected)
        for key, (cmake_break, expected) in CMAKE_BREAKS.items():
            failures += one_problem_failure(broken_copy(tmp, key, "", cmake_break), key, expected)
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
        "Catch2 cases ok: none hidden, none may or should fail, none named ./; discovered with -w NoAssertions",
        lambda n: f"{n} Catch2 case(s) that could pass unseen")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
