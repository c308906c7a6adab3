"""The repository is the sparkops.cluster collection: it must resolve from a checkout and install like one.

The checkout-only checks (galaxy.yml, the collections/ link) skip in the installed collection,
where `ansible-test units` runs this file too.
"""

import fnmatch
import importlib
import re

import pytest
import yaml
from conftest import ROOT

GALAXY = ROOT / "galaxy.yml"
checkout_only = pytest.mark.skipif(not GALAXY.exists(), reason="checkout only (no galaxy.yml in an installed copy)")

# Collections every Ansible install has, and this collection itself.
BUILTIN = {"ansible.builtin", "ansible.legacy", "ansible.module_utils", "ansible.plugins", "sparkops.cluster"}
FQCN_RE = re.compile(r"\b((?:ansible|community)\.[a-z0-9_]+)\.[a-z0-9_]+")
# Roles whose argument specs h-model's cluster model (issue 14) is rewriting.
ARGUMENT_SPECS_PENDING = {"cluster_facts", "roce_network", "fabric_ssh", "preflight"}


def _content_files():
    for top in ("roles", "playbooks", "plugins"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in (".yml", ".yaml", ".j2", ".py") and "__pycache__" not in path.parts:
                yield path


def _collections_used() -> dict[str, str]:
    used = {}
    for path in _content_files():
        for match in FQCN_RE.finditer(path.read_text(errors="replace")):
            if match.group(1) not in BUILTIN:
                used.setdefault(match.group(1), str(path.relative_to(ROOT)))
    return used


@checkout_only
def test_collection_link_points_at_repo_root():
    link = ROOT / "collections" / "ansible_collections" / "sparkops" / "cluster"
    assert link.is_symlink()
    assert link.resolve() == ROOT


def test_module_utils_importable_by_fqcn():
    mod = importlib.import_module("ansible_collections.sparkops.cluster.plugins.plugin_utils.serving_profile")
    assert hasattr(mod, "vllm_serve_args")


@checkout_only
def test_galaxy_declares_exactly_the_collections_the_code_uses():
    declared = yaml.safe_load(GALAXY.read_text())["dependencies"]
    used = _collections_used()
    assert "ansible.utils" in used and "community.crypto" in used  # the ones issue 13 found missing
    missing = {c: where for c, where in used.items() if c not in declared}
    assert not missing, f"used but not in galaxy.yml dependencies: {missing}"
    unused = set(declared) - set(used)
    assert not unused, f"declared in galaxy.yml but used nowhere: {unused}"
    for name, spec in declared.items():
        assert re.fullmatch(r">=\d+\.\d+\.\d+,<\d+\.\d+\.\d+", spec), f"{name}: give a version range, got {spec!r}"


@checkout_only
def test_controller_python_requirements_are_declared_for_ansible_builder():
    ee = yaml.safe_load((ROOT / "meta" / "execution-environment.yml").read_text())
    python_reqs = (ROOT / ee["dependencies"]["python"]).read_text()
    assert re.search(r"^netaddr\b", python_reqs, re.M), "ansible.utils' ipaddr filters need netaddr"
    assert (ROOT / ee["dependencies"]["system"]).is_file()


def _ignored(rel: str, patterns) -> bool:
    parts = rel.split("/")
    for pat in patterns:
        for i in range(1, len(parts) + 1):
            if fnmatch.fnmatch("/".join(parts[:i]), pat) or fnmatch.fnmatch(parts[i - 1], pat):
                return True
    return False


@checkout_only
def test_build_ignore_keeps_only_what_users_need():
    patterns = yaml.safe_load(GALAXY.read_text())["build_ignore"]
    for rel in (
        ".ci/run",
        "sim/simctl.py",
        "benchmarks/weight_sync.py",
        "molecule/default/converge.yml",
        "sparkops.egg-info/PKG-INFO",
        "plugins/module_utils/__pycache__/x.pyc",
        ".ruff_cache/x",
        "inventory/sim/hosts.yml",
        "inventory/two-sparks/credentials/api_key",
        "inventory/two-sparks-state/credentials/api_key",
        "inventory/examples/ring-4-state/sparkops.lock.json",
        "inventory/two-sparks/reports/health.md",
        "tests/integration/test_collection_install.py",
        "tests/unit/sim/test_vllm_test_double.py",
    ):
        assert _ignored(rel, patterns), f"{rel} would ship in the collection tarball"
    for rel in (
        "playbooks/site.yml",
        "roles/vllm_serve/tasks/main.yml",
        "plugins/modules/gpu_facts.py",
        "meta/runtime.yml",
        "tests/sanity/ignore-2.19.txt",
        "tests/unit/test_collection_layout.py",
        "tests/conftest.py",
        "tests/fixtures/nccl/README.md",
        "inventory/two-sparks/hosts.yml",
        "requirements.txt",
    ):
        assert not _ignored(rel, patterns), f"{rel} is needed in the collection but build_ignore drops it"


def test_every_playbook_runs_by_fqcn_including_site():
    names = {p.stem for p in (ROOT / "playbooks").glob("*.yml")}
    assert {"site", "status", "report", "serve", "verify"} <= names


def test_controller_state_never_derives_from_playbook_dir():
    offenders = []
    for path in [*_content_files(), *(ROOT / "inventory").rglob("*.yml")]:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "playbook_dir" in line and not line.lstrip().startswith("#"):
                offenders.append(f"{path.relative_to(ROOT)}:{n}")
    assert not offenders, f"state next to the playbooks lands inside an installed collection: {offenders}"


def test_only_vllm_serve_creates_the_api_key():
    creators = []
    for path in _content_files():
        if "ansible.builtin.password" in path.read_text(errors="replace") or "lookup('password'" in path.read_text():
            creators.append(str(path.relative_to(ROOT)))
    assert creators == ["roles/vllm_serve/tasks/api_key.yml"]
    main = yaml.safe_load((ROOT / "roles" / "vllm_serve" / "tasks" / "main.yml").read_text())
    tasks = [inner for t in main for inner in (t.get("block") or [t])]  # one level of blocks
    assert any(t.get("ansible.builtin.include_tasks") == "api_key.yml" for t in tasks)
    # The shared settings (serving_report, benchmark, status) only read it.
    assert "password" not in (ROOT / "roles" / "vllm_serve" / "tasks" / "settings.yml").read_text()


def _entry_points_used() -> dict[str, set]:
    used: dict[str, set] = {}
    for path in _content_files():
        if path.suffix not in (".yml", ".yaml"):
            continue
        for match in re.finditer(
            r"name: sparkops\.cluster\.(\w+)\s*\n\s*tasks_from: ([\w.-]+?)(?:\.ya?ml)?\s*$", path.read_text(), re.M
        ):
            used.setdefault(match.group(1), set()).add(match.group(2))
    return used


# Roles that every play runs, whose tasks/main.yml options are documented under another entry point and checked by
# the role's own action: an entry point `main` makes Ansible add a task (the check) to every play.
MAIN_DOCUMENTED_AS = {"cluster_facts": "model"}


def test_every_role_entry_point_has_an_argument_spec():
    used = _entry_points_used()
    problems = []
    for role in sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir()):
        spec_file = role / "meta" / "argument_specs.yml"
        if not spec_file.exists():
            if role.name not in ARGUMENT_SPECS_PENDING:
                problems.append(f"{role.name}: no meta/argument_specs.yml")
            continue
        specs = yaml.safe_load(spec_file.read_text())["argument_specs"]
        wanted = set(used.get(role.name, set()))
        if (role / "tasks" / "main.yml").exists():
            wanted.add(MAIN_DOCUMENTED_AS.get(role.name, "main"))
        elif not specs:
            # A role of defaults only (sparkops_defaults) documents them under an entry point of its own: an
            # entry point `main` would make Ansible check it before every role that depends on it, in every play.
            problems.append(f"{role.name}: no entry point documents its variables")
        for entry in sorted(wanted - set(specs)):
            problems.append(f"{role.name}: entry point {entry} has no argument spec")
        for entry, spec in specs.items():
            if not spec.get("short_description"):
                problems.append(f"{role.name}.{entry}: no short_description")
            for name, opt in (spec.get("options") or {}).items():
                if not opt.get("description") or not opt.get("type"):
                    problems.append(f"{role.name}.{entry}.{name}: needs a description and a type")
    assert not problems, problems


