"""tests/mutation/mutate.py (`make mutation`): the mutants it makes, the sample, and that a run scores a
module in a copy and leaves the checkout unchanged."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("sparkops_mutate", ROOT / "tests" / "mutation" / "mutate.py")
mutate = importlib.util.module_from_spec(spec)
sys.modules["sparkops_mutate"] = mutate  # dataclasses look the module up by name
spec.loader.exec_module(mutate)

SOURCE = '''"""doc"""


def pick(values: list[int], limit: int = 3) -> int:
    """Largest value under the limit."""
    best = None
    for v in values:
        if v is None or v > limit:
            continue
        best = max(best or 0, v)
    return best


def flag(x):
    return not x and True  # pragma: no mutate
'''


def mutants(tmp_path) -> list:
    (tmp_path / "m.py").write_text(SOURCE)
    return mutate.mutants_of("m.py", tmp_path)


def applied(tmp_path, kind: str, desc_part: str) -> str:
    (m,) = [m for m in mutants(tmp_path) if m.kind == kind and desc_part in m.desc]
    return mutate.mutated_source(m, SOURCE)


def test_known_mutants_are_made(tmp_path):
    assert "        if v is None or v >= limit:" in applied(tmp_path, "cmp", "v >= limit")
    assert "        if v is None or v < limit:" in applied(tmp_path, "cmpflip", "v < limit")
    assert "            break" in applied(tmp_path, "loopctl", "continue -> break")
    assert "        best = min(best or 0, v)" in applied(tmp_path, "call", "max")
    assert "        if v > limit:" in applied(tmp_path, "dropclause", "`v is None`")
    assert "        if not (v is None or v > limit):" in applied(tmp_path, "negate", "")
    early = applied(tmp_path, "earlyreturn", "pick()")
    assert '    """Largest value under the limit."""\n    return\n    best = None' in early
    assert "def pick(values: list[int], limit: int=4)" in applied(tmp_path, "const", "3 -> 4")
    for m in mutants(tmp_path):  # every mutant is valid Python and differs from the original
        assert ast.dump(ast.parse(mutate.mutated_source(m, SOURCE))) != ast.dump(ast.parse(SOURCE)), m


def test_annotations_docstrings_and_pragma_lines_are_not_mutated(tmp_path):
    found = mutants(tmp_path)
    assert not [m for m in found if m.lineno == 15 and m.kind != "earlyreturn"]  # the pragma line
    assert not [m for m in found if "int" in m.desc and m.kind == "dropelt"]  # list[int] is an annotation
    assert {m.lineno for m in found if m.kind == "earlyreturn"} == {4, 14}


def test_equivalent_mutants_listed_by_line_and_mutation_are_not_made(tmp_path):
    (tmp_path / "tests" / "mutation").mkdir(parents=True)
    entry = {"module": "m.py", "line": "best = max(best or 0, v)", "mutation": "0 -> -1"}
    listed = tmp_path / "tests" / "mutation" / "equivalents.py"
    listed.write_text(f"EQUIVALENTS = [{dict(entry, why='values are never negative')!r}]\n")
    found = mutants(tmp_path)
    assert [m.why for m in found if m.lineno == 10 and m.desc == "0 -> -1"] == ["values are never negative"]
    assert [m.why for m in found if m.lineno == 10 and m.desc == "0 -> 1"] == [""]  # only the one named
    # with the function named: only a mutant in that function
    listed.write_text(f"EQUIVALENTS = [{dict(entry, function='flag', why='x')!r}]\n")
    assert not [m for m in mutants(tmp_path) if m.why]
    listed.write_text(f"EQUIVALENTS = [{dict(entry, function='pick', why='x')!r}]\n")
    assert [m.desc for m in mutants(tmp_path) if m.why] == ["0 -> -1"]
    # with nth: only that one of the line's mutants with this description (`best or 0` has one `0 -> -1`)
    listed.write_text(f"EQUIVALENTS = [{dict(entry, nth=2, why='x')!r}]\n")
    assert not [m for m in mutants(tmp_path) if m.why]
    listed.write_text(f"EQUIVALENTS = [{dict(entry, nth=1, why='x')!r}]\n")
    assert [m.desc for m in mutants(tmp_path) if m.why] == ["0 -> -1"]
    listed.write_text(f"EQUIVALENTS = [{entry!r}]\n")
    with pytest.raises(ValueError, match="lacks"):  # an entry says why, or it is refused
        mutants(tmp_path)


def test_every_listed_equivalent_still_names_a_mutant():
    """An entry whose line or mutation changed no longer matches anything: update it or drop it."""
    entries = mutate.equivalents()
    assert entries
    for e in entries:
        made = mutate.mutants_of(e["module"])
        assert [m for m in made if m.why == e["why"] and m.desc == e["mutation"]], e


def test_a_listed_equivalent_keeps_the_sample_and_is_not_run(capsys):
    every = mutate.mutants_of("plugins/module_utils/capacity.py")
    listed = [m for m in every if m.why]
    assert listed and len(every) == len({(m.index, m.kind, m.arg) for m in every})
    assert mutate.main(["--list", "plugins/module_utils/capacity.py"]) == 0
    out = capsys.readouterr().out
    assert f"{len(every) - len(listed)} of {len(every)} mutants ({len(listed)} listed equivalent, not run)" in out
    assert f"  [equivalent: {listed[0].why}]" in out


def test_the_pure_module_utils_and_plugin_utils_are_checked_by_default():
    defaults = mutate.default_modules()
    for path in ("capacity", "firewall", "gateway_reload"):
        assert f"plugins/module_utils/{path}.py" in defaults
    for path in ("serving", "discovery", "day2_checks", "gateway", "vllm_contract"):
        assert f"plugins/plugin_utils/{path}.py" in defaults


def test_a_sample_is_spread_over_the_module_and_repeatable():
    every = mutate.mutants_of("plugins/plugin_utils/lockfile.py")
    picked = mutate.sample(every, 10, seed=1)
    assert len(picked) == 10 and len(set(picked)) == 10
    lines = sorted(m.lineno for m in every)
    assert min(m.lineno for m in picked) <= lines[len(lines) // 10]
    assert max(m.lineno for m in picked) >= lines[-(len(lines) // 10) - 1]
    assert picked == mutate.sample(every, 10, seed=1)
    assert picked != mutate.sample(every, 10, seed=2)
    assert mutate.sample(every, None, seed=1) == every


def test_a_module_may_be_limited_to_a_line_range(capsys):
    assert mutate.split_spec("plugins/x/hf_cache.py:82-600") == ("plugins/x/hf_cache.py", (82, 600))
    assert mutate.split_spec("plugins/module_utils/hf_cache.py") == ("plugins/module_utils/hf_cache.py", None)
    assert mutate.split_spec("a.py:9-1") == ("a.py:9-1", None)  # not a range: the path as given
    assert mutate.main(["--list", "plugins/plugin_utils/lockfile.py:20-40"]) == 0
    out = capsys.readouterr().out
    listed = [int(line.split(":")[1]) for line in out.splitlines() if line.startswith("  plugins/")]
    assert listed and all(20 <= n <= 40 for n in listed)
    assert "(lines 20-40)" in out


def test_tests_are_found_for_a_module():
    assert "tests/unit/plugins/plugin_utils/test_lockfile.py" in mutate.tests_for("plugins/plugin_utils/lockfile.py")
    assert "tests/unit/plugins/modules/test_nccl_transport.py" in mutate.tests_for("plugins/module_utils/nccl_log.py")
    assert "tests/unit/plugins/plugin_utils/test_cluster.py" in mutate.tests_for("plugins/plugin_utils/cluster.py")
    # found by the import of the bare name from the folder put on sys.path, not only by EXTRA_TESTS
    cluster_tests = mutate.tests_for("plugins/plugin_utils/cluster.py")
    assert "tests/unit/plugins/plugin_utils/test_cluster_inputs.py" in cluster_tests
    assert "tests/unit/plugins/plugin_utils/test_ring_forwarding.py" in cluster_tests
    assert cluster_tests[0] == "tests/unit/plugins/plugin_utils/test_cluster.py"
    assert not any("test_discovery_world" in t or "cluster_inventories" in t for t in cluster_tests)


def test_a_run_scores_in_a_copy_and_leaves_the_checkout_unchanged():
    """Two lockfile mutants run against its tests, side by side (--jobs 2: each in its own copy); the checkout's
    lockfile.py is byte-identical afterwards."""
    target = ROOT / "plugins" / "plugin_utils" / "lockfile.py"
    before = target.read_bytes()
    res = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "mutation" / "mutate.py"), "--sample", "2", "--seed", "3",
         "--jobs", "2", "plugins/plugin_utils/lockfile.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert target.read_bytes() == before
    assert "== plugins/plugin_utils/lockfile.py: 2 of " in res.stdout
    assert "/2  plugins/plugin_utils/lockfile.py" in res.stdout
    assert "test_mutation_tool.py" not in res.stdout  # the mutator never runs its own tests


def test_the_copies_are_readable_by_another_uid(tmp_path):
    """Run as root, gateway_reload's tests start their stand-in master as a throwaway uid from the copy: every
    folder above the copy's tests must be traversable by others (mkdtemp's 0700 would fail them unmutated)."""
    tmp = tmp_path / "run"
    tmp.mkdir(mode=0o700)
    mutate.make_copies(tmp, [tmp / "0", tmp / "1"])
    fake = tmp / "1" / "tests" / "unit" / "fake_gunicorn_master.py"
    assert fake.read_bytes() == (ROOT / "tests" / "unit" / "fake_gunicorn_master.py").read_bytes()
    for folder in (tmp, tmp / "1", fake.parent):
        assert folder.stat().st_mode & 0o005 == 0o005, folder
    assert fake.stat().st_mode & 0o004
