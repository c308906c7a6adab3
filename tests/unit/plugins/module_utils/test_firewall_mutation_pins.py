"""firewall.py at its bounds: the kernel's interface names, the port range ends, a port range, iptables'
15-port multiport limit, the comment's length; each refusal's message and each accepted rule's exact text; the
rules files (one per family, the model's rules replayed in a declared chain) and what doctor reads of a node
(FORWARD's jumps, a cut or blank listing line, a socket ss shows without a process).

Equivalent mutants (tests/mutation/equivalents.py lists them, `make mutation` does not run them):
- `0 < len(parts) <= 2` -> `0 <= len(parts) <= 2` in _ports: str.split(":") returns at least one part, so
  len(parts) is never 0.
- in_place without `bool(appended)`: the rules always come from chain_rules, which gives at least lo's
  RETURN and the DROP, so `len(appended) == len(rules)` already means two lines or more.
- `0 < len(parts) <= 2` -> `-1 < len(parts) <= 2` in _ports: str.split(":") returns at least one part, so both
  bounds always hold.
- chain_rules without `str(n) not in dests`: _networks gives each network once, and str() of two unequal
  ipaddress networks differs, so a destination is never seen twice.
"""

from __future__ import annotations

import shlex

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import firewall as fw
from ansible_collections.sparkops.cluster.plugins.modules import iptables_chain
from module_runner import run_module


@pytest.mark.parametrize("name", [".", "..", None, 8, "", "eth 0", "eth/0", "a" * 16, "é" * 8])
def test_names_the_kernel_refuses_are_not_interface_names(name):
    assert fw.valid_ifname(name) is False


@pytest.mark.parametrize("name", ["lo", "a" * 15, ".eth", "eth0.100", "enP2p1s0f1np1", "é" * 7])
def test_names_the_kernel_takes_are_interface_names(name):
    assert fw.valid_ifname(name) is True


def test_a_dot_interface_is_refused_with_what_is_wrong():
    with pytest.raises(ValueError, match=r"^interface '\.\.' is not a valid Linux interface name \(1-15 characters"):
        fw.chain_rules("SPARKOPS-API", ["8000"], [".."], [], "API")


def test_the_port_range_ends_are_1_and_65535():
    r = fw.chain_rules("SPARKOPS-API", [1, "65535"], [], [], "API")
    assert r["jump"][:6] == ["-p", "tcp", "-m", "multiport", "--dports", "1,65535"]
    with pytest.raises(ValueError, match=r"^port '65536' is not a TCP port \(1-65535\) or a range low:high$"):
        fw.chain_rules("SPARKOPS-API", ["65536"], [], [], "API")


def test_a_port_range_low_high_is_kept_as_iptables_writes_it():
    r = fw.chain_rules("SPARKOPS-RAY", ["8000:8010", "10001:19999", "6379"], ["eth1"], [], "Ray")
    assert shlex.join(r["jump"]) == (
        "-p tcp -m multiport --dports 8000:8010,10001:19999,6379 "
        "-m comment --comment 'sparkops: Ray ports' -j SPARKOPS-RAY"
    )


@pytest.mark.parametrize("port", ["x:y", "8000:", ":8000", "8000:8000", "1:2:3", True])
def test_a_malformed_range_is_refused_with_what_is_wrong(port):
    with pytest.raises(ValueError, match=r"^port .* is not a TCP port \(1-65535\) or a range low:high$"):
        fw.chain_rules("SPARKOPS-API", [port], [], [], "API")


def test_fifteen_ports_fill_the_multiport_match_and_sixteen_are_refused():
    ports = [str(p) for p in range(8000, 8015)]
    assert fw.chain_rules("SPARKOPS-API", ports, [], [], "API")["jump"][5] == ",".join(ports)
    with pytest.raises(ValueError, match=r"^16 ports: iptables' multiport match takes at most 15$"):
        fw.chain_rules("SPARKOPS-API", [*ports, "9000"], [], [], "API")


