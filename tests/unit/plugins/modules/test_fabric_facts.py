"""fabric_facts: links from this machine's real `ip -j addr show`, GIDs from the recorded sysfs trees
(tests/fixtures/sysfs/, formats in its README.md), files, and its refusals. The ping lines are judged on
recorded real outputs in tests/unit/plugins/module_utils/test_node_read.py."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.modules import fabric_facts as mod
from conftest import FIXTURES
from module_runner import run_module

SYSFS = FIXTURES / "sysfs"


def test_links_gids_and_files_in_one_run(tmp_path):
    env = tmp_path / "fabric.env"
    env.write_text("NCCL_IB_GID_INDEX=3\n")
    links = [
        {"netdev": "lo", "address": "127.0.0.1/8", "rdma_device": "ignored"},
        {"netdev": "enp1s0f1np1", "address": "192.168.100.11/24"},
        {"netdev": "enP2p1s0f1np1", "address": "192.168.101.11/24"},
    ]
    r = run_module(
        mod,
        {"links": links, "sysfs_root": str(SYSFS / "right" / "sys"), "files": [str(env), str(tmp_path)]},
        check_mode=True,
    )
    assert r.get("failed") is not True, r
    assert r["changed"] is False
    assert r["links"]["lo"]["present"] and r["links"]["lo"]["has_address"] is True
    assert r["links"]["lo"]["mtu"] == int(Path("/sys/class/net/lo/mtu").read_text())
    assert r["links"]["enp1s0f1np1"] == {"present": False, "mtu": None, "ipv4": [], "has_address": False}
    assert r["rdma_present"] is True and set(r["gid_checks"]) == {"lo", "enp1s0f1np1", "enP2p1s0f1np1"}
    assert r["gid_checks"]["enp1s0f1np1"]["ok"] and r["gid_checks"]["enP2p1s0f1np1"]["ok"]
    assert r["gid_checks"]["lo"]["status"] == "no_device" and r["gid_ok"] is False
    assert r["files"][str(env)]["sha1"] == hashlib.sha1(b"NCCL_IB_GID_INDEX=3\n").hexdigest()  # noqa: S324
    assert r["files"][str(tmp_path)]["kind"] == "directory" and r["files"][str(tmp_path)]["sha1"] is None
    assert r["pings"] == [] and r["pings_ok"] is True and r["routes"] == []


def test_gid_moved_is_reported_not_failed():
    links = [{"netdev": "enp1s0f1np1", "address": "192.168.100.11"}]
    r = run_module(mod, {"links": links, "sysfs_root": str(SYSFS / "moved" / "sys")})
    assert r.get("failed") is not True, r
    assert r["gid_checks"]["enp1s0f1np1"]["status"] == "moved" and r["gid_ok"] is False


@pytest.mark.skipif(shutil.which("ping") is not None, reason="this machine has ping")
def test_a_ping_that_cannot_start_is_a_failed_lane_with_its_reason():
    pings = [{"netdev": "lo", "ip": "127.0.0.1", "peer": "self"}]
    r = run_module(mod, {"pings": pings, "ping_size": 100, "ping_count": 1, "ping_timeout_s": 1})
    assert r.get("failed") is not True, r
    assert r["pings_ok"] is False
    lane = r["pings"][0]
    assert (lane["peer"], lane["rc"], lane["ok"]) == ("self", None, False) and lane["detail"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"links": [{"address": "10.0.0.1"}]}, "links[0] has no netdev"),
        ({"pings": [{"netdev": "lo"}]}, "pings[0] has no ip"),
        ({"links": [{"netdev": "lo", "address": "10.0.0.300/24"}]}, "is not an IPv4 address"),
        ({"pings": [{"netdev": "lo", "ip": "host"}]}, "is not an IPv4 address"),
        ({"gid_index": 300}, "gid_index must be between 0 and 255"),
        ({"ping_count": 0}, "ping_count and ping_timeout_s must be 1 or more"),
    ],
)
def test_bad_arguments_are_refused_with_what_to_fix(args, message):
    r = run_module(mod, args)
    assert r["failed"] is True and message in r["msg"]


def test_the_role_verdicts_come_ready_made(tmp_path):
    """What roce_network reads instead of judging in Jinja: files, forwarding, links, problems."""
    env = tmp_path / "fabric.env"
    env.write_text("A=1\n")
    env.chmod(0o644)
    sysctl_file = tmp_path / "60-sparkops-fabric.conf"
    want_sha1 = hashlib.sha1(b"A=1\n").hexdigest()  # noqa: S324
    args = {
        "node": "spark-1",
        "links": [{"netdev": "lo", "address": "127.0.0.1/8"}, {"netdev": "sparkops-none0", "address": "10.0.0.1/24"}],
        "mtu": 9000,
        "sysfs_root": str(SYSFS / "right" / "sys"),
        "forwarding_wanted": {"net.ipv4.ip_forward": 1},
        "forwarding_file": str(sysctl_file),
        "files_wanted": [
            {"path": str(tmp_path), "kind": "directory", "mode": f"{tmp_path.stat().st_mode & 0o7777:04o}"},
            {"path": str(env), "mode": "0644", "sha1": want_sha1},
            {"path": str(tmp_path / "netplan.yaml"), "mode": "0600", "sha1": want_sha1},
        ],
        "rdma_required": True,
    }
    r = run_module(mod, args, check_mode=True)
    assert r.get("failed") is not True, r
    assert r["files_stale"] == [str(tmp_path / "netplan.yaml")]
    assert r["forwarding_stale"] is True  # no file
    assert str(sysctl_file) in r["files"] and "net.ipv4.ip_forward" in r["sysctls"]
    # lo's MTU (65536) is jumbo; the missing netdev is not
    assert [p.split(";")[0] for p in r["link_problems"]] == ["spark-1: sparkops-none0 has no IPv4 address and MTU None"]
    assert r["problems"][0] == r["link_problems"][0] and r["jumbo_problem"] == ""
    env.write_text("A=2\n")
    assert run_module(mod, args)["files_stale"] == [str(env), str(tmp_path / "netplan.yaml")]
    assert run_module(mod, dict(args, mtu=0))["link_problems"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"forwarding_wanted": {"net.ipv4.ip_forward": 1}}, "forwarding_wanted needs forwarding_file"),
        ({"files_wanted": [{"path": "/x", "mode": "rw"}]}, "is not an octal mode"),
        ({"files_wanted": [{"path": "/x", "mode": "0644", "sha1": "abc"}]}, "is not 40 hex digits"),
        ({"routes_wanted": [{"to": "10.0.5.0/24", "dev": "a"}]}, "routes_wanted[0] has no via"),
    ],
)
def test_bad_verdict_arguments_are_refused(args, message):
    r = run_module(mod, args)
    assert r["failed"] is True and message in r["msg"]
