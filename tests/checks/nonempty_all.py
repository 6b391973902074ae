#!/usr/bin/env python3
"""Fails when an assertion in tests/integration rests on all() or not any() over what may be empty.

    nonempty_all.py [--root DIR] [PATH...]   check PATH... (files or folders; default: tests/integration)
    nonempty_all.py --self-test              check the checker on sample sources and a broken copy

`all(p(x) for x in X)` and `not any(...)` are true when X is empty, so an assertion that rests on
one (the assert's test, an operand of `and`/`or` in it, under any number of `not`) proves nothing
unless X is known not to be empty. This reads the sources with Python's ast and requires, in the
same function and before that call, one of:
  - an assert that holds X true: `assert X`, an earlier operand of the same `and` (`assert X and
    all(...)`), also through set(X), list(X), sorted(X), tuple(X);
  - an assert comparing len(X) with a positive count (`==`, `>=`), or `len(X) > N`;
  - an assert `X == L` (or `set(X) == L`...) with L a non-empty literal;
  - an assert `N < len(X)` (a chain like `1 < len(X) <= 10` included);
  - X assigned from wait_for(...) (waiting.py: its value is always truthy), from a non-empty
    literal, or from a comprehension that filters nothing over what is shown not empty;
or X a non-empty literal. X is the generator's first iterable (all() of a plain argument: that
argument); for X = A.values(), .keys(), .items(), .splitlines() or .split(SEP), the same about A
counts, and what shows [f(a) for a in A] (no filter), set(A)... not empty shows A not empty. A
generator with an `if` filter is refused whatever is known of X: the filtered elements may be
none. Name them (`warm = [e for e in events if ...]`), assert them, then assert all() over them.
`assert any(...)` fails on nothing and needs no proof. The check reads statements in source
order and does not follow control flow: a proof inside an `if`, or a name assigned again after
its proof, still counts (keep such code out of tests).
Exceptions by (file, function, the iterable's source text) in ALLOWED, each with its reason; an
entry that matches no call fails the check, so the table stays true. Exit status 1 on a problem.
"""
import ast
import io
import pathlib
import re
import shutil
import sys
import tempfile

import checklib

# (file under the root, function, ast.unparse of the iterable): why it may be empty or needs no proof.
ALLOWED = {
    ("tests/integration/test_fixtures.py", "test_a_checkpoint_is_valid_safetensors_with_a_matching_index",
     "zip(spans, spans[1:])"): "adjacent spans of a shard: one of a single tensor has no pair, and the asserts "
                               "on spans[0] and spans[-1] around it cover that case",
    ("tests/integration/test_fixtures.py", "test_fake_vllm_token_seconds_spaces_every_token_and_stays_alive",
     "zip(times, times[1:])"): "len(times) == 5 is asserted before it: four pairs",
}

WRAPPERS = {"set", "list", "sorted", "tuple", "frozenset"}
VIEWS = {"values", "keys", "items", "splitlines"}  # and split(SEP)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.Module)


def same(a, b):
    """Whether two expressions read the same (a name assigned and a name read included)."""
    return ast.unparse(a) == ast.unparse(b)


COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def inner(node):
    """X when `node` is not empty only if X is not: set(X), list(X)..., or a comprehension over X
    that filters nothing; else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in WRAPPERS \
            and len(node.args) == 1 and not node.keywords:
        return node.args[0]
    if isinstance(node, COMPREHENSIONS) and not any(g.ifs for g in node.generators):
        return node.generators[0].iter
    return None


def unwrapped(node):
    """`node` and what it being non-empty shows non-empty too (see inner())."""
    out = [node]
    while (node := inner(node)) is not None:
        out.append(node)
    return out


def nonempty_literal(node):
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return bool(node.elts)
    if isinstance(node, ast.Dict):
        return bool(node.keys)
    return isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and bool(node.value)


MIRRORED = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Eq: ast.Eq}


def positive_count(op, node):
    """Whether `len(X) <op> node` implies X is not empty."""
    if not isinstance(node, ast.Constant) or type(node.value) is not int:
        return False
    return node.value > 0 if isinstance(op, (ast.Eq, ast.GtE)) else isinstance(op, ast.Gt) and node.value >= 0


def len_argument(node):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len" \
            and len(node.args) == 1 and not node.keywords:
        return node.args[0]
    return None


def compared_nonempty(left, op, right):
    """What `left <op> right` (one link of a comparison) shows not empty."""
    if (x := len_argument(left)) is not None and positive_count(op, right):
        return unwrapped(x)
    if (x := len_argument(right)) is not None and type(op) in MIRRORED and positive_count(MIRRORED[type(op)](), left):
        return unwrapped(x)
    if isinstance(op, ast.Eq) and nonempty_literal(right):
        return unwrapped(left)
    return []


def evidence_of(test):
    """What an assert's (or an `and` operand's) truth shows not empty: a list of expressions."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [e for v in test.values for e in evidence_of(v)]
    if isinstance(test, ast.Compare):
        sides = [test.left, *test.comparators]
        return [e for i, op in enumerate(test.ops) for e in compared_nonempty(sides[i], op, sides[i + 1])]
    return unwrapped(test)


