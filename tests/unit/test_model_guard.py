"""Guard: direct reads of the inventory layout outside the cluster model may only go down.

Roles read `sparkops_cluster` / `sparkops_node` (roles/cluster_facts). Reading
`sparkops_fast_links`, `groups['spark_head']`, deriving the head's address, reaching into other
hosts' variables or borrowing another role's task files spreads one value over many files again.
BEFORE is the count on main just before the model landed; CEILING is what is left now: lower it
when you remove more, never raise it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ["roles", "playbooks", "plugins", "molecule", "site.yml"]
# The model itself, where these reads belong.
MODEL = {
    "plugins/plugin_utils/cluster.py",
    "plugins/plugin_utils/serving.py",
    "plugins/action/cluster_facts.py",
    "plugins/modules/cluster_facts.py",
}
MODEL_DIRS = ("roles/cluster_facts/",)
# The discovery writes the inventory layout the model reads (its inverse): naming sparkops_fast_links,
# spark_head and each host's connection variables is its job, not a read that bypasses the model.
INVENTORY_WRITERS = {
    "plugins/plugin_utils/discovery.py",
    "plugins/filter/discovery.py",
    "plugins/filter/sparkops_discover_inventory.yml",
    "plugins/filter/sparkops_discover_moved.yml",
    "playbooks/discover.yml",
}
PATTERNS = {
    "sparkops_fast_links reads": re.compile(r"sparkops_fast_links"),
    "groups['spark_head'] reads": re.compile(r"groups\[\s*['\"]spark_head['\"]\s*\]"),
    "head/primary address derivations": re.compile(r"sparkops_fast_links\s*(\[\s*0\s*\]|\|\s*first)"),
    "hostvars reach-ins": re.compile(r"\bhostvars\b"),
    "tasks_from borrowing": re.compile(r"\btasks_from\b"),
    # What is served (issue 24): the serving plan (sparkops_cluster.serving) holds it.
    "sparkops_profile reads": re.compile(r"\bsparkops_profile\b"),
    "sparkops_image reads": re.compile(r"\bsparkops_image\b"),
    "vLLM and Ray argv variables": re.compile(r"\b(vllm_serve_argv|ray_cluster_command)\b"),
    "groups['spark_cluster'] reads": re.compile(r"groups\[\s*['\"]spark_cluster['\"]\s*\]"),
    # How things change (transitions): YAML that asks which executor runs, and one-deployment reads. The plan's
    # members say what runs where; these go down to 0 as the executors own their lifecycle.
    "executor branches": re.compile(r"executor\s*[=!]=|\bray_used\b"),
    "first-deployment reads": re.compile(r"deployments\s*\[\s*0\s*\]"),
}
BEFORE = {
    "sparkops_fast_links reads": 49,
    "groups['spark_head'] reads": 24,
    "head/primary address derivations": 15,
    "hostvars reach-ins": 31,
    "tasks_from borrowing": 12,
    # The serving reads just before the serving plan landed (issue 24).
    "sparkops_profile reads": 74,
    "sparkops_image reads": 42,
    "vLLM and Ray argv variables": 4,
    "groups['spark_cluster'] reads": 20,
    # Counted on the landed main before the transitions work (14535e2), with these patterns.
    "executor branches": 3,
    "first-deployment reads": 9,
}
# After doctor, watchdog, fastpath, ray_cluster, weight_cache's sync, vllm_serve's container and
# verify.yml read the model (others' roles and molecule not yet switched). tasks_from is above
# BEFORE: entry points (wait, proof, checkout, settings, jumbo-ping) that merged playbooks include.
# The groups['spark_head'] reads left are molecule's verify.yml, which finds the head on its own on
# purpose: it checks what the roles did without trusting the model they read.
# tasks_from 10: the serving plan (issue 24) names the image, so weights.yml, serve.yml and watchdog.yml
# run alone no longer borrow spark_vllm_image's checkout.yml.
# argv variables 0: the plan holds Ray's `ray start` too (issue 24), not roles/ray_cluster/vars.
CEILING = {
    "sparkops_fast_links reads": 11,
    "groups['spark_head'] reads": 6,
    "head/primary address derivations": 5,
    "hostvars reach-ins": 23,
    "tasks_from borrowing": 10,
    # The container tasks still read sparkops_image: an upgrade's rollback sets it (from the rollback plan).
    "sparkops_profile reads": 60,
    "sparkops_image reads": 40,
    "vLLM and Ray argv variables": 0,
    "groups['spark_cluster'] reads": 19,
    "executor branches": 3,
    # 8: serve.yml judges every node's watchdog from the node's own part of the plan, not deployments[0].
    "first-deployment reads": 8,
}


def scanned_files():
    for entry in SCANNED:
        path = ROOT / entry
        files = [path] if path.is_file() else sorted(path.rglob("*"))
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            if f.suffix not in {".yml", ".yaml", ".j2", ".py"} or rel in MODEL | INVENTORY_WRITERS:
                continue
            if rel.startswith(MODEL_DIRS):
                continue
            yield rel, f.read_text(encoding="utf-8", errors="replace")


def counts():
    out = dict.fromkeys(PATTERNS, 0)
    where = {name: {} for name in PATTERNS}
    for rel, text in scanned_files():
        for name, pat in PATTERNS.items():
            n = len(pat.findall(text))
            if n:
                out[name] += n
                where[name][rel] = n
    return out, where


def test_layout_reads_outside_the_model_only_go_down():
    now, where = counts()
    print({name: f"{BEFORE[name]} -> {now[name]}" for name in now})
    for name, n in now.items():
        assert n <= CEILING[name], f"{name}: {n} > {CEILING[name]} (new reads in {where[name]}); read sparkops_cluster"


def test_the_guard_sees_a_new_read():
    """The patterns really match the reads they guard against."""
    sample = "x: \"{{ groups['spark_head'][0] }} {{ hostvars[h].sparkops_fast_links[0].address }}\"\n"
    found = {name: len(p.findall(sample)) for name, p in PATTERNS.items()}
    assert found == {
        "sparkops_fast_links reads": 1,
        "groups['spark_head'] reads": 1,
        "head/primary address derivations": 1,
        "hostvars reach-ins": 1,
        "tasks_from borrowing": 0,
        "sparkops_profile reads": 0,
        "sparkops_image reads": 0,
        "vLLM and Ray argv variables": 0,
        "groups['spark_cluster'] reads": 0,
        "executor branches": 0,
        "first-deployment reads": 0,
    }


def test_the_guard_sees_an_executor_branch_and_a_first_deployment_read():
    sample = (
        "when: sparkops_cluster.serving.deployments[0].executor == 'mp'\nwhen: not ray_used and d.executor != 'ray'\n"
    )
    found = {name: len(p.findall(sample)) for name, p in PATTERNS.items()}
    assert found["executor branches"] == 3
    assert found["first-deployment reads"] == 1
