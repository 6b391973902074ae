#!/usr/bin/env python3
"""Fails when a C++ function is too long: over 80 lines, or `main` at 60 lines or more.

    function_length.py [--root DIR] [PATH...]   check PATH... (files or folders; default: lib daemon)
    function_length.py --self-test             check the checker on sample sources

A function's length runs from the first line of its declaration (template line included) to the
line of its closing brace. This is a brace counter, not a compiler: comments, string and character
literals (raw strings included) and preprocessor lines are blanked first; a "{" at namespace or
class scope opens a function body when the statement before it holds a ")" at its top level, no
"=" there, and does not start with a keyword that opens something else. Lambdas and local classes
count towards the function around them. Exit status 1 on a violation, a stale exception or an
unreadable path.
"""
import io
import pathlib
import re
import sys
import tempfile

import checklib

MAX_LINES = 80
MAIN_MAX_LINES = 59  # `main` stays under 60 lines

# Functions allowed to stay long, by file and name, each with its reason; an entry whose function
# is no longer over its limit fails the check, so the table stays true. Format:
#     ("lib/stage/file.cpp", "Class::function"): "why splitting it would make it harder to read",
EXCEPTIONS = {
}

SOURCE_SUFFIXES = (".cpp", ".hpp", ".cc", ".h")
OPENS_NO_FUNCTION = re.compile(
    r"^(if|for|while|switch|catch|do|else|try|return|namespace|struct|class|enum|union|extern)\b")
CLASS_HEAD = re.compile(r"^(template\s*<[^{]*>\s*)?(struct|class|union|enum)\b")
ACCESS = re.compile(r"^\s*((public|private|protected)\s*:(?!:)\s*)+")
NOT_A_CALLEE = {"decltype", "noexcept", "alignas", "sizeof", "requires", "__attribute__", "throw"}


def blank(text):
    """`text` with comments, literals and preprocessor lines replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            j = i
            while True:  # a directive ends at a newline that no backslash continues
                j = text.find("\n", j)
                if j < 0 or text[j - 1] != "\\":
                    break
                j += 1
            j = n if j < 0 else j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                line_start = False
                continue
            j = text.find(")" + m.group(1) + '"', i + m.end())
            j = n if j < 0 else j + len(m.group(1)) + 2
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):  # 1'000 is a digit separator
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(c)
            if c == "\n":
                line_start = True
            elif not c.isspace():
                line_start = False
            i += 1
            continue
        out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
        i = j
    return "".join(out)


def top_level(head):
    """`head` with what is inside parentheses and brackets dropped (the outer pair kept)."""
    depth, out = 0, []
    for ch in head:
        if ch in "([":
            depth += 1
            out.append(ch if depth == 1 else "")
        elif ch in ")]":
            depth = max(depth - 1, 0)
            out.append(ch if depth == 0 else "")
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def function_name(head):
    """The qualified name in front of a function head's parameter list, or None for no function."""
    head = re.sub(r"\[\[.*?\]\]", " ", head)
    for m in re.finditer(r"((?:[~\w]+\s*::\s*)*(?:operator\s*(?:\(\)|[^\s(]+)|~?\w+))\s*(?:<[^;{}()]*>)?\s*\(", head):
        name = re.sub(r"\s+", "", m.group(1))
        if name.split("::")[-1] not in NOT_A_CALLEE:
            return name
    return None


def is_function_head(head):
    """Whether a statement `head` in front of "{" at namespace or class scope opens a function."""
    if not head or OPENS_NO_FUNCTION.match(head) or CLASS_HEAD.match(head):
        return False
    flat = re.sub(r"operator\s*(\(\)|[^\s(]+)", "operator", top_level(head))
    return ")" in flat and "=" not in flat.replace("==", "") and function_name(head) is not None


def is_member_init_brace(head):
    """Whether "{" after `head` is the brace initializer of a constructor's member or base."""
    flat = top_level(head)
    return (is_function_head(head) and re.search(r"\)\s*(noexcept\s*)?:", flat) is not None
            and re.search(r"[\w>]\s*$", flat) is not None)


def scope_kind(head):
    """What a "{" at namespace or class scope after the statement `head` opens."""
    if re.match(r"(inline\s+)?(namespace|extern)\b", head) or CLASS_HEAD.match(head):
        return "scope"  # namespaces and class bodies hold functions
    return "func" if is_function_head(head) else "block"  # an initializer, ...: nothing to count


def functions(path):
    """Yields (name, first line, last line) of each function body in the file at `path`."""
    text = blank(path.read_text(encoding="utf-8", errors="replace"))
    line_of = _line_index(text)
    stack = []  # ("func", name, first line) | ("init",) | ("scope",) | ("block",)
    head_start = 0
    for k, ch in enumerate(text):
        if ch == "{":
            raw = text[head_start:k]
            head = ACCESS.sub("", raw).strip()
            top = stack[-1][0] if stack else "scope"
            if top in ("func", "block"):
                stack.append(("block",))
            elif top == "init" or is_member_init_brace(head):
                stack.append(("init",))
                continue  # the constructor's head goes on after the initializer
            elif scope_kind(head) == "func":
                first = k - len(ACCESS.sub("", raw).lstrip())  # where the head starts
                stack.append(("func", function_name(head), line_of(first)))
            else:
                stack.append((scope_kind(head),))
            head_start = k + 1
        elif ch == "}":
            frame = stack.pop() if stack else ("scope",)
            if frame[0] == "init":
                continue
            if frame[0] == "func":
                yield frame[1], frame[2], line_of(k)
            head_start = k + 1
        elif ch == ";" and not (stack and stack[-1][0] == "init"):
            head_start = k + 1


