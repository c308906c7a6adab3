#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: rdma_facts
short_description: Read RDMA (RoCE) devices from sysfs and check each fabric address's GID index
description:
  - Reads C(<sysfs_root>/class/infiniband/*) for every RDMA device its netdevs, port state, physical state,
    link layer, rate and RoCE GID table (index, GID, type C(RoCE v2) or C(IB/RoCE v1), netdev, IPv4 address).
  - A host without C(/sys/class/infiniband), or with no device in it, is reported with I(rdma_present=false) and a
    I(reason); that is not a failure.
  - With I(expect) (netdev to IPv4 address), checks that GID I(gid_index) of each netdev's RDMA device is the
    RoCE v2 entry of that address, and says what is wrong otherwise (empty, another address, RoCE v1, or the
    address at another index, which happens when a neighbour reboots).
  - Read-only.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  sysfs_root:
    description: Root of sysfs (tests point it at a copied tree).
    type: path
    default: /sys
  expect:
    description:
      - Map of netdev to the IPv4 address it must carry as RoCE v2 GID I(gid_index), for example
        C(enp1s0f1np1) to C(192.168.100.11) and C(enP2p1s0f1np1) to C(192.168.101.11) for both twins of the
        cabled port. An address written with a prefix length (C(/24)) is accepted.
    type: dict
    default: {}
  gid_index:
    description: GID index NCCL uses (C(NCCL_IB_GID_INDEX)); 3 on DGX Sparks.
    type: int
    default: 3
  fail_on_gid_mismatch:
    description: Fail when any I(expect) entry does not check out (otherwise only report it in I(gid_checks)).
    type: bool
    default: false
extends_documentation_fragment:
  - sparkops.cluster.attributes
  - sparkops.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Read the RDMA devices
  sparkops.cluster.rdma_facts:
  register: rdma

- name: Both twins must carry their address at RoCE v2 GID 3 before NCCL starts
  sparkops.cluster.rdma_facts:
    expect:
      enp1s0f1np1: "{{ sparkops_fabric_ip }}"
      enP2p1s0f1np1: "{{ sparkops_fabric_ip2 }}"
    fail_on_gid_mismatch: true
"""

RETURN = r"""
rdma_present:
  description: Whether any RDMA device was found.
  returned: always
  type: bool
reason:
  description: Why I(rdma_present) is false; null otherwise.
  returned: always
  type: str
devices:
  description:
    - RDMA devices by name, each with C(netdevs) and C(ports); a port (keyed by number, as a string) has C(state),
      C(active), C(phys_state), C(link_layer), C(rate), C(gid_table_size) and C(gids), the non-empty GID entries
      with C(index), C(gid), C(type), C(ndev) and C(ipv4) (null unless IPv4-mapped).
    - "C(state) is the kernel's text, for example C(4: ACTIVE); C(rate) for example C(200 Gb/sec (2X NDR))."
  returned: always
  type: dict
netdev_to_device:
  description: Map of netdev to RDMA device name (what C(ibdev2netdev) prints).
  returned: always
  type: dict
gid_checks:
  description:
    - Per I(expect) netdev, C(device), C(expected_ipv4), C(ok), C(status) (C(ok), C(missing), C(other_address),
      C(roce_v1), C(moved), C(no_port), C(no_device)), C(reason), C(found) (the entry at I(gid_index)) and
      C(at_index) (where the address's RoCE v2 entry is).
  returned: always
  type: dict
gid_ok:
  description: Whether every I(expect) entry checked out (true when I(expect) is empty).
  returned: always
  type: bool
"""

import ipaddress

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.rdma import gid_report


def run(p: dict) -> dict:
    return gid_report(p["sysfs_root"], p["expect"], gid_index=p["gid_index"])


def main():
    module = AnsibleModule(
        argument_spec={
            "sysfs_root": {"type": "path", "default": "/sys"},
            "expect": {"type": "dict", "default": {}},
            "gid_index": {"type": "int", "default": 3},
            "fail_on_gid_mismatch": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    if not 0 <= p["gid_index"] <= 255:
        module.fail_json(msg=f"gid_index must be between 0 and 255 (a GID table index), got {p['gid_index']}")
    expect = {}
    for netdev, ipv4 in (p["expect"] or {}).items():
        try:
            expect[str(netdev)] = str(ipaddress.IPv4Address(str(ipv4).split("/", maxsplit=1)[0]))
        except ValueError:
            module.fail_json(
                msg=f"expect[{netdev!r}] must be an IPv4 address (for example 192.168.100.11), got {ipv4!r}"
            )
    p = dict(p, expect=expect)
    result = run(p)
    if p["fail_on_gid_mismatch"] and not result["gid_ok"]:
        bad = "; ".join(f"{nd}: {c['reason']}" for nd, c in result["gid_checks"].items() if not c["ok"])
        module.fail_json(msg=f"RoCE GID check failed: {bad}", changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
