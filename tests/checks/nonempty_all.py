#!/usr/bin/env python3
"""Fails when an assertion in tests/integration rests on all() or not any() over what may be empty,
or is a loop of asserts over what may be empty.

    nonempty_all.py [--root DIR] [PATH...]   check PATH... (files or folders; default: tests/integration)
    nonempty_all.py --self-test              check the checker on sample sources and broken copies

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
`assert any(...)` fails on nothing and needs no proof. A name assigned such a value (`ok =
all(...)`, `found = any(...)`) and asserted later (`assert ok`, `assert X and not found`) counts
as that value asserted there, its call reported on the assignment's line.
A loop whose body does nothing but assert (`for x in X: assert p(x)`, loops of such loops
included, without an `else:`) is all() over X by another name, and X needs the same proof; a
loop that does anything else (an `if`, a call) is not read. For X itself, sorted(X), set(X)...,
enumerate(X), reversed(X), a comprehension with one unfiltered generator over X, and the views
above are proven by a proof of X; range(N) of int literals is non-empty when it holds a number.
The check reads statements in source order and does not follow control flow: a proof inside an
`if`, or a name assigned again after its proof, still counts (keep such code out of tests).
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

# (file under the root, function, ast.unparse of the iterable of an all()/not any() or of a loop of
# asserts): why it may be empty or needs no proof.
ALLOWED = {
    ("tests/integration/test_fixtures.py", "test_a_checkpoint_is_valid_safetensors_with_a_matching_index",
     "zip(spans, spans[1:])"): "adjacent spans of a shard: one of a single tensor has no pair, and the asserts "
                               "on spans[0] and spans[-1] around it cover that case",
    ("tests/integration/test_fixtures.py", "test_fake_vllm_token_seconds_spaces_every_token_and_stays_alive",
     "zip(times, times[1:])"): "len(times) == 5 is asserted before it: four pairs",
    ("tests/integration/test_ops_e2e.py", "test_journalctl_x_explains_the_catalogued_deployment_lines",
     "ALL_IDS"): "the module's constant list of the six catalogued MESSAGE_IDs ([... for n in range(6)]), "
                 "which the check does not follow from module to function",
    ("tests/integration/test_fleet_e2e.py",
     "test_the_role_installs_modeld_on_every_host_and_a_rollout_puts_one_commit_into_service",
     "site.fleet.hosts"): "Fleet(workdir) boots its n_hosts = 4 hosts or raises (fleet.py), and later "
                          "tests of the module name host1..host4",
    ("tests/integration/test_fleet_e2e.py", "test_the_token_reaches_the_hub_only_and_no_output_or_log",
     "site.fleet.hosts"): "Fleet(workdir) boots its n_hosts = 4 hosts or raises (fleet.py), and earlier "
                          "tests of the module name host1..host4",
}

WRAPPERS = {"set", "list", "sorted", "tuple", "frozenset"}
# Not empty exactly when their argument is not, but always true themselves: never evidence.
SAME_LENGTH = {"enumerate", "reversed"}
VIEWS = {"values", "keys", "items", "splitlines"}  # and split(SEP)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.Module)


def same(a, b):
    """Whether two expressions read the same (a name assigned and a name read included)."""
    return ast.unparse(a) == ast.unparse(b)


COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def inner(node):
    """X when `node` is not empty exactly when X is not: set(X), list(X)..., or a comprehension
    with one generator, over X, that filters nothing; else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in WRAPPERS \
            and len(node.args) == 1 and not node.keywords:
        return node.args[0]
    if isinstance(node, COMPREHENSIONS) and len(node.generators) == 1 and not node.generators[0].ifs:
        return node.generators[0].iter
    return None


def unwrapped(node):
    """`node` and what it being non-empty shows non-empty too (see inner())."""
    out = [node]
    while (node := inner(node)) is not None:
        out.append(node)
    return out


