"""The discovery of playbooks/discover.yml as filters: infer, the inventory text, its difference."""

from __future__ import annotations

import difflib

import yaml
from ansible_collections.sparkops.cluster.plugins.plugin_utils.discovery import (
    DiscoveryError,
    infer,
    moved_cables,
    printable,
    render_inventory,
    summary,
)


def sparkops_discover(reads: dict, hosts: list, settings: dict | None = None) -> dict:
    """{ok, result, problems, summary}: the cabling inferred from every node's fabric_discover read."""
    try:
        result = infer(reads, hosts, settings or {})
    except DiscoveryError as err:
        partial = err.partial or {}
        lines = [printable(f"node {h}: " + ", ".join(
            f"{p['netdev']}[{p['rdma_device'] or '-'}] {p['operstate']}" for p in partial.get("ports", {}).get(h, [])
        )) for h in partial.get("hosts", [])]  # fmt: skip
        return {"ok": False, "result": None, "problems": err.problems, "summary": lines}
    return {"ok": True, "result": result, "problems": [], "summary": summary(result)}


CONNECTION_KEYS = ("ansible_host", "ansible_port", "ansible_user")


def sparkops_discover_inventory(result: dict, hostvars=None, source: str = "") -> str:
    """hosts.yml for the discovered cluster (build_cluster's shape), each host with how to reach it
    (ansible_host, ansible_port, ansible_user, as hostvars has them; the rest belongs in group_vars)."""
    connection = {}
    for h in result["hosts"]:
        hv = (hostvars or {}).get(h) or {}
        connection[h] = {k: hv[k] for k in CONNECTION_KEYS if k in hv and hv[k] is not None}
    return render_inventory(result, connection, source)


def sparkops_discover_diff(old: str, new: str, name: str = "hosts.yml") -> list:
    """The unified difference between an existing inventory file and the discovered one, as lines."""
    return [
        line.rstrip("\n")
        for line in difflib.unified_diff(
            (old or "").splitlines(True), (new or "").splitlines(True), f"{name} (existing)", f"{name} (discovered)"
        )
    ]


def sparkops_discover_moved(existing: str, result: dict) -> list:
    """The cables of an existing hosts.yml (its text) that the discovery no longer finds, one sentence each."""
    try:
        data = yaml.safe_load(existing or "") or {}
    except yaml.YAMLError:
        return ["the existing inventory is no valid YAML; compare it by hand with the discovered one."]
    links: dict = {}

    def walk(group):
        if not isinstance(group, dict):
            return
        for h, hv in (group.get("hosts") or {}).items():
            if isinstance(hv, dict) and hv.get("sparkops_fast_links"):
                links[h] = hv["sparkops_fast_links"]
        for child in (group.get("children") or {}).values():
            walk(child)

    walk(data.get("all") or {})
    return moved_cables(links, result) if links else []


class FilterModule:
    def filters(self):
        return {
            "sparkops_discover": sparkops_discover,
            "sparkops_discover_inventory": sparkops_discover_inventory,
            "sparkops_discover_diff": sparkops_discover_diff,
            "sparkops_discover_moved": sparkops_discover_moved,
        }
