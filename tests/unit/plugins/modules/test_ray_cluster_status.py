"""ray_cluster_status on recorded Ray 2.52.1 outputs (tests/fixtures/ray/README.md), given as text
or printed by a stand-in command that changes its answer between polls."""

from __future__ import annotations

import json
import shlex
import time

from ansible_collections.sparkops.cluster.plugins.modules import ray_cluster_status as mod
from conftest import FIXTURES
from module_runner import run_module

RAY = FIXTURES / "ray"


def fx(name: str) -> str:
    return (RAY / f"ray-2.52.1_{name}").read_text()


def sequence_command(tmp_path, *files: str) -> list[str]:
    """A command printing the n-th file on its n-th run (the last one from then on)."""
    counter = tmp_path / "count"
    paths = " ".join(shlex.quote(str(RAY / f"ray-2.52.1_{f}")) for f in files)
    script = (
        f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; "
        f'set -- {paths}; i=0; for f; do last=$f; [ $i -eq $n ] && break; i=$((i+1)); done; cat "$last"'
    )
    return ["sh", "-c", script]


def test_text_two_nodes_ready():
    r = run_module(mod, {"text": fx("status_2nodes.txt"), "expected_nodes": 2, "expected_gpus": 2}, check_mode=True)
    assert r.get("failed") is not True, r
    assert r["ready"] is True and r["changed"] is False
    assert (r["nodes_alive"], r["gpus_total"], r["gpus_used"]) == (2, 2.0, 0.0)
    assert r["polls"] == 1


def test_gpu_in_use_and_node_ips_from_list():
    r = run_module(
        mod,
        {
            "text": fx("status_2nodes_gpu_in_use.txt"),
            "nodes_text": fx("nodes_2nodes.json"),
            "expected_node_ips": ["127.0.0.2", "127.0.0.3"],
        },
    )
    assert r["ready"] is True, r
    assert (r["gpus_used"], r["gpus_reserved"]) == (1.0, 2.0)
    assert r["node_ips"] == ["127.0.0.2", "127.0.0.3"]
    assert r["missing_node_ips"] == []


def test_dead_worker_is_caught_by_gpus_even_though_status_lists_it():
    r = run_module(mod, {"text": fx("status_worker_dead.txt"), "expected_nodes": 2, "expected_gpus": 2})
    assert r["failed"] is True
    assert r["msg"].startswith("Ray cluster after 0 s: 2/2 nodes alive, 1.0/2.0 GPUs")


def test_dead_worker_named_from_node_list():
    r = run_module(
        mod,
        {
            "text": fx("status_worker_dead.txt"),
            "nodes_text": fx("nodes_worker_died.json"),
            "expected_nodes": 2,
            "expected_gpus": 2,
            "expected_node_ips": ["127.0.0.2", "127.0.0.3"],
        },
    )
    assert r["failed"] is True
    assert r["nodes_alive"] == 1
    assert r["missing_node_ips"] == ["127.0.0.3"] and r["dead_node_ips"] == ["127.0.0.3"]
    assert "Ray cluster after 0 s: 1/2 nodes alive, 1.0/2.0 GPUs" in r["msg"]
    assert "not joined: 127.0.0.3" in r["msg"] and "dead: 127.0.0.3" in r["msg"]


def test_node_list_alone_gives_gpus_and_ips():
    r = run_module(mod, {"text": fx("nodes_2nodes.json"), "expected_gpus": 2, "expected_nodes": 2})
    assert r["ready"] is True, r
    assert r["gpus_total"] == 2.0 and r["node_ips"] == ["127.0.0.2", "127.0.0.3"]


def test_expected_ips_without_ip_source_says_what_to_add():
    r = run_module(mod, {"text": fx("status_2nodes.txt"), "expected_node_ips": ["127.0.0.2"]})
    assert r["failed"] is True
    assert "add nodes_command" in r["msg"]


def test_polls_command_until_second_node_joins(tmp_path):
    cmd = sequence_command(tmp_path, "status_starting.txt", "status_1node.txt", "status_2nodes.txt")
    t0 = time.monotonic()
    r = run_module(
        mod, {"command": cmd, "expected_nodes": 2, "expected_gpus": 2, "wait_timeout_s": 10, "poll_interval_s": 0.05}
    )
    assert r["ready"] is True, r
    assert r["polls"] == 3
    assert time.monotonic() - t0 < 5


def test_wait_times_out_naming_the_missing_node(tmp_path):
    cmd = sequence_command(tmp_path, "status_1node.txt")
    nodes_cmd = ["cat", str(RAY / "ray-2.52.1_nodes_1node.json")]
    t0 = time.monotonic()
    r = run_module(
        mod,
        {
            "command": cmd,
            "nodes_command": nodes_cmd,
            "expected_nodes": 2,
            "expected_gpus": 2,
            "expected_node_ips": ["127.0.0.1", "10.0.0.2"],
            "wait_timeout_s": 0.6,
            "poll_interval_s": 0.1,
        },
    )
    took = time.monotonic() - t0
    assert r["failed"] is True
    assert r["msg"].startswith(
        "Ray cluster after 1 s: 1/2 nodes alive, 1.0/2.0 GPUs (0.0 used); not joined: 10.0.0.2"
    ), r["msg"]
    assert r["polls"] >= 3
    assert took < 3


def test_command_failure_is_reported():
    r = run_module(mod, {"command": ["sh", "-c", "echo 'Failed to connect to GCS' >&2; exit 1"]})
    assert r["failed"] is True
    assert "cannot read the Ray cluster" in r["msg"] and "rc=1" in r["msg"] and "Failed to connect to GCS" in r["msg"]


