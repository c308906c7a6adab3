"""discovery.py's refusals word for word, as a person re-cabling reads them: the numbered problem list, a
Spark with no cable (naming its free ports), two loops and the two ends to swap to join them; and a
neighbour that lldpd names by interface (not by MAC) with a stale system name, still placed by its chassis.

Equivalent mutants (tests/mutation/equivalents.py lists them; `make mutation` does not run them):
- `_Index`'s names from `(h, node.get("hostname"))` without `h`: fabric_discover always reports the node's
  hostname (socket.gethostname(), what lldpd advertises as the system name), so the inventory name adds a
  match only for a read without one.
- `_observe`'s `t.get("neighbours") or []` without `or []`: fabric_discovery always gives a list.
- `_merge_hint`'s `[c for c in cables if c[0][0] in comps[0]]` -> `c[1][0]`: both ends of a cable of a loop
  are hosts of that loop, so the same cables are picked (the swap-hint test kills the line's other `0 -> 1`).
- `_phys_ports`' twin order `(t.get("domain") or 0, ...)` -> `or 1`: a Spark port's twins are on PCI domains
  0 and 2 (enp1s0..., enP2p1s0...), and 0 or 1 sort before 2 alike.
"""

from __future__ import annotations

import pytest
from ansible_collections.sparkops.cluster.plugins.plugin_utils import discovery as d
from discovery_world import World, names_of, ring_cables

P0 = "port 0 (enp1s0f0np0/enP2p1s0f0np0)"
P1 = "port 1 (enp1s0f1np1/enP2p1s0f1np1)"


def refusal(world) -> str:
    with pytest.raises(d.DiscoveryError) as err:
        d.infer(world.nodes(), world.names, {"speed_mbps": 200000})
    return str(err.value)


def test_problems_are_counted_and_numbered_from_one():
    assert str(d.DiscoveryError(["first", "second"])) == (
        "The cabling makes no supported sparkops topology (2 problems):\n  1. first\n  2. second"
    )
    assert str(d.DiscoveryError(["only"])) == "The cabling makes no supported sparkops topology (1 problem):\n  1. only"


def test_a_spark_without_a_cable_is_named_with_its_free_ports():
    names = names_of(4)
    assert refusal(World(names, ring_cables(names[:3]))).endswith(
        f"  1. spark-4 has no cable up (spark-4 {P0}, spark-4 {P1}); "
        "on a ring every Spark has two cables, one per port."
    )


@pytest.mark.parametrize("reverse", [False, True], ids=["port0-first", "port1-first"])
def test_two_loops_name_the_two_ends_to_swap_to_make_one_ring(reverse):
    names = names_of(6)
    cables = ring_cables(names[:3]) + ring_cables(names[3:])
    if reverse:  # the same cables, each written from its other end
        cables = [(b, a) for a, b in cables]
    assert refusal(World(names, cables)).endswith(
        "  1. the cables make 2 separate loops (spark-1 - spark-2 - spark-3; spark-4 - spark-5 - spark-6), not one "
        f"ring. Two cables are crossed: swap the ends at spark-2 {P1} and spark-5 {P1} (so that spark-1 port 0 "
        "meets spark-5 port 1 and spark-4 port 0 meets spark-2 port 1)."
    )


def test_a_neighbour_named_by_interface_with_a_stale_system_name_is_placed_by_its_chassis():
    # lldpd configured with `portidsubtype ifname` sends the interface name as the port ID; a system name
    # lldpd read before the hostname was set ("ubuntu") names no Spark: the chassis MAC still does.
    names = names_of(3)
    world = World(names, ring_cables(names))
    expected = d.infer(world.nodes(), names, {"speed_mbps": 200000})
    nodes = world.nodes()
    for node in nodes.values():
        for port in node["ports"]:
            for nb in port["neighbours"]:
                nb.update(port_id=nb["port_descr"], port_id_type="ifname", sysname="ubuntu")
    got = d.infer(nodes, names, {"speed_mbps": 200000})
    assert got["topology"] == expected["topology"] == "ring"
    assert got["cables"] == expected["cables"]


