"""build_cluster: the model of every topology and every refusal, without Ansible."""

from __future__ import annotations

import ipaddress
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3] / "plugins" / "plugin_utils"))
sys.path.insert(0, str(HERE))

import cluster_inventories as inv  # noqa: E402
from cluster import ClusterError, build_cluster, summary  # noqa: E402


def problems_of(inputs):
    with pytest.raises(ClusterError) as err:
        build_cluster(inputs)
    return err.value.problems


def _links(inputs, host):
    return inputs["hostvars"][host]["sparkops_fast_links"]


# ------------------------------------------------------------------------------- pair
def test_pair_model():
    m = build_cluster(inv.pair())
    assert m["topology"] == "pair"
    assert m["head"] == "spark-1"
    assert m["workers"] == ["spark-2"]
    assert m["segments"] == [
        {"cidr": "192.168.100.0/24", "hosts": ["spark-1", "spark-2"]},
        {"cidr": "192.168.101.0/24", "hosts": ["spark-1", "spark-2"]},
    ]
    assert len(m["cables"]) == 1
    lanes = m["cables"][0]["lanes"]
    assert [(ln["a"]["rdma_device"], ln["b"]["ip"]) for ln in lanes] == [
        ("rocep1s0f1", "192.168.100.12"),
        ("roceP2p1s0f1", "192.168.101.12"),
    ]
    head = m["nodes"]["spark-1"]
    assert head["peers"] == ["spark-2"]
    assert head["routes"] == []
    assert head["env"]["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
    assert head["env"]["VLLM_HOST_IP"] == "192.168.100.11"
    assert "NCCL_IB_MERGE_NICS" not in head["env"]
    assert {(p["netdev"], p["ip"]) for p in head["pings"]} == {
        ("enp1s0f1np1", "192.168.100.12"),
        ("enP2p1s0f1np1", "192.168.101.12"),
    }
    assert m["ray"]["address"] == "192.168.100.11:6379"
    assert m["endpoint"] == {
        "host": "spark-1",
        "bind": "192.168.100.11",
        "port": 8000,
        "url": "http://192.168.100.11:8000",
    }
    # The image's name is the serving plan's (tests/unit/plugins/plugin_utils/test_serving_plan.py), not the model's.
    assert set(m["image"]) == {"repo", "ref", "build_host", "fanout"}
    assert m["weights"]["fanout"] == [{"from": "spark-1", "to": "spark-2", "ip": "192.168.100.12", "wave": 1}]
    assert m["paths"]["api_key_file"] == "/srv/inv-state/credentials/api_key"
    assert m["paths"]["lock_file"] == "/srv/inv-state/sparkops.lock.json"
    assert m["nodes"]["spark-2"]["ssh_from"] == ["192.168.100.0/24", "192.168.101.0/24"]
    json.dumps(m)  # the model is plain data (plan.yml writes it as JSON)


def test_endpoint_bind_everywhere_keeps_a_reachable_url():
    m = build_cluster(inv.pair(vllm_serve_host="0.0.0.0", vllm_serve_port=9001))
    assert m["endpoint"]["bind"] == "0.0.0.0"
    assert m["endpoint"]["url"] == "http://192.168.100.11:9001"


def test_paths_follow_explicit_settings():
    m = build_cluster(inv.pair(sparkops_credentials_dir="/vault/creds", sparkops_reports_dir="/r"))
    assert m["paths"]["api_key_file"] == "/vault/creds/api_key"
    assert m["paths"]["reports_dir"] == "/r"


# ----------------------------------------------------------------------------- switch
@pytest.mark.parametrize("n", range(2, 9))
def test_switch_of_n(n):
    m = build_cluster(inv.switch(n))
    assert m["topology"] == "switch"
    assert m["size"] == n
    assert [s["hosts"] for s in m["segments"]] == [inv.names_of(n)] * 2
    for h in m["hosts"]:
        node = m["nodes"][h]
        assert node["peers"] == [p for p in inv.names_of(n) if p != h]
        assert node["routes"] == []
        # every other node on both subnets: a jumbo ping per lane to each
        assert len(node["pings"]) == 2 * (n - 1)
    # per-cable tests: head to each worker, both twins
    assert [(c["a"], c["b"], len(c["lanes"])) for c in m["cables"]] == [("spark-1", w, 2) for w in m["workers"]]
    fan = m["weights"]["fanout"]
    assert sorted(e["to"] for e in fan) == m["workers"]
    # a doubling tree: ceil(log2 n) waves, every sender already holds the data
    assert max(e["wave"] for e in fan) == (n - 1).bit_length()
    have = {"spark-1"}
    for wave in sorted({e["wave"] for e in fan}):
        step = [e for e in fan if e["wave"] == wave]
        assert all(e["from"] in have for e in step)
        assert len({e["from"] for e in step}) == len(step), "one send per node per wave"
        have |= {e["to"] for e in step}


# ------------------------------------------------------------------------------- ring
@pytest.mark.parametrize("n", range(3, 9))
def test_ring_of_n(n):
    m = build_cluster(inv.ring(n))
    names = inv.names_of(n)
    assert m["topology"] == "ring"
    assert m["mesh"] is (n == 3)
    assert m["ring_order"] == names
    assert len(m["cables"]) == n
    assert all(len(s["hosts"]) == 2 for s in m["segments"])
    for i, h in enumerate(names):
        node = m["nodes"][h]
        assert node["peers"] == sorted({names[(i + 1) % n], names[(i - 1) % n]}, key=names.index)
        assert sorted(node["hcas"]) == sorted(["rocep1s0f0", "roceP2p1s0f0", "rocep1s0f1", "roceP2p1s0f1"])
        assert node["env"]["NCCL_IB_HCA"] == ",".join(node["hcas"])
        assert node["env"]["NCCL_IB_MERGE_NICS"] == "0"
        assert node["env"]["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1"
        assert ("NCCL_ALGO" in node["env"]) is (n >= 4)
        mine = {ln["cidr"] for ln in node["links"]}
        routed = {r["to"] for r in node["routes"]}
        # a route to every subnet the node is not on, through a neighbour, at most n//2 hops away
        assert routed == {s["cidr"] for s in m["segments"]} - mine
        for r in node["routes"]:
            assert r["through"] in node["peers"]
            assert 1 <= r["hops"] <= n // 2
            dev_net = next(ln["cidr"] for ln in node["links"] if ln["netdev"] == r["dev"])
            assert ipaddress.ip_address(r["via"]) in ipaddress.ip_network(dev_net)
        direct = [p for p in node["pings"] if not p.get("routed")]
        assert {p["peer"] for p in direct} == set(node["peers"])
        assert len(direct) == 4  # two cables, two twins each
        far = {p["peer"] for p in node["pings"] if p.get("routed")}
        assert far == set(names) - set(node["peers"]) - {h}
    # copies only along cables, two chains: ceil((n-1)/2) waves
    cabled = {frozenset((c["a"], c["b"])) for c in m["cables"]}
    fan = m["weights"]["fanout"]
    assert all(frozenset((e["from"], e["to"])) in cabled for e in fan)
    assert sorted(e["to"] for e in fan) == names[1:]
    assert max(e["wave"] for e in fan) == n // 2


def test_ring_routes_take_the_short_way():
    m = build_cluster(inv.ring(6))
    routes = {r["to"]: r for r in m["nodes"]["spark-1"]["routes"]}
    # cable 3 joins spark-3 and spark-4: two hops clockwise (via spark-2), three the other way
    assert routes["10.3.0.0/24"]["through"] == "spark-2"
    # cable 4 joins spark-4 and spark-5: via spark-6 (two hops) rather than spark-2 (three)
    assert routes["10.4.0.0/24"]["through"] == "spark-6"


def test_summary_names_everything():
    text = "\n".join(summary(build_cluster(inv.ring(4))))
    assert "ring of 4 node(s)" in text
    assert "route 10.2.0.0/24 via 10.1.0.2 dev enp1s0f0np0" in text
    assert "cable spark-3 - spark-4" in text


# --------------------------------------------------------------------------- refusals
def _drop_cable(inputs, c):
    """Remove both twin subnets of ring cable c (1-based, as in inv.ring)."""
    for h in inputs["hostvars"]:
        links = _links(inputs, h)
        links[:] = [ln for ln in links if not ln["address"].startswith(f"10.{c}.")]


def test_ring_missing_cable_names_both_ends_and_every_other_problem():
    inputs = inv.mutate(inv.ring(4), lambda d: _drop_cable(d, 2))
    _links(inputs, "spark-4")[0]["address"] = "10.1.0.1/24"  # and a duplicate address
    probs = problems_of(inputs)
    text = "\n".join(probs)
    assert "spark-2 is cabled to 1 node(s) (spark-1)" in text
    assert "spark-3 is cabled to 1 node(s) (spark-4)" in text
    assert "also short of a cable: spark-3" in text
    assert "duplicated: 10.1.0.1 (on spark-1 enp1s0f0np0 and spark-4 enp1s0f1np1)" in text
    assert len(probs) >= 3


def test_ring_subnet_with_three_nodes():
    def third(d):
        _links(d, "spark-3").append({"netdev": "enp9s0", "address": "10.1.0.3/24"})

    probs = problems_of(inv.mutate(inv.ring(4), third))
    assert any("subnet 10.1.0.0/24 holds 3 nodes" in p and "spark-3 enp9s0 10.1.0.3" in p for p in probs)


def test_ring_of_two_separate_loops():
    # two 3-rings declared as one 6-ring
    a, b = inv.ring(3), inv.ring(3)
    hv = dict(a["hostvars"])
    for h, hvars in b["hostvars"].items():
        new = h.replace("spark-", "spark-b")
        moved = json.loads(json.dumps(hvars).replace('"10.', '"172.'))
        moved["ansible_host"] = "10.9.0." + new[-1]
        hv[new] = moved
    inputs = inv.mutate(a, lambda d: None)
    inputs["hostvars"] = hv
    inputs["groups"]["spark_cluster"] = list(hv)
    probs = problems_of(inputs)
    assert any("several separate loops" in p for p in probs)


def test_ring_too_small_and_mesh_size():
    p = problems_of(inv.mutate(inv.pair(), lambda d: d["settings"].update(sparkops_topology="ring")))
    assert any("a ring needs three or more" in x for x in p)
    p = problems_of(inv.mutate(inv.ring(4), lambda d: d["settings"].update(sparkops_topology="mesh")))
    assert any("a full mesh of Sparks" in x for x in p)
    assert build_cluster(inv.mutate(inv.ring(3), lambda d: d["settings"].update(sparkops_topology="mesh")))["mesh"]


def test_pair_of_three_nodes():
    inputs = inv.switch(3)
    inputs["settings"]["sparkops_topology"] = "pair"
    probs = problems_of(inputs)
    assert any("a pair is exactly two Sparks" in p and "3 node(s)" in p for p in probs)
    assert any("subnet 192.168.100.0/24 holds 3 nodes" in p for p in probs)


def test_pair_with_one_twin_only():
    def one(d):
        for h in d["hostvars"]:
            del _links(d, h)[1]

    probs = problems_of(inv.mutate(inv.pair(), one))
    assert any("carries one lane only" in p and "both twins" in p for p in probs)


def test_pair_sharing_no_subnet():
    def apart(d):
        _links(d, "spark-2")[0]["address"] = "192.168.110.12/24"
        _links(d, "spark-2")[1]["address"] = "192.168.111.12/24"

    probs = problems_of(inv.mutate(inv.pair(), apart))
    assert any("no other node has an address in 192.168.100.0/24" in p and "spark-1 enp1s0f1np1" in p for p in probs)
    assert any("share no fast subnet" in p for p in probs)


def test_switch_subnet_missing_a_node():
    probs = problems_of(inv.mutate(inv.switch(4), lambda d: _links(d, "spark-3").pop()))
    assert any("switch subnet 192.168.101.0/24" in p and "but not spark-3" in p for p in probs)


def test_twins_on_one_subnet_and_duplicate_netdev():
    def same(d):
        _links(d, "spark-1")[1]["address"] = "192.168.100.21/24"
        _links(d, "spark-2")[1]["netdev"] = "enp1s0f1np1"

    probs = problems_of(inv.mutate(inv.pair(), same))
    assert any(p.startswith("spark-1: two fast links are on the same subnet 192.168.100.0/24") for p in probs)
    assert any("spark-2: netdev enp1s0f1np1 is listed twice" in p for p in probs)


# The inventory refusals of the old preflight (0010-inventory.yml), all at once, with its messages.
def test_every_inventory_refusal_reported_at_once():
    def break_all(d):
        d["groups"]["spark_head"] = ["spark-1", "spark-2"]
        _links(d, "spark-2")[0]["address"] = "192.168.100.12"  # no prefix
        _links(d, "spark-2")[1] = "enP2p1s0f1np1"  # not a mapping
        d["hostvars"]["spark-1"]["ansible_host"] = "192.168.101.11"
        d["settings"].update(
            sparkops_fast_mtu=1500,
            sparkops_nvidia_driver_branch="590",
            nvidia_driver_version="575.64-1",
            sparkops_hardware="dgx_station",
            sparkops_topology="torus",
        )

    probs = problems_of(inv.mutate(inv.pair(), break_all))
    text = " ".join(" ".join(probs).split())
    for message in (
        "must hold exactly one host; it holds 2",
        "spark-2: fast link #0",
        "is malformed",
        "spark-2: fast link #1 (enP2p1s0f1np1) is malformed",
        "spark-1: ansible_host 192.168.101.11 is a fast-link address",
        "need MTU 9000",
        "must stay on the 580 driver branch",
        "outside the 590 branch",
        "valid values: dgx_spark, simulated",
        "sparkops_topology is 'torus'",
    ):
        assert message in text, message
    assert len(probs) >= 9
    assert str(len(probs)) + " problems" in str(ClusterError(probs))


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ({"spark_cluster": [], "spark_head": []}, "no hosts in group 'spark_cluster'"),
        ({"spark_cluster": ["spark-1", "spark-2"], "spark_head": []}, "it holds 0 (none)"),
        ({"spark_cluster": ["spark-2"], "spark_head": ["spark-1"]}, "is not in group 'spark_cluster'"),
    ],
)
def test_group_refusals(groups, message):
    inputs = inv.pair()
    inputs["groups"] = groups
    assert any(message in p for p in problems_of(inputs))


