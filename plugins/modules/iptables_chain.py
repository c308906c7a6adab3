#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: iptables_chain
short_description: Keep TCP ports to loopback, the fast links and listed client networks (iptables and ip6tables)
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
  - The chain exists for IPv4 (iptables) and IPv6 (ip6tables), see I(families). The IPv6 chain passes loopback,
    ICMPv6 (neighbour discovery and path MTU keep working), the I(interfaces6) and the IPv6 networks of I(sources),
    and drops the rest, as services on the any address (Ray's gRPC servers) also answer IPv6.
  - With I(destinations) (this node's fast-link addresses), INPUT also sends everything addressed there, every
    protocol and port (ephemeral ones included), to the chain, so only loopback and the fast links reach them.
  - Each family's chain and INPUT jumps are also written to a rules file in I(rules_dir) (iptables-save's format,
    written only when its content changes), which the boot restore (C(sparkops-firewall)) loads before Docker starts.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  chain:
    description: Name of the chain (upper case, at most 28 characters), for example C(SPARKOPS-API).
    type: str
    required: true
  ports:
    description: TCP ports (or C(low:high) ranges) to guard, at most 15. May be empty when I(destinations) is given.
    type: list
    elements: str
    default: []
  destinations:
    description:
      - This node's addresses (one address each, IPv4 or IPv6) to which every packet, whatever its protocol and port,
        goes through the chain. Each family takes its own.
    type: list
    elements: str
    default: []
  interfaces6:
    description: Interfaces whose IPv6 packets pass (the links the plan gives an IPv6 address). C(lo) always passes.
    type: list
    elements: str
    default: []
  families:
    description: Which chains to keep, C(ipv4) (iptables) and C(ipv6) (ip6tables).
    type: list
    elements: str
    choices: [ipv4, ipv6]
    default: [ipv4, ipv6]
  rules_dir:
    description: Where the rules files C(<chain>.v4) and C(<chain>.v6) are written for the boot restore; empty for none.
    type: path
    default: /etc/sparkops/firewall
  interfaces:
    description: Interfaces whose packets pass (the fast links). C(lo) always passes.
    type: list
    elements: str
    default: []
  sources:
    description:
      - Networks (C(a.b.c.d/len), C(x:y::/len) or one address) whose packets pass on any interface (your clients);
        IPv4 ones in the IPv4 chain, IPv6 ones in the IPv6 chain.
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
  - Needs root (C(become)) and the C(iptables), C(iptables-restore), C(ip6tables) and C(ip6tables-restore) commands
    (Debian's and Ubuntu's C(iptables) package has them all).
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

- name: Everything addressed to the fast-link address only from the fast links (any port, IPv4 and IPv6)
  sparkops.cluster.iptables_chain:
    chain: SPARKOPS-MP
    ports: ["29501"]
    destinations: ["192.168.100.10"]
    interfaces: [enp1s0f1np1]
    comment: vLLM ranks
"""

RETURN = r"""
rules:
  description: The IPv4 chain's rules, as C(iptables -A) would take them after the chain's name.
  returned: always
  type: list
  elements: str
jump:
  description: INPUT's rule that sends the ports to the IPv4 chain (empty without ports).
  returned: always
  type: str
families:
  description: Per family (C(ipv4), C(ipv6)) its C(rules), C(jumps) and C(rules_file).
  returned: always
  type: dict
msg:
  description: What was (or, in check mode, would be) done.
  returned: always
  type: str
"""

import os
import shlex

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.files import write_text_atomic
from ansible_collections.sparkops.cluster.plugins.module_utils.firewall import (
    FAMILY_SUFFIX,
    chain_rules,
    in_place,
    input_jumps,
    jumps_input,
    restore_input,
    rules_file,
)

TOOLS = {4: ("iptables", "iptables-restore"), 6: ("ip6tables", "ip6tables-restore")}


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def converge(module: AnsibleModule, family: int, chain: str, want: dict, done: list[str]) -> None:
    """Bring one family's chain and INPUT's jumps to `want`, reading first (check mode reads only)."""
    name = "IPv4" if family == 4 else "IPv6"  # noqa: PLR2004
    tool, restore_tool = TOOLS[family]
    ipt = module.get_bin_path(tool, required=True)
    restore = module.get_bin_path(restore_tool, required=True)
    rc, listing, _err = module.run_command([ipt, "-w", "-S", chain])
    exists = rc == 0
    present = [module.run_command([ipt, "-w", "-C", chain, *r])[0] == 0 for r in want["chain"]] if exists else []
    if not (exists and in_place(listing, want["chain"], present)):
        done.append(f"{'replaced the rules of' if exists else 'created'} {name} chain {chain}")
        if not module.check_mode:
            rc, _out, err = module.run_command([restore, "-w", "--noflush"], data=restore_input(chain, want["chain"]))
            if rc != 0:
                module.fail_json(msg=f"{restore_tool} could not write chain {chain}: {err.strip()}")
    rc, inputs, err = module.run_command([ipt, "-w", "-S", "INPUT"])
    if rc != 0:
        module.fail_json(msg=f"{tool} -S INPUT failed: {err.strip()}. Is {tool} working on this node?")
    have = input_jumps(inputs, chain)
    found = [module.run_command([ipt, "-w", "-C", "INPUT", *j])[0] == 0 for j in want["jumps"]]
    if len(have) != len(want["jumps"]) or not all(found):
        what = [j[j.index("--dports") + 1] if "--dports" in j else j[1] for j in want["jumps"]]
        done.append(f"sent {name} {', '.join(what)} from INPUT to {chain}")
        if not module.check_mode:
            rc, _out, err = module.run_command(
                [restore, "-w", "--noflush"], data=jumps_input(chain, have, want["jumps"])
            )
            if rc != 0:
                module.fail_json(msg=f"{restore_tool} could not set INPUT's jumps to {chain}: {err.strip()}")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "chain": {"type": "str", "required": True},
            "ports": {"type": "list", "elements": "str", "default": []},
            "destinations": {"type": "list", "elements": "str", "default": []},
            "interfaces": {"type": "list", "elements": "str", "default": []},
            "interfaces6": {"type": "list", "elements": "str", "default": []},
            "sources": {"type": "list", "elements": "str", "default": []},
            "families": {"type": "list", "elements": "str", "choices": ["ipv4", "ipv6"], "default": ["ipv4", "ipv6"]},
            "rules_dir": {"type": "path", "default": "/etc/sparkops/firewall"},
            "comment": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    chain = p["chain"]
    families = [4 if f == "ipv4" else 6 for f in dict.fromkeys(p["families"])]
    wants = {}
    try:
        for fam in (4, 6):
            wants[fam] = chain_rules(
                chain, p["ports"], p["interfaces"], p["sources"], p["comment"],
                family=fam, destinations=p["destinations"], interfaces6=p["interfaces6"],
            )  # fmt: skip
        if not wants[4]["jumps"] and not wants[6]["jumps"]:
            raise ValueError("no ports and no destinations: name what the chain guards")
    except ValueError as exc:
        module.fail_json(msg=f"iptables_chain {chain}: {exc}. Fix these values in the inventory; nothing changed.")
    result = {
        "rules": [shlex.join(r) for r in wants[4]["chain"]],
        "jump": shlex.join(wants[4]["jump"]) if wants[4]["jump"] else "",
        "families": {},
    }
    done: list[str] = []
    for fam in families:
        want = wants[fam]
        entry = {"rules": [shlex.join(r) for r in want["chain"]], "jumps": [shlex.join(j) for j in want["jumps"]]}
        converge(module, fam, chain, want, done)
        if p["rules_dir"]:
            path = os.path.join(p["rules_dir"], f"{chain}.{FAMILY_SUFFIX[fam]}")
            entry["rules_file"] = path
            text = rules_file(chain, fam, want["chain"], want["jumps"])
            if _read(path) != text:
                done.append(f"wrote {path}")
                if not module.check_mode:
                    write_text_atomic(path, text)  # root's file 0644: the rules are no secret
        result["families"]["ipv4" if fam == 4 else "ipv6"] = entry  # noqa: PLR2004
    msg = "; ".join(done) if done else f"chain {chain}, INPUT's jumps and the rules files already in place"
    module.exit_json(changed=bool(done), msg=("would have: " + msg) if done and module.check_mode else msg, **result)


if __name__ == "__main__":
    main()
