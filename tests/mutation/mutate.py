#!/usr/bin/env python3
"""A small mutation check for the project's pure logic (`make mutation`, tests/mutation/README.md).

Each mutant is one small real bug made in the module's syntax tree: a flipped comparison, a dropped
clause of `and`/`or`, `and` for `or`, `continue` for `break`, a dropped list/tuple/set/dict element,
an early `return None`, an integer constant +/-1, `True` for `False`, `max` for `min`, `any` for
`all`, a negated condition, a dropped `not`. Each mutant runs against the unit tests that exercise
the module (pytest -x -q, a per-mutant timeout) in a temporary copy of the checkout, so the tree is
never left mutated. A mutant the tests fail on (or that times out) is killed; one they pass on
survives and is printed as file:line with the mutation.

    tests/mutation/mutate.py                                   # every default module, every mutant
    tests/mutation/mutate.py plugins/module_utils/nccl_log.py  # one module
    tests/mutation/mutate.py --sample 60 --seed 1 ...          # 60 mutants spread over each module
    tests/mutation/mutate.py --list ...                        # the mutants and their tests, run nothing
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import copy
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The pure modules: controller logic, the target-side parsers and judgements, the filters. The module_utils
# left out run commands or touch the filesystem of a node; their logic is tested through the modules
# (gateway_reload is in: its clock, sleep, kill and /proc are injected).
DEFAULT_GLOBS = ("plugins/plugin_utils/*.py", "plugins/filter/*.py")
MODULE_UTILS_PARSERS = (
    "bench",
    "capacity",
    "cuda_compat",
    "firewall",
    "gateway_reload",
    "hf_cache",
    "hw_links",
    "image_versions",
    "nccl_log",
    "nvidia_smi",
    "perftest",
    "ray_status",
    "rdma",
)
# Tests that exercise a module without importing it by name (through a module or a filter).
EXTRA_TESTS = {
    "plugins/plugin_utils/cluster.py": ["tests/unit/plugins/plugin_utils/test_cluster.py"],
    "plugins/module_utils/hf_cache.py": ["tests/unit/plugins/modules/test_hf_cache_manifest.py"],
    "plugins/module_utils/image_versions.py": ["tests/unit/plugins/modules/test_image_versions_cache.py"],
    "plugins/module_utils/nccl_log.py": ["tests/unit/plugins/modules/test_nccl_transport.py"],
    "plugins/module_utils/perftest.py": [
        "tests/unit/plugins/filter/test_perftest_filter.py",
        "tests/unit/plugins/modules/test_ib_write_bw.py",
    ],
    "plugins/plugin_utils/serving_profile.py": ["tests/unit/plugins/filter/test_serving.py"],
    # The records and rollbacks of several deployments: planned through test_serving_plan's plan_of, not imported.
    "plugins/plugin_utils/serving.py": ["tests/unit/plugins/plugin_utils/test_serving_records.py"],
}

CMP_SWAP = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
# A second flip for the ordering comparisons: the direction, not only the boundary.
CMP_FLIP = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE}
CALL_SWAP = {"max": "min", "min": "max", "any": "all", "all": "any"}
PRAGMA = "pragma: no mutate"
# Equivalent mutants, one by one (a pragma skips a whole line): each names the module, the stripped source
# line and the mutation as --list prints them, and why no input can tell the mutant from the original.
EQUIVALENTS = "tests/mutation/equivalents.py"
SELF_TEST = "test_mutation_tool.py"  # the mutator's own tests name modules; they run the mutator


@dataclass(frozen=True)
class Mutant:
    path: str  # relative to ROOT
    index: int  # the node's position in ast.walk order
    kind: str
    arg: int
    lineno: int
    desc: str
    why: str = ""  # a listed equivalent: why no input tells it apart (not run, not scored)


def _short(node: ast.AST, width: int = 70) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _skipped_ids(tree: ast.Module, lines: list[str]) -> set[int]:
    """Nodes never mutated: annotations, f-string internals, docstrings, `pragma: no mutate` lines."""
    skip: set[int] = set()

    def drop(node):
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            drop(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            drop(node.returns)
        elif isinstance(node, ast.AnnAssign):
            drop(node.annotation)
        elif isinstance(node, ast.JoinedStr):
            drop(node)
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple):
            skip.add(id(node.slice))  # x[a, b]: dropping an index element is a type error, not a bug
        lineno = getattr(node, "lineno", None)
        if lineno and PRAGMA in lines[lineno - 1]:
            skip.add(id(node))
    return skip


def _docstring_offset(body: list[ast.stmt]) -> int:
    first = body[0] if body else None
    is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return 1 if is_doc and isinstance(first.value.value, str) else 0


def _candidates(node: ast.AST) -> list[tuple[str, int, str]]:
    """(kind, arg, description) of every mutation that applies to node."""
    out: list[tuple[str, int, str]] = []
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            for table, kind in ((CMP_SWAP, "cmp"), (CMP_FLIP, "cmpflip")):
                if type(op) in table:
                    new = copy.deepcopy(node)
                    new.ops[i] = table[type(op)]()
                    out.append((kind, i, f"`{_short(node)}` -> `{_short(new)}`"))
    elif isinstance(node, ast.BoolOp):
        other = "or" if isinstance(node.op, ast.And) else "and"
        out.append(("boolop", 0, f"`{_short(node)}`: {type(node.op).__name__.lower()} -> {other}"))
        for i, value in enumerate(node.values):
            out.append(("dropclause", i, f"clause dropped: `{_short(value)}` from `{_short(node)}`"))
    elif isinstance(node, ast.Continue):
        out.append(("loopctl", 0, "continue -> break"))
    elif isinstance(node, ast.Break):
        out.append(("loopctl", 0, "break -> continue"))
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set)) and isinstance(getattr(node, "ctx", ast.Load()), ast.Load):
        for i, elt in enumerate(node.elts):
            if not isinstance(elt, ast.Starred):
                out.append(("dropelt", i, f"element dropped: `{_short(elt)}` from `{_short(node)}`"))
    elif isinstance(node, ast.Dict):
        for i, key in enumerate(node.keys):
            label = _short(key) if key is not None else f"**{_short(node.values[i])}"
            out.append(("dropkey", i, f"dict entry dropped: `{label}`"))
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        body = node.body[_docstring_offset(node.body) :]
        if body and not (isinstance(body[0], ast.Return) and body[0].value is None):
            out.append(("earlyreturn", 0, f"`return None` at the start of {node.name}()"))
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool):
            out.append(("bool", 0, f"{node.value} -> {not node.value}"))
        elif isinstance(node.value, int):
            out.append(("const", 1, f"{node.value} -> {node.value + 1}"))
            out.append(("const", -1, f"{node.value} -> {node.value - 1}"))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CALL_SWAP:
        out.append(("call", 0, f"{node.func.id}() -> {CALL_SWAP[node.func.id]}()"))
    elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
        out.append(("negate", 0, f"condition negated: `{_short(node.test)}`"))
    elif isinstance(node, ast.comprehension):
        for i, cond in enumerate(node.ifs):
            out.append(("negateif", i, f"comprehension filter negated: `{_short(cond)}`"))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("dropnot", 0, f"`not` dropped: `{_short(node)}`"))
    return out


def equivalents(root: Path = ROOT) -> list[dict]:
    """The entries of EQUIVALENTS (module, line, mutation, why); none when the file is absent."""
    file = root / EQUIVALENTS
    if not file.is_file():
        return []
    namespace: dict = {}
    exec(compile(file.read_text(), str(file), "exec"), namespace)  # noqa: S102 - the checkout's own list
    entries = namespace.get("EQUIVALENTS", [])
    for e in entries:
        missing = {"module", "line", "mutation", "why"} - set(e)
        if missing or not str(e.get("why", "")).strip():
            raise ValueError(f"{EQUIVALENTS}: an entry lacks {sorted(missing) or ['a why']}: {e}")
    return entries


def mutants_of(path: str, root: Path = ROOT) -> list[Mutant]:
    """The module's mutants; those EQUIVALENTS lists carry their `why`."""
    source = (root / path).read_text()
    tree = ast.parse(source)
    lines = source.splitlines()
    skip = _skipped_ids(tree, lines)
    # An entry may name the function it is in (`function`), for a line written the same in two functions.
    # `nth` (optional, from 1) picks one of several mutants with the same line and mutation, in --list's order.
    known = {
        (e["line"].strip(), e["mutation"], e.get("function"), e.get("nth")): e["why"]
        for e in equivalents(root)
        if e["module"] == path
    }
    where: dict[int, str] = {}  # node -> the innermost function holding it
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(func):
                where[id(inner)] = func.name  # walked outer first, so an inner function overwrites
    out = []
    seen: dict = {}
    for index, node in enumerate(ast.walk(tree)):
        if id(node) in skip:
            continue
        lineno = getattr(node, "lineno", 0)
        text = lines[lineno - 1].strip() if lineno else ""
        func = where.get(id(node))
        for kind, arg, desc in _candidates(node):
            nth = seen[(text, desc)] = seen.get((text, desc), 0) + 1
            keys = [(text, desc, f, n) for f in (None, func) for n in (None, nth)]
            why = next((known[k] for k in keys if k in known), "")
            out.append(Mutant(path, index, kind, arg, lineno, desc, why))
    return out


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
                        return
    raise ValueError("node not found in its tree")


