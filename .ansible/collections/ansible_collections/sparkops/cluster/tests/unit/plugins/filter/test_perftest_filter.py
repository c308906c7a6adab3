import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.filter.perftest import FilterModule


def test_cable_verdict_filter_classifies_a_degraded_twin():
    f = FilterModule().filters()["cable_verdict"]
    out = f({"rocep1s0f1": {"bw_avg_gbps": 213.0}, "roceP2p1s0f1": {"bw_avg_gbps": 118.7}}, "190")
    assert out["verdict"] == "degraded"
    assert any("reseat" in line for line in out["advice"])


def test_cable_verdict_filter_rejects_a_bad_threshold():
    with pytest.raises(AnsibleFilterError, match="threshold"):
        FilterModule().filters()["cable_verdict"]([{"bw_avg_gbps": 1.0}], 0)
