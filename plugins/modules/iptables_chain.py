#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: iptables_chain
short_description: Keep TCP ports to loopback, the fast links and listed client networks (an iptables chain)
description:
  - Linux accepts a packet for any of its addresses on any interface, so a service bound to a fast-link address is
    still reached from the management LAN by a host with a static route to the fast subnet. This module makes the
    arriving interface, or the client's network, the test.
  - Owns one chain, I(chain), in the filter table. Its rules are C(-i lo -j RETURN), C(-i <interface> -j RETURN) for
    each of I(interfaces), C(-s <network> -j RETURN) for each of I(sources), then C(-j DROP). The first rule of INPUT
    sends the TCP I(ports) to it (C(-m multiport --dports)). RETURN hands the packet back to INPUT and its policy.
  - The chain's rules are replaced in one C(iptables-restore --noflush) commit when they differ (the other chains and
    tables stay); nothing runs through a shell. Interface names are checked against the kernel's rules and networks
    with Python's ipaddress before anything is run; a bad value fails the task and changes nothing.
  - IPv4 only (iptables); the guarded services listen on IPv4 addresses.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  chain:
    description: Name of the chain (upper case, at most 28 characters), for example C(SPARKOPS-API).
    type: str
    required: true
  ports:
    description: TCP ports (or C(low:high) ranges) to guard, at most 15.
    type: list
    elements: str
    required: true
  interfaces:
    description: Interfaces whose packets pass (the fast links). C(lo) always passes.
    type: list
    elements: str
    default: []
  sources:
    description: IPv4 networks (C(a.b.c.d/len) or one address) whose packets pass on any interface (your clients).
    type: list
    elements: str
    default: []
  comment:
    description: What the ports are, written into every rule's comment (after C(sparkops:)).
    type: str
    required: true
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: Reads the chain and says whether it would change it.
  diff_mode:
    support: none
    details: C(rules) and C(jump) return what the chain holds after the run.
notes:
  - Needs root (C(become)) and the C(iptables) and C(iptables-restore) commands.
seealso:
  - module: ansible.builtin.iptables
"""

EXAMPLES = r"""
- name: Keep the OpenAI API to the fast links and the client networks
  sparkops.cluster.iptables_chain:
    chain: SPARKOPS-API
    ports: ["8000"]
    interfaces: "{{ sparkops_node.netdevs }}"
    sources: "{{ sparkops_client_networks }}"
    comment: OpenAI API
"""

RETURN = r"""
rules:
  description: The chain's rules, as C(iptables -A) would take them after the chain's name.
  returned: always
  type: list
  elements: str
jump:
  description: INPUT's rule that sends the ports to the chain.
  returned: always
  type: str
msg:
  description: What was (or, in check mode, would be) done.
  returned: always
  type: str
"""

import shlex

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.firewall import chain_rules, in_place, restore_input


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "chain": {"type": "str", "required": True},
            "ports": {"type": "list", "elements": "str", "required": True},
            "interfaces": {"type": "list", "elements": "str", "default": []},
            "sources": {"type": "list", "elements": "str", "default": []},
            "comment": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        want = chain_rules(p["chain"], p["ports"], p["interfaces"], p["sources"], p["comment"])
    except ValueError as exc:
        module.fail_json(msg=f"iptables_chain {p['chain']}: {exc}. Fix these values in the inventory; nothing changed.")
    iptables = module.get_bin_path("iptables", required=True)
    restore = module.get_bin_path("iptables-restore", required=True)
    chain = p["chain"]
    result = {
        "rules": [shlex.join(r) for r in want["chain"]],
        "jump": shlex.join(want["jump"]),
    }
    rc, listing, _err = module.run_command([iptables, "-w", "-S", chain])
    exists = rc == 0
    present = [module.run_command([iptables, "-w", "-C", chain, *r])[0] == 0 for r in want["chain"]] if exists else []
    chain_ok = exists and in_place(listing, want["chain"], present)
    jump_ok = module.run_command([iptables, "-w", "-C", "INPUT", *want["jump"]])[0] == 0
    done = []
    if not chain_ok:
        done.append(f"{'replaced the rules of' if exists else 'created'} chain {chain}")
        if not module.check_mode:
            rc, _out, err = module.run_command([restore, "-w", "--noflush"], data=restore_input(chain, want["chain"]))
            if rc != 0:
                module.fail_json(msg=f"iptables-restore could not write chain {chain}: {err.strip()}", **result)
    if not jump_ok:
        done.append(f"sent ports {want['jump'][5]} from INPUT to {chain}")
        if not module.check_mode:
            rc, _out, err = module.run_command([iptables, "-w", "-I", "INPUT", "1", *want["jump"]])
            if rc != 0:
                module.fail_json(msg=f"iptables could not add INPUT's jump to {chain}: {err.strip()}", **result)
    msg = "; ".join(done) if done else f"chain {chain} and INPUT's jump already in place"
    module.exit_json(changed=bool(done), msg=("would have: " + msg) if done and module.check_mode else msg, **result)


if __name__ == "__main__":
    main()