def test_every_filter_is_documented():
    """Every filter a plugin file provides has its plugins/filter/<name>.yml, and every documented filter is
    provided: a filter dropped from a FilterModule (or one returning {}) fails here, not in a playbook."""
    filters = set()
    for path in sorted((ROOT / "plugins" / "filter").glob("*.py")):
        mod = importlib.import_module(f"ansible_collections.sparkops.cluster.plugins.filter.{path.stem}")
        provided = mod.FilterModule().filters()
        assert provided, f"plugins/filter/{path.name}: FilterModule().filters() provides no filter"
        assert all(callable(f) for f in provided.values()), f"plugins/filter/{path.name}: a filter is not callable"
        assert not filters & set(provided), f"plugins/filter/{path.name}: a filter name is provided twice"
        filters |= set(provided)
    documented = {doc.stem for doc in (ROOT / "plugins" / "filter").glob("*.yml")}
    assert documented - filters == set(), "documented in plugins/filter/*.yml but provided by no filter plugin"
    assert filters - documented == set(), "provided by a filter plugin but without plugins/filter/<name>.yml"
    for name in sorted(filters):
        doc = ROOT / "plugins" / "filter" / f"{name}.yml"
        assert doc.exists(), f"filter {name}: no plugins/filter/{name}.yml"
        data = yaml.safe_load(doc.read_text())
        assert data["DOCUMENTATION"]["name"] == name
        assert data["EXAMPLES"].strip() and data["RETURN"]["_value"]["description"]
