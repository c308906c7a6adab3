"""fabric_discovery: the node-side parsers on recorded outputs (tests/fixtures/discovery/README.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import fabric_discovery as fd
from spark_sysfs import build_spark_sysfs

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
DISC = FIXTURES / "discovery"


@pytest.fixture
def spark_sysfs(tmp_path):
    return build_spark_sysfs(tmp_path)


def test_ibdev2netdev_of_nvidia_two_spark_guide():
    got = fd.parse_ibdev2netdev((DISC / "nvidia-connect-two-sparks_ibdev2netdev_port1.txt").read_text())
    assert got == {
        "enP2p1s0f0np0": {"rdma_device": "roceP2p1s0f0", "rdma_port": 1, "state": "Down"},
        "enP2p1s0f1np1": {"rdma_device": "roceP2p1s0f1", "rdma_port": 1, "state": "Up"},
        "enp1s0f0np0": {"rdma_device": "rocep1s0f0", "rdma_port": 1, "state": "Down"},
        "enp1s0f1np1": {"rdma_device": "rocep1s0f1", "rdma_port": 1, "state": "Up"},
    }


def test_ibdev2netdev_as_a_web_page_renders_it():
    got = fd.parse_ibdev2netdev((DISC / "leadtek_ibdev2netdev_all_up_as_rendered.txt").read_text())
    assert {n: v["rdma_device"] for n, v in got.items()} == {
        "enp1s0f0np0": "rocep1s0f0",
        "enp1s0f1np1": "rocep1s0f1",
        "enP2p1s0f0np0": "roceP2p1s0f0",
        "enP2p1s0f1np1": "roceP2p1s0f1",
    }
    assert {v["state"] for v in got.values()} == {"Up"}


def test_ibdev2netdev_ignores_other_lines():
    assert fd.parse_ibdev2netdev("ibdev2netdev: command not found\n\n") == {}


def test_lldp_json0_and_json_give_the_same_neighbour():
    j0 = fd.parse_lldp_neighbours((DISC / "lldpd_json0_neighbors.json").read_text())
    j = fd.parse_lldp_neighbours((DISC / "lldpd_json_neighbors.json").read_text())
    want = {
        "eth0": [
            {
                "via": "lldp",
                "chassis_id": "00:00:00:00:00:02",
                "chassis_id_type": "mac",
                "sysname": "ns-2.example.com",
                "port_id": "00:00:00:00:00:02",
                "port_id_type": "mac",
                "port_descr": "eth1",
                "bridge": False,
            }
        ]
    }
    assert j0 == want
    assert j == want


def test_lldp_json_with_two_neighbours_on_one_interface_is_a_list():
    # lldpcli -f json turns "interface" into a list when a name repeats (why json0 exists: lldpcli(8)).
    text = (
        '{"lldp": {"interface": [{"eth0": {"chassis": {"a": {"id": {"type": "mac", "value": "AA:00:00:00:00:01"}}},'
        ' "port": {"id": {"type": "ifname", "value": "p1"}}}}, {"eth0": {"chassis": {"b": {"id": {"type": "mac",'
        ' "value": "aa:00:00:00:00:02"}, "capability": {"type": "Bridge", "enabled": true}}}, "port": {"id":'
        ' {"type": "ifname", "value": "p2"}}}}]}}'
    )
    got = fd.parse_lldp_neighbours(text)["eth0"]
    assert [(n["sysname"], n["chassis_id"], n["port_id"]) for n in got] == [
        ("a", "aa:00:00:00:00:01", "p1"),
        ("b", "aa:00:00:00:00:02", "p2"),
    ]


def test_lldp_no_neighbour():
    assert fd.parse_lldp_neighbours('{"lldp": [{}]}') == {}
    assert fd.parse_lldp_neighbours('{"lldp": {}}') == {}


def test_ipv6_neighbours_keep_link_local_with_a_mac():
    got = fd.parse_ipv6_neighbours((DISC / "ip-j-6-neigh.json").read_text())
    assert got == [{"via": "nd", "mac": "3c:6d:66:cc:b3:b8", "address": "fe80::3e6d:66ff:fecc:b3b8"}]


def test_ip_link_and_networks_on_the_recorded_sim_node():
    text = (FIXTURES / "net" / "ip-j-addr-show.json").read_text()
    links = fd.parse_ip_link_json(text)
    assert links["enp1s0f1np1"]["mtu"] == 9000
    assert links["enp1s0f1np1"]["carrier"] is True
    assert links["enp1s0f1np1"]["admin_up"] is True
    assert links["docker0"]["carrier"] is False  # NO-CARRIER, UP
    assert links["docker0"]["admin_up"] is True
    nets = fd.parse_ipv4_networks(text)
    assert nets["enP7s7"] == ["192.168.213.11/24"]
    assert nets["docker0"] == ["172.17.0.1/16"]


@pytest.mark.parametrize(
    ("netdev", "pci", "ppn", "port", "twin_key", "domain"),
    [
        ("enp1s0f0np0", "0000:01:00.0", "p0", 0, "01:00.0", 0),
        ("enP2p1s0f0np0", "0002:01:00.0", "p0", 0, "01:00.0", 2),
        ("enp1s0f1np1", "0000:01:00.1", "p1", 1, "01:00.1", 0),
        ("enP2p1s0f1np1", "0002:01:00.1", "p1", 1, "01:00.1", 2),
        ("enP2p1s0f1np1", None, None, 1, "01:00.1", 2),  # the test bed: from the name only
        ("eth7", "0002:01:00.1", "p1", 1, "01:00.1", 2),  # renamed: sysfs decides
    ],
)
def test_function_identity(netdev, pci, ppn, port, twin_key, domain):  # noqa: PLR0917 - one per column
    got = fd.function_identity(netdev, pci, ppn)
    assert (got["port"], got["twin_key"], got["domain"]) == (port, twin_key, domain)


def test_function_identity_of_no_pcie_function():
    assert fd.function_identity("docker0") is None
    assert fd.function_identity("enP7s7") is None


def test_read_sysfs_netdev_of_a_spark(spark_sysfs):
    got = fd.read_sysfs_netdev("enP2p1s0f1np1", str(spark_sysfs))
    assert got == {
        "mac": "fc:4c:ea:f9:42:35",
        "mtu": 1500,
        "operstate": "up",
        "speed_mbps": 200000,
        "pci": "0002:01:00.1",
        "driver": "mlx5_core",
        "phys_port_name": "p1",
        "rdma_devices": ["roceP2p1s0f1"],
    }
    down = fd.read_sysfs_netdev("enp1s0f0np0", str(spark_sysfs))
    assert down["speed_mbps"] is None  # -1: unknown, not a speed
    mgmt = fd.read_sysfs_netdev("enP7s7", str(spark_sysfs))
    assert mgmt["pci"] is None and mgmt["driver"] is None


def test_fast_candidates_on_a_spark_and_in_the_test_bed(spark_sysfs):
    ibdev = fd.parse_ibdev2netdev((DISC / "nvidia-connect-two-sparks_ibdev2netdev_port1.txt").read_text())
    names = sorted(os.listdir(spark_sysfs))
    got = [n for n in names if fd.is_fast_candidate(n, fd.read_sysfs_netdev(n, str(spark_sysfs)), ibdev)]
    assert got == ["enP2p1s0f0np0", "enP2p1s0f1np1", "enp1s0f0np0", "enp1s0f1np1"]
    # The test bed: no ibdev2netdev, no driver, the Spark's names.
    assert fd.is_fast_candidate("enp1s0f1np1", {}, {})
    assert not fd.is_fast_candidate("enP7s7", {}, {})
    assert not fd.is_fast_candidate("eth0", {}, {})


def test_build_port_prefers_ibdev2netdev_then_sysfs_then_the_sim_name(spark_sysfs):
    sysfs = fd.read_sysfs_netdev("enp1s0f1np1", str(spark_sysfs))
    link = {"mac": "fc:4c:ea:f9:42:31", "mtu": 9000, "operstate": "up", "admin_up": True, "carrier": True}
    port = fd.build_port("enp1s0f1np1", sysfs, link, {}, neighbours=[], simulated=False)
    assert port["rdma_device"] == "rocep1s0f1"  # device/infiniband/
    assert (port["port"], port["domain"], port["pci"], port["mtu"]) == (1, 0, "0000:01:00.1", 9000)
    sim = fd.build_port("enP2p1s0f1np1", {}, link, {}, neighbours=[], simulated=True)
    assert sim["rdma_device"] == "roceP2p1s0f1"  # what sim/simctl.py writes in its inventories
    real_missing = fd.build_port("enP2p1s0f1np1", {}, link, {}, neighbours=[], simulated=False)
    assert real_missing["rdma_device"] is None


def test_a_started_daemon_is_stopped():
    proc = fd.start_daemon(["sleep", "30"])
    assert proc.poll() is None
    fd.stop_daemon(proc, timeout_s=5)
    assert proc.poll() is not None


def test_a_daemon_that_exits_leaves_its_message():
    proc = fd.start_daemon(["sh", "-c", "echo 'lldpd: unable to chroot' >&2; exit 1"])
    proc.wait(timeout=10)
    assert fd.daemon_log(proc) == "lldpd: unable to chroot"
    fd.stop_daemon(proc)
