"""weight_senders: the model's fan-out as one copy job per sending node, for every topology."""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.filter.weight_fanout import FanoutError, weight_senders
from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import build_cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugin_utils"))
import cluster_inventories as inv  # noqa: E402


def _check_jobs(model: dict, jobs: dict) -> None:
    """Properties every topology's jobs keep: each receiver once, along a shared subnet, senders hold or follow."""
    source = model["weights"]["source"]
    receivers = [r for job in jobs.values() for r in job["receivers"]]
    assert sorted(receivers) == sorted(model["weights"]["targets"]), "every other node receives exactly once"
    for host, job in jobs.items():
        assert job["follow"] is (host != source)
        assert (job["upstream"] is None) is (host == source)
        assert len(job["targets"]) == len(job["receivers"])
        for ip, receiver in zip(job["targets"], job["receivers"], strict=True):
            own = job["source_addresses"][ip]
            mine = {link["ip"] for link in model["nodes"][host]["links"]}
            theirs = {link["ip"]: link["cidr"] for link in model["nodes"][receiver]["links"]}
            assert own in mine and ip in theirs, "both ends are the two nodes' own link addresses"
            assert ipaddress.ip_address(own) in ipaddress.ip_network(theirs[ip], strict=False), "one subnet: one cable"
        if job["upstream"]:
            assert host in jobs[job["upstream"]]["receivers"]
            assert job["upstream_ip"] in jobs[job["upstream"]]["targets"]


def test_pair_is_one_copy_from_the_head():
    m = build_cluster(inv.pair())
    jobs = weight_senders(m)
    assert jobs == {
        "spark-1": {
            "targets": ["192.168.100.12"],
            "source_addresses": {"192.168.100.12": "192.168.100.11"},
            "source_address": "192.168.100.11",
            "receivers": ["spark-2"],
            "upstream": None,
            "upstream_ip": None,
            "follow": False,
        }
    }
    _check_jobs(m, jobs)


def test_ring_of_4_is_two_chains_along_the_cables():
    m = build_cluster(inv.ring(4))
    jobs = weight_senders(m)
    _check_jobs(m, jobs)
    # spark-1 sends both ways at once (to spark-2 and spark-4, each on its own cable); spark-2 forwards to
    # spark-3 while it receives. spark-3 and spark-4 send nothing.
    assert set(jobs) == {"spark-1", "spark-2"}
    assert sorted(jobs["spark-1"]["receivers"]) == ["spark-2", "spark-4"]
    assert len(set(jobs["spark-1"]["source_addresses"].values())) == 2, "one own address per cable"
    assert jobs["spark-2"]["receivers"] == ["spark-3"] and jobs["spark-2"]["upstream"] == "spark-1"


@pytest.mark.parametrize("n", range(3, 9))
def test_ring_of_n(n):
    m = build_cluster(inv.ring(n))
    jobs = weight_senders(m)
    _check_jobs(m, jobs)
    cabled = {frozenset((c["a"], c["b"])) for c in m["cables"]}
    for host, job in jobs.items():
        assert all(frozenset((host, r)) in cabled for r in job["receivers"])
        assert len(job["receivers"]) <= (2 if host == "spark-1" else 1), "a chain: one child per forwarder"


@pytest.mark.parametrize("n", range(2, 9))
def test_switch_of_n(n):
    m = build_cluster(inv.switch(n))
    jobs = weight_senders(m)
    _check_jobs(m, jobs)
    # the doubling tree: the source sends ceil(log2 n) times, the others fewer
    assert len(jobs["spark-1"]["receivers"]) == (n - 1).bit_length()


def test_an_edge_off_the_cables_is_refused():
    m = build_cluster(inv.ring(4))
    # spark-1 and spark-3 share no cable on a ring of 4: an edge between them is not a cable's.
    bad = [{"from": "spark-1", "to": "spark-3", "ip": m["nodes"]["spark-3"]["links"][0]["ip"], "wave": 1}]
    with pytest.raises(FanoutError, match="does not run along a cable"):
        weight_senders(m, bad)


def test_a_sender_that_never_receives_is_refused():
    m = build_cluster(inv.pair())
    edge = {"from": "spark-2", "to": "spark-1", "ip": "192.168.100.11", "wave": 1}
    with pytest.raises(FanoutError, match="is the source"):
        weight_senders(m, [edge])
    m3 = build_cluster(inv.switch(3))
    ip3 = m3["nodes"]["spark-3"]["links"][0]["ip"]
    with pytest.raises(FanoutError, match="never receives"):
        weight_senders(m3, [{"from": "spark-2", "to": "spark-3", "ip": ip3, "wave": 1}])