@pytest.mark.parametrize(
    ("links", "message"),
    [
        (None, "has no usable 'sparkops_fast_links'"),
        ([], "has no usable 'sparkops_fast_links'"),
        ("", "has no usable 'sparkops_fast_links'"),  # `sparkops_fast_links:` left empty in YAML
        ({"netdev": "enp1s0f1np1"}, "is a dict, not a list"),
        ([{"address": "192.168.100.12/24"}], "'netdev' (e.g. enp1s0f1np1) is missing"),
        ([{"netdev": "x", "address": "192.168.100.0/24"}], "network or broadcast address"),
        ([{"netdev": "x", "address": "192.168.100.12/32"}], "outside /8../30"),
        ([{"netdev": "x", "address": "300.1.1.1/24"}], "not a valid IPv4"),
        ([{"netdev": "x", "address": "fe80::1/64"}], "not an IPv4 host address with prefix"),
    ],
)
def test_malformed_links(links, message):
    inputs = inv.pair()
    inputs["hostvars"]["spark-2"]["sparkops_fast_links"] = links
    probs = problems_of(inputs)
    assert any(p.startswith("spark-2") and message in p for p in probs), probs


def test_ports_must_be_numbers():
    probs = problems_of(inv.pair(vllm_serve_port="eighty", ray_cluster_gcs_port=70000))
    assert any("vllm_serve_port" in p for p in probs)
    assert any("ray_cluster_gcs_port" in p for p in probs)


def test_same_inputs_same_model():
    assert build_cluster(inv.ring(5)) == build_cluster(inv.ring(5))
