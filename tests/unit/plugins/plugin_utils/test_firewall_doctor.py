"""doctor's firewall and listening-socket verdicts, on recorded iptables-save / ip6tables-save / ss output
(tests/fixtures/firewall/README.md): parsers in plugins/module_utils/firewall.py, verdicts in day2_checks.py."""

from __future__ import annotations

import copy
from pathlib import Path

from ansible_collections.sparkops.cluster.plugins.module_utils import firewall as fw
from ansible_collections.sparkops.cluster.plugins.plugin_utils import day2_checks as d2

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "firewall"
SAVE4 = (FIX / "iptables-save_1.8.9-nft_ray-api-mp.txt").read_text()
SAVE6 = (FIX / "ip6tables-save_1.8.9-nft_ray-api-mp.txt").read_text()
SS = (FIX / "ss-Hltnp_iproute2-6.1.0.txt").read_text()
CHAINS = ("SPARKOPS-API", "SPARKOPS-MP", "SPARKOPS-RAY")


def node_firewall(save4=SAVE4, save6=SAVE6):
    return {
        "expected": [{"chain": c, "family": f} for c in CHAINS for f in ("ipv4", "ipv6")],
        "ipv4": fw.parse_save(save4),
        "ipv6": fw.parse_save(save6),
    }


def test_the_recorded_listing_parses_into_chains_jumps_and_guarded_ports():
    v4, v6 = fw.parse_save(SAVE4), fw.parse_save(SAVE6)
    assert v4["chains"] == list(CHAINS) == v6["chains"]
    assert v4["hooks"]["SPARKOPS-MP"] == 2 and v6["hooks"]["SPARKOPS-MP"] == 1  # the -d jump is IPv4's alone
    assert all(v4["drops"].values()) and all(v6["drops"].values())
    assert v4["ports"]["SPARKOPS-RAY"] == ["6379", "8265", "10001", "6381:6385", "52365", "20000:20999"]
    assert v4["ports"]["ACCEPT"] == ["22"]  # `-m tcp --dport 22`, a rule that is not ours


def test_every_chain_in_place_passes_and_a_lost_one_is_critical_per_family():
    assert d2.check_firewall("spark-1", node_firewall())["verdict"] == d2.PASS
    # ip6tables -F INPUT (or a reboot without the boot restore for IPv6): the chains stay, the jumps go
    no_jumps6 = "\n".join(ln for ln in SAVE6.splitlines() if not ln.startswith("-A INPUT"))
    v = d2.check_firewall("spark-1", node_firewall(save6=no_jumps6))
    assert v["verdict"] == d2.CRITICAL and "SPARKOPS-RAY (IPv6): nothing jumps to it" in v["evidence"]
    assert "(IPv4)" not in v["evidence"] and "sparkops-firewall" in v["action"]
    # a rebooted node: nothing at all
    v = d2.check_firewall("spark-1", node_firewall(save4="*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"))
    assert v["verdict"] == d2.CRITICAL and "SPARKOPS-API (IPv4) is missing" in v["evidence"]
    # the DROP gone
    no_drop = "\n".join(ln for ln in SAVE4.splitlines() if not (ln.startswith("-A SPARKOPS-API") and "DROP" in ln))
    assert "SPARKOPS-API (IPv4) does not end in DROP" in d2.check_firewall("n", node_firewall(no_drop))["evidence"]
    unread = dict(node_firewall(), ipv6={"error": "ip6tables-save is not installed"})
    assert "could not be read (ip6tables-save is not installed)" in d2.check_firewall("n", unread)["evidence"]
    assert d2.check_firewall("n", {"expected": []})["verdict"] == d2.NA


def test_sockets_on_the_any_address_must_be_guarded_in_each_family_they_answer_or_expected():
    sockets = fw.parse_ss_listening(SS)
    assert {(s["address"], s["port"], s["process"]) for s in sockets if s["wildcard"]} == {
        ("0.0.0.0", 44217, "raylet"),
        ("0.0.0.0", 22, "sshd"),
        ("[::]", 22, "sshd"),
        ("*", 9100, "node_exporter"),
        ("*", 6381, "raylet"),
        ("*", 6379, "gcs_server"),
    }
    bound = {(s["address"], s["interface"], s["port"]) for s in sockets if not s["wildcard"]}
    assert ("0.0.0.0", "eth1", 29501) in bound and ("[::1]", None, 5432) in bound
    v = d2.check_listening("spark-1", sockets, node_firewall(), ["22"])
    assert v["verdict"] == d2.CRITICAL
    # a Ray metrics port (0.0.0.0:44217 here) and the node exporter: no chain in this recording guards them
    assert "0.0.0.0:44217 (raylet) unguarded for IPv4" in v["evidence"]
    assert "*:9100 (node_exporter) unguarded for IPv4/IPv6" in v["evidence"]
    assert "6379" not in v["evidence"] and ":22 " not in v["evidence"]  # guarded (Ray) / expected (sshd)
    # the same sockets once their ports are guarded in both families, or named as expected
    assert d2.check_listening("spark-1", sockets, node_firewall(), ["22", "9100", "44217"])["verdict"] == d2.PASS


def test_a_dual_stack_socket_with_only_its_ipv4_chain_is_critical_for_ipv6():
    """Ray's GCS on `*:6379` behind SPARKOPS-RAY for IPv4 only (the finding: GetAllNodeInfo answered over IPv6)."""
    sockets = fw.parse_ss_listening(SS)
    only4 = node_firewall(save6="*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n")
    v = d2.check_listening("spark-1", sockets, only4, ["22", "9100", "44217"])
    assert v["verdict"] == d2.CRITICAL and "*:6379 (gcs_server) unguarded for IPv6" in v["evidence"]
    assert "IPv4" not in v["evidence"].split("*:6379")[1].split(";")[0]


def test_process_names_from_the_node_stay_printable_and_short():
    line = 'LISTEN 0 128 0.0.0.0:1234 0.0.0.0:* users:(("ev\x1bil\x07",pid=1,fd=3))'
    (sock,) = fw.parse_ss_listening(line)
    assert sock["process"] == "evil" and sock["port"] == 1234 and sock["wildcard"]
    assert fw.parse_ss_listening("garbage\nLISTEN 0 128 not-an-address 0.0.0.0:*\n") == []


def test_the_verdicts_run_for_a_node_that_reports_them_and_not_for_older_results():
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.day2_checks import build_verdicts  # noqa: PLC0415

    settings = {
        "hardware": "simulated", "driver_branch": "580", "memory_floor_gib": 4, "disk_headroom_gib": 10,
        "weights_path": "/w", "cable_threshold_gbps": 190, "expected_nodes": 1, "expected_gpus": 1,
        "serve_host": "10.0.0.1", "mgmt_address": "192.168.1.1", "listen_allowed": ["22", "9100", "44217"],
    }  # fmt: skip
    node = {"kernel": "6.8", "firewall": node_firewall(), "listening": fw.parse_ss_listening(SS)}
    inputs = {"settings": settings, "nodes": {"spark-1": node}, "now_epoch": 0}
    got = {v["check"]: v["verdict"] for v in build_verdicts(copy.deepcopy(inputs)) if v["scope"] == "spark-1"}
    assert got["firewall"] == d2.PASS and got["listening sockets"] == d2.PASS
    del node["firewall"]
    got = {v["check"] for v in build_verdicts(inputs) if v["scope"] == "spark-1"}
    assert "firewall" not in got and "listening sockets" not in got
