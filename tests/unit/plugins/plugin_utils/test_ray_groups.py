"""Ray groups on part of the cluster (issue 25): the serving plan's `ray_groups` and what reads them.

Each replica under Ray is a Ray cluster of its own: its head holds the GCS its workers join, and what
waits on Ray or reports its membership (ray_cluster's wait, verify, doctor, the health report, status)
reads each group on its own head against its own nodes, GPUs and node IPs. Without sparkops_deployments
there is one group, on every node of the cluster, headed by the cluster's head, as before groups.
"""

from __future__ import annotations

from ansible_collections.sparkops.cluster.plugins.filter.cluster import FilterModule
from ansible_collections.sparkops.cluster.plugins.plugin_utils import day2_checks as d
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving import node_part, ray_rows
from cluster_inventories import pair, ring, switch
from test_serving_plan import plan_of

TP2 = "qwen3-235b-a22b-gptq-int4-tp2"
QWEN30 = "qwen3-30b-a3b"


def _ip(cluster, host):
    return cluster["nodes"][host]["primary"]["ip"]


def _group(cluster, deployment, replica, hosts, gpus_per_node=1):
    head_ip = _ip(cluster, hosts[0])
    return {
        "deployment": deployment,
        "replica": replica,
        "name": f"{deployment} replica {replica}",
        "head": hosts[0],
        "head_ip": head_ip,
        "hosts": list(hosts),
        "gcs_address": f"{head_ip}:{cluster['ray']['port']}",
        "expected_nodes": len(hosts),
        "expected_gpus": len(hosts) * gpus_per_node,
        "node_ips": [_ip(cluster, h) for h in hosts],
    }


# ------------------------------------------------------------------------------------- the plan
def test_the_default_deployment_is_one_ray_group_on_every_node_headed_by_the_cluster_head():
    for inventory in (pair(), switch(3), ring(4)):
        cluster, plan = plan_of(inventory)
        (group,) = plan["ray_groups"]
        # Today's Ray cluster: every node, the cluster's head and its GCS address (the model's ray.address).
        assert group == _group(cluster, "main", 0, cluster["hosts"])
        assert group["head"] == cluster["head"] and group["gcs_address"] == cluster["ray"]["address"]
        assert sorted(group["hosts"]) == sorted(cluster["nodes"]) and plan["ray_used"] is True
    # The GPUs each node declares to Ray (ray_cluster_gpus_per_node) are what the group must reach.
    cluster, plan = plan_of(switch(3), ray_gpus_per_node=2)
    assert plan["ray_groups"][0]["expected_gpus"] == 6
    argv = node_part(plan, "spark-2")[0]["ray"]["argv"]
    assert argv[argv.index("--num-gpus") + 1] == "2"


def test_a_single_node_profile_on_the_default_deployment_still_runs_ray_on_every_node():
    cluster, plan = plan_of(switch(3), profile_name=QWEN30)
    (group,) = plan["ray_groups"]
    assert group["hosts"] == cluster["hosts"] and group["expected_nodes"] == 3


def test_no_ray_group_where_no_replica_runs_under_ray():
    assert plan_of(executor="mp")[1]["ray_groups"] == []
    _cluster, plan = plan_of(
        switch(4),
        deployments=[
            {"name": "big", "profile": TP2, "hosts": ["spark-1", "spark-2"], "executor": "mp"},
            {"name": "code", "profile": QWEN30, "hosts": ["spark-3", "spark-4"]},
        ],
    )
    assert plan["ray_groups"] == [] and plan["ray_used"] is False


def test_a_ray_group_on_two_of_four_nodes_expects_those_two():
    cluster, plan = plan_of(
        switch(4),
        deployments=[
            {"name": "big", "profile": TP2, "hosts": ["spark-3", "spark-4"]},
            {"name": "code", "profile": QWEN30, "hosts": ["spark-1", "spark-2"]},
        ],
    )
    (group,) = plan["ray_groups"]
    assert group == _group(cluster, "big", 0, ["spark-3", "spark-4"])
    # Not the cluster's head (spark-1, serving `code` alone): the group's own.
    assert group["head"] != cluster["head"] and group["gcs_address"] != cluster["ray"]["address"]
    for host in group["hosts"]:
        (member,) = node_part(plan, host)
        assert member["ray"]["address"] == group["gcs_address"]


def test_two_ray_groups_at_once_each_joined_to_its_own_head():
    cluster, plan = plan_of(
        switch(4),
        deployments=[
            {"name": "big", "profile": TP2, "hosts": ["spark-1", "spark-2"]},
            {"name": "other", "profile": "qwen3-235b-a22b-gptq-int4-tp2-alt", "hosts": ["spark-3", "spark-4"]},
        ],
        profiles=_with_alt(),
    )
    assert plan["ray_groups"] == [
        _group(cluster, "big", 0, ["spark-1", "spark-2"]),
        _group(cluster, "other", 0, ["spark-3", "spark-4"]),
    ]
    for group in plan["ray_groups"]:
        for host in group["hosts"]:
            (member,) = node_part(plan, host)
            assert member["ray"]["address"] == group["gcs_address"]
            assert member["ray"]["argv"][-2:] == ["--address", group["gcs_address"]] or member["ray"]["head"]