def mutated_source(mutant: Mutant, source: str) -> str:
    """The module's source with the one mutation applied (re-parsed, so the original is untouched)."""
    tree = ast.parse(source)
    node = list(ast.walk(tree))[mutant.index]
    kind, arg = mutant.kind, mutant.arg
    if kind == "cmp":
        node.ops[arg] = CMP_SWAP[type(node.ops[arg])]()
    elif kind == "cmpflip":
        node.ops[arg] = CMP_FLIP[type(node.ops[arg])]()
    elif kind == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif kind == "dropclause":
        del node.values[arg]
        if len(node.values) == 1:
            _replace(tree, node, node.values[0])
    elif kind == "loopctl":
        _replace(tree, node, ast.Break() if isinstance(node, ast.Continue) else ast.Continue())
    elif kind == "dropelt":
        del node.elts[arg]
    elif kind == "dropkey":
        del node.keys[arg]
        del node.values[arg]
    elif kind == "earlyreturn":
        node.body.insert(_docstring_offset(node.body), ast.Return(value=None))
    elif kind == "bool":
        node.value = not node.value
    elif kind == "const":
        node.value = node.value + arg
    elif kind == "call":
        node.func.id = CALL_SWAP[node.func.id]
    elif kind == "negate":
        node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)
    elif kind == "negateif":
        node.ifs[arg] = ast.UnaryOp(op=ast.Not(), operand=node.ifs[arg])
    elif kind == "dropnot":
        _replace(tree, node, node.operand)
    else:
        raise ValueError(f"unknown mutation kind {kind}")
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def sample(mutants: list[Mutant], n: int | None, seed: int) -> list[Mutant]:
    """n mutants spread over the whole module: one from each of n equal slices (in line order), at a
    position the seed picks, so the same seed gives the same sample."""
    if not n or n >= len(mutants):
        return list(mutants)
    ordered = sorted(mutants, key=lambda m: (m.lineno, m.index, m.kind, m.arg))
    rng = random.Random(f"{seed}:{mutants[0].path}")
    picked = []
    for k in range(n):
        lo, hi = (k * len(ordered)) // n, ((k + 1) * len(ordered)) // n
        picked.append(ordered[rng.randrange(lo, hi)])
    return picked


