"""The firewall_rules_file filter (plugins/filter/firewall.py): a rules file for the boot restore from the model's
rules, on the controller. (A controller-side test: ansible-test runs tests/unit/plugins/module_utils in the target's
context, where the filter's ansible imports do not exist.)"""

from __future__ import annotations

import pytest


def test_a_rules_file_from_the_models_rules_holds_only_its_chain_and_the_built_in_hooks():
    from ansible_collections.sparkops.cluster.plugins.filter.firewall import firewall_rules_file  # noqa: PLC0415
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import _forward_rules  # noqa: PLC0415

    text = firewall_rules_file(_forward_rules(["eth1", "eth2"]), "SPARKOPS-FWD", 6, "roles/roce_network")
    lines = text.splitlines()
    assert lines[0].startswith("# SPARKOPS-FWD (IPv6): written by roles/roce_network")
    assert lines[1:3] == ["*filter", ":SPARKOPS-FWD - [0:0]"] and lines[-1] == "COMMIT"
    assert (
        '-I SPARKOPS-FWD 1 -i eth1 -o eth2 -m comment --comment "sparkops: ring forwarding eth1 to eth2" -j ACCEPT'
        in lines
    )
    assert lines[-2] == '-I FORWARD 1 -o eth2 -m comment --comment "sparkops: forwarding to eth2" -j SPARKOPS-FWD'
    for where in (["-A", "OUTPUT"], ["-I", "OTHER", "1"], ["-F", "SPARKOPS-FWD"], ["-I", "FORWARD", "x"]):
        with pytest.raises(Exception, match="not one this file may hold"):
            firewall_rules_file([{"where": where, "rule": ["-j", "ACCEPT"]}], "SPARKOPS-FWD")
    with pytest.raises(Exception, match="not one this file may hold"):
        firewall_rules_file([{"where": ["-A", "SPARKOPS-FWD"], "rule": ["-j", "DROP\nCOMMIT"]}], "SPARKOPS-FWD")
