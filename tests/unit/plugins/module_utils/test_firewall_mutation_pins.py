"""firewall.py at its bounds: the kernel's interface names, the port range ends, a port range, iptables'
15-port multiport limit, the comment's length; each refusal's message and each accepted rule's exact text.

Equivalent mutants (tests/mutation/equivalents.py lists them, `make mutation` does not run them):
- `0 < len(parts) <= 2` -> `0 <= len(parts) <= 2` in _ports: str.split(":") returns at least one part, so
  len(parts) is never 0.
- in_place without `bool(appended)`: the rules always come from chain_rules, which gives at least lo's
  RETURN and the DROP, so `len(appended) == len(rules)` already means two lines or more.
"""

from __future__ import annotations

import shlex

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import firewall as fw


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
