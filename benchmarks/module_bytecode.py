#!/usr/bin/env python3
"""What the bytecode module_cache adds to a packed module saves on the node, measured in one run.

A node runs each task's module from the zip Ansible sends (AnsiballZ) through zipimport, which keeps no bytecode:
without the .pyc files that the sparkops.cluster.module_cache callback adds, the node compiles
ansible.module_utils.basic and everything it imports again for every task. This packs ansible.builtin.command the
way a run does (one local ansible-playbook run with the callback), then imports it from the payload with and
without the bytecode, alternately, ROUNDS times each, under PYTHON (the node's interpreter; this machine's python3
by default), and prints the CPU seconds of each and their ratio. CPU time is what a task costs the node (and, on
the simulated cluster, the same cores as everything else).

    .venv/bin/python benchmarks/module_bytecode.py [--rounds 15] [--python /usr/bin/python3]
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))
from ansible_collections.sparkops.cluster.plugins.callback.module_cache import read_cached, with_bytecode  # noqa: E402

PLAYBOOK = "- hosts: localhost\n  gather_facts: false\n  tasks:\n    - ansible.builtin.command: 'true'\n"
IMPORT = "import sys; sys.path.insert(0, sys.argv[1]); import ansible.module_utils.basic, ansible.modules.command"


def packed_command(workdir: Path) -> bytes:
    """The payload of ansible.builtin.command as a run packs it (the callback's cache, bytecode removed)."""
    (workdir / "site.yml").write_text(PLAYBOOK)
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_LOCAL_TEMP": str(workdir / "ltmp"),
        "ANSIBLE_CALLBACKS_ENABLED": "sparkops.cluster.module_cache",
    }
    playbook = Path(sys.executable).with_name("ansible-playbook")
    subprocess.run(
        [str(playbook), "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
         "site.yml"],
        cwd=workdir, env=env, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (cached,) = [
        p for p in (workdir / "ltmp").glob("sparkops-ansiballz-*/ansible.modules.command-*") if p.suffix != ".lock"
    ]
    _record, payload = read_cached(str(cached))
    src = zipfile.ZipFile(io.BytesIO(payload))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if not info.filename.endswith(".pyc"):
                dst.writestr(info, src.read(info))
    return out.getvalue()


def cpu_seconds(python: str, payload: Path) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([python, "-c", IMPORT, str(payload)], check=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--python", default="python3", help="the node's interpreter (default: python3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plain = packed_command(work)
        compiled = with_bytecode(plain)
        paths = {"source only": work / "plain.zip", "with bytecode": work / "compiled.zip"}
        paths["source only"].write_bytes(plain)
        paths["with bytecode"].write_bytes(compiled)
        got: dict[str, list[float]] = {name: [] for name in paths}
        for _round in range(args.rounds):
            for name, path in paths.items():
                got[name].append(cpu_seconds(args.python, path))
    med = {name: statistics.median(values) for name, values in got.items()}
    cores = os.cpu_count()
    print(
        f"ansible.builtin.command imported from its payload by {args.python}, median of {args.rounds} ({cores} cores):"
    )
    sizes = {"source only": len(plain), "with bytecode": len(compiled)}
    for name, value in med.items():
        print(f"  {name:14s} {value * 1000:6.0f} ms CPU  (payload {sizes[name]} bytes)")
    print(f"  ratio with/without bytecode: {med['with bytecode'] / med['source only']:.2f}")


if __name__ == "__main__":
    main()