def iterable_of(call):
    """(the iterable X of all()/any() `call`, whether its generator filters), or None."""
    if len(call.args) != 1 or call.keywords:
        return None
    arg = call.args[0]
    if isinstance(arg, (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
        return arg.generators[0].iter, any(g.ifs for g in arg.generators)
    return arg, False


def quantifiers(test, negated=False):
    """The all() calls and negated any() calls an assertion's truth rests on, in evaluation
    order, each with the evidence its `and` gives before it: [(call, [expressions])]."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return quantifiers(test.operand, not negated)
    if isinstance(test, ast.BoolOp):
        out, before = [], []
        for v in test.values:
            out += [(c, before + e) for c, e in quantifiers(v, negated)]
            if isinstance(test.op, ast.And) and not negated:
                before = before + evidence_of(v)
        return out
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) \
            and test.func.id == ("any" if negated else "all"):
        return [(test, [])]
    return []


def is_wait_for(value):
    return isinstance(value, ast.Call) and (isinstance(value.func, ast.Name) and value.func.id == "wait_for"
                                            or isinstance(value.func, ast.Attribute) and value.func.attr == "wait_for")


def statements(scope):
    """The statements of `scope` outside nested functions, classes and lambdas, in source order."""
    out, todo = [], list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, SCOPES):
            continue
        if isinstance(node, ast.stmt):
            out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return sorted(out, key=lambda s: (s.lineno, s.col_offset))


def shown_nonempty(x, known):
    """Whether `x` is a non-empty literal or `known` shows it (or what it is a view of) not empty."""
    candidates = [x]
    if isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and (
            x.func.attr in VIEWS or x.func.attr == "split" and x.args):
        candidates.append(x.func.value)
    return nonempty_literal(x) or any(same(c, k) for c in candidates for k in known)


def assigned_nonempty(s, known):
    """The names an assignment `s` gives a value that cannot be empty: wait_for()'s, a non-empty
    literal, or what is not empty when something known is (a comprehension over it...)."""
    if not isinstance(s, ast.Assign):
        return []
    value = s.value
    if is_wait_for(value) or any(shown_nonempty(v, known) for v in unwrapped(value)[1:]) or nonempty_literal(value):
        return [t for t in s.targets if isinstance(t, ast.Name)]
    return []


def problems_in(scope):
    """[(line, iterable text, why)] for the unproven quantifiers of `scope`'s own statements."""
    found, known = [], []
    for s in statements(scope):
        known += assigned_nonempty(s, known)
        if not isinstance(s, ast.Assert):
            continue
        for call, before in quantifiers(s.test):
            it = iterable_of(call)
            if it is None:
                continue
            x, filtered = it
            if filtered:
                found.append((call.lineno, ast.unparse(x), "its generator filters: the elements it checks may "
                              "be none; name them, assert them, then assert all() over them"))
            elif not shown_nonempty(x, known + before):
                found.append((call.lineno, ast.unparse(x), "nothing before it asserts that this is not empty"))
        known += evidence_of(s.test)
    return found


def scopes(tree):
    """(name, node) of the module and every function in it."""
    yield "<module>", tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node


def python_files(root, paths):
    for p in paths:
        full = root / p
        if full.is_file():
            yield full
        elif full.is_dir():
            yield from sorted(f for f in full.rglob("*.py") if f.is_file())
        else:
            raise FileNotFoundError(f"{full}: no such file or folder")


def check(root, paths, out=sys.stdout, allowed=None):
    """Checks the Python files under `paths` (relative to `root`); returns the number of problems."""
    allowed = ALLOWED if allowed is None else allowed
    problems, seen = 0, set()
    for f in python_files(root, paths):
        rel = f.relative_to(root).as_posix()
        tree = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
        for name, scope in scopes(tree):
            for line, text, why in problems_in(scope):
                if (rel, name, text) in allowed:
                    seen.add((rel, name, text))
                    continue
                problems += 1
                print(f"{rel}:{line}: {name}: all()/not any() over {text}: {why} (or list it in "
                      "tests/checks/nonempty_all.py's ALLOWED with a reason)", file=out)
    for key in sorted(allowed.keys() - seen):
        if (root / key[0]).is_file() and any(pathlib.PurePosixPath(key[0]).is_relative_to(p) for p in paths):
            problems += 1
            print(f"{key[0]}: {key[1]}: ALLOWED lists all()/not any() over {key[2]}, which is not there (or "
                  "is proven now): remove the entry", file=out)
    return problems


SAMPLE = '''
def wait_for(what, condition):
    return condition()


def test_proven(xs, d, text, n):
    assert xs
    assert all(x > 0 for x in xs)
    assert d and all(v for v in d.values())
    assert len(n) == 2 and not any(m for m in n)
    assert text.splitlines() and all(line for line in text.splitlines())
    got = wait_for("it", lambda: [1])
    assert all(g for g in got)
    assert sorted(d) == ["a"] and all(d[k] for k in d)
    assert all(c != "x" for c in "abc")
    assert all(k in d for k in ("a", "b"))
    assert 1 < len(ys) <= 10 and all(y for y in ys)
    zs = [x + 1 for x in xs]
    assert all(z for z in zs)
    assert [k for k in d] == ["a", "b"] and all(d.values())
    assert text and all(part for part in text.split(","))


def test_unproven(xs, ys, zs, d):
    assert all(x > 0 for x in xs)
    assert ys or all(y for y in ys)
    assert not any(z for z in zs if z)
    assert len(d) >= 0 and all(d.values())
    assert not (xs and all(x for x in xs))
    def inner():
        assert all(x for x in xs)
    assert xs
    assert all(x for x in ys if x)


def test_allowed(ws):
    assert all(w for w in ws)


def test_not_vacuous(xs):
    assert any(x for x in xs)
    assert not all(x for x in xs)
    if all(x for x in xs):
        pass
'''

EXPECTED = [("test_unproven", 25, "xs"), ("test_unproven", 26, "ys"), ("test_unproven", 27, "zs"),
            ("test_unproven", 28, "d.values()"), ("inner", 31, "xs"), ("test_unproven", 33, "ys")]
REPORTED = re.compile(r"^(\S+?):(\d+): (\w+): all\(\)/not any\(\) over (.+?): ", re.M)


def reported(text):
    """[(function, line, iterable)] of a check's report."""
    return [(m.group(3), int(m.group(2)), m.group(4)) for m in REPORTED.finditer(text)]


def sample_failures(root):
    """The self-test on SAMPLE: exactly EXPECTED reported, the allowed one and a stale entry."""
    failures = []
    (root / "t").mkdir()
    (root / "t" / "test_sample.py").write_text(SAMPLE)
    allowed = {("t/test_sample.py", "test_allowed", "ws"): "a sample", ("t/test_sample.py", "gone", "vs"): "stale"}
    report = io.StringIO()
    problems = check(root, ["t"], report, allowed)
    got = sorted(reported(report.getvalue()))
    if got != sorted(EXPECTED) or problems != len(EXPECTED) + 1 or "gone: ALLOWED lists all()/not any() over vs" \
            not in report.getvalue():
        failures.append(f"sample: expected {EXPECTED} and the stale entry, got:\n{report.getvalue()}")
    return failures


STRIP = re.compile(r"^(\s*assert )(\w+) and ((?:all|not any)\()", re.M)


def broken_copy_failures(root):
    """The self-test on a copy of tests/integration whose `assert X and all(...)` lines lose their
    `X and`: it must fail, on those lines only."""
    copy = root / "copy"
    shutil.copytree(checklib.REPOSITORY / "tests" / "integration", copy / "tests" / "integration",
                    ignore=shutil.ignore_patterns("__pycache__"))
    stripped = set()
    for f in sorted((copy / "tests" / "integration").glob("*.py")):
        text = f.read_text(encoding="utf-8")
        rel = f.relative_to(copy).as_posix()
        stripped |= {(rel, text.count("\n", 0, m.start()) + 1) for m in STRIP.finditer(text)}
        f.write_text(STRIP.sub(r"\1\3", text), encoding="utf-8")
    before, after = io.StringIO(), io.StringIO()
    base = check(checklib.REPOSITORY, ["tests/integration"], before)
    check(copy, ["tests/integration"], after)
    new = set(re.findall(r"^(\S+?):(\d+): ", after.getvalue(), re.M)) - \
        set(re.findall(r"^(\S+?):(\d+): ", before.getvalue(), re.M))
    new = {(f, int(n)) for f, n in new}
    if not stripped or not new or not new <= stripped:
        failures = [f"broken copy: {len(stripped)} line(s) stripped, expected some of them (and only them) "
                    f"reported beyond the {base} problem(s) of the tree, got {sorted(new)}:\n{after.getvalue()}"]
        return failures
    return []


def self_test():
    """Checks the checker on samples and a broken copy; returns the process's exit status."""
    with tempfile.TemporaryDirectory() as d:
        failures = sample_failures(pathlib.Path(d)) + broken_copy_failures(pathlib.Path(d))
    return checklib.self_test_verdict(failures)


def main(argv):
    return checklib.main(
        argv, lambda root, args: check(root, args or ["tests/integration"]), self_test,
        f"all()/not any() ok: each rests on a non-empty iterable ({len(ALLOWED)} allowed)",
        lambda n: f"{n} all()/not any() problem(s): an assertion that holds over nothing proves nothing")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
