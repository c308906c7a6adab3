#!/usr/bin/env python3
"""Image fan-out benchmark on the simulated cluster: one copy to one node against the copy to every other node.

Needs a deployed simulated cluster (`make sim-up`, then at least `playbooks/provision.yml` and
`playbooks/image.yml` on it; a ring: `make sim-up SIM_NODES=4 SIM_TOPOLOGY=ring`, inventory under
`.sim/inventories/ring-4`). Each pass removes the image on some nodes (`docker image rm` inside them)
and runs `playbooks/image.yml`, which streams it along `sparkops_cluster.image.fanout` with the
image_fanout module. It prints, for each pass, the module's own transfer time (`seconds`: from the first
byte of `docker save` until every node's `docker load` ended) and the playbook's, then the ratio of the
"every node" transfer to the "one node" transfer and the core count, all measured in this one run.

    .venv/bin/python benchmarks/image_fanout.py --inventory .sim/inventories/ring-4 \\
        -e sparkops_serving_profile=sim-tiny-tp2-pp2 --repeat 2

Before the fan-out, the image went to each node in turn (one `docker save | zstd | ssh | docker load`
per node), so N-1 nodes took N-1 transfers. Bounded: --repeat passes (default 1) of each kind.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def sh(*argv: str, check: bool = True) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=120).stdout.strip()


def hosts_of(inventory: Path) -> list:
    data = yaml.safe_load((inventory / "hosts.yml").read_text())
    out = []

    def walk(group: dict) -> None:
        out.extend((group or {}).get("hosts", {}) or {})
        for child in ((group or {}).get("children") or {}).values():
            walk(child)

    walk(data["all"])
    return sorted(set(out))


def image_tag(node: str) -> str:
    tags = sh("docker", "exec", node, "docker", "image", "ls", "vllm-node", "--format", "{{.Repository}}:{{.Tag}}")
    if not tags:
        sys.exit(f"{node} has no vllm-node image: run playbooks/image.yml on this inventory first")
    return tags.splitlines()[0]


def one_pass(inventory: Path, extra: list, tag: str, empty: list) -> dict:
    for node in empty:
        sh("docker", "exec", node, "docker", "image", "rm", "-f", tag)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    argv = ["ansible-playbook", "playbooks/image.yml", "-i", str(inventory), "-v", *extra]
    started = time.monotonic()
    res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    playbook_s = time.monotonic() - started
    if res.returncode != 0:
        sys.exit(f"image.yml failed (rc {res.returncode}):\n{res.stdout[-3000:]}")
    task = res.stdout[res.stdout.find("Stream the image along the fan-out tree") :]
    seconds = re.search(r"^\s+seconds: ([\d.]+)$", task, re.M)
    nbytes = re.search(r"^\s+bytes: (\d+)$", task, re.M)
    if not seconds:
        sys.exit("image.yml did not stream anything: was the image removed?")
    return {"nodes": empty, "seconds": float(seconds.group(1)), "bytes": int(nbytes.group(1)), "playbook": playbook_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inventory", type=Path, default=ROOT / "inventory" / "sim")
    ap.add_argument("--build-host", default="spark-sim-1")
    ap.add_argument("--one", help="the node emptied for the one-copy pass (default: the build host's first child)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("-e", "--extra-vars", action="append", default=[])
    args = ap.parse_args()
    extra = [a for e in args.extra_vars for a in ("-e", e)]
    hosts = hosts_of(args.inventory)
    others = [h for h in hosts if h != args.build_host]
    one = args.one or others[0]
    tag = image_tag(args.build_host)
    rows = []
    for _ in range(max(1, min(args.repeat, 5))):
        rows.append(("one node", one_pass(args.inventory, extra, tag, [one])))
        rows.append((f"{len(others)} nodes", one_pass(args.inventory, extra, tag, others)))
    for name, r in rows:
        print(
            f"{name:>8} ({', '.join(r['nodes'])}): transfer {r['seconds']:.2f} s, {r['bytes'] / 1e6:.0f} MB "
            f"compressed, playbook {r['playbook']:.1f} s"
        )
    one_s = sum(r["seconds"] for n, r in rows if n == "one node")
    all_s = sum(r["seconds"] for n, r in rows if n != "one node")
    print(
        f"{len(hosts)} nodes ({args.inventory.name}), {os.cpu_count()} cores: every node / one node = "
        f"{all_s / one_s:.2f} (one copy after another would be {len(others)})"
    )


if __name__ == "__main__":
    main()
