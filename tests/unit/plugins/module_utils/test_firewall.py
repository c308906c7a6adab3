"""The API and monitoring chain's rules, rendered from data (plugins/module_utils/firewall.py)."""

from __future__ import annotations

import shlex

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import firewall as fw
from ansible_collections.sparkops.cluster.plugins.modules import iptables_chain
from module_runner import run_module


def test_rules_accept_loopback_the_fast_links_and_the_client_networks_then_drop():
    r = fw.chain_rules(
        "SPARKOPS-API", ["8000"], ["enp1s0f0np0", "enP2p1s0f1np1"], ["192.168.10.0/24", "10.9.9.9"], "OpenAI API"
    )
    chain = [shlex.join(rule) for rule in r["chain"]]
    assert chain == [
        "-i lo -m comment --comment 'sparkops: OpenAI API from lo' -j RETURN",
        "-i enp1s0f0np0 -m comment --comment 'sparkops: OpenAI API from enp1s0f0np0' -j RETURN",
        "-i enP2p1s0f1np1 -m comment --comment 'sparkops: OpenAI API from enP2p1s0f1np1' -j RETURN",
        "-s 192.168.10.0/24 -m comment --comment 'sparkops: OpenAI API from client network 192.168.10.0/24' -j RETURN",
        "-s 10.9.9.9/32 -m comment --comment 'sparkops: OpenAI API from client network 10.9.9.9/32' -j RETURN",
        "-m comment --comment 'sparkops: OpenAI API: fast links and client networks only' -j DROP",
    ]
    assert shlex.join(r["jump"]) == (
        "-p tcp -m multiport --dports 8000 -m comment --comment 'sparkops: OpenAI API ports' -j SPARKOPS-API"
    )


def test_no_client_networks_by_default_means_fast_links_only_and_duplicates_go():
    r = fw.chain_rules("SPARKOPS-MONITORING", [9100, "9090"], ["eth1", "eth1", "lo"], [], "monitoring")
    assert [rule[:2] for rule in r["chain"]] == [["-i", "lo"], ["-i", "eth1"], ["-m", "comment"]]
    assert r["chain"][-1][-2:] == ["-j", "DROP"]
    assert r["jump"][5] == "9100,9090"


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("interfaces", ["enp1s0f1np1 -j ACCEPT; touch /tmp/x #"], "not a valid Linux interface name"),
        ("interfaces", ["a" * 16], "not a valid Linux interface name"),
        ("interfaces", ["eth0\nx"], "not a valid Linux interface name"),
        ("interfaces", ["eth:0"], "not a valid Linux interface name"),
        ("sources", ["192.168.1.0/33"], "not an IPv4 network"),
        ("sources", ["lan"], "not an IPv4 network"),
        ("sources", ["fd00::/64"], "is IPv6"),
        ("sources", ["0.0.0.0/0"], "every address"),
        ("ports", ["80; id"], "not a TCP port"),
        ("ports", ["0"], "not a TCP port"),
        ("ports", ["9000:8000"], "not a TCP port"),
        ("ports", [], "ports is empty"),
        ("ports", [str(p) for p in range(8000, 8016)], "at most 15"),
    ],
)
def test_bad_values_are_refused_with_what_is_wrong(field, value, says):
    args = {"chain": "SPARKOPS-API", "ports": ["8000"], "interfaces": ["eth1"], "sources": [], "what": "API"}
    args[field] = value
    with pytest.raises(ValueError, match=says):
        fw.chain_rules(**args)


def test_chain_name_and_comment_are_checked():
    with pytest.raises(ValueError, match="chain"):
        fw.chain_rules("INPUT -j ACCEPT", ["8000"], [], [], "API")
    with pytest.raises(ValueError, match="comment"):
        fw.chain_rules("SPARKOPS-API", ["8000"], [], [], 'API" -j ACCEPT')


def test_restore_input_replaces_only_this_chain_in_one_commit():
    r = fw.chain_rules("SPARKOPS-API", ["8000"], ["eth1"], ["10.1.0.0/16"], "OpenAI API")
    text = fw.restore_input("SPARKOPS-API", r["chain"])
    lines = text.splitlines()
    assert lines[0] == "*filter" and lines[1] == ":SPARKOPS-API - [0:0]" and lines[-1] == "COMMIT"
    assert lines[2] == '-A SPARKOPS-API -i lo -m comment --comment "sparkops: OpenAI API from lo" -j RETURN'
    assert lines[-2].endswith("-j DROP") and len(lines) == 3 + len(r["chain"])
    assert not any(line.startswith((":INPUT", "-A INPUT", "-F", "-X")) for line in lines)


