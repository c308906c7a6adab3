"""image_fanout: which hops carry the image stream, what each node runs, and how a hop's failure is named.

The edges come from the real cluster model (build_cluster over pair, switch and ring inventories), so a
change in the model's fan-out shows up here.
"""

from __future__ import annotations

import base64
import json
import shlex
import sys
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import image_fanout as fo
from ansible_collections.sparkops.cluster.plugins.modules import image_fanout as module

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "plugins" / "plugin_utils"))
sys.path.insert(0, str(ROOT / "tests" / "unit" / "plugins" / "plugin_utils"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

import cluster_inventories as inv  # noqa: E402
from cluster import build_cluster  # noqa: E402
from module_runner import run_module  # noqa: E402

SSH = ["ssh", "-i", "/root/.ssh/key", "-o", "BatchMode=yes"]


def image_of(inputs):
    return build_cluster(inputs)["image"]


def pairs(hops):
    return [(h["from"], h["to"]) for h in hops]


def test_pair_one_hop_to_the_worker():
    img = image_of(inv.pair())
    p = fo.plan(img["build_host"], img["fanout"], ["spark-2"])
    assert pairs(p["hops"]) == [("spark-1", "spark-2")]
    assert p["hops"][0]["ip"] == "192.168.100.12"
    assert p["loads"] == ["spark-2"]
    assert p["relay_only"] == []


def test_switch_of_four_is_a_tree_and_a_subtree_that_needs_nothing_gets_nothing():
    img = image_of(inv.switch(4))
    assert fo.tree_problems("spark-1", img["fanout"]) == []
    every = fo.plan("spark-1", img["fanout"], ["spark-2", "spark-3", "spark-4"])
    assert sorted(pairs(every["hops"])) == [("spark-1", "spark-2"), ("spark-1", "spark-3"), ("spark-2", "spark-4")]
    # Only spark-4 lacks it: spark-2 (its parent) relays without loading, spark-3 gets nothing.
    one = fo.plan("spark-1", img["fanout"], ["spark-4"])
    assert pairs(one["hops"]) == [("spark-1", "spark-2"), ("spark-2", "spark-4")]
    assert one["loads"] == ["spark-4"]
    assert one["relay_only"] == ["spark-2"]


def test_ring_of_four_two_chains_along_the_cables():
    model = build_cluster(inv.ring(4))
    img = model["image"]
    p = fo.plan("spark-1", img["fanout"], ["spark-2", "spark-3", "spark-4"])
    assert sorted(pairs(p["hops"])) == [("spark-1", "spark-2"), ("spark-1", "spark-4"), ("spark-2", "spark-3")]
    # Each hop's address is the receiver's end of a cable the sender is on (no copy routed through a third node).
    cable_ends = {(c["a"], c["b"], ln["b"]["ip"]) for c in model["cables"] for ln in c["lanes"]} | {
        (c["b"], c["a"], ln["a"]["ip"]) for c in model["cables"] for ln in c["lanes"]
    }
    for h in p["hops"]:
        assert (h["from"], h["to"], h["ip"]) in cable_ends, h


def test_ring_middle_node_holding_the_image_relays_only():
    img = image_of(inv.ring(4))
    p = fo.plan("spark-1", img["fanout"], ["spark-3", "spark-4"])  # spark-2 already has it
    assert sorted(pairs(p["hops"])) == [("spark-1", "spark-2"), ("spark-1", "spark-4"), ("spark-2", "spark-3")]
    assert sorted(p["loads"]) == ["spark-3", "spark-4"]
    assert p["relay_only"] == ["spark-2"]
    spec = fo.relay_spec(p, ssh=SSH, user="root", docker="docker", python="python3", timeout_s=60)
    assert "spark-2" not in spec["load"]
    assert spec["children"] == {"spark-1": ["spark-2", "spark-4"], "spark-2": ["spark-3"]}


def test_nothing_needed_nothing_sent():
    img = image_of(inv.ring(6))
    p = fo.plan("spark-1", img["fanout"], [])
    assert p == {"hops": [], "loads": [], "relay_only": [], "unreachable": []}
    # The source itself never "needs" the image from itself.
    assert fo.plan("spark-1", img["fanout"], ["spark-1"])["hops"] == []


def test_needed_node_outside_the_tree_is_unreachable():
    img = image_of(inv.pair())
    assert fo.plan("spark-1", img["fanout"], ["spark-9"])["unreachable"] == ["spark-9"]


def test_tree_problems_name_the_bad_edge():
    edges = [
        {"from": "a", "to": "b", "ip": "1"},
        {"from": "a", "to": "c", "ip": "2"},
        {"from": "b", "to": "c", "ip": "3"},
        {"from": "x", "to": "d", "ip": "4"},
        {"from": "a", "to": "e"},
    ]
    problems = fo.tree_problems("a", edges)
    assert "c is reached twice (again from b)" in problems
    assert "edge x -> d: x is never reached from a" in problems
    assert any("lacks from, to or ip" in p for p in problems)
    # Edges in any order: a child listed before its parent's own edge is still a tree.
    assert fo.tree_problems("a", [{"from": "b", "to": "c", "ip": "1"}, {"from": "a", "to": "b", "ip": "2"}]) == []


def test_hop_command_runs_the_relay_for_that_child_with_the_whole_plan():
    img = image_of(inv.ring(4))
    p = fo.plan("spark-1", img["fanout"], ["spark-2", "spark-3", "spark-4"])
    spec = fo.relay_spec(p, ssh=SSH, user="root", docker="docker", python="python3", timeout_s=60)
    argv = fo.hop_command(spec, "spark-2", "spark-3")
    assert argv[: len(SSH)] == SSH
    assert argv[len(SSH)] == f"root@{spec['ip']['spark-3']}"
    remote = shlex.split(argv[-1])
    assert remote[:3] == ["python3", "-c", fo.BOOT]
    # The relay that travels is the shipped file image_relay.py, whole.
    relay_file = Path(fo.image_relay.__file__)
    assert base64.b64decode(remote[3]) == relay_file.read_bytes()
    assert remote[4] == "spark-3"
    assert json.loads(base64.b64decode(remote[5])) == spec
    with pytest.raises(ValueError, match="does not send"):
        fo.hop_command(spec, "spark-4", "spark-3")
    # The relay re-sends itself with the same boot program the first hop used.
    assert fo.image_relay.ARGV_BOOT == fo.BOOT


def _child(frm, to, ip, rc=0, *, report=None, error=None, stderr=""):
    return {"from": frm, "to": to, "ip": ip, "rc": rc, "bytes": 10, "error": error, "stderr": stderr, "report": report}


def _node(name, load_ok=None, children=(), stderr=""):
    load = None if load_ok is None else {"ok": load_ok, "zstd_rc": 0, "rc": 0 if load_ok else 1, "stderr": stderr}
    return {"node": name, "load": load, "bytes": 10, "children": list(children)}


def test_flatten_names_the_failed_hop_and_keeps_what_loaded():
    report = _node(
        "s1",
        children=[
            _child(
                "s1",
                "s2",
                "10.1.0.2",
                report=_node(
                    "s2",
                    None,
                    [
                        _child(
                            "s2",
                            "s3",
                            "10.2.0.2",
                            255,
                            stderr="ssh: connect to host 10.2.0.2 port 22: No route to host",
                        )
                    ],
                ),
            ),
            _child("s1", "s4", "10.4.0.1", report=_node("s4", True)),
        ],
    )
    out = fo.flatten(report, ["s3", "s4"])
    assert out["loaded"] == ["s4"]
    assert [(h["from"], h["to"], h["ok"]) for h in out["hops"]] == [
        ("s1", "s2", True),
        ("s1", "s4", True),
        ("s2", "s3", False),
    ]
    (bad,) = out["failed"]
    msg = fo.describe_failure(bad)
    assert msg.startswith("s2 -> s3 (10.2.0.2): ssh exited 255")
    assert "No route to host" in msg


def test_flatten_a_load_that_failed_is_a_failed_hop():
    report = _node("s1", children=[_child("s1", "s2", "ip2", report=_node("s2", False, stderr="unexpected EOF"))])
    out = fo.flatten(report, ["s2"])
    assert out["loaded"] == []
    assert "docker load failed" in out["failed"][0]["error"]
    assert "unexpected EOF" in out["failed"][0]["error"]


def test_module_check_mode_reports_the_plan_and_runs_nothing():
    img = image_of(inv.switch(4))
    args = {
        "image": "vllm-node:x",
        "source": "spark-1",
        "edges": img["fanout"],
        "need": ["spark-4"],
        "docker": "/nonexistent/docker",
    }
    out = run_module(module, args, check_mode=True)
    assert not out.get("failed"), out
    assert out["changed"] is True
    assert out["plan"]["loads"] == ["spark-4"]
    assert out["loaded"] == []


def test_module_nothing_needed_is_not_changed():
    img = image_of(inv.pair())
    out = run_module(module, {"image": "i", "source": "spark-1", "edges": img["fanout"], "need": []})
    assert out["changed"] is False
    assert out["plan"]["hops"] == []


def test_module_refuses_a_tree_rooted_elsewhere():
    img = image_of(inv.pair())
    out = run_module(module, {"image": "i", "source": "spark-2", "edges": img["fanout"], "need": ["spark-1"]})
    assert out["failed"]
    assert "not a copy tree rooted at spark-2" in out["msg"]
    assert "sparkops_image_build_host" in out["msg"]
