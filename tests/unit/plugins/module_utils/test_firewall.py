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
        ("sources", ["192.168.1.0/33"], "not an IPv4 or IPv6 network"),
        ("sources", ["lan"], "not an IPv4 or IPv6 network"),
        ("sources", ["::/0"], "every address"),
        ("destinations", ["192.168.100.0/24"], "must be one address"),
        ("destinations", ["x; reboot"], "not an IPv4 or IPv6 network"),
        ("interfaces6", ["eth0 -j ACCEPT"], "not a valid Linux interface name"),
        ("family", 5, "must be ipv4 or ipv6"),
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


def test_ipv6_chain_passes_loopback_and_icmpv6_and_drops_the_fast_links_without_an_ipv6_address():
    """The plan gives the fast links no IPv6 address: IPv6 to the guarded ports passes loopback only (and
    ICMPv6, so neighbour discovery and path MTU work); IPv4 client networks stay out of the IPv6 chain."""
    r = fw.chain_rules("SPARKOPS-RAY", ["6379", "6381:6382"], ["eth1"], ["10.1.0.0/16", "fd00:5::/64"], "Ray", family=6)
    assert [shlex.join(rule) for rule in r["chain"]] == [
        "-i lo -m comment --comment 'sparkops: Ray from lo' -j RETURN",
        "-p ipv6-icmp -m comment --comment 'sparkops: ICMPv6 (neighbour discovery, path MTU)' -j RETURN",
        "-s fd00:5::/64 -m comment --comment 'sparkops: Ray from client network fd00:5::/64' -j RETURN",
        "-m comment --comment 'sparkops: Ray: fast links and client networks only' -j DROP",
    ]
    assert r["jumps"] == [r["jump"]] and r["jump"][5] == "6379,6381:6382"
    v4 = fw.chain_rules("SPARKOPS-RAY", ["6379"], ["eth1"], ["10.1.0.0/16", "fd00:5::/64"], "Ray", family=4)
    assert "fd00:5::/64" not in str(v4) and v4["chain"][2][:2] == ["-s", "10.1.0.0/16"]
    with_link = fw.chain_rules("SPARKOPS-RAY", ["6379"], ["eth1"], [], "Ray", family=6, interfaces6=["eth1"])
    assert with_link["chain"][2][:2] == ["-i", "eth1"]


def test_destinations_send_every_protocol_and_port_for_that_address_to_the_chain():
    """vLLM's mp ranks listen on ephemeral ports (ZMQ XPUB, gloo, NCCL's bootstrap) at the fast-link address:
    INPUT sends everything addressed there to the chain, each family its own addresses."""
    kw = {"destinations": ["192.168.100.10", "fd00:1::10"]}
    v4 = fw.chain_rules("SPARKOPS-MP", ["29501"], ["enp1s0f1np1"], [], "vLLM ranks", family=4, **kw)
    assert [shlex.join(j) for j in v4["jumps"]] == [
        "-p tcp -m multiport --dports 29501 -m comment --comment 'sparkops: vLLM ranks ports' -j SPARKOPS-MP",
        "-d 192.168.100.10/32 -m comment --comment 'sparkops: vLLM ranks: to 192.168.100.10/32' -j SPARKOPS-MP",
    ]
    v6 = fw.chain_rules("SPARKOPS-MP", [], ["enp1s0f1np1"], [], "vLLM ranks", family=6, **kw)
    assert [j[:2] for j in v6["jumps"]] == [["-d", "fd00:1::10/128"]] and v6["jump"] is None
    assert v4["chain"][1][:2] == ["-i", "enp1s0f1np1"] and v4["chain"][-1][-1] == "DROP"


def test_rules_file_is_iptables_save_format_with_the_chain_and_inputs_jumps_first():
    r = fw.chain_rules("SPARKOPS-MP", ["29501"], ["eth1"], [], "ranks", destinations=["10.0.0.1"])
    lines = fw.rules_file("SPARKOPS-MP", 4, r["chain"], r["jumps"]).splitlines()
    assert lines[0].startswith("# SPARKOPS-MP (IPv4)") and lines[1:3] == ["*filter", ":SPARKOPS-MP - [0:0]"]
    assert lines[3] == '-A SPARKOPS-MP -i lo -m comment --comment "sparkops: ranks from lo" -j RETURN'
    # -I INPUT 1 in reverse: the ports' jump ends up first, as the module puts it
    assert lines[-3].startswith("-I INPUT 1 -d 10.0.0.1/32 ") and lines[-2].startswith("-I INPUT 1 -p tcp ")
    assert lines[-1] == "COMMIT"
    # what the module compares to decide whether to write: the same input gives the same text
    assert fw.rules_file("SPARKOPS-MP", 4, r["chain"], r["jumps"]) == "\n".join(lines) + "\n"


