#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: ray_cluster_status
short_description: Read a Ray cluster's nodes and GPUs, and optionally wait until every node has joined
description:
  - Runs C(ray status) (or the I(command) given, for example through C(docker exec)) and parses it, or
    parses I(text) given directly. Optionally also runs I(nodes_command), C(ray list nodes --format json),
    whose per-node ALIVE/DEAD states and IPs are more reliable than C(ray status); that needs Ray's
    dashboard (state API) to be running.
  - With I(wait_timeout_s), polls until the cluster has I(expected_nodes), I(expected_gpus) and every
    address in I(expected_node_ips), or fails naming what is missing.
  - Right after a node dies, C(ray status) can keep listing it as Active while its GPUs are already gone
    from the totals (seen on Ray 2.52); readiness therefore also needs the GPUs.
  - Alive nodes and GPUs are judged in one place (C(membership) in module_utils/ray_status.py), so
    readiness, C(verify.yml), C(status.yml) and the health report say the same thing; I(summary) is
    that sentence.
  - Read-only.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  container:
    description:
      - Name of the Ray container on the host the module runs on. When given, I(command) defaults to
        C(docker exec <container> ray status [--address <gcs_address>]) and I(nodes_command) to a
        C(python3 -c) inside it that prints Ray's GCS node list (C(ray.nodes())) as
        C(ray list nodes --format json) would, which needs no dashboard.
    type: str
  gcs_address:
    description: C(host:port) of the GCS, passed to C(ray status --address) when I(container) builds the command.
    type: str
  command:
    description:
      - Command (argv list) printing C(ray status) text, or C(ray list nodes --format json|yaml) output.
      - For example C([docker, exec, sparkops-ray, ray, status, --address, 10.0.0.1:6379]).
      - Default C([ray, status]), or built from I(container).
    type: list
    elements: str
  nodes_command:
    description: Optional second command printing C(ray list nodes --format json) (or yaml) for node IPs and states.
    type: list
    elements: str
  text:
    description: Output to parse instead of running I(command) (C(ray status) text or node list JSON/YAML).
    type: str
  nodes_text:
    description: C(ray list nodes --format json|yaml) output to parse instead of running I(nodes_command).
    type: str
  expected_nodes:
    description: Number of alive nodes the cluster must have.
    type: int
  expected_gpus:
    description: Total GPUs the cluster must have.
    type: float
  expected_node_ips:
    description:
      - Node IPs that must all be alive in the cluster. Needs node IPs in the output, that is
        I(nodes_command)/I(nodes_text) (C(ray status) of Ray 2.x names nodes by id only).
    type: list
    elements: str
  wait_timeout_s:
    description: Keep polling for up to this many seconds until the expectations hold; 0 looks once.
    type: float
    default: 0
  poll_interval_s:
    description: Seconds between polls.
    type: float
    default: 5
  command_timeout_s:
    description: Timeout of one run of I(command) or I(nodes_command) (C(ray status) against a dead head waits ~35 s).
    type: float
    default: 60
extends_documentation_fragment:
  - sparkops.cluster.attributes
  - sparkops.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Read membership through the Ray container (ray status and the GCS node list)
  sparkops.cluster.ray_cluster_status:
    container: sparkops-ray
    expected_nodes: 2
    expected_gpus: 2
  register: ray
  failed_when: false

- name: Wait until both Sparks have joined the Ray cluster with their GPUs
  sparkops.cluster.ray_cluster_status:
    command: [docker, exec, sparkops-ray, ray, status, --address, "{{ head_ip }}:6379"]
    nodes_command: [docker, exec, sparkops-ray, ray, list, nodes, --format, json,
                    --address, "http://{{ head_ip }}:8265"]
    expected_nodes: 2
    expected_gpus: 2
    expected_node_ips: "{{ groups['sparks'] | map('extract', hostvars, 'sparkops_fabric_ip') | list }}"
    wait_timeout_s: 120
    poll_interval_s: 5
  register: ray

- name: Parse captured output
  sparkops.cluster.ray_cluster_status:
    text: "{{ captured_ray_status }}"
"""

RETURN = r"""
summary:
  description:
    - "One sentence on membership, the same that status, verify and the health report print, for example
      C(1/2 nodes alive, 1.0/2.0 GPUs (0.0 used); not joined: 10.213.0.12; dead: 10.213.0.12)."
  returned: always
  type: str