def test_each_replica_of_a_deployment_is_its_own_ray_group():
    cluster, plan = plan_of(switch(4), deployments=[{"name": "big", "profile": TP2}])
    assert plan["ray_groups"] == [
        _group(cluster, "big", 0, ["spark-1", "spark-2"]),
        _group(cluster, "big", 1, ["spark-3", "spark-4"]),
    ]


def _with_alt():
    from test_serving_plan import PROFILES  # noqa: PLC0415

    alt = dict(PROFILES[TP2])
    alt["served_model_name"] = "qwen3-235b-alt"
    return {**PROFILES, "qwen3-235b-a22b-gptq-int4-tp2-alt": alt}


# ------------------------------------------------------------------------------------- readers
def _reading(group, alive, gpus, **more):
    expected = group["expected_nodes"]
    summary = f"{alive}/{expected} nodes alive, {gpus:.1f}/{group['expected_gpus']:.1f} GPUs (0.0 used)"
    ready = alive == expected and gpus == group["expected_gpus"]
    return {"item": group, "ready": ready, "summary": summary, "nodes_alive": alive, "gpus_total": gpus, **more}


def test_one_group_s_ray_line_is_today_s():
    cluster, plan = plan_of()
    (group,) = plan["ray_groups"]
    (row,) = ray_rows([_reading(group, 2, 2.0)])
    assert row["line"] == "ray: ok: 2/2 nodes alive, 2.0/2.0 GPUs (0.0 used)"
    (bad,) = ray_rows([_reading(group, 1, 1.0, msg="Ray cluster after 30 s: 1/2 nodes alive")])
    assert bad["line"] == "ray: DEGRADED: 1/2 nodes alive, 1.0/2.0 GPUs (0.0 used)" and not bad["ready"]
    assert bad["msg"] == "Ray cluster after 30 s: 1/2 nodes alive" and bad["head"] == cluster["head"]


def test_several_groups_each_have_a_named_line_and_the_loop_var_is_followed():
    cluster, plan = plan_of(switch(4), deployments=[{"name": "big", "profile": TP2}])
    first, second = plan["ray_groups"]
    wait_results = [  # ray_cluster's wait.yml loops with loop_var ray_cluster_group
        {**_reading(first, 2, 2.0), "item": None, "ray_cluster_group": first, "ansible_loop_var": "ray_cluster_group"},
        {
            **_reading(second, 1, 1.0),
            "item": None,
            "ray_cluster_group": second,
            "ansible_loop_var": "ray_cluster_group",
        },
    ]
    rows = FilterModule().filters()["serving_ray_rows"](wait_results)
    assert [r["line"] for r in rows] == [
        "ray big replica 0 (spark-1, spark-2): ok: 2/2 nodes alive, 2.0/2.0 GPUs (0.0 used)",
        "ray big replica 1 (spark-3, spark-4): DEGRADED: 1/2 nodes alive, 1.0/2.0 GPUs (0.0 used)",
    ]
    assert [r["state"] for r in rows] == ["ok", "DEGRADED"]


def test_doctor_judges_each_group_against_its_own_nodes_and_gpus():
    cluster, plan = plan_of(
        switch(4),
        deployments=[
            {"name": "big", "profile": TP2, "hosts": ["spark-1", "spark-2"]},
            {"name": "code", "profile": QWEN30, "hosts": ["spark-3", "spark-4"]},
        ],
    )
    (group,) = plan["ray_groups"]
    # A group of 2 on a 4-node cluster: 2 alive is all (the cluster's size, 4, is not what it must reach).
    (v,) = d.check_rays([_reading(group, 2, 2.0)], 4, 4)
    assert (v["check"], v["scope"], v["verdict"]) == ("Ray membership", "cluster", "PASS")
    assert v["evidence"] == "2 of 2 nodes alive, 2 of 2 GPUs"
    # Two groups: one verdict each, named; the short one CRITICAL, its head named when unreadable.
    cluster, plan = plan_of(switch(4), deployments=[{"name": "big", "profile": TP2}])
    first, second = plan["ray_groups"]
    ok, short = d.check_rays([_reading(first, 2, 2.0), _reading(second, 1, 1.0, dead_node_ips=["10.9.9.9"])], 4, 4)
    assert (ok["scope"], ok["verdict"]) == ("big replica 0 (spark-1, spark-2)", "PASS")
    assert (short["scope"], short["verdict"]) == ("big replica 1 (spark-3, spark-4)", "CRITICAL")
    assert "1 of 2 nodes alive" in short["evidence"] and "10.9.9.9" in short["evidence"]
    _ok, gone = d.check_rays([_reading(first, 2, 2.0), {"item": second, "unreachable": True, "msg": "ssh"}], 4, 4)
    assert gone["verdict"] == "CRITICAL" and "spark-3" in gone["action"] and "ssh" in gone["evidence"]
    # Without Ray, and the one reading of before groups: as they were.
    (na,) = d.check_rays({"not_used": "no replica runs under Ray"}, 2, 2)
    assert na["verdict"] == d.NA
    (one,) = d.check_rays({"nodes_alive": 1, "gpus_total": 1.0}, 2, 2)
    assert (one["scope"], one["verdict"]) == ("cluster", "CRITICAL")
