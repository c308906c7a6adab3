"""Ring nodes forward only from one fast link to another (issue 23: "rings route everything").

The model's forward_rules are applied in order by roce_network/tasks/forwarding.yml (`-I chain 1`
puts a rule first, `-A` last). A small evaluator of that rule set (match -i/-o, jump, ACCEPT/DROP,
fall through to the rest of FORWARD and its policy) checks what a packet meets, whatever Docker's
FORWARD policy is.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3] / "plugins" / "plugin_utils"))
sys.path.insert(0, str(HERE))

import cluster_inventories as inv  # noqa: E402
from cluster import FORWARD_CHAIN, build_cluster  # noqa: E402

MGMT = "enP7s7"


def chains_after(rules, forward=()):
    """The chains as iptables holds them once the rules are added in order to an existing FORWARD."""
    chains = {"FORWARD": list(forward), FORWARD_CHAIN: []}
    for r in rules:
        where, rule = r["where"], r["rule"]
        chain = chains.setdefault(where[1], [])
        if where[0] == "-I":
            chain.insert(int(where[2]) - 1, rule)
        else:
            assert where[0] == "-A"
            chain.append(rule)
    return chains


def verdict(chains, inner, outer, policy, chain="FORWARD"):
    for rule in chains[chain]:
        if "-i" in rule and rule[rule.index("-i") + 1] != inner:
            continue
        if "-o" in rule and rule[rule.index("-o") + 1] != outer:
            continue
        target = rule[rule.index("-j") + 1]
        if target in ("ACCEPT", "DROP"):
            return target
        if target in chains:
            found = verdict(chains, inner, outer, None, target)
            if found:
                return found
    return policy


@pytest.mark.parametrize("policy", ["ACCEPT", "DROP"])  # Docker sets FORWARD's policy to DROP
@pytest.mark.parametrize("n", [3, 4, 5])
def test_a_ring_node_forwards_between_fast_links_only(n, policy):
    model = build_cluster(inv.ring(n))
    # Docker's own rules stay behind ours: a bridge's traffic out through the management interface.
    docker = [["-i", "docker0", "-o", MGMT, "-j", "ACCEPT"]]
    for h in model["hosts"]:
        node = model["nodes"][h]
        chains = chains_after(node["forward_rules"], docker)
        fast = node["netdevs"]
        assert len(fast) == 4
        for a in fast:
            for b in fast:
                if a != b:
                    assert verdict(chains, a, b, policy) == "ACCEPT", (h, a, b)
            # the routes send traffic on: a packet going back out the link it came in on is a loop
            assert verdict(chains, a, a, policy) == "DROP", (h, a)
            # the management LAN never reaches the ring through this node, nor the ring the LAN
            assert verdict(chains, MGMT, a, policy) == "DROP", (h, a)
            assert verdict(chains, a, MGMT, policy) == "DROP", (h, a)
            assert verdict(chains, "docker0", a, policy) == "DROP"
        # traffic that touches no fast link is left to the rest of FORWARD (Docker's NAT keeps working)
        assert verdict(chains, "docker0", MGMT, policy) == "ACCEPT"
        assert verdict(chains, MGMT, "docker0", policy) == policy
        assert not any(MGMT in " ".join(r["rule"]) for r in node["forward_rules"])


def test_a_rule_added_later_goes_ahead_of_the_drop():
    rules = build_cluster(inv.ring(4))["nodes"]["spark-1"]["forward_rules"]
    chain = chains_after(rules)[FORWARD_CHAIN]
    assert chain[-1][-2:] == ["-j", "DROP"]
    assert all(r[-2:] == ["-j", "ACCEPT"] for r in chain[:-1])
    # the chain is filled before FORWARD jumps to it: no moment where a hook meets an empty chain
    first_hook = next(i for i, r in enumerate(rules) if r["where"][1] == "FORWARD")
    assert all(r["where"][1] == FORWARD_CHAIN for r in rules[:first_hook])


@pytest.mark.parametrize("inputs", [inv.pair(), inv.switch(4)], ids=["pair", "switch"])
def test_only_ring_nodes_get_forwarding_rules(inputs):
    model = build_cluster(inputs)
    assert all(model["nodes"][h]["forward_rules"] == [] for h in model["hosts"])


# ------------------------------------------------------------- no forwarding from the management LAN
def _forwarding_wanted(backend: str, mgmt: str) -> dict:
    """roce_network_forwarding_wanted as ansible-core's Templar renders it from the role's files."""
    import importlib  # noqa: PLC0415

    import yaml  # noqa: PLC0415
    from ansible.template import Templar  # noqa: PLC0415

    trusted = importlib.import_module("ansible._internal._datatag._tags").TrustedAsTemplate()
    role = HERE.parents[3] / "roles" / "roce_network"
    names = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    names["roce_network_forwarding_wanted"] = trusted.tag(
        yaml.safe_load((role / "vars" / "main.yml").read_text())["roce_network_forwarding_wanted"]
    )
    names.update(roce_network_backend=backend, sparkops_cluster={"mgmt_interface": mgmt})
    return dict(Templar(variables=names).template(trusted.tag("{{ roce_network_forwarding_wanted }}")))


def test_the_management_interface_never_forwards_on_a_netplan_ring_node():
    wanted = _forwarding_wanted("netplan", "enP7s7")
    assert wanted == {"net.ipv4.ip_forward": 1, "net.ipv4.conf.all.rp_filter": 2, "net.ipv4.conf.enP7s7.forwarding": 0}
    # after ip_forward, which turns every interface's forwarding on when it changes
    assert list(wanted)[-1] == "net.ipv4.conf.enP7s7.forwarding"
    assert "net.ipv4.conf.eno1.forwarding" in _forwarding_wanted("netplan", "eno1")


def test_preconfigured_links_keep_their_forwarding_settings():
    # sparkops writes no sysctl there (the test bed sets them with docker run --sysctl)
    assert _forwarding_wanted("preconfigured", "enP7s7") == {"net.ipv4.ip_forward": 1, "net.ipv4.conf.all.rp_filter": 2}