def test_jumps_input_deletes_the_old_jumps_and_inserts_the_new_in_one_commit():
    have = ['-A INPUT -p tcp -m multiport --dports 8000 -m comment --comment "sparkops: API ports" -j SPARKOPS-API']
    listing = "-P INPUT ACCEPT\n" + have[0] + "\n-A INPUT -j SPARKOPS-APIX\n-A INPUT -p tcp --dport 22 -j ACCEPT\n"
    assert fw.input_jumps(listing, "SPARKOPS-API") == have
    new = fw.chain_rules("SPARKOPS-API", ["8001"], [], [], "API")["jumps"]
    assert fw.jumps_input("SPARKOPS-API", have, new).splitlines() == [
        "*filter",
        '-D INPUT -p tcp -m multiport --dports 8000 -m comment --comment "sparkops: API ports" -j SPARKOPS-API',
        '-I INPUT 1 -p tcp -m multiport --dports 8001 -m comment --comment "sparkops: API ports" -j SPARKOPS-API',
        "COMMIT",
    ]


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
import os, subprocess, sys, tempfile
sys.path[:0] = sys.argv[1:3]
restore_script = sys.argv[3]
from ansible_collections.sparkops.cluster.plugins.modules import iptables_chain
from module_runner import run_module

def rules(tool="iptables"):
    return subprocess.run([tool, "-w", "-S"], capture_output=True, text=True, check=True).stdout

rules_dir = tempfile.mkdtemp()
args = {"chain": "SPARKOPS-API", "ports": ["8000"], "interfaces": ["eth1"], "sources": ["192.168.10.0/24"],
        "comment": "OpenAI API", "rules_dir": rules_dir}
r = run_module(iptables_chain, args, check_mode=True)
assert r["changed"] and "SPARKOPS" not in rules() and "SPARKOPS" not in rules("ip6tables"), r
assert os.listdir(rules_dir) == [], "check mode wrote a rules file"
r = run_module(iptables_chain, args)
assert r["changed"] and not r.get("failed"), r
assert run_module(iptables_chain, args)["changed"] is False
got = [l for l in rules().splitlines() if "SPARKOPS" in l]
assert got[1].startswith("-A INPUT -p tcp -m multiport --dports 8000 "), got
assert [l.split(" -m comment")[0] for l in got[2:]] == [
    "-A SPARKOPS-API -i lo", "-A SPARKOPS-API -i eth1", "-A SPARKOPS-API -s 192.168.10.0/24", "-A SPARKOPS-API"], got
assert got[-1].endswith("-j DROP"), got
# IPv6: the same ports go to a chain that passes loopback and ICMPv6 only (no IPv6 address is planned)
got6 = [l for l in rules("ip6tables").splitlines() if "SPARKOPS" in l]
assert got6[1].startswith("-A INPUT -p tcp -m multiport --dports 8000 "), got6
assert [l.split(" -m comment")[0] for l in got6[2:]] == [
    "-A SPARKOPS-API -i lo", "-A SPARKOPS-API -p ipv6-icmp", "-A SPARKOPS-API"], got6
assert sorted(os.listdir(rules_dir)) == ["SPARKOPS-API.v4", "SPARKOPS-API.v6"]
# a lost DROP (someone's iptables -D) comes back; a network taken off the list goes
subprocess.run(["iptables", "-w", "-D", "SPARKOPS-API", "-m", "comment", "--comment",
                "sparkops: OpenAI API: fast links and client networks only", "-j", "DROP"], check=True)
assert run_module(iptables_chain, dict(args, sources=[]))["changed"]
got = [l for l in rules().splitlines() if l.startswith("-A SPARKOPS-API")]
assert len(got) == 3 and got[-1].endswith("-j DROP") and "192.168" not in "".join(got), got
assert "192.168" not in open(os.path.join(rules_dir, "SPARKOPS-API.v4")).read()
assert run_module(iptables_chain, dict(args, sources=[]))["changed"] is False
# a changed port list replaces INPUT's jump (no stale jump left behind)
assert run_module(iptables_chain, dict(args, sources=[], ports=["8001"]))["changed"]
jumps = [l for l in rules().splitlines() if l.startswith("-A INPUT") and l.endswith("-j SPARKOPS-API")]
assert len(jumps) == 1 and "--dports 8001 " in jumps[0], jumps
# destinations: everything addressed to the fast-link address, any port and protocol
mp = {"chain": "SPARKOPS-MP", "ports": ["29501"], "destinations": ["192.168.100.10", "fd00:1::10"],
      "interfaces": ["eth1"], "interfaces6": ["eth1"], "comment": "vLLM ranks", "rules_dir": rules_dir}
