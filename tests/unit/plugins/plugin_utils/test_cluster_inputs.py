"""build_cluster refuses inventory values that would reach a root shell, an env file or the wrong host
(issue 23), and the model's edge cases the mutation run found unpinned (issue 30: cluster.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3] / "plugins" / "plugin_utils"))
sys.path.insert(0, str(HERE))

import cluster  # noqa: E402
import cluster_inventories as inv  # noqa: E402
from cluster import IB_DEVICE_NAME_MAX, IFNAMSIZ, MAX_NODES, ClusterError, build_cluster  # noqa: E402


def problems_of(inputs):
    with pytest.raises(ClusterError) as err:
        build_cluster(inputs)
    return err.value.problems


def _links(inputs, host):
    return inputs["hostvars"][host]["sparkops_fast_links"]


def _with_netdev(name, field="netdev"):
    def change(d):
        _links(d, "spark-2")[0][field] = name

    return inv.mutate(inv.pair(), change)


# ------------------------------------------------------------------ netdev and RDMA names
@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("enp1s0f1np1 -j ACCEPT; touch /tmp/x #", "which the kernel refuses"),  # the audit's injection
        ("enp1s0f1np1\nLD_PRELOAD=/tmp/x.so", "which the kernel refuses"),
        ("enp1s0f1np1\tx", "which the kernel refuses"),
        ("enp1s0\xa0f1", "which the kernel refuses"),  # the kernel's isspace() includes 0xA0
        ("a/b", "which the kernel refuses"),
        ("eth0:1", "which the kernel refuses"),  # an alias label, not an interface
        (".", "not a name the kernel accepts"),
        ("..", "not a name the kernel accepts"),
        ("x" * IFNAMSIZ, "the kernel takes at most 15"),
        ("enp1s0f1np1;id", "sparkops takes letters, digits"),
        ("en$(id)", "sparkops takes letters, digits"),
        ("enp'1", "sparkops takes letters, digits"),
        ("énp1", "sparkops takes letters, digits"),
    ],
)
def test_netdev_names_follow_the_kernel_grammar(name, why):
    probs = problems_of(_with_netdev(name))
    assert any(p.startswith("spark-2: fast link #0") and why in p for p in probs), probs


@pytest.mark.parametrize("name", ["x" * (IFNAMSIZ - 1), "eth0.100", "enP2p1s0f0np0", "fast_0-a"])
def test_netdev_names_the_kernel_takes_are_accepted(name):
    model = build_cluster(_with_netdev(name))
    assert model["nodes"]["spark-2"]["netdevs"][0] == name


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("rocep1s0f1\nLD_PRELOAD=/tmp/x.so", "which the kernel refuses"),
        ("roce p1", "which the kernel refuses"),
        ("roce/p1", "which the kernel refuses"),
        ("r" * IB_DEVICE_NAME_MAX, f"at most {IB_DEVICE_NAME_MAX - 1}"),
        ("rocep1,roceP2", "sparkops takes letters, digits"),  # would split NCCL_IB_HCA in two
    ],
)
def test_rdma_names_follow_the_kernel_grammar(name, why):
    probs = problems_of(_with_netdev(name, "rdma_device"))
    assert any(p.startswith("spark-2: fast link #0") and why in p for p in probs), probs


def test_a_long_rdma_name_within_the_kernel_limit_is_accepted():
    name = "r" * (IB_DEVICE_NAME_MAX - 1)  # longer than any netdev may be: RDMA names have their own limit
    assert build_cluster(_with_netdev(name, "rdma_device"))["nodes"]["spark-2"]["hcas"][0] == name


def test_the_management_interface_is_no_fast_link():
    probs = problems_of(_with_netdev("enP7s7"))
    assert any("spark-2: fast link #0" in p and "is the management interface" in p for p in probs), probs
    # the setting names the management interface, whatever it is called
    renamed = inv.mutate(_with_netdev("enP7s7"), lambda d: d["settings"].update(sparkops_mgmt_interface="eno1"))
    assert build_cluster(renamed)["mgmt_interface"] == "eno1"
    probs = problems_of(inv.mutate(renamed, lambda d: _links(d, "spark-1")[1].update(netdev="eno1")))
    assert any(p.startswith("spark-1: fast link #1") and "management interface" in p for p in probs), probs


def test_the_management_interface_name_is_checked_too():
    probs = problems_of(inv.pair(sparkops_mgmt_interface="enP7s7 -j ACCEPT"))
    assert any(p.startswith("sparkops_mgmt_interface 'enP7s7 -j ACCEPT'") for p in probs), probs


# ------------------------------------------------------------------ values that reach files
@pytest.mark.parametrize(
    "setting",
    ["spark_vllm_image_ref", "sparkops_cluster_name", "sparkops_reports_dir", "spark_vllm_image_repo"],
)
def test_no_control_characters_in_settings(setting):
    probs = problems_of(inv.pair(**{setting: "x\nLD_PRELOAD=/tmp/x.so"}))
    assert any(p.startswith(f"{setting} contains control characters") and "'\\n'" in p for p in probs), probs
    assert any("'\\x1b'" in p for p in problems_of(inv.pair(**{setting: "x\x1b[2J"})))


def test_extra_env_for_the_containers_is_one_variable_per_line():
    assert build_cluster(inv.pair(roce_network_env_extra={"NCCL_P2P_LEVEL": "SYS"}))
    probs = problems_of(inv.pair(roce_network_env_extra={"X": "1\nLD_PRELOAD=/tmp/x.so", "A B": "1", "9X": "1"}))
    assert any("the value of 'X' contains control characters" in p for p in probs), probs
    assert any("'A B' is no environment variable name" in p for p in probs), probs
    assert any("'9X' is no environment variable name" in p for p in probs), probs
    assert any("is a list" in p for p in problems_of(inv.pair(roce_network_env_extra=["X=1"])))


def test_no_control_characters_in_the_management_address():
    probs = problems_of(inv.mutate(inv.pair(), lambda d: d["hostvars"]["spark-2"].update(ansible_host="10.0.0.12\nx")))
    assert any(p.startswith("spark-2: ansible_host") and "control characters" in p for p in probs), probs


# ------------------------------------------------------------------ host names and the API address
@pytest.mark.parametrize("setting", ["sparkops_weights_source_host", "sparkops_image_build_host"])
def test_an_unknown_host_is_refused_not_replaced_by_the_head(setting):
    probs = problems_of(inv.switch(3, **{setting: "spark-22"}))
    assert any(p.startswith(f"{setting} is 'spark-22', which is not a host") and "spark-3" in p for p in probs)
    model = build_cluster(inv.switch(3, **{setting: "spark-3"}))
    assert (model["weights"]["source"], model["image"]["build_host"])[
        setting == "sparkops_image_build_host"
    ] == "spark-3"


@pytest.mark.parametrize("bind", ["192.168.100.11", "192.168.101.11", "10.0.0.11", "0.0.0.0"])
def test_the_api_binds_to_an_address_of_the_head_or_everywhere(bind):
    assert build_cluster(inv.pair(vllm_serve_host=bind))["endpoint"]["bind"] == bind


@pytest.mark.parametrize("bind", ["::", "fe80::1", "::ffff:10.0.0.11", "2001:db8::11"])
def test_an_ipv6_api_bind_is_refused_until_the_chains_cover_ipv6(bind):
    # The SPARKOPS-* chains are iptables (IPv4) rules: a port bound to IPv6 is open to every network.
    probs = problems_of(inv.pair(vllm_serve_host=bind))
    (p,) = [p for p in probs if p.startswith("vllm_serve_host")]
    assert p.startswith(f"vllm_serve_host is '{bind}', an IPv6 address.")
    assert "refused until the chains cover IPv6" in p
    assert "192.168.100.11, 192.168.101.11, 10.0.0.11 or 0.0.0.0" in p


@pytest.mark.parametrize("bind", ["192.168.100.12", "10.0.0.12", "8.8.8.8", "localhost", "0.0.0.0; id"])
def test_the_api_bind_address_must_be_the_heads(bind):
    probs = problems_of(inv.pair(vllm_serve_host=bind))
    assert any(p.startswith(f"vllm_serve_host is '{bind}', which is none of the head spark-1") for p in probs)


def test_a_head_with_malformed_links_gets_no_second_guess_about_its_api_address():
    # The head's addresses are unknown while its links are malformed: only the links are reported.
    def broken(d):
        for link in _links(d, "spark-1"):
            link["netdev"] = "en p1"

    probs = problems_of(inv.mutate(inv.pair(vllm_serve_host="192.168.100.11"), broken))
    assert any(p.startswith("spark-1: fast link #0") for p in probs), probs
    assert not any("vllm_serve_host" in p for p in probs), probs


# ------------------------------------------------------------------ issue 30 survivors
def test_on_a_switch_each_lane_end_carries_its_own_hosts_address():
    model = build_cluster(inv.switch(4))
    for cable in model["cables"]:
        for lane in cable["lanes"]:
            for end in ("a", "b"):
                node = model["nodes"][lane[end]["host"]]
                link = next(ln for ln in node["links"] if ln["cidr"] == lane["cidr"])
                assert (lane[end]["ip"], lane[end]["netdev"], lane[end]["rdma_device"]) == (
                    link["ip"],
                    link["netdev"],
                    link["rdma_device"],
                )
    first = model["cables"][2]["lanes"][1]
    assert (first["a"]["host"], first["a"]["ip"], first["b"]["host"], first["b"]["ip"]) == (
        "spark-1",
        "192.168.101.11",
        "spark-4",
        "192.168.101.14",
    )


def test_a_malformed_link_does_not_hide_the_hosts_other_links():
    def broken(d):
        _links(d, "spark-2")[:] = ["enp1s0f1np1", {"netdev": "en p1", "address": "192.168.101.12/24"}]

    probs = problems_of(inv.mutate(inv.pair(), broken))
    assert any(p.startswith("spark-2: fast link #0 (enp1s0f1np1) is malformed") for p in probs), probs
    assert any(p.startswith("spark-2: fast link #1") and "'en p1'" in p for p in probs), probs


@pytest.mark.parametrize(("prefix", "ok"), [(7, False), (8, True), (30, True), (31, False)])
def test_prefix_lengths_from_8_to_30(prefix, ok):
    def net(d):
        for i, h in enumerate(("spark-1", "spark-2")):
            _links(d, h)[0]["address"] = f"10.0.0.{1 + i}/{prefix}" if prefix < 31 else f"10.0.0.{i}/{prefix}"
            _links(d, h)[1]["address"] = f"11.0.0.{1 + i}/{prefix}" if prefix < 31 else f"11.0.0.{i}/{prefix}"

    inputs = inv.mutate(inv.pair(), net)
    if ok:
        assert build_cluster(inputs)["nodes"]["spark-1"]["links"][0]["prefix"] == prefix
    else:
        assert any(f"prefix /{prefix} is outside /8../30" in p for p in problems_of(inputs))


def test_64_nodes_are_modelled_65_are_refused():
    assert build_cluster(inv.switch(MAX_NODES))["size"] == MAX_NODES == 64
    probs = problems_of(inv.switch(MAX_NODES + 1))
    assert any(p == "The cluster has 65 nodes; sparkops models at most 64." for p in probs), probs


def test_ring_ties_go_clockwise():
    # On a 5-ring the cable opposite spark-1 (spark-3 - spark-4) is two hops either way: the route goes
    # clockwise, through the next node in ring order (spark-2), as _ring_routes documents.
    routes = {r["to"]: r for r in build_cluster(inv.ring(5))["nodes"]["spark-1"]["routes"]}
    assert (routes["10.3.0.0/24"]["through"], routes["10.3.0.0/24"]["hops"]) == ("spark-2", 2)
    assert routes["10.3.0.0/24"]["via"] == "10.1.0.2"
    # ...and from spark-3 the opposite cable is spark-5 - spark-1: clockwise is spark-4.
    routes = {r["to"]: r for r in build_cluster(inv.ring(5))["nodes"]["spark-3"]["routes"]}
    assert routes["10.5.1.0/24"]["through"] == "spark-4"
    # On a 3-ring (the full mesh) every far subnet is a tie: also clockwise.
    routes = build_cluster(inv.ring(3))["nodes"]["spark-1"]["routes"]
    assert [(r["to"], r["through"]) for r in routes] == [("10.2.0.0/24", "spark-2"), ("10.2.1.0/24", "spark-2")]


# ------------------------------------------------------------------ issue 30: boundaries a mutation run found
@pytest.mark.parametrize(("mtu", "ok"), [(8999, False), (9000, True), ("9000", True), (True, False), (None, True)])
def test_the_fast_mtu_is_at_least_9000(mtu, ok):
    inputs = inv.pair(sparkops_fast_mtu=mtu)
    if ok:
        assert build_cluster(inputs)["mtu"] == 9000
    else:
        assert any(
            p.startswith(f"sparkops_fast_mtu is {mtu}; the QSFP links need MTU 9000") for p in problems_of(inputs)
        )


@pytest.mark.parametrize(("port", "ok"), [(0, False), (1, True), (65535, True), (65536, False), (" 8080 ", True)])
def test_ports_from_1_to_65535(port, ok):
    for name in ("ray_cluster_gcs_port", "vllm_serve_port"):
        inputs = inv.pair(**{name: port})
        if ok:
            model = build_cluster(inputs)
            got = model["ray"]["port"] if name == "ray_cluster_gcs_port" else model["endpoint"]["port"]
            assert got == int(port)
        else:
            assert problems_of(inputs) == [f"{name} is '{port}'; give a TCP port number (1-65535)."]


def test_device_name_limits_are_the_kernels():
    """IFNAMSIZ 16 (include/uapi/linux/if.h), IB_DEVICE_NAME_MAX 64 (include/rdma/ib_verbs.h), NUL included."""
    assert build_cluster(_with_netdev("x" * 15))["nodes"]["spark-2"]["netdevs"][0] == "x" * 15
    assert any("is 16 bytes; the kernel takes at most 15" in p for p in problems_of(_with_netdev("x" * 16)))
    assert build_cluster(_with_netdev("r" * 63, "rdma_device"))["nodes"]["spark-2"]["hcas"][0] == "r" * 63
    probs = problems_of(_with_netdev("r" * 64, "rdma_device"))
    assert any("is 64 bytes; the kernel takes at most 63" in p for p in probs), probs


def test_a_character_the_kernel_refuses_is_named_once():
    def link0(name):
        (prob,) = [p for p in problems_of(_with_netdev(name)) if p.startswith("spark-2: fast link #0")]
        return prob

    prob = link0("a/b")
    assert "contains '/', which the kernel refuses" in prob
    assert "sparkops takes" not in prob  # not named a second time as a character sparkops does not take
    prob = link0("a/b;c")
    assert "contains '/', which the kernel refuses" in prob and "contains ';'; sparkops takes" in prob


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85", "\x00"])
def test_line_and_paragraph_separators_are_control_characters(char):
    probs = problems_of(inv.pair(sparkops_cluster_name=f"sparks{char}X=1"))
    assert any(p.startswith("sparkops_cluster_name contains control characters") for p in probs), probs
    probs = problems_of(_with_netdev(f"en{char}p1"))
    assert any("which the kernel refuses in a device name" in p for p in probs), probs


@pytest.mark.parametrize("rdma", ["", "  ", 7])
def test_an_empty_or_non_string_rdma_device_is_named_as_such(rdma):
    probs = problems_of(_with_netdev(rdma, "rdma_device"))
    assert any(
        p.startswith("spark-2: fast link #0") and "'rdma_device' must be a name such as rocep1s0f1" in p for p in probs
    ), probs


def test_cables_are_listed_in_rank_order_of_their_ends():
    model = build_cluster(inv.ring(4))
    assert [(c["a"], c["b"]) for c in model["cables"]] == [
        ("spark-1", "spark-2"),
        ("spark-1", "spark-4"),
        ("spark-2", "spark-3"),
        ("spark-3", "spark-4"),
    ]


def test_no_cycle_when_a_node_has_other_than_two_neighbours():
    hosts = ["a", "b", "c", "d"]
    full = {h: {o for o in hosts if o != h} for h in hosts}  # every node three neighbours
    assert cluster._cycle(hosts, full) is None
    # a ring with a chord b-d: the walk a-b-c-d-a visits every node, but b and d have three neighbours
    chord = {"a": {"b", "d"}, "b": {"a", "c", "d"}, "c": {"b", "d"}, "d": {"a", "b", "c"}}
    assert cluster._cycle(hosts, chord) is None
    ring = {"a": {"b", "d"}, "b": {"a", "c"}, "c": {"b", "d"}, "d": {"c", "a"}}
    assert cluster._cycle(hosts, ring) == ["a", "b", "c", "d"]


@pytest.mark.parametrize("bind", ["0.0.0.0"])
def test_an_api_bound_everywhere_is_reached_at_the_heads_fast_address(bind):
    assert build_cluster(inv.pair(vllm_serve_host=bind))["endpoint"]["url"] == "http://192.168.100.11:8000"


def test_an_env_name_with_a_final_newline_is_refused():
    """Python's "$" matches before a final newline; in the env file it would end the line after the name."""
    probs = problems_of(inv.pair(roce_network_env_extra={"NCCL_DEBUG\n": "INFO"}))
    assert probs == [
        "roce_network_env_extra: 'NCCL_DEBUG\\n' is no environment variable name (letters, digits and '_', "
        "not starting with a digit)."
    ]


