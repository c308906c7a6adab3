"""doctor's cabling verdict: the cables found now (fabric_discover reads) against the inventory's links."""

from __future__ import annotations

import yaml
from ansible_collections.sparkops.cluster.plugins.plugin_utils import day2_checks as d
from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import build_cluster
from conftest import ROOT
from discovery_world import World, names_of, ring_cables
from test_discovery import inputs_from_hosts_yml

RING4 = ROOT / "inventory" / "examples" / "ring-4" / "hosts.yml"


def discovery_of(path, topology):
    model = build_cluster(inputs_from_hosts_yml(yaml.safe_load(path.read_text()), {"sparkops_topology": topology}))
    return {
        "hosts": model["hosts"],
        "head": model["head"],
        "topology": model["topology"],
        "links": {h: model["nodes"][h]["links"] for h in model["hosts"]},
        "hardware": "dgx_spark",
    }


def test_the_cables_where_the_inventory_says_pass():
    names = names_of(4)
    v = d.check_cabling(discovery_of(RING4, "ring"), World(names, ring_cables(names)).nodes())
    assert (v["verdict"], v["evidence"]) == ("PASS", "ring: 4 cable(s) where the inventory says")


def test_a_moved_cable_is_named():
    names = names_of(4)
    moved = World(names, ring_cables(["spark-1", "spark-3", "spark-2", "spark-4"])).nodes()
    v = d.check_cabling(discovery_of(RING4, "ring"), moved)
    assert v["verdict"] == "CRITICAL"
    assert (
        "the cable spark-1 port 0 - spark-2 port 1 of the inventory is not there: spark-1 port 0 now meets"
        in v["evidence"]
    )


def test_a_missing_cable_is_named():
    names = names_of(4)
    v = d.check_cabling(discovery_of(RING4, "ring"), World(names, ring_cables(names)[:-1]).nodes())
    assert v["verdict"] == "CRITICAL" and "connect spark-1 port 1" in v["evidence"]


def test_a_switch_the_inventory_calls_a_switch():
    names = names_of(4)
    path = ROOT / "inventory" / "examples" / "switch-4" / "hosts.yml"
    v = d.check_cabling(discovery_of(path, "switch"), World(names, switch={(h, 1) for h in names}).nodes())
    assert (v["verdict"], v["evidence"]) == ("PASS", "switch: the switch where the inventory says")
    ring = d.check_cabling(discovery_of(RING4, "ring"), World(names, switch={(h, 1) for h in names}).nodes())
    assert ring["verdict"] == "CRITICAL" and "the inventory says ring, the cables make a switch" in ring["evidence"]


def test_nothing_heard_is_not_applicable_not_a_failure():
    names = names_of(4)
    reads = World(names, ring_cables(names)).nodes()
    for r in reads.values():
        for p in r["ports"]:
            p["neighbours"] = []
    v = d.check_cabling(discovery_of(RING4, "ring"), reads)
    assert v["verdict"] == "N/A" and "apt-get install lldpd" in v["action"]
    assert d.check_cabling(None, {})["verdict"] == "N/A"


def test_an_unread_node_is_a_warning():
    names = names_of(4)
    reads = World(names, ring_cables(names)).nodes()
    reads["spark-3"] = {"failed": True, "msg": "unreachable"}
    v = d.check_cabling(discovery_of(RING4, "ring"), reads)
    assert v["verdict"] == "WARN" and "spark-3" in v["evidence"]


def test_doctor_makes_the_cabling_verdict_from_each_nodes_read():
    names = names_of(4)
    reads = World(names, ring_cables(["spark-1", "spark-3", "spark-2", "spark-4"])).nodes()
    inputs = {
        "now_epoch": 0,
        "settings": {"hardware": "dgx_spark", "driver_branch": "580", "memory_floor_gib": 0.25,
                     "disk_headroom_gib": 1, "weights_path": "/w", "cable_threshold_gbps": 190,
                     "expected_nodes": 4, "expected_gpus": 4, "serve_host": "10.0.0.1", "mgmt_address": "10.0.0.11"},
        "nodes": {h: {"discover": reads[h], "kernel": "6.11.0-1016-nvidia"} for h in names},
        "discovery": discovery_of(RING4, "ring"),
    }  # fmt: skip
    (v,) = [v for v in d.build_verdicts(inputs) if v["check"] == "cabling as in the inventory"]
    assert v["verdict"] == "CRITICAL" and "spark-1 port 0 now meets spark-3 port 1" in v["evidence"]


def test_nodes_not_read_at_once_are_not_judged():
    names = names_of(4)
    moved = World(names, ring_cables(["spark-1", "spark-3", "spark-2", "spark-4"])).nodes()
    v = d.check_cabling(dict(discovery_of(RING4, "ring"), all_at_once=False), moved)
    assert v["verdict"] == "N/A" and "-f 4" in v["action"]