assert run_module(iptables_chain, mp)["changed"] and run_module(iptables_chain, mp)["changed"] is False
assert "-A INPUT -d 192.168.100.10/32 " in rules() and "-A INPUT -d fd00:1::10/128 " in rules("ip6tables")

# the ring's forwarding chain, built as roles/roce_network does (iptables <where> <rule>, in the model's order),
# and its rules file as the role writes it (filter firewall_rules_file)
from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import _forward_rules
from ansible_collections.sparkops.cluster.plugins.module_utils.firewall import rules_file_from
fwd = _forward_rules(["eth1", "eth2"])
for fam, tool in ((4, "iptables"), (6, "ip6tables")):
    subprocess.run([tool, "-w", "-N", "SPARKOPS-FWD"], check=True)
    for r in fwd:
        subprocess.run([tool, "-w", *r["where"], *r["rule"]], check=True)
    with open(os.path.join(rules_dir, f"SPARKOPS-FWD.v{fam}"), "w") as fh:
        fh.write(rules_file_from("SPARKOPS-FWD", fam, fwd, "test"))

# a reboot: every rule gone; the boot restore brings back exactly what the module wrote, twice is once
before = {t: sorted(l for l in rules(t).splitlines() if "SPARKOPS" in l) for t in ("iptables", "ip6tables")}
assert any(l.startswith("-A FORWARD -o eth2 ") for l in before["ip6tables"]), before
for t in ("iptables", "ip6tables"):
    subprocess.run([t, "-w", "-F", "INPUT"], check=True)
    subprocess.run([t, "-w", "-F", "FORWARD"], check=True)
    for c in ("SPARKOPS-API", "SPARKOPS-MP", "SPARKOPS-FWD"):
        subprocess.run([t, "-w", "-F", c], check=True)
        subprocess.run([t, "-w", "-X", c], check=True)
    subprocess.run([t, "-w", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"], check=True)
for _ in range(2):
    res = subprocess.run(["sh", restore_script, rules_dir], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    for t in ("iptables", "ip6tables"):
        assert sorted(l for l in rules(t).splitlines() if "SPARKOPS" in l) == before[t], (t, rules(t), before[t])
        assert "--dport 22 -j ACCEPT" in rules(t), "the restore removed a rule that is not ours"
assert run_module(iptables_chain, dict(args, sources=[], ports=["8001"]))["changed"] is False
assert run_module(iptables_chain, mp)["changed"] is False
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
        [
            "unshare",
            "-n",
            sys.executable,
            "-c",
            REAL_IPTABLES,
            str(COLLECTIONS),
            str(ROOT / "tests" / "unit"),
            str(ROOT / "roles" / "firewall_boot" / "files" / "sparkops-firewall-restore"),
        ],  # fmt: skip
        # the child imports the collection as this process does (ansible-test units puts it elsewhere)
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), res.stdout + res.stderr


@pytest.mark.parametrize(
    ("tasks", "chain"),
    [
        ("roles/ray_cluster/tasks/firewall.yml", "SPARKOPS-RAY"),
        ("roles/vllm_serve/tasks/firewall.yml", "SPARKOPS-API"),
        ("roles/vllm_serve/tasks/firewall.yml", "SPARKOPS-MP"),
        ("roles/gateway/tasks/firewall.yml", "SPARKOPS-GATEWAY"),
        ("roles/monitoring/tasks/main.yml", "SPARKOPS-MONITORING"),
    ],
)
def test_every_input_chain_goes_through_the_module_for_both_families_and_a_rules_file(tasks, chain):
    """No shell builds an INPUT chain: the module keeps IPv4 and IPv6 (its default families) and writes the rules
    file the boot restore loads; no task narrows it to one family or turns the file off."""
    import yaml  # noqa: PLC0415
    from conftest import ROOT  # noqa: PLC0415

    found = [
        t["sparkops.cluster.iptables_chain"]
        for t in yaml.safe_load((ROOT / tasks).read_text())
        if (t.get("sparkops.cluster.iptables_chain") or {}).get("chain") == chain
    ]
    assert len(found) == 1, f"{tasks} has no iptables_chain task for {chain}"
    assert "families" not in found[0] and "rules_dir" not in found[0]
    if chain == "SPARKOPS-MP":  # the ranks' ephemeral ports: everything to the fast-link addresses
        assert found[0]["destinations"] == "{{ sparkops_node.ips }}"
