"""discovery.infer: cables -> topology -> addresses over every shape and every refusal, and the inventory it
writes compared, through build_cluster, with the hand-written ones (inventory/two-sparks,
inventory/examples, and the inventories sim/simctl.py writes)."""

from __future__ import annotations

import importlib.util
import ipaddress
import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkops.cluster.plugins.plugin_utils import discovery as d
from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import build_cluster
from conftest import ROOT
from discovery_world import World, names_of, ring_cables

HERE = Path(__file__).resolve().parent


def infer(world, **settings):
    settings.setdefault("speed_mbps", 200000)
    return d.infer(world.nodes(), world.names, settings)


def problems(world, **settings):
    with pytest.raises(d.DiscoveryError) as err:
        infer(world, **settings)
    return err.value.problems


def inputs_from_hosts_yml(data: dict, settings: dict | None = None) -> dict:
    """build_cluster's inputs from a hosts.yml (the groups, host vars and the cluster group's vars)."""
    cluster = data["all"]["children"]["spark_cluster"]
    groups = {"spark_cluster": [], "spark_head": [], "spark_workers": []}
    hostvars = {}
    for group in ("spark_head", "spark_workers"):
        for h, hv in ((cluster["children"].get(group) or {}).get("hosts") or {}).items():
            groups[group].append(h)
            groups["spark_cluster"].append(h)
            hostvars[h] = hv
    merged = dict(cluster.get("vars") or {})
    merged.update(settings or {})
    return {"groups": groups, "hostvars": hostvars, "settings": merged}


def cabling(model: dict) -> dict:
    """What must match between two inventories: the topology and which ends share a subnet."""
    ends = {}
    for h in model["hosts"]:
        for link in model["nodes"][h]["links"]:
            ends.setdefault(link["cidr"], set()).add((h, link["netdev"], link["rdma_device"]))
    return {"topology": model["topology"], "mesh": model["mesh"], "lanes": {frozenset(e) for e in ends.values()}}


def model_of_discovery(world, **settings) -> dict:
    result = infer(world, **settings)
    conn = {h: {"ansible_host": f"10.0.0.{11 + i}"} for i, h in enumerate(world.names)}
    text = d.render_inventory(result, conn, source="test")
    return build_cluster(inputs_from_hosts_yml(yaml.safe_load(text)))


