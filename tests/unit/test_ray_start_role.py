"""roles/ray_cluster runs the serving plan's `ray start` (issue 24): no command line of its own.

The role's variables and tasks are templated by ansible-core's own Templar from the role files, with
the plan cluster_facts would set (plugins/plugin_utils/serving.py) for each node.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests/unit/plugins/plugin_utils"))
from cluster_inventories import switch  # noqa: E402
from role_templates import render_role  # noqa: E402
from test_serving_plan import plan_of  # noqa: E402

QWEN30 = "qwen3-30b-a3b"
TP2 = "qwen3-235b-a22b-gptq-int4-tp2"


def _task(name: str, file: str = "containers.yml") -> dict:
    tasks = yaml.safe_load((ROOT / "roles/ray_cluster/tasks" / file).read_text())
    (task,) = [t for t in tasks if t.get("name") == name]
    return task


def _render(expr, cluster: dict, plan: dict, host: str, **more):
    return render_role("ray_cluster", expr, cluster, plan, host, **more)


def test_each_node_runs_its_member_s_ray_start_and_the_head_tells_its_own_workers():
    cluster, plan = plan_of(
        switch(4),
        deployments=[
            {"name": "big", "profile": TP2, "hosts": ["spark-3", "spark-4"]},
            {"name": "code", "profile": QWEN30, "hosts": ["spark-1", "spark-2"]},
        ],
    )
    run, tell = _task("Run the Ray container"), _task("Tell the workers when the head's Ray started")
    members = {m["host"]: m for m in plan["deployments"][0]["replicas"][0]["members"]}
    for host in ("spark-3", "spark-4"):
        command = _render(run["community.docker.docker_container"]["command"], cluster, plan, host)
        assert command == members[host]["ray"]["argv"]
        assert _render("{{ ray_cluster_is_head | bool }}", cluster, plan, host) is (host == "spark-3")
    # The group's head (not the cluster's) hands its start time to its own Ray cluster's workers.
    assert _render(tell["loop"], cluster, plan, "spark-3") == ["spark-4"]
    assert members["spark-4"]["ray"]["argv"][-2:] == ["--address", f"{members['spark-3']['ip']}:6379"]


def test_today_s_plan_starts_ray_on_every_node_joined_to_the_cluster_head():
    cluster, plan = plan_of(switch(3))
    run = _task("Run the Ray container")
    head_ip = cluster["nodes"]["spark-1"]["primary"]["ip"]
    head = _render(run["community.docker.docker_container"]["command"], cluster, plan, "spark-1")
    assert head[:2] == ["ray", "start"] and "--head" in head
    for host in ("spark-2", "spark-3"):
        argv = _render(run["community.docker.docker_container"]["command"], cluster, plan, host)
        assert argv[-2:] == ["--address", f"{head_ip}:6379"] and "--head" not in argv
    tell = _task("Tell the workers when the head's Ray started")
    assert _render(tell["loop"], cluster, plan, "spark-1") == ["spark-2", "spark-3"]


def _waits(cluster: dict, plan: dict, host: str) -> list:
    """What wait.yml asks, group by group, as the host that runs it (run once) templates it: where it runs
    (delegate_to) and the module's arguments."""
    wait = _task("Wait for every node and GPU of each Ray group", "wait.yml")
    assert wait["run_once"] is True and wait["loop_control"]["loop_var"] == "ray_cluster_group"
    out = []
    for group in _render(wait["loop"], cluster, plan, host):
        args = _render(wait["sparkops.cluster.ray_cluster_status"], cluster, plan, host, ray_cluster_group=group)
        where = _render(wait["delegate_to"], cluster, plan, host, ray_cluster_group=group)
        out.append((where, args["gcs_address"], int(args["expected_nodes"]), float(args["expected_gpus"]),
                    args["expected_node_ips"]))  # fmt: skip
    return out


def test_the_wait_reads_each_ray_group_on_its_own_head_against_its_own_nodes():
    cluster, plan = plan_of(
        switch(4),
        deployments=[
            {"name": "big", "profile": TP2, "hosts": ["spark-3", "spark-4"]},
            {"name": "code", "profile": QWEN30, "hosts": ["spark-1", "spark-2"]},
        ],
    )
    ip = {h: n["primary"]["ip"] for h, n in cluster["nodes"].items()}
    # A TP=2 group on 2 of 4 nodes: 2 nodes, 2 GPUs, its own head's GCS, whichever node runs the task.
    for host in ("spark-3", "spark-4"):
        assert _waits(cluster, plan, host) == [
            ("spark-3", f"{ip['spark-3']}:6379", 2, 2.0, [ip["spark-3"], ip["spark-4"]])
        ]
    # Each replica of a deployment under Ray is a group of its own, each waited on from its own head.
    cluster, plan = plan_of(switch(4), deployments=[{"name": "big", "profile": TP2}])
    assert _waits(cluster, plan, "spark-1") == [
        ("spark-1", f"{ip['spark-1']}:6379", 2, 2.0, [ip["spark-1"], ip["spark-2"]]),
        ("spark-3", f"{ip['spark-3']}:6379", 2, 2.0, [ip["spark-3"], ip["spark-4"]]),
    ]


def test_the_wait_on_today_s_plan_expects_every_node_from_the_cluster_head():
    cluster, plan = plan_of(switch(3))
    ips = [cluster["nodes"][h]["primary"]["ip"] for h in cluster["hosts"]]
    assert _waits(cluster, plan, "spark-2") == [(cluster["head"], cluster["ray"]["address"], 3, 3.0, ips)]
