"""benchmarks/jinja_counts.py counts what issue 24 measures, on a small tree whose figures are known."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "jinja_counts.py"
# The built collection leaves benchmarks/ out (galaxy.yml build_ignore): ansible-test units runs there.
pytestmark = pytest.mark.skipif(not SCRIPT.is_file(), reason="benchmarks/ is not in the built collection")
if SCRIPT.is_file():
    spec = importlib.util.spec_from_file_location("jinja_counts", SCRIPT)
    jinja_counts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(jinja_counts)


def test_the_four_figures_on_a_known_tree(tmp_path):
    (tmp_path / "roles" / "r" / "vars").mkdir(parents=True)
    (tmp_path / "roles" / "r" / "vars" / "main.yml").write_text(
        "---\n"
        'a: "{{ x }}"\n'  # a Jinja line, not a block
        "b: >-\n"  # a block holding Jinja (one line opens it)
        "  {{ y\n"
        "     | list }}\n"
        "c: |\n"  # a block without Jinja
        "  plain text\n"
        "d:\n"
        "  - |\n"  # a list item's block holding a Jinja statement
        "    {% if z %}1{% endif %}\n"
    )
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "p.yml").write_text(
        "- hosts: all\n  tasks:\n    - name: One\n      ansible.builtin.set_fact:\n        v: 1\n"
        '    - set_fact:\n        w: "{{ v }}"\n'
    )
    assert jinja_counts.counts(tmp_path) == {"vars_lines": 10, "set_fact": 2, "jinja_lines": 4, "jinja_blocks": 2}


def test_it_runs_on_this_repository():
    figures = jinja_counts.counts(ROOT)
    assert figures["vars_lines"] > 0 and figures["jinja_lines"] >= figures["jinja_blocks"] > 0