def test_a_comment_of_100_characters_is_taken_and_101_refused():
    r = fw.chain_rules("SPARKOPS-API", ["8000"], [], [], "x" * 100)
    assert r["jump"][-3] == "sparkops: " + "x" * 100 + " ports"
    with pytest.raises(ValueError, match=r"must be printable text of 1-100 characters without a double quote"):
        fw.chain_rules("SPARKOPS-API", ["8000"], [], [], "x" * 101)
    with pytest.raises(ValueError, match=r"^comment '' must be printable"):
        fw.chain_rules("SPARKOPS-API", ["8000"], [], [], "")


def test_a_chain_name_of_28_characters_is_taken_and_29_refused():
    name = "S" + "X" * 27
    assert fw.chain_rules(name, ["8000"], [], [], "API")["jump"][-1] == name
    with pytest.raises(ValueError, match=r"must be 1-28 characters of A-Z"):
        fw.chain_rules(name + "X", ["8000"], [], [], "API")


def test_no_interfaces_given_means_loopback_only():
    r = fw.chain_rules("SPARKOPS-API", ["8000"], None, None, "API")
    assert [shlex.join(rule) for rule in r["chain"]] == [
        "-i lo -m comment --comment 'sparkops: API from lo' -j RETURN",
        "-m comment --comment 'sparkops: API: fast links and client networks only' -j DROP",
    ]


def test_values_that_are_not_text_are_refused_not_crashed_on():
    # Values reach the module utils from YAML: a number or null where a name belongs is a refusal.
    with pytest.raises(ValueError, match=r"^chain None must be 1-28 characters"):
        fw.chain_rules(None, ["8000"], [], [], "API")
    with pytest.raises(ValueError, match=r"^comment 42 must be printable text"):
        fw.chain_rules("SPARKOPS-API", ["8000"], [], [], 42)
    with pytest.raises(ValueError, match=r"^interface 10 is not a valid Linux interface name"):
        fw.chain_rules("SPARKOPS-API", ["8000"], [10], [], "API")


def test_every_bad_client_network_is_named_not_only_the_first():
    # One run tells the user every value to fix: an IPv4 and an IPv6 network that are not networks, and the
    # every-address one after them, each in the refusal.
    with pytest.raises(ValueError) as err:
        fw.chain_rules("SPARKOPS-API", ["8000"], [], ["192.168.1.0/33", "fd00::/129", "::/0"], "API", family=6)
    assert str(err.value) == (
        "client network '192.168.1.0/33' is not an IPv4 or IPv6 network (a.b.c.d/len, x:y::/len or an address); "
        "client network 'fd00::/129' is not an IPv4 or IPv6 network (a.b.c.d/len, x:y::/len or an address); "
        "client network '::/0' is every address: leave it out and bind the service there instead"
    )


@pytest.mark.parametrize(
    ("family", "sources", "bad"),
    [(4, ["0.0.0.0/0", "10.1.0.0/33"], "'10.1.0.0/33'"), (6, ["::/0", "fd00::/129"], "'fd00::/129'")],
)
def test_a_bad_client_network_after_the_every_address_one_is_named_too(family, sources, bad):
    # The every-address network first: the networks after it are still read, and each bad one is named.
    with pytest.raises(ValueError) as err:
        fw.chain_rules("SPARKOPS-API", ["8000"], [], sources, "API", family=family)
    assert str(err.value) == (
        f"client network {sources[0]!r} is every address: leave it out and bind the service there instead; "
        f"client network {bad} is not an IPv4 or IPv6 network (a.b.c.d/len, x:y::/len or an address)"
    )


