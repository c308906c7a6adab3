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
    not failed on. Read-only.
  - The role's verdicts come ready-made, so the role only reads them - I(link_problems) (with I(mtu)),
    I(forwarding_stale) (with I(forwarding_wanted)), I(routes_missing) (with I(routes_wanted)),
    I(files_stale) (with I(files_wanted)), I(jumbo_problem) and I(problems), everything that stops the play.
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
  node:
    description: The node's name, which starts each message in I(link_problems), I(jumbo_problem) and I(problems).
    type: str
    default: this node
  mtu:
    description:
      - When more than 0, each of I(links) must carry its address (C(ip), else C(address) without its prefix) and at
        least this MTU; each that does not is a line of I(link_problems). 0 judges no link.
    type: int
    default: 0
  forwarding_check:
    description:
      - A ring node on links made elsewhere - C(net.ipv4.ip_forward) must be 1 and C(net.ipv4.conf.all.rp_filter)
        not 1 (replies come back the other way round); otherwise a line of I(link_problems) says so.
    type: bool
    default: false
  forwarding_wanted:
    description:
      - Kernel settings (name to value) that must be live and be the C(name=value) lines of I(forwarding_file), in
        this order (as C(ansible.posix.sysctl) writes them). I(forwarding_stale) says whether either is not so.
    type: dict
    default: {}
  forwarding_file:
    description: The file I(forwarding_wanted) is kept in; required with I(forwarding_wanted).
    type: path
  routes_wanted:
    description:
      - Routes (mappings with C(to), C(via), C(dev); other keys come back as given) the static routes must show
        with that destination, gateway and device; those missing are I(routes_missing). Implies I(static_routes).
    type: list
    elements: dict
    default: []
  files_wanted:
    description:
      - What a role would write - each entry's C(path) must be of C(kind) (C(file) or C(directory)), have C(mode)
        and, for a file given C(sha1), that SHA-1 (C(hash('sha1')) of the rendered content). Those that are not are
        I(files_stale); all of them are read into I(files) too.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The file or folder.
        type: path
        required: true
      kind:
        description: What it must be.
        type: str
        choices: [file, directory]
        default: file
      mode:
        description: Its mode, four octal digits such as C(0644).
        type: str
        required: true
      sha1:
        description: The SHA-1 of the content it must hold; left out, the content is not compared.
        type: str
  rdma_required:
    description: Whether a host without an RDMA device is a line of I(problems) (a DGX Spark always has one).
    type: bool
    default: false
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

- name: Judge a ring node on preconfigured links, and its env file
  sparkops.cluster.fabric_facts:
    node: spark-1
    links: [{netdev: enp1s0f1np1, address: 10.213.0.11/24}]
    mtu: 9000
    forwarding_check: true
    routes_wanted: [{to: 10.213.2.0/24, via: 10.213.0.12, dev: enp1s0f1np1}]
    files_wanted:
      - {path: /etc/sparkops/fabric.env, mode: "0644", sha1: 0a4d55a8d778e5022fab701977c5d840bbc486d0}
    rdma_required: true
  register: fabric

- name: Stop on what the read found
  ansible.builtin.assert:
    that: fabric.problems | length == 0
    fail_msg: "{{ fabric.problems | join(' | ') }}"
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
link_problems:
  description: One message per link not as I(mtu) and its address want, and a ring node that does not forward
    (I(forwarding_check)); empty otherwise.
  returned: always
  type: list
  elements: str
forwarding_stale:
  description: Whether a setting of I(forwarding_wanted) is not live or I(forwarding_file) does not hold them.
  returned: always
  type: bool
routes_missing:
  description: The entries of I(routes_wanted) the static routes do not show, as given.
  returned: always
  type: list
  elements: dict
files_stale:
  description: The paths of I(files_wanted) not in place (missing, other kind, mode or content).
  returned: always
  type: list
  elements: str
jumbo_problem:
  description: Empty when every ping got its replies; else which lanes failed and why, and what to check.
  returned: always
  type: str
