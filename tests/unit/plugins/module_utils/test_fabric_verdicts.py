"""fabric_verdicts: the roce_network role's verdicts (links, ring forwarding, routes, jumbo lanes), as the
role's Jinja gave them before they moved into fabric_facts (same messages, same decisions)."""

from __future__ import annotations

import hashlib

from ansible_collections.sparkops.cluster.plugins.module_utils import fabric_verdicts as fv

LINKS = [
    {"netdev": "a", "address": "10.0.0.1/24", "ip": "10.0.0.1"},
    {"netdev": "b", "address": "10.0.1.1/24", "ip": "10.0.1.1"},
    {"netdev": "c", "address": "10.0.2.1/24", "ip": "10.0.2.1"},
]
WANTED = {"net.ipv4.ip_forward": 1, "net.ipv4.conf.all.rp_filter": 2, "net.ipv4.conf.eth0.forwarding": 0}
LIVE = {"net.ipv4.ip_forward": "1", "net.ipv4.conf.all.rp_filter": "2", "net.ipv4.conf.eth0.forwarding": "0"}


def test_a_link_without_its_address_or_jumbo_mtu_is_named_with_what_the_inventory_expects():
    read = {
        "a": {"ipv4": ["10.0.0.1"], "mtu": 9000},
        "b": {"ipv4": [], "mtu": 1500},
        "c": {"ipv4": ["10.0.2.1"], "mtu": None},
    }
    assert fv.link_problems("h1", LINKS, read, 9000) == [
        "h1: b has no IPv4 address and MTU 1500; the inventory expects 10.0.1.1/24 and MTU 9000.",
        "h1: c has 10.0.2.1 and MTU None; the inventory expects 10.0.2.1/24 and MTU 9000.",
    ]
    ok = {n: {"ipv4": [link["ip"], "10.9.9.9"], "mtu": 9216} for n, link in zip("abc", LINKS, strict=True)}
    assert fv.link_problems("h1", LINKS, ok, 9000) == []
    # a netdev the read did not find at all
    assert fv.link_problems("h1", LINKS[:1], {}, 9000)[0].startswith("h1: a has no IPv4 address and MTU None;")


def test_a_ring_node_must_forward_and_accept_replies_the_other_way_round():
    assert fv.ring_forwarding_problem("h1", {"net.ipv4.ip_forward": "1", "net.ipv4.conf.all.rp_filter": "2"}) is None
    assert fv.ring_forwarding_problem("h1", {"net.ipv4.ip_forward": "1", "net.ipv4.conf.all.rp_filter": "0"}) is None
    strict = fv.ring_forwarding_problem("h1", {"net.ipv4.ip_forward": "1", "net.ipv4.conf.all.rp_filter": "1"})
    assert strict.startswith("h1: net.ipv4.ip_forward=1, net.ipv4.conf.all.rp_filter=1. A ring node forwards")
    assert "docker run --sysctl" in fv.ring_forwarding_problem("h1", {"net.ipv4.ip_forward": "0"})


def test_forwarding_is_stale_when_a_setting_is_not_live_or_the_file_differs():
    sha1 = hashlib.sha1(
        b"net.ipv4.ip_forward=1\nnet.ipv4.conf.all.rp_filter=2\nnet.ipv4.conf.eth0.forwarding=0\n"
    ).hexdigest()  # noqa: S324
    assert fv.forwarding_stale(WANTED, LIVE, sha1) is False
    assert fv.forwarding_stale(WANTED, LIVE, None) is True  # no file
    assert fv.forwarding_stale(WANTED, dict(LIVE, **{"net.ipv4.ip_forward": "0"}), sha1) is True
    # the file's lines in another order are another file (ansible.posix.sysctl writes them in the loop's order)
    assert fv.forwarding_stale(dict(reversed(WANTED.items())), LIVE, sha1) is True
    assert fv.forwarding_stale({}, {}, None) is False


def test_routes_missing_match_destination_gateway_and_device():
    wanted = [
        {"to": "10.0.5.0/24", "via": "10.0.0.2", "dev": "a", "through": "x"},
        {"to": "10.0.6.0/24", "via": "10.0.0.2", "dev": "a", "through": "y"},
        {"to": "10.0.5.0/24", "via": "10.0.0.3", "dev": "a", "through": "z"},
        {"to": "10.0.7.0/24", "via": "10.0.0.2", "dev": "b", "through": "w"},
    ]
    routes = [
        {"dst": "10.0.5.0/24", "gateway": "10.0.0.2", "dev": "a"},
        {"dst": "10.0.6.0/24", "dev": "a"},
        {"dst": "10.0.7.0/24", "gateway": "10.0.0.2", "dev": "a"},
    ]
    assert [r["through"] for r in fv.routes_missing(wanted, routes)] == ["y", "z", "w"]
    assert fv.routes_missing(wanted[:1], routes) == []


def test_jumbo_problem_names_each_failed_lane_and_why():
    pings = [
        {"netdev": "a", "ip": "10.0.0.2", "peer": "h2", "ok": True, "rc": 0, "detail": ""},
        {"netdev": "b", "ip": "10.0.1.2", "ok": False, "rc": None, "detail": ""},
        {
            "netdev": "a",
            "ip": "10.0.5.2",
            "peer": "h3",
            "routed": True,
            "ok": False,
            "rc": 1,
            "detail": "100% packet loss",
        },
    ]
    assert fv.jumbo_problem("h1", 9000, pings) == (
        "Jumbo frames (9000 bytes, don't fragment) fail on: h1 b -> ? 10.0.1.2 (rc None), h1 a -> h3 10.0.5.2"
        " (routed) (100% packet loss). Check the MTU on both ends (ip link), with a switch on the switch ports,"
        " and on a ring the routes (ip route)."
    )
    assert fv.jumbo_problem("h1", 9000, pings[:1]) == ""
    assert fv.jumbo_problem("h1", 9000, []) == ""


def test_problems_gather_links_rdma_gids_and_jumbo_in_order():
    read = {
        "link_problems": ["h1: b has no IPv4 address"],
        "rdma_present": False,
        "reason": "no /sys/class/infiniband",
        "gid_ok": True,
        "gid_checks": {},
        "jumbo_problem": "Jumbo frames fail",
    }
    out = fv.problems("h1", read, rdma_required=True)
    assert out[0] == "h1: b has no IPv4 address" and out[-1] == "Jumbo frames fail"
    assert out[1].startswith("h1: no RDMA device found (no /sys/class/infiniband).")
    assert fv.problems("h1", read, rdma_required=False) == [out[0], out[-1]]
    gids = {
        "a": {"ok": True, "reason": None},
        "b": {"ok": False, "reason": "b moved"},
        "c": {"ok": False, "reason": "c gone"},
    }
    read = dict(read, rdma_present=True, gid_ok=False, gid_checks=gids, link_problems=[], jumbo_problem="")
    assert fv.problems("h1", read, rdma_required=True) == ["h1: b moved | c gone"]
    assert fv.problems("h1", dict(read, gid_ok=True), rdma_required=True) == []