@pytest.mark.parametrize(
    ("families", "icmp"),
    [
        ((4, "4", "ipv4"), []),
        (
            (6, "6", "ipv6"),
            ["-p ipv6-icmp -m comment --comment 'sparkops: ICMPv6 (neighbour discovery, path MTU)' -j RETURN"],
        ),
    ],
    ids=["IPv4", "IPv6"],
)
def test_a_family_is_taken_as_a_number_or_as_the_modules_families_name_it(families, icmp):
    # iptables_chain's `families` option says ipv4 / ipv6; chain_rules takes those, 4 / 6 and "4" / "6" alike.
    for family in families:
        r = fw.chain_rules("SPARKOPS-API", ["8000"], [], [], "API", family=family)
        assert [shlex.join(rule) for rule in r["chain"]] == [
            "-i lo -m comment --comment 'sparkops: API from lo' -j RETURN",
            *icmp,
            "-m comment --comment 'sparkops: API: fast links and client networks only' -j DROP",
        ], family


def test_a_bad_family_and_a_bad_ipv6_link_are_each_named_once():
    with pytest.raises(ValueError) as err:
        fw.chain_rules("SPARKOPS-API", ["8000"], [], [], "API", family="ipv5", interfaces6=["eth1:v6"])
    assert str(err.value) == (
        "family 'ipv5' must be ipv4 or ipv6; "
        "interface 'eth1:v6' is not a valid Linux interface name (1-15 characters, no / : or space)"
    )


@pytest.mark.parametrize("family", [4, 6])
def test_no_destinations_and_no_ipv6_links_given_mean_none(family):
    # None, as for interfaces and sources: INPUT sends the ports alone to the chain.
    r = fw.chain_rules(
        "SPARKOPS-API", ["8000"], ["eth1"], None, "API", family=family, destinations=None, interfaces6=None
    )
    assert [shlex.join(j) for j in r["jumps"]] == [
        "-p tcp -m multiport --dports 8000 -m comment --comment 'sparkops: API ports' -j SPARKOPS-API"
    ]


def test_a_stale_rule_before_the_drop_means_the_chain_is_not_in_place():
    # A client network taken off the list: the old chain still RETURNs it before the DROP. Every wanted rule is
    # found (`iptables -C` succeeds for each) and DROP is last, but the count differs: the chain is rewritten.
    r = fw.chain_rules("SPARKOPS-API", ["8000"], ["eth1"], [], "API")["chain"]
    old = fw.chain_rules("SPARKOPS-API", ["8000"], ["eth1"], ["10.1.0.0/16"], "API")["chain"]
    listing = "-N SPARKOPS-API\n" + "".join(f"-A SPARKOPS-API {shlex.join(x)}\n" for x in old)
    assert listing.splitlines()[-1].endswith("-j DROP") and len(old) == len(r) + 1
    assert fw.in_place(listing, r, [True] * len(r)) is False
    assert fw.in_place(listing, old, [True] * len(old)) is True


def test_the_module_writes_one_rules_file_per_family_where_the_boot_restore_reads_it(monkeypatch, tmp_path):
    """roles/firewall_boot's sparkops-firewall-restore loads RULES_DIR/SPARKOPS-*.v4 with iptables-restore and
    SPARKOPS-*.v6 with ip6tables-restore: the module names each family's file so (here a node without the chain)."""
    monkeypatch.setattr(iptables_chain.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: f"/usr/sbin/{name}")

    def run(self, argv, *a, **k):  # no chain yet, INPUT empty, every restore succeeds
        return (0, "-P INPUT ACCEPT\n", "") if argv[-2:] == ["-S", "INPUT"] or "restore" in argv[0] else (1, "", "")

    monkeypatch.setattr(iptables_chain.AnsibleModule, "run_command", run)
    args = {"chain": "SPARKOPS-API", "ports": ["8000"], "interfaces": ["eth1"], "comment": "API"}
    out = run_module(iptables_chain, {**args, "rules_dir": str(tmp_path)})
    assert out["changed"] and not out.get("failed"), out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["SPARKOPS-API.v4", "SPARKOPS-API.v6"]
    assert out["families"]["ipv6"]["rules_file"] == str(tmp_path / "SPARKOPS-API.v6")
    v4, v6 = (tmp_path / "SPARKOPS-API.v4").read_text(), (tmp_path / "SPARKOPS-API.v6").read_text()
    assert v4.startswith("# SPARKOPS-API (IPv4)") and "ipv6-icmp" not in v4
    assert v6.startswith("# SPARKOPS-API (IPv6)") and "-A SPARKOPS-API -p ipv6-icmp " in v6