def nonempty_range(node):
    """Whether `node` is range(N) or range(A, B) of int literals that holds a number."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
            and 1 <= len(node.args) <= 2 and not node.keywords):
        return False
    bounds = [a.value if isinstance(a, ast.Constant) and type(a.value) is int else None for a in node.args]
    if None in bounds:
        return False
    low, high = bounds if len(bounds) == 2 else (0, bounds[0])
    return high > low


def nonempty_literal(node):
    """Whether `node` is a literal that is not empty (a list, tuple, set, dict, string, bytes) or
    a range of literals that holds a number."""
    if nonempty_range(node):
        return True
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


def quantifiers(test, negated=False, names=None):
    """The all() calls and negated any() calls an assertion's truth rests on, in evaluation
    order, each with the evidence its `and` gives before it: [(call, [expressions])]. A name in
    `names` (a name assigned such a value: `ok = all(...)`) stands for its value."""
    names = names or {}
    if isinstance(test, ast.Name) and test.id in names:
        rest = {k: v for k, v in names.items() if k != test.id}
        return quantifiers(names[test.id], negated, rest)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return quantifiers(test.operand, not negated, names)
    if isinstance(test, ast.BoolOp):
        out, before = [], []
        for v in test.values:
            out += [(c, before + e) for c, e in quantifiers(v, negated, names)]
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


def same_emptiness(x):
    """What is empty exactly when `x` is: what inner() gives, the argument of enumerate() or
    reversed(), or A for a view of A (A.values(), A.split(SEP)...)."""
    if (i := inner(x)) is not None:
        return i
    if isinstance(x, ast.Call) and isinstance(x.func, ast.Name) and x.func.id in SAME_LENGTH \
            and len(x.args) == 1 and not x.keywords:
        return x.args[0]
    if isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and (
            x.func.attr in VIEWS or x.func.attr == "split" and x.args):
        return x.func.value
    return None


def shown_nonempty(x, known):
    """Whether `x`, or what is empty exactly when it is (same_emptiness(), repeatedly), is a
    non-empty literal or shown not empty by `known`."""
    candidates = [x]
    while (c := same_emptiness(candidates[-1])) is not None:
        candidates.append(c)
    return any(nonempty_literal(c) or any(same(c, k) for k in known) for c in candidates)


def assigned_nonempty(s, known):
    """The names an assignment `s` gives a value that cannot be empty: wait_for()'s, a non-empty
    literal, or what is not empty when something known is (a comprehension over it...)."""
    if not isinstance(s, ast.Assign):
        return []
    value = s.value
    if is_wait_for(value) or any(shown_nonempty(v, known) for v in unwrapped(value)[1:]) or nonempty_literal(value):
        return [t for t in s.targets if isinstance(t, ast.Name)]
    return []


def only_asserts(body):
    """Whether a loop's `body` does nothing but assert (in loops of its own, too)."""
    return all(isinstance(s, ast.Assert) or isinstance(s, (ast.For, ast.AsyncFor)) and not s.orelse
               and only_asserts(s.body) for s in body)


ALL_FORM, LOOP_FORM = "all()/not any()", "a loop of asserts"


def quantifier_problems(s, known, names):
    """[(line, form, iterable text, why)] for the unproven quantifiers assert `s` rests on."""
    found = []
    for call, before in quantifiers(s.test, names=names):
        it = iterable_of(call)
        if it is None:
            continue
        x, filtered = it
        if filtered:
            found.append((call.lineno, ALL_FORM, ast.unparse(x), "its generator filters: the elements it checks may "
                          "be none; name them, assert them, then assert all() over them"))
        elif not shown_nonempty(x, known + before):
            found.append((call.lineno, ALL_FORM, ast.unparse(x), "nothing before it asserts that this is not empty"))
    return found