def hand_written(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    gv = path.parent / "group_vars" / "all" / "cluster.yml"
    settings = (
        {"sparkops_topology": (yaml.safe_load(gv.read_text()) or {}).get("sparkops_topology", "pair")}
        if gv.exists()
        else {}
    )
    return build_cluster(inputs_from_hosts_yml(data, settings))


# sim/ and inventory/ stay out of the built collection (galaxy.yml build_ignore): under `ansible-test units`
# there is no test bed to compare with; `make unit` runs these from the checkout.
NEEDS_TEST_BED = pytest.mark.skipif(
    not (ROOT / "sim" / "simctl.py").is_file() or not (ROOT / "inventory" / "sim" / "hosts.yml").is_file(),
    reason="sim/ and inventory/sim are not shipped in the built collection",
)


def load_simctl(monkeypatch, state: Path):
    monkeypatch.setenv("SPARKOPS_SIM_STATE", str(state))
    spec = importlib.util.spec_from_file_location("simctl_for_discovery", ROOT / "sim" / "simctl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sim_inventory(monkeypatch, tmp_path, n, topology) -> dict:
    simctl = load_simctl(monkeypatch, tmp_path / "state")
    simctl.configure(n, topology)
    inv = simctl.write_topology_inventory(n, topology)
    data = json.loads((inv / "hosts.yml").read_text().split("\n", 1)[1])
    return build_cluster(inputs_from_hosts_yml(data, {"sparkops_topology": topology}))


# ------------------------------------------------------------ equal to the hand-written ones
def test_pair_equals_inventory_two_sparks():
    world = World(names_of(2), [(("spark-1", 1), ("spark-2", 1))])
    got = model_of_discovery(world)
    assert cabling(got) == cabling(hand_written(ROOT / "inventory" / "two-sparks" / "hosts.yml"))
    assert got["topology"] == "pair"


def test_ring4_equals_inventory_examples_ring4():
    names = names_of(4)
    got = model_of_discovery(World(names, ring_cables(names)))
    assert cabling(got) == cabling(hand_written(ROOT / "inventory" / "examples" / "ring-4" / "hosts.yml"))
    assert got["ring_order"] == names


def test_switch4_equals_inventory_examples_switch4():
    names = names_of(4)
    got = model_of_discovery(World(names, switch={(h, 1) for h in names}))
    assert cabling(got) == cabling(hand_written(ROOT / "inventory" / "examples" / "switch-4" / "hosts.yml"))


@NEEDS_TEST_BED
def test_sim_pair_equals_inventory_sim():
    names = names_of(2, "spark-sim")
    got = model_of_discovery(World(names, [((names[0], 1), (names[1], 1))]))
    assert cabling(got) == cabling(hand_written(ROOT / "inventory" / "sim" / "hosts.yml"))


@NEEDS_TEST_BED
@pytest.mark.parametrize("n", [3, 4, 5])
def test_sim_ring_equals_what_simctl_writes(monkeypatch, tmp_path, n):
    names = names_of(n, "spark-sim")
    got = model_of_discovery(World(names, ring_cables(names)))
    assert cabling(got) == cabling(sim_inventory(monkeypatch, tmp_path, n, "ring"))


@NEEDS_TEST_BED
@pytest.mark.parametrize("n", [3, 4])
def test_sim_switch_equals_what_simctl_writes(monkeypatch, tmp_path, n):
    # The test bed's switch is a Docker bridge per twin: with LLDP forwarded (group_fwd_mask), every
    # node's port 1 twin hears every other node's: a segment, not a cable.
    names = names_of(n, "spark-sim")
    got = model_of_discovery(World(names, bridge={(h, 1) for h in names}))
    assert cabling(got) == cabling(sim_inventory(monkeypatch, tmp_path, n, "switch"))


def test_a_different_cabling_is_not_equal():
    # The comparison itself can fail: a ring the other way round pairs other ends.
    names = names_of(4)
    other = [((names[i], 1), (names[(i + 1) % 4], 0)) for i in range(4)]
    got = model_of_discovery(World(names, other), allow_any_port=True)
    assert cabling(got) != cabling(hand_written(ROOT / "inventory" / "examples" / "ring-4" / "hosts.yml"))


# ------------------------------------------------------------------------ shapes
def test_pair_on_port_0_uses_port_0_twins():
    world = World(names_of(2), [(("spark-1", 0), ("spark-2", 0))])
    result = infer(world)
    assert result["topology"] == "pair"
    assert [lk["netdev"] for lk in result["links"]["spark-1"]] == ["enp1s0f0np0", "enP2p1s0f0np0"]
    assert [lk["rdma_device"] for lk in result["links"]["spark-2"]] == ["rocep1s0f0", "roceP2p1s0f0"]
    (cable,) = result["cables"]
    assert [ln["cidr"] for ln in cable["lanes"]] == ["192.168.96.0/24", "192.168.97.0/24"]
    assert result["links"]["spark-1"][0]["address"] == "192.168.96.11/24"
    assert result["links"]["spark-2"][1]["address"] == "192.168.97.12/24"


def test_three_node_ring_is_the_mesh():
    names = names_of(3)
    result = infer(World(names, ring_cables(names)))
    assert (result["topology"], result["mesh"]) == ("ring", True)
    model = build_cluster(inputs_from_hosts_yml(yaml.safe_load(d.render_inventory(result))))
    assert model["mesh"] is True


def test_eight_node_ring_fills_the_default_pool():
    names = names_of(8)
    result = infer(World(names, ring_cables(names)))
    cidrs = [ln["cidr"] for c in result["cables"] for ln in c["lanes"]]
    assert len(cidrs) == len(set(cidrs)) == 16
    assert all(ipaddress.ip_network(c).subnet_of(ipaddress.ip_network(d.DEFAULT_POOL)) for c in cidrs)


def test_the_head_comes_first_and_the_ring_leaves_it_by_port_0():
    names = names_of(4)
    result = infer(World(names, ring_cables(names)), head="spark-3")
    assert result["hosts"][0] == "spark-3"
    assert result["ring_order"] == ["spark-3", "spark-4", "spark-1", "spark-2"]


def test_ipv6_neighbour_fallback_finds_the_same_cables():
    names = names_of(4)
    lldp = infer(World(names, ring_cables(names)))
    nd = infer(World(names, ring_cables(names), via="nd"))
    assert nd["cables"] == lldp["cables"]


def test_a_twin_hearing_its_own_twin_is_no_cable():
    names = names_of(2)
    world = World(names, [((names[0], 1), (names[1], 1))])
    world.hear_own_twin = True
    assert infer(world)["topology"] == "pair"


def test_speed_is_not_checked_when_not_asked():
    world = World(names_of(2), [(("spark-1", 1), ("spark-2", 1))])
    world.speed[("spark-2", "enp1s0f1np1")] = 10000  # a veth in the test bed
    assert infer(world, speed_mbps=0)["topology"] == "pair"


def test_addresses_avoid_the_networks_in_use():
    world = World(names_of(2), [(("spark-1", 1), ("spark-2", 1))])
    world.networks["spark-2"].append("192.168.96.0/23")  # the management LAN, say
    result = infer(world)
    assert [ln["cidr"] for ln in result["cables"][0]["lanes"]] == ["192.168.98.0/24", "192.168.99.0/24"]


def test_a_configured_pool_and_prefix():
    world = World(names_of(2), [(("spark-1", 1), ("spark-2", 1))])
    result = infer(world, pool="10.77.0.0/16", prefix=27)
    assert [ln["cidr"] for ln in result["cables"][0]["lanes"]] == ["10.77.0.0/27", "10.77.0.32/27"]
    assert result["links"]["spark-2"][0]["address"] == "10.77.0.12/27"
    # A /28 holds .1-.14: host numbers 11 and 12 fit for two nodes, 11-14 do not for four (14 + 1 = broadcast).
    assert infer(world, pool="10.77.0.0/16", prefix=28)["topology"] == "pair"
    names = names_of(4)
    (p,) = problems(World(names, ring_cables(names)), pool="10.77.0.0/16", prefix=28)
    assert "sparkops_discover_prefix /28 is too small" in p and "4 nodes need a /27" in p


def test_summary_names_nodes_cables_twins_topology_addresses():
    names = names_of(4)
    lines = d.summary(infer(World(names, ring_cables(names))))
    text = "\n".join(lines)
    assert lines[0] == "topology: ring of 4 Sparks, head spark-1"
    assert "ring order: spark-1 -> spark-2 -> spark-3 -> spark-4 -> spark-1" in text
    assert "cable spark-1 port 0 (enp1s0f0np0/enP2p1s0f0np0) <-> spark-2 port 1 (enp1s0f1np1/enP2p1s0f1np1)" in text
    assert "twin lane 192.168.97.0/24: spark-1 enP2p1s0f0np0 192.168.97.11/24 <-> spark-2 enP2p1s0f1np1" in text
    assert "node spark-3: enp1s0f0np0[rocep1s0f0] up 200G mtu 1500" in text


def test_rendered_inventory_keeps_connection_vars_and_quotes_odd_values():
    world = World(names_of(2), [(("spark-1", 1), ("spark-2", 1))])
    text = d.render_inventory(infer(world), {"spark-1": {"ansible_host": "10.0.0.11", "ansible_user": "yes"}})
    data = yaml.safe_load(text)
    head = data["all"]["children"]["spark_cluster"]["children"]["spark_head"]["hosts"]["spark-1"]
    assert head["ansible_user"] == "yes"  # a string, not YAML's boolean
    assert data["all"]["children"]["spark_cluster"]["vars"] == {"sparkops_topology": "pair"}


# ---------------------------------------------------------------------------- refusals
def test_ring_with_a_missing_cable_names_both_free_ends():
    names = names_of(4)
    world = World(names, ring_cables(names)[:-1])  # spark-4 port 0 - spark-1 port 1 removed
    (p,) = problems(world)
    assert "missing one cable: connect spark-1 port 1 (enp1s0f1np1/enP2p1s0f1np1) to spark-4 port 0" in p


def test_ring_with_two_cables_crossed_between_loops_names_the_ends_to_swap():
    names = names_of(4)
    c = ring_cables(names)
    # Cables spark-1 p0 - spark-2 p1 and spark-3 p0 - spark-4 p1 with their port-1 ends swapped.
    c[0], c[2] = (("spark-1", 0), ("spark-4", 1)), (("spark-3", 0), ("spark-2", 1))
    got = problems(World(names, c))
    text = "\n".join(got)
    assert "two cables join spark-1 and spark-4" in text
    assert "two cables join spark-2 and spark-3" in text
    assert "2 separate loops (spark-1 - spark-4; spark-2 - spark-3)" in text
    assert "swap the ends at spark-4 port 1" in text


def test_ring_with_one_sparks_cables_crossed_names_that_spark():
    names = names_of(4)
    c = ring_cables(names)
    c[0], c[1] = (("spark-1", 0), ("spark-2", 0)), (("spark-2", 1), ("spark-3", 1))
    (p,) = problems(World(names, c))
    assert p.startswith("spark-2's cables are crossed: its port 1 goes to spark-3 and its port 0 to spark-1")
    assert "Swap the two cables at spark-2" in p
    assert infer(World(names, c), allow_any_port=True)["topology"] == "ring"


def test_two_separate_rings_name_the_swap_that_joins_them():
    names = names_of(6)
    c = ring_cables(names[:3]) + ring_cables(names[3:])
    (p,) = problems(World(names, c))
    assert "2 separate loops (spark-1 - spark-2 - spark-3; spark-4 - spark-5 - spark-6)" in p
    assert "swap the ends at" in p


def test_two_cables_between_a_pair():
    names = names_of(2)
    (p,) = problems(World(names, [((names[0], 0), (names[1], 0)), ((names[0], 1), (names[1], 1))]))
    assert "two cables join spark-1 and spark-2" in p
    assert "Remove the cable spark-1 port 1 (enp1s0f1np1/enP2p1s0f1np1) - spark-2 port 1" in p


def test_two_cables_between_two_sparks_of_a_ring_with_a_spark_short():
    names = names_of(3)
    (*_first, last) = got = problems(World(names, [((names[0], 0), (names[1], 1)), ((names[0], 1), (names[1], 0))]))
    text = "\n".join(got)
    assert "two cables join spark-1 and spark-2" in text
    assert "Move the end at spark-2 port 0 (enp1s0f0np0/enP2p1s0f0np0) to spark-3 (cabled 0 time(s))" in text
    assert "spark-3 has no cable up" in last


def test_a_port_cabled_to_itself():
    names = names_of(2)
    got = problems(World(names, [((names[0], 0), (names[0], 1))]))
    assert any(
        "spark-1 port 0 (enp1s0f0np0/enP2p1s0f0np0) is cabled to spark-1 port 1 (enp1s0f1np1/enP2p1s0f1np1) of the "
        "same Spark"
        in p
        and "Move the end at spark-1 port 1 to another Spark" in p
        for p in got
    )


def test_a_link_down_names_the_twin_and_both_ends():
    world = World(names_of(2), [(("spark-1", 1), ("spark-2", 1))])
    world.down.add(("spark-2", "enP2p1s0f1np1"))
    (p,) = problems(world)
    assert p.startswith(
        "enP2p1s0f1np1 of spark-2 port 1 (enp1s0f1np1/enP2p1s0f1np1) is down (no carrier) (the cable spark-2 port 1 "
        "(enp1s0f1np1/enP2p1s0f1np1) - spark-1 port 1 (enp1s0f1np1/enP2p1s0f1np1))"
    )


def test_an_administratively_down_twin():
    world = World(names_of(2), [(("spark-1", 1), ("spark-2", 1))])
    world.admin_down.add(("spark-1", "enp1s0f1np1"))
    (p,) = problems(world)
    assert "enp1s0f1np1 of spark-1 port 1" in p and "administratively down" in p and "ip link set enp1s0f1np1 up" in p


def test_a_link_at_the_wrong_speed_names_both_ends():
    world = World(names_of(2), [(("spark-1", 1), ("spark-2", 1))])
    world.speed[("spark-1", "enp1s0f1np1")] = 100000
    (p,) = problems(world)
    assert "enp1s0f1np1 of spark-1 port 1 (enp1s0f1np1/enP2p1s0f1np1) runs at 100000 Mb/s, not 200000" in p
    assert "spark-2 port 1" in p


def test_one_twin_missing():
    world = World(names_of(2), [(("spark-1", 1), ("spark-2", 1))])
    world.missing_twin.add(("spark-2", "enP2p1s0f1np1"))
    got = problems(world)
    assert any("spark-2 port 1 (enp1s0f1np1) shows one PCIe function only" in p for p in got)


def test_a_link_up_with_no_neighbour():
    names = names_of(2)
    world = World(names, [((names[0], 1), (names[1], 1))])
    world.switch.add(("spark-1", 0))
    world.switch_silent = True
    nodes = world.nodes()
    for p in nodes["spark-1"]["ports"]:
        if p["port"] == 0:
            p["neighbours"] = []
    with pytest.raises(d.DiscoveryError) as err:
        d.infer(nodes, names, {"speed_mbps": 200000})
    (p,) = err.value.problems
    assert p.startswith("spark-1 port 0 (enp1s0f0np0/enP2p1s0f0np0) has a link (enp1s0f0np0, enP2p1s0f0np0 up)")


def test_no_cable_at_all():
    (p,) = problems(World(names_of(3)))
    assert p.startswith("no cable found between the Sparks")


def test_a_ring_spark_without_cables():
    names = names_of(4)
    got = problems(World(names, ring_cables(names[:3])))
    assert any(p.startswith("spark-4 has no cable up") for p in got)


def test_switch_with_a_spark_missing_or_on_two_ports_or_two_switches():
    names = names_of(3)
    world = World(names, switch={("spark-1", 1), ("spark-2", 1), ("spark-2", 0)})
    got = "\n".join(problems(world))
    assert "spark-3 is not on the switch" in got
    assert "spark-2 has both ports on the switch" in got and "unplug spark-2 port 1" in got


def test_mixed_cables_and_switch():
    names = names_of(3)
    world = World(names, [((names[0], 0), (names[1], 1))], switch={(h, 1) for h in (names[0], names[2])})
    (p,) = problems(world)
    assert p.startswith("some Sparks are cabled to each other (the cable spark-1 port 0")
    assert "and some to a switch (sw-200g (chassis b8:ce:f6:00:00:01)" in p


def test_the_expected_topology_is_checked():
    world = World(names_of(2), [(("spark-1", 1), ("spark-2", 1))])
    (p,) = problems(world, topology="switch")
    assert p == "sparkops_discover_topology is switch, but the cabling makes a pair."


def test_a_pool_too_small():
    names = names_of(4)
    world = World(names, ring_cables(names))
    (p,) = problems(world, pool="192.168.100.0/22")
    assert "the pool 192.168.100.0/22 holds 4 free /24 subnet(s), 8 are needed" in p


def test_bad_pool_and_prefix():
    world = World(names_of(2), [(("spark-1", 1), ("spark-2", 1))])
    assert "is no IPv4 network" in problems(world, pool="192.168.100.1/20")[0]
    assert "must lie between" in problems(world, prefix=31)[0]


def test_a_host_without_a_read():
    with pytest.raises(d.DiscoveryError) as err:
        d.infer({}, ["spark-1"], {})
    assert "no discovery read from spark-1" in err.value.problems[0]


def test_refusal_keeps_the_ports_for_the_summary():
    names = names_of(4)
    with pytest.raises(d.DiscoveryError) as err:
        infer(World(names, ring_cables(names)[:-1]))
    assert set(err.value.partial["ports"]) == set(names)
    assert err.value.render().startswith("The cabling makes no supported sparkops topology (1 problem):")


# ------------------------------------------------------------------------ moved cables
def test_moved_cables_against_the_hand_written_ring():
    data = yaml.safe_load((ROOT / "inventory" / "examples" / "ring-4" / "hosts.yml").read_text())
    links = inputs_from_hosts_yml(data)["hostvars"]
    links = {h: v["sparkops_fast_links"] for h, v in links.items()}
    names = names_of(4)
    assert d.moved_cables(links, infer(World(names, ring_cables(names)))) == []
    # spark-2 and spark-3 swapped places in the ring: 1-3-2-4.
    order = ["spark-1", "spark-3", "spark-2", "spark-4"]
    moved = d.moved_cables(links, infer(World(names, ring_cables(order))))
    assert moved
    assert any(
        m.startswith("the cable spark-1 port 0 - spark-2 port 1 of the inventory is not there: spark-1 port 0 now "
                     "meets spark-3 port 1; spark-2 port 1 now meets spark-3 port 0") for m in moved
    )  # fmt: skip


@pytest.mark.parametrize(
    ("n", "topology", "pool"),
    [
        (2, "pair", "10.213.0.0/23"),
        (4, "switch", "10.213.0.0/23"),
        (4, "ring", "10.214.0.0/16"),
        (3, "ring", "10.214.0.0/16"),
    ],
)
@NEEDS_TEST_BED
def test_with_the_test_beds_pool_the_addresses_are_dockers(monkeypatch, tmp_path, n, topology, pool):
    # The test bed's networks are Docker's (roce_network_backend: preconfigured checks, never writes, them):
    # with its subnets as the pool, the proposal is exactly what simctl wired, so site.yml converges on it.
    names = names_of(n, "spark-sim")
    if topology == "switch":
        world = World(names, bridge={(h, 1) for h in names})
    elif topology == "ring":
        world = World(names, ring_cables(names))
    else:
        world = World(names, [((names[0], 1), (names[1], 1))])
    got = model_of_discovery(world, pool=pool, speed_mbps=0)
    if topology == "pair":
        want = hand_written(ROOT / "inventory" / "sim" / "hosts.yml")
    else:
        want = sim_inventory(monkeypatch, tmp_path, n, topology)

    def addresses(model):
        return {h: sorted((lk["netdev"], lk["address"]) for lk in model["nodes"][h]["links"]) for h in names}

    assert addresses(got) == addresses(want)