def test_in_place_needs_the_same_count_every_rule_and_drop_last():
    r = fw.chain_rules("SPARKOPS-API", ["8000"], ["eth1"], [], "API")["chain"]
    listing = "-N SPARKOPS-API\n" + "".join(f"-A SPARKOPS-API {' '.join(x)}\n" for x in r)
    assert fw.in_place(listing, r, [True] * len(r))
    assert not fw.in_place(listing, r, [True, False, True])  # a rule differs
    extra = listing + "-A SPARKOPS-API -s 0.0.0.0/0 -j RETURN\n"
    assert not fw.in_place(extra, r, [True] * len(r))  # one too many (a stale client network)
    swapped = "-N SPARKOPS-API\n" + "".join(f"-A SPARKOPS-API {' '.join(x)}\n" for x in [r[2], r[0], r[1]])
    assert not fw.in_place(swapped, r, [True] * len(r))  # DROP not last
    assert not fw.in_place("-N SPARKOPS-API\n", r, [])


def test_the_module_refuses_a_bad_interface_before_running_anything(monkeypatch):
    ran = []
    monkeypatch.setattr(iptables_chain.AnsibleModule, "run_command", lambda self, *a, **k: ran.append(a) or (0, "", ""))
    out = run_module(
        iptables_chain,
        {"chain": "SPARKOPS-API", "ports": ["8000"], "interfaces": ["eth1; reboot"], "comment": "API"},
    )
    assert out["failed"] and "not a valid Linux interface name" in out["msg"] and "nothing changed" in out["msg"]
    assert ran == []


REAL_IPTABLES = r"""
import subprocess, sys
sys.path[:0] = sys.argv[1:3]
from ansible_collections.sparkops.cluster.plugins.modules import iptables_chain
from module_runner import run_module

def rules():
    return subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True, check=True).stdout

args = {"chain": "SPARKOPS-API", "ports": ["8000"], "interfaces": ["eth1"], "sources": ["192.168.10.0/24"],
        "comment": "OpenAI API"}
r = run_module(iptables_chain, args, check_mode=True)
assert r["changed"] and "SPARKOPS" not in rules(), r
r = run_module(iptables_chain, args)
assert r["changed"] and not r.get("failed"), r
assert run_module(iptables_chain, args)["changed"] is False
got = [l for l in rules().splitlines() if "SPARKOPS" in l]
assert got[1].startswith("-A INPUT -p tcp -m multiport --dports 8000 "), got
assert [l.split(" -m comment")[0] for l in got[2:]] == [
    "-A SPARKOPS-API -i lo", "-A SPARKOPS-API -i eth1", "-A SPARKOPS-API -s 192.168.10.0/24", "-A SPARKOPS-API"], got
assert got[-1].endswith("-j DROP"), got
# a lost DROP (someone's iptables -D) comes back; a network taken off the list goes
subprocess.run(["iptables", "-w", "-D", "SPARKOPS-API", "-m", "comment", "--comment",
                "sparkops: OpenAI API: fast links and client networks only", "-j", "DROP"], check=True)
assert run_module(iptables_chain, dict(args, sources=[]))["changed"]
got = [l for l in rules().splitlines() if l.startswith("-A SPARKOPS-API")]
assert len(got) == 3 and got[-1].endswith("-j DROP") and "192.168" not in "".join(got), got
assert run_module(iptables_chain, dict(args, sources=[]))["changed"] is False
print("OK")
"""


def test_the_module_against_the_real_iptables_in_a_private_network_namespace():
    """Runs the module, not in check mode, inside `unshare -n` (a new network namespace: the machine's own
    firewall is never touched). Skipped where that is not possible (not root, no iptables)."""
    import os  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from conftest import COLLECTIONS, ROOT  # noqa: PLC0415

    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("iptables"):
        pytest.skip("needs root, unshare and iptables")
    if subprocess.run(["unshare", "-n", "iptables", "-w", "-S"], capture_output=True, check=False).returncode:
        pytest.skip("iptables does not work in a new network namespace here")
    res = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", REAL_IPTABLES, str(COLLECTIONS), str(ROOT / "tests" / "unit")],
        # the child imports the collection as this process does (ansible-test units puts it elsewhere)
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), res.stdout + res.stderr