def test_forward_rules_are_the_exact_iptables_arguments():
    rules = cluster._forward_rules(["f0", "f1"])
    assert rules == [
        {
            "where": ["-I", "SPARKOPS-FWD", "1"],
            "rule": ["-i", "f0", "-o", "f1", "-m", "comment", "--comment", "sparkops: ring forwarding f0 to f1",
                     "-j", "ACCEPT"],
        },
        {
            "where": ["-I", "SPARKOPS-FWD", "1"],
            "rule": ["-i", "f1", "-o", "f0", "-m", "comment", "--comment", "sparkops: ring forwarding f1 to f0",
                     "-j", "ACCEPT"],
        },
        {
            "where": ["-A", "SPARKOPS-FWD"],
            "rule": ["-m", "comment", "--comment", "sparkops: no other forwarding to or from the fast links",
                     "-j", "DROP"],
        },
    ] + [
        {
            "where": ["-I", "FORWARD", "1"],
            "rule": [flag, dev, "-m", "comment", "--comment", f"sparkops: forwarding {way} {dev}",
                     "-j", "SPARKOPS-FWD"],
        }
        for dev in ("f0", "f1")
        for flag, way in (("-i", "from"), ("-o", "to"))
    ]  # fmt: skip


def test_a_host_without_hostvars_is_reported_not_a_crash():
    inputs = inv.pair()
    inputs["hostvars"]["spark-2"] = None
    probs = problems_of(inputs)
    assert any(p.startswith("spark-2 has no usable 'sparkops_fast_links'") for p in probs), probs


