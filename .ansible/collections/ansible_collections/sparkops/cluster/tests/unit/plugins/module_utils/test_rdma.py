"""rdma sysfs reader and RoCE GID check on the trees in tests/fixtures/sysfs/ (formats: its README.md)."""

from __future__ import annotations

from ansible_collections.sparkops.cluster.plugins.module_utils import rdma
from conftest import FIXTURES

SYSFS = FIXTURES / "sysfs"
A, B = "192.168.100.11", "192.168.101.11"


def tree(case: str) -> dict:
    return rdma.read_rdma_sysfs(str(SYSFS / case / "sys"))


def test_ipv4_from_gid():
    assert rdma.ipv4_from_gid("0000:0000:0000:0000:0000:ffff:0a00:0001") == "10.0.0.1"
    assert rdma.ipv4_from_gid("0000:0000:0000:0000:0000:ffff:0a64:b801") == "10.100.184.1"
    assert rdma.ipv4_from_gid("::ffff:192.168.100.11") == "192.168.100.11"
    assert rdma.ipv4_from_gid("fe80:0000:0000:0000:4ebb:47ff:fe82:0e6a") is None
    assert rdma.ipv4_from_gid("not a gid") is None and rdma.ipv4_from_gid(None) is None


def test_right_tree_devices_ports_and_gids():
    state = tree("right")
    assert state["present"] is True and state["reason"] is None
    assert sorted(state["devices"]) == ["roceP2p1s0f1", "rocep1s0f0", "rocep1s0f1"]
    dev = state["devices"]["rocep1s0f1"]
    assert dev["netdevs"] == ["enp1s0f1np1"]
    port = dev["ports"]["1"]
    assert (port["state"], port["active"], port["phys_state"]) == ("4: ACTIVE", True, "5: LinkUp")
    assert (port["link_layer"], port["rate"]) == ("Ethernet", "200 Gb/sec (2X NDR)")
    assert [g["index"] for g in port["gids"]] == [0, 1, 2, 3]  # zero entries 4-7 left out
    assert port["gid_table_size"] == 8
    assert port["gids"][3] == {
        "index": 3,
        "gid": "0000:0000:0000:0000:0000:ffff:c0a8:640b",
        "type": "RoCE v2",
        "ndev": "enp1s0f1np1",
        "ipv4": A,
    }
    assert port["gids"][0]["type"] == "IB/RoCE v1" and port["gids"][0]["ipv4"] is None
    down = state["devices"]["rocep1s0f0"]["ports"]["1"]
    assert down["active"] is False and down["state"] == "1: DOWN"
    assert rdma.device_for_netdev(state["devices"], "enP2p1s0f1np1") == "roceP2p1s0f1"
    assert rdma.device_for_netdev(state["devices"], "eth9") is None


def test_check_ok_on_both_twins():
    devs = tree("right")["devices"]
    for name, addr in (("rocep1s0f1", A), ("roceP2p1s0f1", B)):
        res = rdma.check_roce_gid(devs[name], addr)
        assert res["ok"] is True and res["status"] == "ok" and res["at_index"] == 3
        assert res["found"]["ipv4"] == addr


def test_check_other_address_when_twins_are_swapped():
    res = rdma.check_roce_gid(tree("right")["devices"]["rocep1s0f1"], B)
    assert res["ok"] is False and res["status"] == "other_address"
    assert f"holds {A}, not {B}" in res["reason"]


def test_check_moved_names_the_index_and_the_fix():
    res = rdma.check_roce_gid(tree("moved")["devices"]["rocep1s0f1"], A)
    assert (res["ok"], res["status"], res["at_index"]) == (False, "moved", 5)
    assert res["found"] is None
    assert "index 5, not 3" in res["reason"]
    assert "it moves when a neighbour reboots; re-add the address or restart the interface" in res["reason"]
    assert rdma.check_roce_gid(tree("moved")["devices"]["rocep1s0f1"], A, gid_index=5)["ok"] is True


def test_check_v1():
    res = rdma.check_roce_gid(tree("v1")["devices"]["rocep1s0f1"], A)
    assert (res["ok"], res["status"]) == (False, "roce_v1")
    assert "as IB/RoCE v1, not RoCE v2" in res["reason"]


def test_check_missing_and_no_port():
    devs = tree("right")["devices"]
    res = rdma.check_roce_gid(devs["rocep1s0f0"], "192.168.102.11")
    assert (res["ok"], res["status"]) == (False, "missing")
    assert "GID 3 is empty" in res["reason"]
    res = rdma.check_roce_gid(devs["rocep1s0f1"], A, port="2")
    assert res["status"] == "no_port"


def test_empty_and_absent():
    state = tree("empty")
    assert state == {"present": False, "reason": state["reason"], "devices": {}}
    assert state["reason"].endswith("is empty: no RDMA devices")
    absent = rdma.read_rdma_sysfs(str(SYSFS / "does-not-exist"))
    assert absent["present"] is False and "does not exist" in absent["reason"]
