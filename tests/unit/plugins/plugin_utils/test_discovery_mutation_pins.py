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
- `_NEIGHBOUR_TEXT` without `"port_descr"`: the port description is only looked up among the Sparks' netdev
  names, never shown; a ConnectX-7 function's name (letters and digits, at most 15) equals the text as sent
  exactly when it equals it escaped and cut at 255.
- the switch's lanes `if t < len(tw)` -> `t <= len(tw)`: every port on the switch has its two twins there (one
  with a single twin is refused before), so t never reaches len(tw).
- `_ports_out` without `"mac"`: nothing reads a port's MAC from the result (summary, moved_cables and the
  refusal's node lines read netdev, port, RDMA device, state, speed and MTU).
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


def _port(nodes, h, netdev) -> dict:
    return next(p for p in nodes[h]["ports"] if p["netdev"] == netdev)


def test_the_playbook_without_settings_gets_the_defaults():
    # sparkops_discover passes `settings or {}`, a caller of infer may pass none at all.
    names = names_of(3)
    nodes = World(names, ring_cables(names)).nodes()
    assert d.infer(nodes, names) == d.infer(nodes, names, {"speed_mbps": 200000, "pool": "192.168.96.0/19"})


def test_a_pair_has_an_empty_ring_order_not_none():
    # The result goes back to the playbook: ring_order is a list for every topology (`| length`, `| join`).
    names = names_of(2)
    result = d.infer(World(names, [(("spark-1", 0), ("spark-2", 1))]).nodes(), names, {"speed_mbps": 200000})
    assert result["topology"] == "pair"
    assert result["ring_order"] == []


def test_a_segment_that_forwards_lldp_is_named_as_one_segment_of_every_spark():
    names = names_of(3)
    world = World(names, bridge={(h, 1) for h in names})
    result = d.infer(world.nodes(), names, {"speed_mbps": 200000})
    assert result["topology"] == "switch"
    assert d.summary(result, brief=True)[1] == (
        f"switch a segment that joins several Sparks: spark-1 {P1}, spark-2 {P1}, spark-3 {P1}"
    )


def test_a_switch_that_names_its_ports_by_mac_is_a_switch():
    # Some switches send the LLDP port ID as the port's MAC (subtype macAddress), not its name: that MAC is
    # no Spark's, so the neighbour is the switch (its chassis), not a Spark port.
    names = names_of(3)
    nodes = World(names, switch={(h, 1) for h in names}).nodes()
    for h in names:
        for port in nodes[h]["ports"]:
            for nb in port["neighbours"]:
                nb.update(port_id="b8:ce:f6:00:01:07", port_id_type="mac")
    result = d.infer(nodes, names, {"speed_mbps": 200000})
    assert result["topology"] == "switch"
    assert result["segments"][0]["switch"] == "sw-200g (chassis b8:ce:f6:00:00:01)"


def test_a_neighbour_mac_a_node_answers_is_cut_like_every_neighbour_string():
    # A compromised Spark answers for fabric_discover with an IPv6 neighbour whose "MAC" is 1000 characters:
    # the controller cuts it at 255 (neighbour_text) before the refusal names it.
    names = names_of(2)
    nodes = World(names, [(("spark-1", 0), ("spark-2", 1))]).nodes()
    for nd in ("enp1s0f1np1", "enP2p1s0f1np1"):
        _port(nodes, "spark-1", nd)["neighbours"] = [{"via": "nd", "mac": "a" * 1000, "address": "fe80::1"}]
    with pytest.raises(d.DiscoveryError) as err:
        d.infer(nodes, names, {"speed_mbps": 200000})
    assert f"mac {'a' * 255}: spark-1 port 1)" in str(err.value)
    assert "a" * 256 not in str(err.value)


def test_two_loops_where_one_end_did_not_hear_its_cable_still_name_the_port_1_ends_to_swap():
    # lldpd on spark-1 missed its port 0 neighbour (the cable is known from spark-2's end): the first loop's
    # cable that the hint picks is then spark-1's port 1 cable, written from spark-1's end. The swap still
    # joins a port 0 to a port 1 (spark-3 port 0 - spark-5 port 1), as the ring wants.
    names = names_of(6)
    nodes = World(names, ring_cables(names[:3]) + ring_cables(names[3:])).nodes()
    for nd in ("enp1s0f0np0", "enP2p1s0f0np0"):
        _port(nodes, "spark-1", nd)["neighbours"] = []
    with pytest.raises(d.DiscoveryError) as err:
        d.infer(nodes, names, {"speed_mbps": 200000})
    assert str(err.value).endswith(
        f"Two cables are crossed: swap the ends at spark-1 {P1} and spark-5 {P1} (so that spark-3 port 0 "
        "meets spark-5 port 1 and spark-4 port 0 meets spark-1 port 1)."
    )