def tests_for(path: str, root: Path = ROOT) -> list[str]:
    """The unit test files that import the module by name, and the ones EXTRA_TESTS names (its own first)."""
    module = Path(path)
    pkg, name = module.parent.name, module.stem
    pattern = re.compile(rf"(\b{pkg}\b[ .]+import\b[^\n]*\b{name}\b|\b{pkg}\.{name}\b|{pkg}/{name}\.py)")
    # A test that puts the module's folder on sys.path and imports it by its bare name
    # (`sys.path.insert(0, str(ROOT / "plugins" / "plugin_utils"))` then `from cluster import ...`).
    on_path = re.compile(rf"sys\.path\.insert\([^\n]*[\"']{pkg}[\"']")
    bare = re.compile(rf"^(from {name} import|import {name}\b)", re.M)
    found = set(EXTRA_TESTS.get(path, []))
    for test in sorted((root / "tests" / "unit").rglob("test_*.py")):
        text = test.read_text()
        if test.name != SELF_TEST and (pattern.search(text) or (on_path.search(text) and bare.search(text))):
            found.add(str(test.relative_to(root)))
    # The module's own test file first, then the others named after it (test_<name>_*.py): most mutants die
    # there, and -x stops at the first failure, before a slow file that only plans a whole inventory.
    return sorted(
        (t for t in found if (root / t).exists()),
        key=lambda t: (Path(t).stem != f"test_{name}", not Path(t).stem.startswith(f"test_{name}"), t),
    )