def test_a_ring_of_three_is_the_mesh_a_user_may_ask_for_and_a_ring_of_four_is_not():
    three = names_of(3)
    got = d.infer(World(three, ring_cables(three)).nodes(), three, {"speed_mbps": 200000, "topology": "mesh"})
    assert got["topology"] == "ring"  # three Sparks in a ring: each meets both others
    four = names_of(4)
    assert refusal_with(World(four, ring_cables(four)), topology="mesh").endswith(
        "  1. sparkops_discover_topology is mesh, but the cabling makes a ring."
    )


def refusal_with(world, **settings) -> str:
    with pytest.raises(d.DiscoveryError) as err:
        d.infer(world.nodes(), world.names, {"speed_mbps": 200000, **settings})
    return str(err.value)


@pytest.mark.parametrize("word", ["true", "False", "null", "yes", "No", "on", "OFF"])
def test_a_connection_value_yaml_would_read_as_a_boolean_or_null_stays_text(word):
    import yaml  # noqa: PLC0415

    names = names_of(3)
    result = d.infer(World(names, ring_cables(names)).nodes(), names, {"speed_mbps": 200000})
    conn = {h: {"ansible_host": f"10.0.0.{11 + i}", "ansible_user": word} for i, h in enumerate(names)}
    data = yaml.safe_load(d.render_inventory(result, conn, source="test"))
    hosts = data["all"]["children"]["spark_cluster"]["children"]["spark_head"]["hosts"]
    assert [hv["ansible_user"] for hv in hosts.values()] == [word]


def test_a_discovered_inventory_says_where_it_came_from_and_how_to_check_it():
    names = names_of(3)
    result = d.infer(World(names, ring_cables(names)).nodes(), names, {"speed_mbps": 200000})
    text = d.render_inventory(result, {}, source="inventory/lab")
    assert text.startswith(
        "---\n# Written by playbooks/discover.yml from inventory/lab: the ring the cables make,\n"
        "# both twins of every cabled port, one subnet per cable lane and twin. Check it with\n"
        "#   ansible-playbook playbooks/plan.yml -i <this directory>\n"
    )


@pytest.mark.parametrize(
    ("netdev", "port"), [("enp1s0f1np1", 1), ("enP2p1s0f0np0", 0), ("enp1s0f1", 1), ("enP2p1s0f0", 0), ("eth0", None)]
)
def test_the_port_of_a_netdev_the_read_no_longer_shows_comes_from_its_name(netdev, port):
    # An inventory's link on a netdev that is gone from the node's read (renamed, or the port down): the QSFP
    # port is read from the kernel's name, with or without the np<port> suffix.
    assert d._port_of_netdev(netdev, []) == port


def test_a_cable_the_inventory_does_not_have_is_named():
    import yaml  # noqa: PLC0415
    from conftest import ROOT  # noqa: PLC0415
    from test_discovery import inputs_from_hosts_yml  # noqa: PLC0415

    data = yaml.safe_load((ROOT / "inventory" / "examples" / "ring-4" / "hosts.yml").read_text())
    links = {h: v["sparkops_fast_links"] for h, v in inputs_from_hosts_yml(data)["hostvars"].items()}
    # The inventory lost the cable spark-4 port 0 - spark-1 port 1 (both twins of both ends).
    links["spark-1"] = [lk for lk in links["spark-1"] if not lk["netdev"].endswith("f1np1")]
    links["spark-4"] = [lk for lk in links["spark-4"] if not lk["netdev"].endswith("f0np0")]
    names = names_of(4)
    world = World(names, ring_cables(names))
    got = d.moved_cables(links, d.infer(world.nodes(), names, {"speed_mbps": 200000}))
    assert got == ["a cable spark-1 port 1 - spark-4 port 0 is not in the inventory."]
