"""The shared defaults reach every role through cluster_facts, which every play that runs a sparkops role lists.

Only cluster_facts declares sparkops_defaults as a dependency: Ansible reads a dependency's files again for every
role that declares it (its defaults and argument specs, deep-copied each time), which cost about a second of every
site.yml. The other roles read the shared defaults as their play's role defaults, so a play that runs one of them
without listing cluster_facts in its `roles:` would see them undefined. These tests read every shipped playbook
(and molecule's) and follow its task files, including the ones a role or an include pulls in.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = [ROOT / "site.yml", *sorted((ROOT / "playbooks").glob("*.yml")), *sorted(ROOT.glob("molecule/*/*.yml"))]
SHARED = ("sparkops_defaults", "cluster_facts")


def short(name) -> str:
    """sparkops.cluster.vllm_serve -> vllm_serve (a role's name as its folder says it)."""
    if isinstance(name, dict):
        name = name.get("role") or name.get("name")
    return str(name).rsplit(".", 1)[-1]


def roles_in_tasks(tasks, base: Path, seen: set) -> set:
    """The roles a list of tasks includes or imports, following include_tasks/import_tasks files by path."""
    found = set()
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        for key in ("block", "rescue", "always"):
            found |= roles_in_tasks(task.get(key), base, seen)
        for key, value in task.items():
            action = key.rsplit(".", 1)[-1]
            if action in ("include_role", "import_role"):
                found.add(short(value))
            elif action in ("include_tasks", "import_tasks"):
                name = value if isinstance(value, str) else (value or {}).get("file")
                if not name or "{{" in name:
                    continue
                path = Path(os.path.normpath(base / name))
                if path.is_file() and path not in seen:
                    seen.add(path)
                    found |= roles_in_tasks(yaml.safe_load(path.read_text()), path.parent, seen)
    return found


def plays():
    for book in PLAYBOOKS:
        doc = yaml.safe_load(book.read_text())
        for index, play in enumerate(doc if isinstance(doc, list) else []):
            if isinstance(play, dict) and "hosts" in play:
                yield book, index, play


def test_only_cluster_facts_declares_the_shared_defaults():
    declared = {}
    for meta in sorted((ROOT / "roles").glob("*/meta/main.yml")):
        deps = yaml.safe_load(meta.read_text()).get("dependencies") or []
        declared[meta.parent.parent.name] = [short(d) for d in deps]
    assert declared["cluster_facts"] == ["sparkops_defaults"]
    others = {role: deps for role, deps in declared.items() if role != "cluster_facts" and deps}
    assert not others, f"declare no dependency (the play's cluster_facts brings the shared defaults): {others}"


def test_every_play_that_runs_a_sparkops_role_lists_cluster_facts():
    checked, missing = 0, []
    for book, index, play in plays():
        listed = [short(r) for r in play.get("roles") or []]
        used = set(listed)
        for key in ("pre_tasks", "tasks", "post_tasks", "handlers"):
            used |= roles_in_tasks(play.get(key), book.parent, set())
        used -= set(SHARED)
        if not used:
            continue
        checked += 1
        if "cluster_facts" not in listed:
            missing.append(f"{book.relative_to(ROOT)} play {index} ({play.get('name', '')}): runs {sorted(used)}")
    assert checked >= 20, f"only {checked} plays run a sparkops role: is the walk still finding them?"
    assert not missing, "list sparkops.cluster.cluster_facts in these plays' roles:\n" + "\n".join(missing)


def test_the_walk_finds_a_role_pulled_in_by_an_included_task_file(tmp_path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "inner.yml").write_text(
        "- ansible.builtin.include_role:\n    name: sparkops.cluster.vllm_serve\n"
    )
    tasks = [{"block": [{"ansible.builtin.include_tasks": "tasks/inner.yml"}]}]
    assert roles_in_tasks(tasks, tmp_path, set()) == {"vllm_serve"}