def default_modules() -> list[str]:
    paths = [str(p.relative_to(ROOT)) for g in DEFAULT_GLOBS for p in sorted(ROOT.glob(g)) if p.name != "__init__.py"]
    paths += [f"plugins/module_utils/{name}.py" for name in MODULE_UTILS_PARSERS]
    return paths


def copy_checkout(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files of the checkout, links kept as links."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        rel = raw.decode()
        src, dst = ROOT / rel, dest / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree, not yet in git
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def make_copies(tmp: Path, workdirs: list[Path]) -> None:
    """One copy of the checkout per job (a mutant is written over the module in its own copy while the others
    run), in a folder every user may traverse: run as root, gateway_reload's tests start their stand-in master
    as a throwaway uid from the copy's tests/unit/fake_gunicorn_master.py, which a 0700 folder (mkdtemp's)
    hides from it, and the unmutated tests fail."""
    tmp.chmod(0o755)
    for workdir in workdirs:
        copy_checkout(workdir)


def run_tests(workdir: Path, tests: list[str], timeout: float) -> tuple[str, float]:
    """'pass', 'fail' or 'timeout', and the seconds it took."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", *tests]
    start = time.monotonic()
    try:
        res = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - start
    return ("pass" if res.returncode == 0 else "fail"), time.monotonic() - start


def check_module(path: str, workdirs: list[Path], args) -> tuple[int, int, list[Mutant] | None] | None:
    """(killed, run, survivors) of one module; survivors None when its tests fail unmutated; None when
    not scored (--list, or no tests). The mutants run len(workdirs) at a time, each in its own copy."""
    # Read from the copy: the checkout may change while a run goes on.
    root = ROOT if args.list else workdirs[0]
    path, lines = split_spec(path)
    tests = tests_for(path, root)
    every = [m for m in mutants_of(path, root) if lines is None or lines[0] <= m.lineno <= lines[1]]
    chosen = sorted(sample(every, args.sample, args.seed), key=lambda m: (m.lineno, m.index, m.kind, m.arg))
    # Listed equivalents are sampled like the others (so listing one leaves the sample as it was) but not run.
    equivalent = [m for m in chosen if m.why]
    chosen = [m for m in chosen if not m.why]
    where = f" (lines {lines[0]}-{lines[1]})" if lines else ""
    listed = f" ({len(equivalent)} listed equivalent, not run)" if equivalent else ""
    print(
        f"\n== {path}{where}: {len(chosen)} of {len(every)} mutants{listed}, tests: {' '.join(tests) or '(none)'}",
        flush=True,
    )
    if args.list:
        for m in sorted([*chosen, *equivalent], key=lambda m: (m.lineno, m.index, m.kind, m.arg)):
            print(f"  {m.path}:{m.lineno}: {m.desc}" + (f"  [equivalent: {m.why}]" if m.why else ""))
        return None
    if not tests:
        print("   no unit test imports this module: not scored")
        return None
    original = (workdirs[0] / path).read_text()
    free: queue.Queue[Path] = queue.Queue()
    for workdir in workdirs:
        free.put(workdir)
    lock = threading.Lock()
    killed, survivors, done = [0], [], [0]

    def one(m: Mutant) -> None:
        workdir = free.get()
        try:
            (workdir / path).write_text(mutated_source(m, original))
            verdict, _ = run_tests(workdir, tests, timeout)
        finally:
            free.put(workdir)
        with lock:
            done[0] += 1
            if verdict == "pass":
                survivors.append(m)
                print(f"   [{done[0]}/{len(chosen)}] SURVIVED {m.path}:{m.lineno}: {m.desc}", flush=True)
            else:
                killed[0] += 1
                if args.verbose:
                    print(f"   [{done[0]}/{len(chosen)}] killed ({verdict}) {m.path}:{m.lineno}: {m.desc}", flush=True)

    try:
        # The baseline runs the module as the mutants are written (unparsed), so a difference is the mutation's.
        (workdirs[0] / path).write_text(ast.unparse(ast.parse(original)) + "\n")
        verdict, took = run_tests(workdirs[0], tests, args.timeout or 300)
        if verdict != "pass":
            print(f"   the tests fail on the unmutated module ({verdict}): fix them first")
            return 0, 0, None
        timeout = args.timeout or max(10.0, 5 * took)
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(workdirs)) as pool:
            for future in [pool.submit(one, m) for m in chosen]:
                future.result()
    finally:
        for workdir in workdirs:
            (workdir / path).write_text(original)
    survivors.sort(key=lambda m: (m.lineno, m.index, m.kind, m.arg))
    return killed[0], len(chosen), survivors


def split_spec(spec: str) -> tuple[str, tuple[int, int] | None]:
    """``path`` or ``path:START-END`` (only the mutants on lines START..END, e.g. a module's pure part)."""
    path, sep, span = spec.rpartition(":")
    m = re.fullmatch(r"(\d+)-(\d+)", span) if sep else None
    if not m or int(m.group(1)) > int(m.group(2)):
        return spec, None
    return path, (int(m.group(1)), int(m.group(2)))


def _interrupt(_signum, _frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "modules",
        nargs="*",
        help="module paths relative to the checkout, each optionally PATH:START-END for those lines only "
        "(default: the pure modules)",
    )
    ap.add_argument("--sample", type=int, default=None, help="N mutants per module, spread over the whole module")
    ap.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per mutant (default 5x the baseline, >= 10)")
    ap.add_argument("--fail-under", type=float, default=None, help="exit 1 when a module scores below this percent")
    ap.add_argument(
        "--jobs", type=int, default=1, help="mutants run at a time, each in its own copy of the checkout (default 1)"
    )
    ap.add_argument("--list", action="store_true", help="print the mutants and the tests, run nothing")
    ap.add_argument("-v", "--verbose", action="store_true", help="print killed mutants too")
    args = ap.parse_args(argv)
    # A stopped run (Ctrl-C, kill) still removes its copy: SIGTERM unwinds like Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupt)
    modules = args.modules or default_modules()
    for spec in modules:
        if not (ROOT / split_spec(spec)[0]).is_file():
            ap.error(f"{spec}: no such module under {ROOT} (PATH or PATH:START-END)")
    results = {}
    with tempfile.TemporaryDirectory(prefix="sparkops-mutation-") as tmp:
        workdirs = [Path(tmp) / str(n) for n in range(max(1, args.jobs))]
        if not args.list:
            make_copies(Path(tmp), workdirs)
        for path in modules:
            res = check_module(path, workdirs, args)
            if res is not None:
                results[path] = res
    if args.list:
        return 0
    print("\nmutation score per module (killed/run):")
    low = []
    broken = []
    for path, (killed, total, survivors) in results.items():
        if survivors is None:
            print(f"    -    tests fail unmutated  {path}")
            broken.append(path)
            continue
        pct = 100.0 * killed / total if total else 0.0
        print(f"  {pct:5.1f}%  {killed}/{total}  {path}")
        for m in survivors:
            print(f"          survived {m.path}:{m.lineno}: {m.desc}")
        if args.fail_under is not None and pct < args.fail_under:
            low.append(path)
    if low:
        print(f"below {args.fail_under}%: {' '.join(low)}")
    if broken:
        print(f"not scored, their tests fail without a mutation: {' '.join(broken)}")
    return 2 if broken else (1 if low else 0)


if __name__ == "__main__":
    sys.exit(main())
