#!/usr/bin/env python3
"""Fails when an #include escapes the layering that the build's include roots enforce.

    include_paths.py [--root DIR]   check DIR (default: this repository)
    include_paths.py --self-test    check the checker on a sample tree

The build gives each stage its own include root (CMakeLists.txt, modeld_stage), so a stage's
sources see only the headers of the stages it depends on. Two holes remain, closed here:
- a quoted include also searches the including file's own folder, from where "../hub/hub.hpp"
  reaches any stage: no include in lib/, daemon/ or tests/ may climb out ("..") or be absolute;
- a header is compiled with the include roots of whatever includes it, so a header that no
  source of its own stage includes could name a stage its stage does not depend on: every file
  in lib/<stage>/ may include "<other>/..." only for a stage in its DEPS, transitively (read from
  the modeld_stage lines of CMakeLists.txt).
Exit status 1 on a violation.
"""
import io
import pathlib
import re
import sys
import tempfile

import checklib

SOURCE_SUFFIXES = (".cpp", ".hpp", ".c", ".h", ".cc")
CHECKED = ["lib", "daemon", "tests"]
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
STAGE = re.compile(r"^\s*modeld_stage\(\s*(\w+)((?:\s+DEPS)?[\w\s]*)\)", re.M)


def stage_deps(cmakelists):
    """Each stage of `cmakelists` -> the stages it may include, itself and its DEPS transitively."""
    direct = {}
    for m in STAGE.finditer(cmakelists.read_text()):
        words = m.group(2).split()
        direct[m.group(1)] = words[1:] if words[:1] == ["DEPS"] else []
    closure = {}

    def visit(stage):
        if stage not in closure:
            closure[stage] = {stage}
            for d in direct.get(stage, []):
                closure[stage] |= visit(d)
        return closure[stage]
    for stage in direct:
        visit(stage)
    return closure


def includes(f):
    """(line number, quoted, include path) of each #include of `f`."""
    for number, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        m = INCLUDE.match(line)
        if m:
            yield number, m.group(1) == '"', m.group(2)


def problems_of(root, f, allowed):
    """The problems of the file `f`; `allowed`: the stages its stage may include, or None."""
    for number, quoted, name in includes(f):
        where = f"{f.relative_to(root)}:{number}: #include \"{name}\""
        top = pathlib.PurePosixPath(name).parts[0]
        if name.startswith("/") or ".." in pathlib.PurePosixPath(name).parts:
            yield f"{where} reaches outside the include roots: include \"<stage>/<file>\" of a stage instead"
        elif quoted and allowed is not None and "/" in name and (root / "lib" / top).is_dir() and top not in allowed:
            yield (f"{where}: stage {f.relative_to(root).parts[1]} does not depend on {top} "
                   f"(modeld_stage in CMakeLists.txt)")


def check(root, out=sys.stdout):
    """Checks the sources under `root`; returns the number of problems."""
    deps = stage_deps(root / "CMakeLists.txt")
    count = 0
    for p in CHECKED:
        for f in sorted(f for f in (root / p).rglob("*") if f.suffix in SOURCE_SUFFIXES and f.is_file()):
            rel = f.relative_to(root).parts
            allowed = deps.get(rel[1], set()) if rel[0] == "lib" and len(rel) > 2 else None
            for problem in problems_of(root, f, allowed):
                count += 1
                print(problem, file=out)
    return count


def self_test():
    """Checks the checker on a sample tree; returns the process's exit status."""
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        (root / "CMakeLists.txt").write_text("modeld_stage(util)\nmodeld_stage(repo)\n"
                                             "modeld_stage(verify DEPS util repo)\nmodeld_stage(hub DEPS verify)\n")
        for stage in ("util", "repo", "verify", "hub"):
            (root / "lib" / stage).mkdir(parents=True)
        (root / "lib" / "verify" / "ok.cpp").write_text('#include "verify/hash.hpp"\n#include <vector>\n'
                                                        '#include "hash_detail.hpp"\n// #include "../x.hpp"\n')
        (root / "lib" / "hub" / "ok.hpp").write_text('#include "util/error.hpp"\n#include <fmt/format.h>\n')
        (root / "lib" / "verify" / "bad.cpp").write_text('#include "verify/hash.hpp"\n # include "../hub/hub.hpp"\n'
                                                         '#include </work/lib/hub/hub.hpp>\n')
        (root / "lib" / "util" / "bad.hpp").write_text('#include "util/text.hpp"\n#include "repo/snapshot.hpp"\n')
        report = io.StringIO()
        problems = check(root, report)
    expected = ['lib/verify/bad.cpp:2: #include "../hub/hub.hpp" reaches outside',
                'lib/verify/bad.cpp:3: #include "/work/lib/hub/hub.hpp" reaches outside',
                'lib/util/bad.hpp:2: #include "repo/snapshot.hpp": stage util does not depend on repo']
    ok = problems == 3 and all(e in report.getvalue() for e in expected)
    return checklib.self_test_verdict([] if ok else [f"expected {expected}, got:\n{report.getvalue()}"])


def main(argv):
    return checklib.main(
        argv, lambda root, args: check(root), self_test,
        "includes ok: none climbs out of its folder, every stage file includes only its DEPS",
        lambda n: f"{n} include problem(s)")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