def test_controller_paths_default_beside_the_inventory():
    # In a state folder beside the inventory folder, never inside it (Ansible reads every file of an inventory
    # folder as an inventory source: an API key there becomes a host).
    model = build_cluster(inv.pair())
    assert model["paths"] == {
        "inventory_dir": "/srv/inv",
        "state_dir": "/srv/inv-state",
        "credentials_dir": "/srv/inv-state/credentials",
        "api_key_file": "/srv/inv-state/credentials/api_key",
        "reports_dir": "/srv/inv-state/reports",
        "lock_file": "/srv/inv-state/sparkops.lock.json",
        "plan_file": "/srv/inv-state/sparkops-plan.json",
    }
    # one setting moves all of them; each can still be set on its own
    moved = build_cluster(inv.pair(sparkops_controller_state_dir="/var/sparks", sparkops_lock_file="/l.json"))
    assert moved["paths"]["api_key_file"] == "/var/sparks/credentials/api_key"
    assert moved["paths"]["plan_file"] == "/var/sparks/sparkops-plan.json"
    assert moved["paths"]["lock_file"] == "/l.json"
    # a trailing slash names the same folder
    assert build_cluster(inv.pair(inventory_dir="/srv/inv/"))["paths"]["state_dir"] == "/srv/inv-state"
    # without inventory_dir (plan.yml on a bare inventory): a folder in the working folder, said as "."
    bare = inv.mutate(inv.pair(), lambda d: d["settings"].pop("inventory_dir"))
    assert build_cluster(bare)["paths"]["api_key_file"] == "./sparkops-state/credentials/api_key"
    assert build_cluster(inv.pair(inventory_dir=""))["paths"]["reports_dir"] == "./sparkops-state/reports"


def test_an_empty_cluster_is_told_once_not_judged_as_a_topology():
    inputs = inv.pair()
    inputs["groups"] = {"spark_cluster": [], "spark_head": []}
    probs = problems_of(inputs)
    assert not any(p.startswith("sparkops_topology is pair") for p in probs), probs


def test_only_a_three_node_ring_is_the_mesh():
    assert build_cluster(inv.ring(3))["mesh"] is True
    assert build_cluster(inv.switch(3))["mesh"] is False
    assert build_cluster(inv.ring(4))["mesh"] is False


def test_the_ray_head_and_the_weights_source_carry_their_addresses():
    model = build_cluster(inv.switch(3, sparkops_weights_source_host="spark-3"))
    assert model["ray"] == {
        "head": "spark-1",
        "head_ip": "192.168.100.11",
        "port": 6379,
        "address": "192.168.100.11:6379",
    }
    assert (model["weights"]["source"], model["weights"]["source_ip"]) == ("spark-3", "192.168.100.13")
    assert model["weights"]["targets"] == ["spark-1", "spark-2"]
