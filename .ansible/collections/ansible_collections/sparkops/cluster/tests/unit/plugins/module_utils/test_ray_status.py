"""ray_status parsers on real outputs: Ray 2.52.1 recorded here, older versions from public threads.

Fixtures and their sources: tests/fixtures/ray/README.md.
"""

from __future__ import annotations

import builtins

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import ray_status as rs
from conftest import FIXTURES

RAY = FIXTURES / "ray"


def status(name: str) -> dict:
    return rs.parse_ray_status((RAY / name).read_text())


def test_252_two_nodes_idle():
    s = status("ray-2.52.1_status_2nodes.txt")
    assert s["available"] is True
    assert s["nodes_alive"] == 2
    assert s["node_ids"] == [
        "c91f8a8d69652968983a4941dd3aca70d6ef3c74b5db0eb7d6cdb9b9",
        "f6333f3dfa05dc7f47837d7832aacb00a09dfa16b6bfc40031111d41",
    ]
    assert (s["gpus_total"], s["gpus_used"], s["gpus_reserved"]) == (2.0, 0.0, 0.0)
    assert s["resources"]["memory"]["unit"] == "GiB"
    assert s["pending"] == [] and s["failures"] == [] and s["demands"] == []


def test_252_one_node_and_starting():
    s = status("ray-2.52.1_status_1node.txt")
    assert (s["nodes_alive"], s["gpus_total"]) == (1, 1.0)
    starting = status("ray-2.52.1_status_starting.txt")
    assert starting["available"] is False and starting["nodes_alive"] == 0


def test_252_placement_group_reserves_but_does_not_use():
    s = status("ray-2.52.1_status_2nodes_pg.txt")
    assert (s["gpus_used"], s["gpus_reserved"], s["gpus_total"]) == (0.0, 1.0, 2.0)
    assert s["demands"] == ["{'GPU': 1.0} * 3 (STRICT_SPREAD): 1+ pending placement groups"]


def test_252_gpu_in_use_by_an_actor():
    s = status("ray-2.52.1_status_2nodes_gpu_in_use.txt")
    assert (s["gpus_used"], s["gpus_reserved"], s["gpus_total"]) == (1.0, 2.0, 2.0)


def test_252_verbose_has_per_node_usage_keyed_by_id():
    s = status("ray-2.52.1_status_2nodes_pg_verbose.txt")
    assert s["gpus_total"] == 2.0  # per-node lines are not added to the totals
    per = s["per_node"]
    assert len(per) == 2
    head = per["c91f8a8d69652968983a4941dd3aca70d6ef3c74b5db0eb7d6cdb9b9"]["resources"]["GPU"]
    assert head == {"used": 0.0, "total": 1.0, "reserved": 1.0}
    assert s["node_ips"] == []  # ids, not IPs, in this version


def test_252_dead_worker_still_listed_active_but_gpus_dropped():
    s = status("ray-2.52.1_status_worker_dead.txt")
    assert s["nodes_alive"] == 2  # what Ray prints...
    assert s["gpus_total"] == 1.0  # ...while the GPU total already tells the truth


def test_old_healthy_pending_failures_formats():
    s = status("ray-1.x_status_issue13586.txt")
    assert s["nodes_alive"] == 1 and s["gpus_total"] == 0.0
    assert s["pending_ips"] == ["172.31.31.155"]
    assert s["resources"]["memory"] == {"used": 0.0, "total": 36.67, "unit": "GiB"}
    f = status("ray-1.x_status_pr14608_failures.txt")
    assert f["nodes_alive"] == 2
    assert f["failed_ips"] == ["10.0.0.157"]
    assert f["pending_ips"] == ["10.0.0.226", "10.0.0.118"]
    assert f["demands"] == ["{'CPU': 1.0, 'Custom1': 1.0}: 1+ pending tasks/actors"]


