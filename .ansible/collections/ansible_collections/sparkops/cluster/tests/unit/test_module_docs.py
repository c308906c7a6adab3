"""Every module's DOCUMENTATION/EXAMPLES/RETURN parse as YAML, and the documented options are the
argument_spec (names, types, defaults and choices), so `ansible-doc` and the code never disagree."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import yaml

MODULES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "plugins" / "modules").glob("*.py"))


def doc_blocks(name: str) -> dict:
    path = Path(__file__).resolve().parents[2] / "plugins" / "modules" / f"{name}.py"
    blocks = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in (
            "DOCUMENTATION",
            "EXAMPLES",
            "RETURN",
        ):
            blocks[node.targets[0].id] = node.value.value
    return blocks


def captured_spec(name: str, monkeypatch) -> dict:
    """The argument_spec main() hands AnsibleModule (captured, then main() is stopped)."""
    mod = importlib.import_module(f"ansible_collections.sparkops.cluster.plugins.modules.{name}")
    seen = {}

    class Stop(Exception):
        pass

    def fake(*args, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(mod, "AnsibleModule", fake)
    with pytest.raises(Stop):
        mod.main()
    return seen


def test_there_are_modules():
    assert len(MODULES) >= 10


@pytest.mark.parametrize("name", MODULES)
def test_docs_parse_and_match_argument_spec(name, monkeypatch):
    blocks = doc_blocks(name)
    assert set(blocks) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}
    doc = yaml.safe_load(blocks["DOCUMENTATION"])
    assert doc["module"] == name
    assert isinstance(yaml.safe_load(blocks["EXAMPLES"]), list)
    assert isinstance(yaml.safe_load(blocks["RETURN"]), dict)
    kwargs = captured_spec(name, monkeypatch)
    spec = kwargs["argument_spec"]
    assert "supports_check_mode" in kwargs, f"{name}: say whether check mode is supported"
    options = doc.get("options") or {}
    assert set(options) == set(spec), f"{name}: documented options differ from argument_spec"
    for opt, s in spec.items():
        d = options[opt]
        assert d.get("type", "str") == s.get("type", "str"), f"{name}.{opt}: type"
        assert d.get("default") == s.get("default"), f"{name}.{opt}: default"
        assert d.get("choices") == s.get("choices"), f"{name}.{opt}: choices"
        assert bool(d.get("required")) == bool(s.get("required")), f"{name}.{opt}: required"
        assert d.get("description"), f"{name}.{opt}: undocumented"