def test_a_stale_view_on_a_ring_short_of_a_cable_is_refused_naming_the_ends_not_a_crash():
    # Six Sparks, the ring's last cable (spark-6 port 0 - spark-1 port 1) unplugged, and spark-4's port 1
    # still lists spark-1 port 0 (LLDP stale after a cable moved). The walk from spark-1 reaches spark-6 and
    # ends there: that is no ring (it once went on to check the cables' orientation and raised KeyError).
    names = names_of(6)
    nodes = World(names, ring_cables(names)[:-1]).nodes()
    for nd in ("enp1s0f1np1", "enP2p1s0f1np1"):
        _port(nodes, "spark-4", nd)["neighbours"] = _port(nodes, "spark-2", nd)["neighbours"]
    with pytest.raises(d.DiscoveryError) as err:
        d.infer(nodes, names, {"speed_mbps": 200000})
    problems = err.value.problems
    assert len(problems) == 3
    assert problems[0].startswith(f"spark-1 {P0} is seen at the end of the cable spark-1 {P0} - spark-2 {P1} and of")
    assert problems[1].startswith(f"spark-4 {P1} is seen at the end of the cable spark-3 {P0} - spark-4 {P1} and of")
    assert problems[2].startswith("the cables do not make one ring: ")


def test_a_ring_where_a_stale_view_adds_a_cable_is_no_ring():
    # Four Sparks in a ring; spark-1's port 1 (cabled to spark-4 port 0) still lists spark-3 port 1, where
    # that cable went before it was moved. Five cables on four Sparks make no ring, whichever way one walks.
    names = names_of(4)
    nodes = World(names, ring_cables(names)).nodes()
    for old, now in (("enp1s0f1np1", "enp1s0f0np0"), ("enP2p1s0f1np1", "enP2p1s0f0np0")):
        _port(nodes, "spark-1", old)["neighbours"] = _port(nodes, "spark-2", now)["neighbours"]
    with pytest.raises(d.DiscoveryError) as err:
        d.infer(nodes, names, {"speed_mbps": 200000})
    problems = err.value.problems
    assert [p.split(" is seen at the end of ")[0] for p in problems[:2]] == [f"spark-1 {P1}", f"spark-3 {P1}"]
    assert problems[2].startswith("the cables do not make one ring: ")
    assert len(problems) == 3


def test_the_missing_cable_hint_is_for_a_chain_only_not_for_a_stale_view():
    # Four Sparks, the ring's cable spark-4 port 0 - spark-1 port 1 unplugged, and spark-2's port 0 lists
    # spark-3 port 0 (stale): spark-3 is then cabled three times. Only a chain (every Spark cabled once or
    # twice) is a ring short of one cable; here the two ends that disagree are named, no cable to add.
    names = names_of(4)
    nodes = World(names, ring_cables(names)[:-1]).nodes()
    for nd, now in (("enp1s0f0np0", "enp1s0f1np1"), ("enP2p1s0f0np0", "enP2p1s0f1np1")):
        _port(nodes, "spark-2", nd)["neighbours"] = _port(nodes, "spark-4", now)["neighbours"]
    with pytest.raises(d.DiscoveryError) as err:
        d.infer(nodes, names, {"speed_mbps": 200000})
    assert not [p for p in err.value.problems if "missing one cable" in p]
    assert [p for p in err.value.problems if "the two ends disagree" in p]


def test_the_missing_cable_of_a_spark_that_shows_one_port_goes_to_its_other_port():
    # spark-1's port 1 shows neither PCIe function (a driver that did not bind it): the ring's missing cable
    # still goes to spark-1 port 1, not to its port 0, which is cabled already.
    names = names_of(3)
    world = World(names, ring_cables(names)[:-1])
    world.missing_twin |= {("spark-1", "enp1s0f1np1"), ("spark-1", "enP2p1s0f1np1")}
    assert refusal(world).endswith(
        f"  1. the ring is missing one cable: connect spark-1 port 1 to spark-3 {P0} "
        "(the Sparks cabled once: spark-1, spark-3)."
    )