def _line_index(text):
    """A function from an offset in `text` to its line number (1-based)."""
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]

    def line_of(offset):
        lo, hi = 0, len(starts)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if starts[mid] <= offset:
                lo = mid
            else:
                hi = mid
        return lo + 1
    return line_of


def limit_for(name):
    """The most lines the function `name` may have."""
    return MAIN_MAX_LINES if name == "main" else MAX_LINES


def source_files(root, paths):
    """The C++ files among `paths` (relative to `root`), folders searched; raises for a missing path."""
    for p in paths:
        full = root / p
        if full.is_file():
            yield full
        elif full.is_dir():
            yield from sorted(f for f in full.rglob("*") if f.suffix in SOURCE_SUFFIXES and f.is_file())
        else:
            raise FileNotFoundError(f"{full}: no such file or folder")


def check(root, paths, out=sys.stdout):
    """Checks the sources under `paths` (relative to `root`); returns the number of problems."""
    problems, seen = 0, set()
    for f in source_files(root, paths):
        rel = f.relative_to(root).as_posix()
        for name, first, last in functions(f):
            length = last - first + 1
            key = (rel, name)
            if length <= limit_for(name):
                continue
            seen.add(key)
            if key in EXCEPTIONS:
                continue
            problems += 1
            print(f"{rel}:{first}: function {name} is {length} lines long "
                  f"(limit {limit_for(name)}): split it, or list it in "
                  f"tests/checks/function_length.py's EXCEPTIONS with a reason", file=out)
    for key in sorted(EXCEPTIONS.keys() - seen):
        if _under(root, key[0], paths):
            problems += 1
            print(f"{key[0]}: {key[1]} is listed in EXCEPTIONS but is not over its limit: "
                  f"remove the entry", file=out)
    return problems


def _under(root, rel, paths):
    """Whether the existing file `rel` is one of `paths` or inside one of them."""
    return (root / rel).is_file() and any(pathlib.PurePosixPath(rel).is_relative_to(p) for p in paths)


SAMPLE = """\
#include "x.hpp"
// a comment with a brace {
namespace n {
struct S {
  S(int a) : a_{a}, b_(a) {}
  int a_{0};
  int b_;
  int short_one() const { return a_; }
};
int long_one() {
  const char* s = "}}}";
  char c = '{';
  auto f = [](int x) { return x; };
BODY
  return f(1);
}
}  // namespace n
int main() {
MAIN
  return 0;
}
"""


def self_test():
    """Checks the checker on sample sources; returns the process's exit status."""
    failures = []
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        (root / "lib").mkdir()
        body = "  int x = 0;\n" * 74  # long_one: 80 lines, the limit
        (root / "lib" / "ok.cpp").write_text(SAMPLE.replace("BODY", body.rstrip("\n")).replace("MAIN", "  int y = 1;\n" * 55))
        (root / "lib" / "long.cpp").write_text(SAMPLE.replace("BODY", body + "  int z = 0;").replace("MAIN", "  int y = 1;\n" * 56))
        (root / "lib" / "raw.cpp").write_text('const char* r = R"x( } { )x";\nvoid g() {\n' + "  h();\n" * 85 + "}\n")
        report = io.StringIO()
        problems = check(root, ["lib/ok.cpp"], report)
        if problems:
            failures.append(f"ok.cpp: expected no problem, got:\n{report.getvalue()}")
        report = io.StringIO()
        problems = check(root, ["lib/long.cpp"], report)
        if problems != 2 or "lib/long.cpp:10: function long_one is 81 lines long (limit 80)" not in report.getvalue() \
                or "lib/long.cpp:92: function main is 60 lines long (limit 59)" not in report.getvalue():
            failures.append(f"long.cpp: expected long_one (81 lines) and main (60 lines), got:\n{report.getvalue()}")
        names = list(functions(root / "lib" / "long.cpp"))
        if [n for n, _, _ in names] != ["S", "short_one", "long_one", "main"]:
            failures.append(f"long.cpp: expected functions S, short_one, long_one, main, got {names}")
        report = io.StringIO()
        if check(root, ["lib/raw.cpp"], report) != 1 or "lib/raw.cpp:2: function g is 87 lines long" not in report.getvalue():
            failures.append(f"raw.cpp: expected g (87 lines), got:\n{report.getvalue()}")
    return checklib.self_test_verdict(failures)


def main(argv):
    return checklib.main(
        argv, lambda root, args: check(root, args or ["lib", "daemon"]), self_test,
        f"function lengths ok (limits: {MAX_LINES} lines, main under {MAIN_MAX_LINES + 1}; "
        f"{len(EXCEPTIONS)} exception(s))",
        lambda n: f"{n} function length problem(s) (limits: {MAX_LINES} lines, main under {MAIN_MAX_LINES + 1})")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
