#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: fabric_facts
short_description: Read a node's fast links, RDMA GIDs and files, and send jumbo pings, in one call
description:
  - What the roce_network role judges on a node, read in one module run so that a run with nothing to change
    costs one run per node instead of one per link, per ping and per file.
  - I(links) - each fast link's IPv4 addresses and MTU (C(ip -j addr show)).
  - RDMA - every RDMA device from sysfs and, for each link with an address, whether GID I(gid_index) of its
    device is that address's RoCE v2 entry (the same reading and checks as M(sparkops.cluster.rdma_facts)).
  - I(pings) - don't-fragment pings that fill the MTU, out through each lane's netdev, all started at once.
  - I(sysctls), I(static_routes) and I(files) (checksum and mode, so the role skips a write already in place).
  - A host without RDMA devices is reported with I(rdma_present=false) and a I(reason); a failed ping is reported,
    not failed on (the role judges). Read-only.
version_added: "0.7.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  links:
    description:
      - The fast links to read, each a mapping with C(netdev) and, optionally, C(address), the IPv4 address (a
        prefix length is accepted) the link must carry, also checked as its RoCE v2 GID. Other keys are ignored,
        so the cluster model's links can be passed as they are.
    type: list
    elements: dict
    default: []
  gid_index:
    description: GID index NCCL uses (C(NCCL_IB_GID_INDEX)); 3 on DGX Sparks.
    type: int
    default: 3
  sysfs_root:
    description: Root of sysfs for the RDMA devices (tests point it at a copied tree).
    type: path
    default: /sys
  pings:
    description:
      - Pings to send, all side by side, each a mapping with C(netdev) (the interface the ping leaves through,
        C(ping -I)) and C(ip) (the address pinged). Other keys (a label such as C(peer)) come back in I(pings).
    type: list
    elements: dict
    default: []
  ping_size:
    description: Payload bytes (MTU - 20 IP - 8 ICMP fills the MTU).
    type: int
    default: 8972
  ping_count:
    description: Pings per lane.
    type: int
    default: 3
  ping_interval_s:
    description: Seconds between pings (0.2 is the shortest ping allows without root).
    type: float
    default: 0.2
  ping_timeout_s:
    description: Deadline per reply, in seconds (C(ping -W)).
    type: int
    default: 2
  sysctls:
    description: Kernel settings to read, such as C(net.ipv4.ip_forward).
    type: list
    elements: str
    default: []
  static_routes:
    description: Also read the IPv4 routes of protocol C(static) (C(ip -j -4 route show proto static)).
    type: bool
    default: false
  files:
    description: Files (or folders) whose existence, kind, mode and SHA-1 to report.
    type: list
    elements: path
    default: []
extends_documentation_fragment:
  - sparkops.cluster.attributes
  - sparkops.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Read the fast links, the GIDs and the env file, and ping the other end of each lane
  sparkops.cluster.fabric_facts:
    links:
      - {netdev: enp1s0f1np1, address: 10.213.0.11/24}
      - {netdev: enP2p1s0f1np1, address: 10.213.1.11/24}
    pings:
      - {netdev: enp1s0f1np1, ip: 10.213.0.12}
      - {netdev: enP2p1s0f1np1, ip: 10.213.1.12}
    ping_size: 8972
    files: [/etc/sparkops/fabric.env]
  register: fabric
"""

RETURN = r"""
links:
  description: Per netdev, C(present), C(mtu), C(ipv4) (its addresses, no prefix) and C(has_address).
  returned: always
  type: dict
  sample: {"enp1s0f1np1": {"present": true, "mtu": 9000, "ipv4": ["10.213.0.11"], "has_address": true}}
rdma_present:
  description: Whether any RDMA device was found.
  returned: always
  type: bool
reason:
  description: Why I(rdma_present) is false; null otherwise.
  returned: always
  type: str
netdev_to_device:
  description: Map of netdev to RDMA device name (what C(ibdev2netdev) prints).
  returned: always
  type: dict
gid_checks:
  description: Per link with an address, its GID check (as M(sparkops.cluster.rdma_facts) returns it).
  returned: always
  type: dict
gid_ok:
  description: Whether every GID check passed (true when there is none).
  returned: always
  type: bool