problems:
  description:
    - Everything that stops the play - I(link_problems), no RDMA device where I(rdma_required), misplaced GIDs
      and I(jumbo_problem).
  returned: always
  type: list
  elements: str
"""

import ipaddress
import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils import fabric_verdicts
from ansible_collections.sparkops.cluster.plugins.module_utils.node_read import (
    FILES_WANTED_SPEC,
    file_states,
    files_with_wanted,
    parse_ip_addr_json,
    ping_argv,
    ping_detail,
    run_side_by_side,
    stale_files,
    sysctls,
    wanted_problems,
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
            "node": {"type": "str", "default": "this node"},
            "mtu": {"type": "int", "default": 0},
            "forwarding_check": {"type": "bool", "default": False},
            "forwarding_wanted": {"type": "dict", "default": {}},
            "forwarding_file": {"type": "path"},
            "routes_wanted": {"type": "list", "elements": "dict", "default": []},
            "files_wanted": FILES_WANTED_SPEC,
            "rdma_required": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    problems = []
    if not 0 <= p["gid_index"] <= 255:
        problems.append(f"gid_index must be between 0 and 255 (a GID table index), got {p['gid_index']}")
    if p["ping_count"] < 1 or p["ping_timeout_s"] < 1 or p["ping_interval_s"] <= 0 or p["ping_size"] < 0:
        problems.append("ping_count and ping_timeout_s must be 1 or more, ping_interval_s positive, ping_size >= 0")
    if p["forwarding_wanted"] and not p["forwarding_file"]:
        problems.append("forwarding_wanted needs forwarding_file, the file the settings are kept in")
    problems += wanted_problems(p["files_wanted"])
    for what, keys in (("links", ("netdev",)), ("pings", ("netdev", "ip")), ("routes_wanted", ("to", "via", "dev"))):
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
    names = list(p["sysctls"]) + list(p["forwarding_wanted"])
    names += list(fabric_verdicts.RING_SYSCTLS) if p["forwarding_check"] else []
    result["sysctls"] = sysctls(list(dict.fromkeys(names)))
    result["routes"] = []
    if p["static_routes"] or p["routes_wanted"]:
        rc, out, err = module.run_command(["ip", "-j", "-4", "route", "show", "proto", "static"])
        if rc != 0:
            module.fail_json(msg=f"ip -j -4 route show proto static failed (rc {rc}): {err.strip()}")
        try:
            result["routes"] = json.loads(out or "[]")
        except ValueError as exc:
            module.fail_json(msg=f"could not read the static routes: {exc}")
    extra = [p["forwarding_file"]] if p["forwarding_wanted"] else []
    result["files"] = file_states(files_with_wanted(p["files"] + extra, p["files_wanted"]))
    node = p["node"]
    result["link_problems"] = (
        fabric_verdicts.link_problems(node, p["links"], result["links"], p["mtu"]) if p["mtu"] > 0 else []
    )
    if p["forwarding_check"]:
        ring = fabric_verdicts.ring_forwarding_problem(node, result["sysctls"])
        result["link_problems"] += [ring] if ring else []
    forwarding_sha1 = result["files"][p["forwarding_file"]]["sha1"] if p["forwarding_wanted"] else None
    result["forwarding_stale"] = fabric_verdicts.forwarding_stale(
        p["forwarding_wanted"], result["sysctls"], forwarding_sha1
    )
    result["routes_missing"] = fabric_verdicts.routes_missing(p["routes_wanted"], result["routes"])
    result["files_stale"] = stale_files(p["files_wanted"], result["files"])
    # ping -s is the payload: the MTU less 20 bytes of IP and 8 of ICMP header.
    result["jumbo_problem"] = fabric_verdicts.jumbo_problem(node, p["ping_size"] + 28, result["pings"])
    result["problems"] = fabric_verdicts.problems(node, result, rdma_required=p["rdma_required"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
