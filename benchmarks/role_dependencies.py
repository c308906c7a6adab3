#!/usr/bin/env python3
"""What declaring the shared settings once (in cluster_facts only) saves when Ansible reads site.yml, in one run.

Ansible reads a role dependency's files (defaults, argument specs) again for every role that declares it and
deep-copies them each time. This checks site.yml's syntax (`ansible-playbook --syntax-check`, which loads every
play and role and runs nothing) in the checkout as it is, and in a copy whose roles each declare
sparkops.cluster.sparkops_defaults again (as they did before), alternately, ROUNDS times each, and prints the CPU
seconds (user + system) of each and their ratio.

    .venv/bin/python benchmarks/role_dependencies.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPENDENCY = {"role": "sparkops.cluster.sparkops_defaults"}


def every_role_declares_the_defaults(tree: Path) -> int:
    """Give every role but sparkops_defaults the dependency back; returns how many roles changed."""
    changed = 0
    for meta in sorted((tree / "roles").glob("*/meta/main.yml")):
        if meta.parent.parent.name in ("sparkops_defaults", "cluster_facts"):
            continue
        data = yaml.safe_load(meta.read_text())
        data["dependencies"] = [DEPENDENCY, *(data.get("dependencies") or [])]
        meta.unlink()  # a copy, not the checkout's file (the tree's other files are links)
        meta.write_text(yaml.safe_dump(data, sort_keys=False))
        changed += 1
    return changed


def linked_copy(dest: Path) -> None:
    """The checkout as hard links (cheap); its collections/ link is relative, so it points at the copy."""
    skip = shutil.ignore_patterns(".venv", ".sim", ".git")
    shutil.copytree(ROOT, dest, symlinks=True, copy_function=os.link, ignore=skip)


def cpu_of(tree: Path) -> float:
    env = {**os.environ, "ANSIBLE_CONFIG": str(tree / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [str(ROOT / ".venv/bin/ansible-playbook"), "--syntax-check", "-i", "inventory/two-sparks", "site.yml"],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sparkops-roledeps-") as tmp:
        before = Path(tmp) / "declared-by-every-role"
        linked_copy(before)
        roles = every_role_declares_the_defaults(before)
        shipped, declared = [], []
        for _ in range(args.rounds):
            shipped.append(cpu_of(ROOT))
            declared.append(cpu_of(before))
    a, b = statistics.median(declared), statistics.median(shipped)
    print(f"site.yml --syntax-check, CPU seconds (median of {args.rounds}, alternating, {os.cpu_count()} cores):")
    print(f"  {roles} roles each declaring sparkops_defaults: {a:.2f} s")
    print(f"  only cluster_facts declaring it (shipped):       {b:.2f} s")
    print(f"  ratio: {a / b:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