pings:
  description: Per ping, in order, what was asked (C(netdev), C(ip) and any other key) with C(rc) (null when
    killed at the deadline), C(ok) and C(detail) (why it failed, from ping's output).
  returned: always
  type: list
  elements: dict
pings_ok:
  description: Whether every ping got its replies (true when there is none).
  returned: always
  type: bool
sysctls:
  description: Per name, its value (null when unreadable).
  returned: always
  type: dict
routes:
  description: The static IPv4 routes (C(ip -j) objects); empty unless I(static_routes).
  returned: always
  type: list
  elements: dict
files:
  description:
    - Per path, C(exists), C(kind) (C(file), C(directory), C(link), C(other)), C(mode) and C(sha1) (files only).
  returned: always
  type: dict
"""

import ipaddress
import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.node_read import (
    file_states,
    parse_ip_addr_json,
    ping_argv,
    ping_detail,
    run_side_by_side,
    sysctls,
)
from ansible_collections.sparkops.cluster.plugins.module_utils.rdma import gid_report


def _ipv4(text: str) -> str:
    return str(ipaddress.IPv4Address(str(text).split("/", maxsplit=1)[0]))


def read_links(module: AnsibleModule, links: list) -> dict:
    if not links:
        return {}
    rc, out, err = module.run_command(["ip", "-j", "addr", "show"])
    if rc != 0:
        module.fail_json(msg=f"ip -j addr show failed (rc {rc}): {err.strip()}; is iproute2 installed?")
    try:
        seen = parse_ip_addr_json(out)
    except ValueError as exc:
        module.fail_json(msg=f"could not read `ip -j addr show`: {exc}")
    result = {}
    for link in links:
        now = seen.get(link["netdev"])
        want = _ipv4(link["address"]) if link.get("address") else None
        result[link["netdev"]] = {
            "present": now is not None,
            "mtu": now["mtu"] if now else None,
            "ipv4": now["ipv4"] if now else [],
            "has_address": bool(now) and want in now["ipv4"] if want else None,
        }
    return result


def run_pings(p: dict) -> list:
    if not p["pings"]:
        return []
    argvs = [
        ping_argv(
            x["netdev"],
            x["ip"],
            size=p["ping_size"],
            count=p["ping_count"],
            interval_s=p["ping_interval_s"],
            timeout_s=p["ping_timeout_s"],
        )
        for x in p["pings"]
    ]
    # Every lane at once: the slowest lane bounds the run, not their sum.
    deadline = p["ping_count"] * p["ping_interval_s"] + p["ping_timeout_s"] + 5
    out = []
    for x, (rc, stdout, stderr) in zip(p["pings"], run_side_by_side(argvs, deadline), strict=True):
        out.append(dict(x, rc=rc, ok=rc == 0, detail="" if rc == 0 else ping_detail(stdout, stderr)))
    return out


def main():
    module = AnsibleModule(
        argument_spec={
            "links": {"type": "list", "elements": "dict", "default": []},
            "gid_index": {"type": "int", "default": 3},
            "sysfs_root": {"type": "path", "default": "/sys"},
            "pings": {"type": "list", "elements": "dict", "default": []},
            "ping_size": {"type": "int", "default": 8972},
            "ping_count": {"type": "int", "default": 3},
            "ping_interval_s": {"type": "float", "default": 0.2},
            "ping_timeout_s": {"type": "int", "default": 2},
            "sysctls": {"type": "list", "elements": "str", "default": []},
            "static_routes": {"type": "bool", "default": False},
            "files": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    problems = []
    if not 0 <= p["gid_index"] <= 255:
        problems.append(f"gid_index must be between 0 and 255 (a GID table index), got {p['gid_index']}")
    if p["ping_count"] < 1 or p["ping_timeout_s"] < 1 or p["ping_interval_s"] <= 0 or p["ping_size"] < 0:
        problems.append("ping_count and ping_timeout_s must be 1 or more, ping_interval_s positive, ping_size >= 0")
    for what, keys in (("links", ("netdev",)), ("pings", ("netdev", "ip"))):
        for i, x in enumerate(p[what]):
            missing = [k for k in keys if not x.get(k)]
            if missing:
                problems.append(f"{what}[{i}] has no {' or '.join(missing)}")
    if problems:
        module.fail_json(msg="; ".join(problems))
    expect = {}
    for link in p["links"]:
        if link.get("address"):
            try:
                expect[link["netdev"]] = _ipv4(link["address"])
            except ValueError:
                problems.append(f"links: {link['netdev']}: address {link['address']!r} is not an IPv4 address")
    for x in p["pings"]:
        try:
            ipaddress.IPv4Address(x["ip"])
        except ValueError:
            problems.append(f"pings: {x['netdev']}: ip {x['ip']!r} is not an IPv4 address")
    if problems:
        module.fail_json(msg="; ".join(problems))

    result = {"links": read_links(module, p["links"])}
    result.update(gid_report(p["sysfs_root"], expect, gid_index=p["gid_index"]))
    result["pings"] = run_pings(p)
    result["pings_ok"] = all(x["ok"] for x in result["pings"])
    result["sysctls"] = sysctls(p["sysctls"])
    result["routes"] = []
    if p["static_routes"]:
        rc, out, err = module.run_command(["ip", "-j", "-4", "route", "show", "proto", "static"])
        if rc != 0:
            module.fail_json(msg=f"ip -j -4 route show proto static failed (rc {rc}): {err.strip()}")
        try:
            result["routes"] = json.loads(out or "[]")
        except ValueError as exc:
            module.fail_json(msg=f"could not read the static routes: {exc}")
    result["files"] = file_states(p["files"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
