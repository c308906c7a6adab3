"""Listen addresses the inventory gives: an IPv4 address of the node (or the wildcard), never IPv6 while the
SPARKOPS-* chains are iptables (IPv4) rules only; each refusal names the variable, the value and what is valid.
vllm_serve_host and sparkops_gateway_bind are checked by the plan (test_cluster_inputs.py, test_serving_plan.py);
monitoring_listen_address by the monitoring role through the bind_problem filter, here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkops.cluster.plugins.filter.cluster import FilterModule

ROOT = Path(__file__).resolve().parents[4]
bind_problem = FilterModule().filters()["bind_problem"]
NODE = {"ips": ["192.168.100.12", "192.168.101.12"], "mgmt_address": "10.0.0.12"}


@pytest.mark.parametrize("address", ["192.168.100.12", "192.168.101.12", "10.0.0.12", "127.0.0.1", "0.0.0.0"])
def test_an_address_of_the_node_loopback_or_every_ipv4_address_is_taken(address):
    assert bind_problem(address, "monitoring_listen_address", NODE, "spark-2") == ""


@pytest.mark.parametrize("address", ["::", "::1", "fe80::1", "2001:db8::12"])
def test_an_ipv6_listen_address_is_refused_until_the_chains_cover_ipv6(address):
    got = bind_problem(address, "monitoring_listen_address", NODE, "spark-2")
    assert got.startswith(f"monitoring_listen_address is '{address}', an IPv6 address.")
    assert "refused until the chains cover IPv6" in got
    assert "192.168.100.12, 192.168.101.12, 10.0.0.12 or 0.0.0.0, 127.0.0.1" in got


@pytest.mark.parametrize("address", ["192.168.100.11", "0.0.0.0 --web.enable-admin-api", "localhost", ""])
def test_an_address_of_another_node_or_no_address_is_refused(address):
    got = bind_problem(address, "monitoring_listen_address", NODE, "spark-2")
    assert got.startswith(f"monitoring_listen_address is '{address}', which is none of spark-2's addresses")


def test_the_monitoring_role_stops_on_the_filter_s_problem():
    tasks = yaml.safe_load((ROOT / "roles/monitoring/tasks/main.yml").read_text())
    (check,) = [t for t in tasks if t.get("name") == "Check the monitoring settings"]
    assert "monitoring_listen_problem | length == 0" in check["ansible.builtin.assert"]["that"]
    assert (
        "sparkops.cluster.bind_problem('monitoring_listen_address', sparkops_node"
        in (check["vars"]["monitoring_listen_problem"])
    )
    assert "{{ monitoring_listen_problem }}" in check["ansible.builtin.assert"]["fail_msg"]
