"""rdma_facts on the sysfs trees in tests/fixtures/sysfs/ (right, moved, v1, empty; formats in its README.md)."""

from __future__ import annotations

from ansible_collections.sparkops.cluster.plugins.modules import rdma_facts as mod
from conftest import FIXTURES
from module_runner import run_module

SYSFS = FIXTURES / "sysfs"
EXPECT = {"enp1s0f1np1": "192.168.100.11", "enP2p1s0f1np1": "192.168.101.11"}


def root(case: str) -> str:
    return str(SYSFS / case / "sys")


def test_right_both_twins_ok():
    r = run_module(mod, {"sysfs_root": root("right"), "expect": EXPECT, "fail_on_gid_mismatch": True}, check_mode=True)
    assert r.get("failed") is not True, r
    assert r["changed"] is False
    assert (r["rdma_present"], r["reason"], r["gid_ok"]) == (True, None, True)
    assert r["netdev_to_device"]["enP2p1s0f1np1"] == "roceP2p1s0f1"
    check = r["gid_checks"]["enp1s0f1np1"]
    assert (check["device"], check["status"], check["at_index"]) == ("rocep1s0f1", "ok", 3)
    assert r["devices"]["rocep1s0f1"]["ports"]["1"]["state"] == "4: ACTIVE"


def test_no_expect_reports_devices_only():
    r = run_module(mod, {"sysfs_root": root("right")})
    assert r["gid_checks"] == {} and r["gid_ok"] is True
    assert sorted(r["devices"]) == ["roceP2p1s0f1", "rocep1s0f0", "rocep1s0f1"]


def test_moved_reported_then_failed_on_request():
    r = run_module(mod, {"sysfs_root": root("moved"), "expect": EXPECT})
    assert r.get("failed") is not True, r
    assert r["gid_ok"] is False
    moved = r["gid_checks"]["enp1s0f1np1"]
    assert (moved["status"], moved["at_index"]) == ("moved", 5)
    assert r["gid_checks"]["enP2p1s0f1np1"]["ok"] is True
    f = run_module(mod, {"sysfs_root": root("moved"), "expect": EXPECT, "fail_on_gid_mismatch": True})
    assert f["failed"] is True
    assert f["msg"].startswith(
        "RoCE GID check failed: enp1s0f1np1: rocep1s0f1: 192.168.100.11 is the RoCE v2 GID at index 5"
    )
    assert "re-add the address or restart the interface" in f["msg"]
    assert f["gid_checks"]["enp1s0f1np1"]["status"] == "moved"


def test_v1_entry():
    r = run_module(mod, {"sysfs_root": root("v1"), "expect": EXPECT})
    assert r["gid_checks"]["enp1s0f1np1"]["status"] == "roce_v1"
    assert r["gid_ok"] is False


def test_empty_is_not_a_failure_unless_checks_are_demanded():
    r = run_module(mod, {"sysfs_root": root("empty")})
    assert r.get("failed") is not True, r
    assert r["rdma_present"] is False and "is empty" in r["reason"]
    r = run_module(mod, {"sysfs_root": root("empty"), "expect": EXPECT})
    assert r.get("failed") is not True
    assert r["gid_checks"]["enp1s0f1np1"]["status"] == "no_device"
    f = run_module(mod, {"sysfs_root": root("empty"), "expect": EXPECT, "fail_on_gid_mismatch": True})
    assert f["failed"] is True and "no RDMA device has netdev enp1s0f1np1" in f["msg"]


def test_absent_class_infiniband(tmp_path):
    r = run_module(mod, {"sysfs_root": str(tmp_path)})
    assert r.get("failed") is not True
    assert r["rdma_present"] is False and "does not exist" in r["reason"]


def test_unknown_netdev_and_cidr_address():
    r = run_module(
        mod, {"sysfs_root": root("right"), "expect": {"enp9s9": "10.0.0.1", "enp1s0f1np1": "192.168.100.11/24"}}
    )
    assert r["gid_checks"]["enp9s9"]["status"] == "no_device"
    assert r["gid_checks"]["enp1s0f1np1"]["ok"] is True
    assert r["gid_checks"]["enp1s0f1np1"]["expected_ipv4"] == "192.168.100.11"


def test_argument_errors():
    r = run_module(mod, {"sysfs_root": root("right"), "expect": {"enp1s0f1np1": "fe80::1"}})
    assert r["failed"] is True and "must be an IPv4 address" in r["msg"]
    r = run_module(mod, {"sysfs_root": root("right"), "gid_index": 300})
    assert r["failed"] is True and "gid_index must be between 0 and 255" in r["msg"]
    r = run_module(mod, {"sysfs_root": root("right"), "fail_on_gid_mismatch": "maybe"})
    assert r["failed"] is True