source:
  description: What the membership was judged on (the GCS node list, C(ray status), both, or none).
  returned: always
  type: str
ready:
  description:
    - Whether the cluster met every expectation (without expectations, that it answered with at least one node).
  returned: always
  type: bool
nodes_alive:
  description: Alive nodes (ALIVE in the node list when given, else Active/Healthy/Idle entries of C(ray status)).
  returned: always
  type: int
gpus_total:
  description: GPUs in the cluster (C(ray status) Total Usage; from the node list when only that is given).
  returned: always
  type: float
gpus_used:
  description: GPUs in use (C(ray status) only; a placement group's reservation alone is not use).
  returned: always
  type: float
gpus_reserved:
  description: GPUs reserved in placement groups (C(ray status) only).
  returned: always
  type: float
node_ips:
  description: IPs of alive nodes (node list, or C(Node:) headers of older C(ray status -v)); empty when unknown.
  returned: always
  type: list
  elements: str
node_ids:
  description: Ids of nodes listed by C(ray status) (C(node_<id>) lines) or alive in the node list.
  returned: always
  type: list
  elements: str
missing_node_ips:
  description: Entries of I(expected_node_ips) not alive in the cluster.
  returned: always
  type: list
  elements: str
dead_node_ips:
  description: IPs the node list reports DEAD.
  returned: always
  type: list
  elements: str
pending:
  description: C(ray status) Pending entries.
  returned: always
  type: list
  elements: str
failures:
  description: C(ray status) Recent failures entries.
  returned: always
  type: list
  elements: str
demands:
  description: C(ray status) pending resource demands (for example unplaced placement groups).
  returned: always
  type: list
  elements: str
polls:
  description: How many times the cluster was read.
  returned: always
  type: int
elapsed_s:
  description: Seconds spent.
  returned: always
  type: float
"""

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.ray_status import (
    GCS_NODES_SCRIPT,
    RayParseError,
    describe_membership,
    looks_like_node_list,
    membership,
    parse_ray_nodes,
    parse_ray_status,
)


class CommandError(Exception):
    pass


def _run(argv: list[str], timeout: float) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise CommandError(f"{argv[0]!r} not found: install Ray there, or run it through docker exec") from exc
    except subprocess.TimeoutExpired as exc:
        raise CommandError(f"{' '.join(argv)} did not finish within {timeout:g} s (is the Ray head up?)") from exc
    if proc.returncode != 0:
        tail = " ".join((proc.stderr or proc.stdout or "").split())[-400:]
        raise CommandError(f"{' '.join(argv)} failed (rc={proc.returncode}): {tail}")
    return proc.stdout


def observe(p: dict) -> dict:
    """Read the cluster once; return the result fields (plus `error` when nothing could be read)."""
    status, nodes, errors = None, None, []
    # The two readings are independent Python processes in the container (each ~1 s of imports):
    # start the node list's in the background while `ray status` runs.
    pool = None
    nodes_future = None
    if p["nodes_text"] is None and p["nodes_command"] and p["text"] is None:
        pool = ThreadPoolExecutor(max_workers=1)
        nodes_future = pool.submit(_run, p["nodes_command"], p["command_timeout_s"])
    try:
        try:
            out = p["text"] if p["text"] is not None else _run(p["command"], p["command_timeout_s"])
            if looks_like_node_list(out):
                nodes = parse_ray_nodes(out)
            else:
                status = parse_ray_status(out)
        except (CommandError, RayParseError) as exc:
            errors.append(str(exc))
        if p["nodes_text"] is not None or p["nodes_command"]:
            try:
                if p["nodes_text"] is not None:
                    out = p["nodes_text"]
                elif nodes_future is not None:
                    out = nodes_future.result()
                else:
                    out = _run(p["nodes_command"], p["command_timeout_s"])
                nodes = parse_ray_nodes(out)
            except (CommandError, RayParseError) as exc:
                errors.append(str(exc))
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    r = membership(status, nodes)
    if status is not None and not status["available"]:
        errors.append(status["message"])
    r["error"] = "; ".join(errors) or None
    return r


def judge(r: dict, p: dict) -> tuple[bool, list[str]]:
    missing = sorted(set(p["expected_node_ips"] or []) - set(r["node_ips"]))
    r["missing_node_ips"] = missing if r["ips_known"] else list(p["expected_node_ips"] or [])
    if not r["available"]:
        return False, r["missing_node_ips"]
    ok = True
    if p["expected_nodes"] is not None and r["nodes_alive"] < p["expected_nodes"]:
        ok = False
    if p["expected_gpus"] is not None and r["gpus_total"] + 1e-9 < p["expected_gpus"]:
        ok = False
    if r["missing_node_ips"]:
        ok = False
    if p["expected_nodes"] is None and p["expected_gpus"] is None and not p["expected_node_ips"]:
        ok = r["nodes_alive"] >= 1
    return ok, r["missing_node_ips"]


def describe(r: dict, p: dict, elapsed: float) -> str:
    msg = f"Ray cluster after {elapsed:.0f} s: " + describe_membership(r, p["expected_nodes"], p["expected_gpus"])
    if r.get("error"):
        msg += f"; last error: {r['error']}"
    return msg


def default_commands(p: dict) -> None:
    """Fill command/nodes_command from `container` (the one place the GCS node-list script is named)."""
    if p["container"]:
        address = ["--address", p["gcs_address"]] if p["gcs_address"] else []
        if p["command"] is None:
            p["command"] = ["docker", "exec", p["container"], "ray", "status", *address]
        if p["nodes_command"] is None and p["nodes_text"] is None:
            p["nodes_command"] = ["docker", "exec", p["container"], "python3", "-c", GCS_NODES_SCRIPT]
    elif p["command"] is None:
        p["command"] = ["ray", "status"]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "container": {"type": "str"},
            "gcs_address": {"type": "str"},
            "command": {"type": "list", "elements": "str"},
            "nodes_command": {"type": "list", "elements": "str"},
            "text": {"type": "str"},
            "nodes_text": {"type": "str"},
            "expected_nodes": {"type": "int"},
            "expected_gpus": {"type": "float"},
            "expected_node_ips": {"type": "list", "elements": "str"},
            "wait_timeout_s": {"type": "float", "default": 0},
            "poll_interval_s": {"type": "float", "default": 5},
            "command_timeout_s": {"type": "float", "default": 60},
        },
        supports_check_mode=True,
    )
    p = module.params
    default_commands(p)
    if not p["command"] and p["text"] is None:
        module.fail_json(msg="command is empty and no text was given: pass the ray status command or its output")
    if p["wait_timeout_s"] < 0 or p["poll_interval_s"] <= 0 or p["command_timeout_s"] <= 0:
        module.fail_json(msg="wait_timeout_s must be >= 0, poll_interval_s and command_timeout_s > 0")
    start = time.monotonic()
    deadline = start + p["wait_timeout_s"]
    polls = 0
    while True:
        polls += 1
        r = observe(p)
        ready = judge(r, p)[0]
        elapsed = round(time.monotonic() - start, 3)
        # Without any node-list source, no poll can ever tell node IPs: say so at once. A node list that
        # failed on this poll (the GCS still busy with a joining node) is read again until the deadline.
        no_ip_source = p["nodes_text"] is None and not p["nodes_command"]
        if p["expected_node_ips"] and r["available"] and not r["ips_known"] and no_ip_source:
            module.fail_json(
                msg="expected_node_ips needs node IPs, which this `ray status` output does not carry: "
                "add nodes_command (ray list nodes --format json, needs the dashboard) or nodes_text",
                ready=False,
                polls=polls,
                elapsed_s=elapsed,
                **_public(r),
            )
        if ready or time.monotonic() >= deadline:
            break
        time.sleep(max(0.0, min(p["poll_interval_s"], deadline - time.monotonic())))
    result = {
        "changed": False,
        "ready": ready,
        "polls": polls,
        "elapsed_s": elapsed,
        "summary": describe_membership(r, p["expected_nodes"], p["expected_gpus"]),
        **_public(r),
    }
    has_expectations = p["expected_nodes"] is not None or p["expected_gpus"] is not None or p["expected_node_ips"]
    if not r["available"] and not has_expectations:
        module.fail_json(msg=f"cannot read the Ray cluster: {r['error']}", **result)
    if has_expectations and not ready:
        module.fail_json(msg=describe(r, p, elapsed), **result)
    module.exit_json(**result)


def _public(r: dict) -> dict:
    return {k: v for k, v in r.items() if k not in ("ips_known", "available", "error")}


if __name__ == "__main__":
    main()