def test_a_read_with_something_else_than_a_port_among_its_ports_keeps_the_others():
    # A node that answers for fabric_discover (not ours, or a broken module) puts junk among its ports:
    # the junk is dropped (as a neighbour that is no mapping is), the ports after it still count.
    names = names_of(3)
    world = World(names, ring_cables(names))
    expected = d.infer(world.nodes(), names, {"speed_mbps": 200000})
    nodes = world.nodes()
    nodes["spark-2"]["ports"].insert(0, "enp1s0f0np0")
    assert d.infer(nodes, names, {"speed_mbps": 200000}) == expected


def test_a_ring_whose_head_has_its_two_cables_the_wrong_way_round_names_the_head_alone():
    # spark-1's port 0 goes to spark-2's port 0 and its port 1 to spark-3's port 1: read the other way round
    # (spark-1 -> spark-3 -> spark-2) only spark-1 is crossed; one swap at spark-1, not two elsewhere.
    names = names_of(3)
    cables = [(("spark-1", 0), ("spark-2", 0)), (("spark-2", 1), ("spark-3", 0)), (("spark-3", 1), ("spark-1", 1))]
    assert refusal(World(names, cables)).endswith(
        "(1 problem):\n  1. spark-1's cables are crossed: its port 1 goes to spark-3 and its port 0 to spark-2; on a "
        "ring each cable runs from port 0 to the next Spark's port 1. Swap the two cables at spark-1 "
        f"(spark-1 {P1} and spark-1 {P0}), or set sparkops_discover_allow_any_port: true to accept this cabling."
    )


def test_a_spark_that_does_not_say_which_port_is_named_by_its_name():
    # lldpd on spark-2 sends a locally assigned port ID and a description that names no netdev: its
    # chassis says spark-2, not which of its ports; the refusal names spark-2 and how to make it say.
    names = names_of(2)
    nodes = World(names, [(("spark-1", 0), ("spark-2", 1))]).nodes()
    for nd in ("enp1s0f0np0", "enP2p1s0f0np0"):
        for nb in _port(nodes, "spark-1", nd)["neighbours"]:
            nb.update(port_id="7", port_id_type="local", port_descr="QSFP 2")
    with pytest.raises(d.DiscoveryError) as err:
        d.infer(nodes, names, {"speed_mbps": 200000})
    assert err.value.problems == [
        f"spark-1 {P0} hears spark-2 by LLDP but not which of its ports; check that lldpd on spark-2 sends the "
        "port's MAC or interface name (lldpcli configure lldp portidsubtype macaddress), then run the discovery again."
    ]


def test_a_twin_without_carrier_is_down_even_when_its_operstate_is_unknown():
    # A driver that leaves operstate UNKNOWN: `ip -j link` shows NO-CARRIER all the same. The cable is
    # known from the other twin; this twin's link is named down.
    names = names_of(2)
    nodes = World(names, [(("spark-1", 0), ("spark-2", 1))]).nodes()
    _port(nodes, "spark-1", "enP2p1s0f0np0").update(carrier=False, operstate="unknown", neighbours=[])
    _port(nodes, "spark-2", "enP2p1s0f1np1")["neighbours"] = []
    with pytest.raises(d.DiscoveryError) as err:
        d.infer(nodes, names, {"speed_mbps": 200000})
    assert err.value.problems == [
        f"enP2p1s0f0np0 of spark-1 {P0} is down (no carrier) (the cable spark-1 {P0} - spark-2 {P1}). Check that "
        "the cable is seated at both ends and is a 200G QSFP56 DAC/AOC; bring the link up (ip link set "
        "enP2p1s0f0np0 up) and run the discovery again."
    ]


def test_a_segment_where_one_spark_has_not_heard_every_other_yet_is_still_one_segment():
    # On a segment that forwards LLDP, spark-4 has not yet heard spark-1 (LLDP every 30 s): its view is
    # spark-2 and spark-3 only, the others' views are all four. The views overlap: one segment.
    names = names_of(4)
    nodes = World(names, bridge={(h, 1) for h in names}).nodes()
    for nd in ("enp1s0f1np1", "enP2p1s0f1np1"):
        port = _port(nodes, "spark-4", nd)
        port["neighbours"] = [nb for nb in port["neighbours"] if nb["sysname"] != "spark-1"]
    result = d.infer(nodes, names, {"speed_mbps": 200000})
    assert result["topology"] == "switch"
    assert [s["ports"] for s in result["segments"]] == [[f"{h} {P1}" for h in names]]