def test_counts_per_node_type_and_integer_resources():
    s = status("ray-2.x_status_pr36894_verbose.txt")
    assert s["nodes_alive"] == 22
    assert (s["gpus_used"], s["gpus_total"]) == (2.0, 2.0)
    assert s["failed_ips"] == ["1.2.3.6"]
    assert s["node_ips"] == ["192.168.1.1"]
    assert s["per_node"]["192.168.1.1"]["resources"]["GPU"] == {"used": 0.7, "total": 1.0}
    assert len(s["demands"]) == 3
    m = status("ray-2.x_status_mars2768_pg.txt")
    assert m["nodes_alive"] == 2
    assert m["resources"]["CPU"] == {"used": 4.0, "total": 8.0, "reserved": 4.0}


def test_vllm_cluster_from_issue_with_active_node_lines():
    s = status("ray-2.4x_status_gpustack2077_vllm.txt")
    assert s["nodes_alive"] == 2 and s["gpus_total"] == 16.0
    assert s["resources"]["memory"]["unit"] == "TiB"


def test_not_ray_status_raises():
    with pytest.raises(rs.RayParseError, match="not `ray status` output"):
        rs.parse_ray_status("Error: connection refused")


def test_nodes_json_and_yaml_agree():
    j = rs.parse_ray_nodes((RAY / "ray-2.52.1_nodes_2nodes.json").read_text())
    y = rs.parse_ray_nodes((RAY / "ray-2.52.1_nodes_2nodes.yaml").read_text())
    assert j == y
    assert [(n["node_ip"], n["alive"], n["is_head"], n["gpus"]) for n in j] == [
        ("127.0.0.2", True, True, 1.0),
        ("127.0.0.3", True, False, 1.0),
    ]


def test_nodes_yaml_without_pyyaml(monkeypatch):
    real_import = builtins.__import__

    def no_yaml(name, *a, **kw):
        if name == "yaml":
            raise ImportError("no yaml on this target")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_yaml)
    y = rs.parse_ray_nodes((RAY / "ray-2.52.1_nodes_2nodes.yaml").read_text())
    j = rs.parse_ray_nodes((RAY / "ray-2.52.1_nodes_2nodes.json").read_text())
    assert y == j


def test_dead_node_in_list():
    nodes = rs.parse_ray_nodes((RAY / "ray-2.52.1_nodes_worker_died.json").read_text())
    dead = [n for n in nodes if not n["alive"]]
    assert [(n["node_ip"], n["state"]) for n in dead] == [("127.0.0.3", "DEAD")]
    assert "missing too many heartbeats" in dead[0]["state_message"]


def test_table_format_is_refused_with_a_hint():
    with pytest.raises(rs.RayParseError, match="--format json"):
        rs.parse_ray_nodes((RAY / "ray-2.52.1_nodes_2nodes_table.txt").read_text())


def test_membership_prefers_the_node_list_and_never_counts_more_gpus_than_ray_status():
    """Ray 2.52.1 after a worker died: `ray status` lists 2 Active nodes (1.0 GPU), the GCS list 1 ALIVE."""
    membership, describe_membership = rs.membership, rs.describe_membership
    st = status("ray-2.52.1_status_worker_died.txt")
    nodes = rs.parse_ray_nodes((RAY / "ray-2.52.1_nodes_worker_died.json").read_text())
    only_status = membership(st, None)
    assert (only_status["nodes_alive"], only_status["gpus_total"]) == (2, 1.0)
    assert "can still hold a dead node" in only_status["source"]
    both = membership(st, nodes)
    assert (both["nodes_alive"], both["gpus_total"], both["dead_node_ips"]) == (1, 1.0, ["127.0.0.3"])
    # A node list that still counts a GPU ray status has dropped: the smaller figure wins.
    alive_both = [dict(n, alive=True) for n in nodes]
    assert membership(st, alive_both)["gpus_total"] == 1.0
    assert membership(None, alive_both)["gpus_total"] == 2.0
    assert describe_membership(both, 2, 2) == "1/2 nodes alive, 1.0/2.0 GPUs (0.0 used); dead: 127.0.0.3"