# Shaped as the cluster model's forward_rules for a ring node's fast links eth1 and eth2 (roles/roce_network), and one
# INPUT hook: the built-in chains a rules file may name besides its own.
ACCEPT_1_2 = ["-i", "eth1", "-o", "eth2", "-m", "comment", "--comment", "sparkops: ring forwarding eth1 to eth2"]
FORWARD_RULES = [
    {"where": ["-I", "SPARKOPS-FWD", "1"], "rule": [*ACCEPT_1_2, "-j", "ACCEPT"]},
    {
        "where": ["-A", "SPARKOPS-FWD"],
        "rule": ["-m", "comment", "--comment", "sparkops: no other forwarding", "-j", "DROP"],
    },
    {"where": ["-I", "FORWARD", "1"], "rule": ["-o", "eth2", "-j", "SPARKOPS-FWD"]},
    {"where": ["-A", "INPUT"], "rule": ["-i", "eth2", "-j", "SPARKOPS-FWD"]},
]


@pytest.mark.parametrize(("family", "name"), [(4, "IPv4"), (6, "IPv6")])
def test_a_rules_file_from_the_models_rules_declares_its_chain_and_replays_each_rule_where_it_was_put(family, name):
    # `:SPARKOPS-FWD - [0:0]` declares (and so flushes) the chain: replaying the rules then rebuilds it, twice is once.
    lines = fw.rules_file_from("SPARKOPS-FWD", family, FORWARD_RULES, "roles/roce_network").splitlines()
    assert lines[0].startswith(f"# SPARKOPS-FWD ({name}): written by roles/roce_network, restored at boot")
    assert lines[1:] == [
        "*filter",
        ":SPARKOPS-FWD - [0:0]",
        '-I SPARKOPS-FWD 1 -i eth1 -o eth2 -m comment --comment "sparkops: ring forwarding eth1 to eth2" -j ACCEPT',
        '-A SPARKOPS-FWD -m comment --comment "sparkops: no other forwarding" -j DROP',
        "-I FORWARD 1 -o eth2 -j SPARKOPS-FWD",
        "-A INPUT -i eth2 -j SPARKOPS-FWD",
        "COMMIT",
    ]


@pytest.mark.parametrize(
    ("where", "rule"),
    [
        (["-A", "OUTPUT"], ["-j", "ACCEPT"]),  # a chain that is neither this one nor INPUT/FORWARD
        (["-A", "SPARKOPS-FWD"], ["-m", "comment", "--comment", "x\nCOMMIT\n*nat", "-j", "DROP"]),  # a line break
        (["-A", "SPARKOPS-FWD"], ["-m", "comment", "--comment", 'a "quoted" word', "-j", "DROP"]),  # a double quote
        (["-I", "FORWARD", "1", "2"], ["-j", "SPARKOPS-FWD"]),  # more than a position after the chain
        # iptables(8): rule numbers start at 1, and -A takes none: iptables-restore would refuse these at boot.
        (["-I", "FORWARD", "0"], ["-j", "SPARKOPS-FWD"]),
        (["-A", "FORWARD", "1"], ["-j", "SPARKOPS-FWD"]),
    ],
)
def test_a_rule_the_rules_file_may_not_hold_is_refused_with_the_rule(where, rule):
    with pytest.raises(ValueError, match=r"^rule \[.*\] \[.*\] is not one this file may hold$") as err:
        fw.rules_file_from("SPARKOPS-FWD", 6, [*FORWARD_RULES, {"where": where, "rule": rule}], "roles/roce_network")
    assert str(err.value).startswith(f"rule {where} {rule} ")