def test_command_timeout_is_bounded():
    t0 = time.monotonic()
    r = run_module(mod, {"command": ["sleep", "5"], "command_timeout_s": 0.3})
    assert r["failed"] is True and "did not finish within 0.3 s" in r["msg"]
    assert time.monotonic() - t0 < 3


def test_missing_binary():
    r = run_module(mod, {"command": ["definitely-not-ray-xyz", "status"]})
    assert r["failed"] is True and "not found" in r["msg"]


def test_result_is_json_clean():
    r = run_module(mod, {"text": fx("status_1node.txt")})
    assert r["ready"] is True and r["nodes_alive"] == 1
    json.dumps(r)


def test_status_and_verify_read_the_same_membership_from_one_function():
    """Issue 16.1: status.yml printed `2 nodes, 1.0 GPUs` (ray status only) while verify said 1/2 nodes.
    Read without expectations (as status does) and with them (as verify does), the same recorded
    outputs give the same alive nodes, GPUs and summary sentence."""
    common = {"text": fx("status_worker_dead.txt"), "nodes_text": fx("nodes_worker_died.json")}
    status_view = run_module(mod, common)
    verify_view = run_module(mod, {**common, "expected_nodes": 2, "expected_gpus": 2})
    assert verify_view["failed"] is True
    for key in ("nodes_alive", "gpus_total", "node_ips", "dead_node_ips"):
        assert status_view[key] == verify_view[key], key
    assert (status_view["nodes_alive"], status_view["gpus_total"]) == (1, 1.0)
    assert status_view["summary"] == "1 nodes alive, 1.0 GPUs (0.0 used); dead: 127.0.0.3"
    assert verify_view["summary"].startswith("1/2 nodes alive, 1.0/2.0 GPUs (0.0 used)")
    assert verify_view["summary"] in verify_view["msg"]
    assert status_view["source"] == "ray status and the GCS node list"


def test_container_builds_both_commands(tmp_path):
    """With `container`, the module runs ray status AND the GCS node list inside it (status.yml used to
    read `ray status` alone, whose Active list still held the dead worker)."""
    log = tmp_path / "argv"
    docker = tmp_path / "docker"
    docker.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        f'case "$4" in status) cat {RAY / "ray-2.52.1_status_worker_dead.txt"};; '
        f"*) cat {RAY / 'ray-2.52.1_nodes_worker_died.json'};; esac\n"
    )
    docker.chmod(0o755)
    import os

    old = os.environ["PATH"]
    os.environ["PATH"] = f"{tmp_path}:{old}"
    try:
        r = run_module(mod, {"container": "sparkops-ray", "gcs_address": "10.0.0.1:6379"})
    finally:
        os.environ["PATH"] = old
    # The two run side by side, so either may be logged first.
    calls = sorted(log.read_text().splitlines())
    assert len(calls) == 2, calls
    assert calls[0].startswith("exec sparkops-ray python3 -c import json, ray;")
    assert calls[1] == "exec sparkops-ray ray status --address 10.0.0.1:6379"
    assert r["nodes_alive"] == 1 and r["dead_node_ips"] == ["127.0.0.3"], r


def test_a_failing_node_list_is_reported_next_to_a_good_ray_status(tmp_path):
    """The node list runs alongside `ray status`; when it fails, membership is judged on `ray status`."""
    r = run_module(
        mod,
        {
            "command": sequence_command(tmp_path, "status_2nodes.txt"),
            "nodes_command": ["sh", "-c", "echo 'ray.init: no cluster' >&2; exit 3"],
            "expected_nodes": 2,
            "wait_timeout_s": 0,
        },
    )
    assert r["ready"] and r["source"].startswith("ray status (its Active list"), r
    good = run_module(
        mod,
        {
            "command": ["cat", str(RAY / "ray-2.52.1_status_2nodes.txt")],
            "nodes_command": ["cat", str(RAY / "ray-2.52.1_nodes_2nodes.json")],
            "expected_nodes": 2,
        },
    )
    assert good["source"] == "ray status and the GCS node list", good


def test_a_node_list_that_fails_once_is_read_again_until_the_ips_are_known(tmp_path):
    """CI stop 23: on a loaded ring of four, the GCS node list failed on the first poll while `ray status`
    answered; the wait failed at once as if no IP source existed. It must poll again instead."""
    counter = tmp_path / "nodes-count"
    nodes = RAY / "ray-2.52.1_nodes_2nodes.json"
    flaky_nodes = [
        "sh",
        "-c",
        f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; "
        f"[ $n -eq 0 ] && {{ echo 'GCS busy' >&2; exit 1; }}; cat {shlex.quote(str(nodes))}",
    ]
    ips = [n["node_ip"] for n in json.loads(nodes.read_text()) if n["state"] == "ALIVE"]
    r = run_module(
        mod,
        {
            "command": ["cat", str(RAY / "ray-2.52.1_status_2nodes.txt")],
            "nodes_command": flaky_nodes,
            "expected_nodes": 2,
            "expected_node_ips": ips,
            "wait_timeout_s": 5,
            "poll_interval_s": 0.05,
        },
    )
    assert r.get("failed") is not True and r["ready"] is True, r
    assert r["polls"] == 2, r


def test_a_node_list_that_never_answers_times_out_with_its_error(tmp_path):
    r = run_module(
        mod,
        {
            "command": ["cat", str(RAY / "ray-2.52.1_status_2nodes.txt")],
            "nodes_command": ["sh", "-c", "echo 'GCS busy' >&2; exit 1"],
            "expected_node_ips": ["127.0.0.1"],
            "wait_timeout_s": 0.3,
            "poll_interval_s": 0.1,
        },
    )
    assert r["failed"] is True and r["polls"] >= 2, r
    assert "GCS busy" in r["msg"], r["msg"]