def problems_in(scope):
    """[(line, form, iterable text, why)] for the unproven quantifiers and loops of asserts of
    `scope`'s own statements."""
    found, known, names = [], [], {}
    for s in statements(scope):
        known += assigned_nonempty(s, known)
        if isinstance(s, ast.Assign):
            for t in s.targets:
                if isinstance(t, ast.Name):
                    names.pop(t.id, None)
                    if quantifiers(s.value, names=names) or quantifiers(s.value, True, names):
                        names[t.id] = s.value  # all() or any(): asserted as it is or negated
        if isinstance(s, (ast.For, ast.AsyncFor)) and not s.orelse and only_asserts(s.body) \
                and not shown_nonempty(s.iter, known):
            found.append((s.lineno, LOOP_FORM, ast.unparse(s.iter), "it asserts nothing when this is empty, and "
                          "nothing before it asserts that this is not empty"))
        if not isinstance(s, ast.Assert):
            continue
        found += [p for p in quantifier_problems(s, known, names) if p not in found]
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
            for line, form, text, why in problems_in(scope):
                if (rel, name, text) in allowed:
                    seen.add((rel, name, text))
                    continue
                problems += 1
                print(f"{rel}:{line}: {name}: {form} over {text}: {why} (or list it in "
                      "tests/checks/nonempty_all.py's ALLOWED with a reason)", file=out)
    for key in sorted(allowed.keys() - seen):
        if (root / key[0]).is_file() and any(pathlib.PurePosixPath(key[0]).is_relative_to(p) for p in paths):
            problems += 1
            print(f"{key[0]}: {key[1]}: ALLOWED lists all()/not any() or a loop of asserts over {key[2]}, which is "
                  "not there (or "
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


def test_proven_forms(xs, ws, d):
    assert xs
    ok = all(x for x in xs)
    assert ok
    for x in xs:
        assert x
    for i, x in enumerate(sorted(xs)):
        assert x, i
    for n in range(3):
        assert n >= 0
    for w in ws:
        print(w)
        assert w
    done = not any(y for y in [1, 2])
    assert done
    later = all(w for w in ws)
    later = bool(ws)
    assert later
    never_asserted = all(w for w in ws)
    assert d and (fine := True)
    for v in d.values():
        assert v
    for w in ws:
        assert w
    else:
        pass


def test_unproven_forms(xs, ys, zs, d):
    ok = all(x for x in xs)
    assert ok, "a message"
    assert ok
    fine = ys and all(y for y in ys)
    assert fine
    clean = any(z for z in zs)
    assert not clean
    for k, v in d.items():
        assert v, k
    for i, y in enumerate(reversed(ys)):
        for z in zs:
            assert y != z
    for _ in range(0):
        assert False
    flag = all(x for x in xs if x)
    assert xs and flag
'''

EXPECTED = [("test_unproven", 25, ALL_FORM, "xs"), ("test_unproven", 26, ALL_FORM, "ys"),
            ("test_unproven", 27, ALL_FORM, "zs"), ("test_unproven", 28, ALL_FORM, "d.values()"),
            ("inner", 31, ALL_FORM, "xs"), ("test_unproven", 33, ALL_FORM, "ys"),
            ("test_unproven_forms", 76, ALL_FORM, "xs"), ("test_unproven_forms", 81, ALL_FORM, "zs"),
            ("test_unproven_forms", 83, LOOP_FORM, "d.items()"),
            ("test_unproven_forms", 85, LOOP_FORM, "enumerate(reversed(ys))"),
            ("test_unproven_forms", 86, LOOP_FORM, "zs"), ("test_unproven_forms", 88, LOOP_FORM, "range(0)"),
            ("test_unproven_forms", 90, ALL_FORM, "xs")]
REPORTED = re.compile(r"^(\S+?):(\d+): (\w+): (all\(\)/not any\(\)|a loop of asserts) over (.+?): ", re.M)


def reported(text):
    """[(function, line, form, iterable)] of a check's report."""
    return [(m.group(3), int(m.group(2)), m.group(4), m.group(5)) for m in REPORTED.finditer(text)]


def sample_failures(root):
    """The self-test on SAMPLE: exactly EXPECTED reported, the allowed one and a stale entry."""
    failures = []
    (root / "t").mkdir()
    (root / "t" / "test_sample.py").write_text(SAMPLE)
    allowed = {("t/test_sample.py", "test_allowed", "ws"): "a sample", ("t/test_sample.py", "gone", "vs"): "stale"}
    report = io.StringIO()
    problems = check(root, ["t"], report, allowed)
    got = sorted(reported(report.getvalue()))
    if got != sorted(EXPECTED) or problems != len(EXPECTED) + 1 or "gone: ALLOWED lists all()/not any() or a loop " \
            "of asserts over vs" not in report.getvalue():
        failures.append(f"sample: expected {EXPECTED} and the stale entry, got:\n{report.getvalue()}")
    return failures


# Broken copies of tests/integration, each (what it breaks, pattern, replacement, the line a match
# must be reported on relative to the match's first line): `assert X and all(...)` lines lose their
# `X and`; an `assert X` (or `assert X, why`) right before a loop of asserts over X becomes `pass`.
BREAKS = [
    ("`X and` stripped", re.compile(r"^(\s*assert )(\w+) and ((?:all|not any)\()", re.M), r"\1\3", 0),
    ("`assert X` before a loop over X dropped",
     re.compile(r"^([ \t]*)assert (\w+)(?:,[^\n]*)?$(?=\n[ \t]*for [^\n]* in \2\b[^\n]*:$)", re.M), r"\1pass", 1),
]


def reported_lines(text):
    """{(file, line)} of a check's report."""
    return {(f, int(n)) for f, n in re.findall(r"^(\S+?):(\d+): ", text, re.M)}


def broken_copy_failures(root, label, pattern, replacement, offset):
    """The self-test on a copy of tests/integration broken by `pattern` -> `replacement`: it must
    fail, on the lines `offset` after the matches only."""
    copy = root / label.translate(str.maketrans(" `", "__"))
    shutil.copytree(checklib.REPOSITORY / "tests" / "integration", copy / "tests" / "integration",
                    ignore=shutil.ignore_patterns("__pycache__"))
    broken = set()
    for f in sorted((copy / "tests" / "integration").glob("*.py")):
        text = f.read_text(encoding="utf-8")
        rel = f.relative_to(copy).as_posix()
        broken |= {(rel, text.count("\n", 0, m.start()) + 1 + offset) for m in pattern.finditer(text)}
        f.write_text(pattern.sub(replacement, text), encoding="utf-8")
    before, after = io.StringIO(), io.StringIO()
    base = check(checklib.REPOSITORY, ["tests/integration"], before)
    check(copy, ["tests/integration"], after)
    new = reported_lines(after.getvalue()) - reported_lines(before.getvalue())
    if not broken or not new or not new <= broken:
        return [f"broken copy ({label}): {len(broken)} place(s) broken, expected some of them (and only them) "
                f"reported beyond the {base} problem(s) of the tree, got {sorted(new)}:\n{after.getvalue()}"]
    return []


def self_test():
    """Checks the checker on samples and broken copies; returns the process's exit status."""
    with tempfile.TemporaryDirectory() as d:
        failures = sample_failures(pathlib.Path(d))
        for label, pattern, replacement, offset in BREAKS:
            failures += broken_copy_failures(pathlib.Path(d), label, pattern, replacement, offset)
    return checklib.self_test_verdict(failures)


def main(argv):
    return checklib.main(
        argv, lambda root, args: check(root, args or ["tests/integration"]), self_test,
        f"all()/not any() and loops of asserts ok: each rests on a non-empty iterable ({len(ALLOWED)} allowed)",
        lambda n: f"{n} all()/not any() or loop problem(s): an assertion that holds over nothing proves nothing")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