IPTABLES_SAVE = """# Generated by iptables-save v1.8.9 (nf_tables)
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:SPARKOPS-FWD - [0:0]
-A INPUT -i eth2 -j SPARKOPS-FWD
-A FORWARD -o eth2 -m comment --comment "sparkops: forwarding to eth2" -j SPARKOPS-FWD
-A FORWARD -i eth2 -m comment --comment "sparkops: forwarding from eth2" -j SPARKOPS-FWD
-A SPARKOPS-FWD -i eth1 -o eth2 -j ACCEPT
-A SPARKOPS-FWD -m comment --comment "sparkops: no other forwarding" -j DROP
COMMIT
"""


def test_forward_jumps_count_as_hooks_of_a_chain():
    # The ring's forwarding chain is hooked from FORWARD (and here INPUT): doctor counts every jump to it.
    for text in (IPTABLES_SAVE, IPTABLES_SAVE.replace("iptables-save", "ip6tables-save")):
        assert fw.parse_save(text) == {
            "chains": ["SPARKOPS-FWD"],
            "hooks": {"SPARKOPS-FWD": 3},
            "drops": {"SPARKOPS-FWD": True},
            "ports": {},
        }


@pytest.mark.parametrize(
    "noise",
    ["", "   ", "-A", ":"],
    ids=["blank line", "white space", "a bare -A", "a bare colon"],
)
def test_a_listing_with_a_blank_or_cut_line_parses_as_without_it(noise):
    # Text from the node (a listing cut short, two listings run together): a line without a rule is skipped,
    # never an IndexError that loses the node's whole firewall read.
    lines = IPTABLES_SAVE.splitlines()
    noisy = "\n".join([*lines[:7], noise, *lines[7:]]) + "\n"
    assert fw.parse_save(noisy) == fw.parse_save(IPTABLES_SAVE)


def test_a_listening_socket_without_a_process_column_is_still_seen():
    # ss writes users:(...) only when find_entry finds a process holding the socket's inode (iproute2 v6.1.0
    # misc/ss.c:2440-2457 proc_ctx_print, called last by inet_stats_print :2459-2467): a socket no process holds
    # (the kernel's nfsd on 2049) has five columns, and is still one on the any address that doctor must weigh.
    text = "LISTEN 0      64           0.0.0.0:2049  0.0.0.0:*\nLISTEN 0      64              [::]:2049     [::]:*\n"
    assert fw.parse_ss_listening(text) == [
        {"address": "0.0.0.0", "interface": None, "port": 2049, "wildcard": True, "v6only": False, "process": ""},
        {"address": "[::]", "interface": None, "port": 2049, "wildcard": True, "v6only": True, "process": ""},
    ]


@pytest.mark.parametrize(("addr", "peer"), [("10.0.0.1", "0.0.0.0"), ("[fd00::1]", "[::]")], ids=["IPv4", "IPv6"])
def test_a_process_name_with_a_line_break_hides_no_socket_listed_after_it(addr, peer):
    # ss prints the process's comm as it is (iproute2 misc/ss.c find_entry: `"(\"%s\",pid=%d,fd=%d),"`), and a
    # process may name itself with a line break (prctl PR_SET_NAME): its socket is kept without a name, the half
    # line after the break is skipped, and the sockets listed after it are still read.
    text = (
        f'LISTEN 0      4096   {addr}:9000   {peer}:*    users:(("ev\nil",pid=7,fd=3))\n'
        f'LISTEN 0      4096   {addr}:8000   {peer}:*    users:(("vllm",pid=9,fd=5))\n'
    )
    assert [(s["address"], s["port"], s["process"]) for s in fw.parse_ss_listening(text)] == [
        (addr, 9000, ""),
        (addr, 8000, "vllm"),
    ]
