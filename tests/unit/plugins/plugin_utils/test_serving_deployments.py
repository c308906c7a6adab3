"""Deployments as data (issue 25): sparkops_deployments read by the serving plan.

Several deployments, each a profile on its own nodes, and replicas: a deployment whose hosts make K
groups of TP x PP nodes serves K replicas. Every refusal names the problem and how to fix it, all at
once. deployments[0] keeps the keys every consumer read before (its first replica).
"""

from __future__ import annotations

import json

import pytest
from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import ClusterError
from ansible_collections.sparkops.cluster.plugins.plugin_utils.lockfile import LOCK_VERSION, parse_lock
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving import node_part, summary, upgrade_strategy
from cluster_inventories import pair, ring, switch
from test_serving_plan import MODEL_COMMIT, PROFILES, lock_for, plan_of, plan_of_only

TP2 = "qwen3-235b-a22b-gptq-int4-tp2"
# Shipped single-node profiles (tensor_parallel_size 1, pipeline_parallel_size 1).
GPT_OSS = "gpt-oss-120b-mxfp4"
QWEN30 = "qwen3-30b-a3b"
FIRST_REPLICA_KEYS = ("hosts", "executor", "members", "api_host", "endpoint")


def _problems(*args, **inputs):
    with pytest.raises(ClusterError) as err:
        plan_of(*args, **inputs)
    return err.value.problems


def _one(problems, *needles):
    """The one problem that says every needle."""
    found = [p for p in problems if all(n in p for n in needles)]
    assert len(found) == 1, (needles, problems)
    return found[0]


# ------------------------------------------------------------------------------------- plans
def test_a_pair_serves_two_single_node_deployments_each_on_its_own_node():
    cluster, plan = plan_of(
        deployments=[
            {"name": "chat", "profile": GPT_OSS, "hosts": ["spark-1"]},
            {"name": "code", "profile": QWEN30, "hosts": ["spark-2"]},
        ]
    )
    chat, code = plan["deployments"]
    assert (chat["name"], chat["profile_name"], chat["served_model_name"]) == ("chat", GPT_OSS, "gpt-oss-120b")
    assert (code["name"], code["profile_name"], code["served_model_name"]) == ("code", QWEN30, "qwen3-30b-a3b")
    for dep, host in ((chat, "spark-1"), (code, "spark-2")):
        (replica,) = dep["replicas"]
        (member,) = replica["members"]
        ip = cluster["nodes"][host]["primary"]["ip"]
        # One node, one vLLM, no Ray: a single-node replica needs no executor across nodes.
        assert (replica["executor"], replica["hosts"], replica["head"]) == ("single", [host], host)
        assert (member["host"], member["role"], member["ray"]) == (host, "api", None)
        assert member["vllm"]["env"]["VLLM_HOST_IP"] == ip
        argv = member["vllm"]["argv"]
        # Each API on its own node's fast-link address, the same port (a node holds one deployment).
        assert argv[argv.index("--host") + 1] == ip
        assert argv[argv.index("--port") + 1] == str(cluster["endpoint"]["port"])
        assert argv[argv.index("--served-model-name") + 1] == dep["served_model_name"]
        assert replica["endpoint"]["url"] == f"http://{ip}:{cluster['endpoint']['port']}"
        # The keys every consumer reads are the first replica's.
        assert [dep[k] for k in FIRST_REPLICA_KEYS] == [
            replica["hosts"], replica["executor"], replica["members"], replica["head"], replica["endpoint"]
        ]  # fmt: skip
        assert dep["nnodes"] == 1 and dep["all_hosts"] == [host]
    # One image for the cluster; every node finds its own member in its deployment.
    assert chat["image"] == code["image"]
    assert [(m["deployment"], m["replica"], m["host"]) for m in node_part(plan, "spark-2")] == [("code", 0, "spark-2")]
    lines = summary(plan)
    assert any(line.startswith("deployment chat: profile gpt-oss-120b-mxfp4") for line in lines)
    assert any("replica 0: executor single on spark-2" in line for line in lines)


def test_a_four_node_switch_serves_tp2_on_two_nodes_and_two_replicas_of_a_single_node_profile():
    cluster, plan = plan_of(
        switch(4),
        deployments=[
            {"name": "big", "profile": TP2, "hosts": ["spark-1", "spark-2"]},
            {"name": "code", "profile": QWEN30, "hosts": ["spark-3", "spark-4"]},
        ],
    )
    big, code = plan["deployments"]
    (group,) = big["replicas"]
    head, worker = group["members"]
    head_ip = cluster["nodes"]["spark-1"]["primary"]["ip"]
    assert (group["executor"], group["hosts"], big["nnodes"]) == ("ray", ["spark-1", "spark-2"], 2)
    # Ray only on the group's nodes, the group's head holding the GCS.
    assert head["ray"]["head"] and not worker["ray"]["head"]
    assert head["ray"]["workers"] == ["spark-2"] and worker["ray"]["address"] == f"{head_ip}:6379"
    assert worker["ray"]["argv"][-2:] == ["--address", f"{head_ip}:6379"]
    assert head["vllm"]["argv"][head["vllm"]["argv"].index("--distributed-executor-backend") + 1] == "ray"
    # Two replicas of the single-node profile, each its own API on its own node.
    assert [r["hosts"] for r in code["replicas"]] == [["spark-3"], ["spark-4"]]
    assert [r["index"] for r in code["replicas"]] == [0, 1]
    urls = [r["endpoint"]["url"] for r in code["replicas"]]
    assert urls == [f"http://{cluster['nodes'][h]['primary']['ip']}:8000" for h in ("spark-3", "spark-4")]
    assert all(r["members"][0]["ray"] is None for r in code["replicas"])
    assert code["all_hosts"] == ["spark-3", "spark-4"] and code["hosts"] == ["spark-3"]
    assert [(m["deployment"], m["replica"]) for m in node_part(plan, "spark-4")] == [("code", 1)]
    assert node_part(plan, "spark-3")[0]["vllm"]["argv"] != node_part(plan, "spark-4")[0]["vllm"]["argv"]
    # A node's part is enough to run and watch its member: its replica's hosts and endpoint, its model.
    (own,) = node_part(plan, "spark-4")
    assert own["replica_hosts"] == ["spark-4"] and own["endpoint"]["url"] == urls[1]
    assert own["served_model_name"] == code["served_model_name"] and own["model_cache_dir"] == code["model_cache_dir"]
    (tp_worker,) = node_part(plan, "spark-2")
    assert tp_worker["replica_hosts"] == ["spark-1", "spark-2"] and tp_worker["endpoint"]["host"] == "spark-1"
    lines = summary(plan)
    assert "  replica 1: executor single on spark-4; API " + urls[1] + " on spark-4" in lines


def test_a_deployment_s_own_executor_runs_its_group_under_vllm_s_multi_node_executor():
    cluster, plan = plan_of(
        switch(4),
        executor="ray",
        deployments=[
            {"name": "big", "profile": TP2, "hosts": ["spark-3", "spark-4"], "executor": "mp"},
            {"name": "code", "profile": QWEN30, "hosts": ["spark-1"]},
        ],
    )
    group = plan["deployments"][0]["replicas"][0]
    head_ip = cluster["nodes"]["spark-3"]["primary"]["ip"]
    assert group["executor"] == "mp" and group["head"] == "spark-3"
    for rank, member in enumerate(group["members"]):
        argv = member["vllm"]["argv"]
        assert member["ray"] is None
        assert argv[argv.index("--master-addr") + 1] == head_ip
        assert argv[argv.index("--node-rank") + 1] == str(rank)
    assert "--headless" in group["members"][1]["vllm"]["argv"]


def test_no_deployments_is_today_s_one_plan_with_its_one_replica():
    for empty in (None, []):
        plan = plan_of_only(switch(4), deployments=empty)
        (dep,) = plan["deployments"]
        (replica,) = dep["replicas"]
        assert dep["name"] == "main" and dep["profile_name"] == TP2
        # Today's shape: Ray on every node, vLLM on the head.
        assert replica["executor"] == "ray" and replica["hosts"] == ["spark-1", "spark-2", "spark-3", "spark-4"]
        assert [dep[k] for k in FIRST_REPLICA_KEYS] == [
            replica["hosts"], replica["executor"], replica["members"], replica["head"], replica["endpoint"]
        ]  # fmt: skip
        assert "models" not in plan["lock"]["wanted"]


def test_a_deployment_without_hosts_or_profile_takes_every_node_and_the_selected_profile():
    plan = plan_of_only(pair(), profile_name=QWEN30, deployments=[{"name": "solo"}])
    (dep,) = plan["deployments"]
    assert dep["profile_name"] == QWEN30
    assert [r["hosts"] for r in dep["replicas"]] == [["spark-1"], ["spark-2"]]


# ------------------------------------------------------------------------------------- refusals
def test_a_node_in_two_deployments_is_refused():
    problems = _problems(
        deployments=[
            {"name": "chat", "profile": GPT_OSS, "hosts": ["spark-1"]},
            {"name": "code", "profile": QWEN30},
        ]
    )
    msg = _one(problems, "spark-1 is in two deployments")
    assert "'chat'" in msg and "'code'" in msg and "remove it from the hosts of one of them" in msg


def test_hosts_that_do_not_divide_into_tp_x_pp_groups_are_refused():
    problems = _problems(
        switch(4), deployments=[{"name": "big", "profile": TP2, "hosts": ["spark-1", "spark-2", "spark-3"]}]
    )
    msg = _one(problems, "do not divide into groups of 2 node(s)")
    assert "TP x PP = 2" in msg and "give it a multiple of 2 hosts" in msg


def test_a_profile_that_does_not_fit_its_nodes_is_refused():
    big = {**PROFILES[GPT_OSS], "weights_gib": 200, "served_model_name": "gpt-oss-big"}
    problems = _problems(
        profiles={**PROFILES, "big": big},
        deployments=[{"name": "chat", "profile": "big", "hosts": ["spark-1"]}],
    )
    msg = _one(
        problems, "Serving profile 'big' (sparkops_deployments 'chat': profile on 1 host(s)) is refused", "does not fit"
    )
    assert "Raise tensor_parallel_size or pipeline_parallel_size" in msg


def test_a_profile_that_breaks_the_memory_floor_is_refused_for_its_deployment():
    problems = _problems(memory_floor_gib=20, deployments=[{"name": "code", "profile": QWEN30, "hosts": ["spark-2"]}])
    msg = _one(
        problems, "Serving profile 'qwen3-30b-a3b' (sparkops_deployments 'code': profile on 1 host(s)) is refused"
    )
    assert "below the memory floor" in msg and "lower gpu_memory_utilization" in msg


def test_two_deployments_with_one_served_model_name_are_refused():
    problems = _problems(
        deployments=[
            {"name": "a", "profile": QWEN30, "hosts": ["spark-1"]},
            {"name": "b", "profile": QWEN30, "hosts": ["spark-2"]},
        ]
    )
    msg = _one(problems, "serve the same served model name 'qwen3-30b-a3b'")
    assert "'a'" in msg and "'b'" in msg and "give one of them another profile" in msg


@pytest.mark.parametrize(
    ("deployments", "needles"),
    [
        ([{"name": "Chat_1", "profile": QWEN30}], ("the name 'Chat_1' is malformed", "lower-case letters")),
        ([{"profile": QWEN30}], ("the name None is malformed", "(e.g. chat)")),
        ([{"name": "-chat", "profile": QWEN30}], ("the name '-chat' is malformed", "starting and ending")),
        (
            [{"name": "x", "profile": QWEN30, "hosts": ["spark-1"]}, {"name": "x", "hosts": ["spark-2"]}],
            ("the name 'x' is given twice", "give each deployment its own name"),
        ),
        ([{"name": "x", "hosts": ["spark-7"]}], ("spark-7 is not a host of group 'spark_cluster'", "name hosts of")),
        ([{"name": "x", "hosts": ["spark-1", "spark-1"]}], ("spark-1 is listed twice", "name each host once")),
        ([{"name": "x", "hosts": "spark-1"}], ("hosts must be a list of host names", "leave it out for every node")),
        ([{"name": "x", "replicas": 2}], ("unknown key(s) replicas", "takes name, profile, hosts, executor")),
        ([{"name": "x", "executor": "k8s"}], ("executor must be one of ray, mp, got 'k8s'",)),
        ([{"name": "x", "profile": "nope"}], ("'x': profile 'nope' is not a known profile", "_serving_profiles_extra")),
        ([{"name": "x", "profile": "nope", "hosts": ["spark-9"]}], ("'x': profile 'nope' is not a known profile",)),
        (["chat"], ("sparkops_deployments[0] must be a mapping with name, profile and hosts",)),
        ({"name": "x"}, ("sparkops_deployments must be a list of deployments", "leave it empty")),
    ],
)  # fmt: skip
def test_a_malformed_deployment_is_refused_with_what_to_fix(deployments, needles):
    _one(_problems(deployments=deployments), *needles)


def test_a_ring_group_whose_path_to_its_head_leaves_the_group_is_refused():
    problems = _problems(ring(4), deployments=[{"name": "big", "profile": TP2, "hosts": ["spark-1", "spark-3"]}])
    msg = _one(problems, "spark-3 reaches the group's head spark-1 over the fast links only through spark-2, spark-4")
    assert "ring order spark-1, spark-2, spark-3, spark-4" in msg and "are neighbours on the fast links" in msg
    # Neighbours on the ring make two groups, each cabled within itself.
    plan = plan_of_only(
        ring(4), deployments=[{"name": "big", "profile": TP2, "hosts": ["spark-2", "spark-3", "spark-4", "spark-1"]}]
    )
    assert [r["hosts"] for r in plan["deployments"][0]["replicas"]] == [["spark-2", "spark-3"], ["spark-4", "spark-1"]]


def test_every_problem_is_reported_at_once():
    problems = _problems(
        switch(4),
        deployments=[
            {"name": "big", "profile": TP2, "hosts": ["spark-1", "spark-2", "spark-3"]},
            {"name": "Bad", "profile": QWEN30, "hosts": ["spark-3", "spark-9"]},
            {"name": "c", "profile": QWEN30, "hosts": ["spark-4"]},
        ],
    )
    for needle in ("do not divide", "'Bad' is malformed", "spark-9 is not a host", "spark-3 is in two deployments",
                   "same served model name"):  # fmt: skip
        assert any(needle in p for p in problems), (needle, problems)


# ------------------------------------------------------------------------------------- the lock
def test_today_s_lock_still_loads_and_pins_the_deployment_named_main():
    # The lock as sparkops wrote it before deployments existed: one `model` (the default deployment,
    # "main"), no `models`.
    old = lock_for(QWEN30, revision="main")
    assert "models" not in old and old["lock_version"] == LOCK_VERSION
    lock = parse_lock(json.dumps(old))
    plan = plan_of_only(
        lock=lock,
        deployments=[
            {"name": "main", "profile": QWEN30, "hosts": ["spark-1"]},
            {"name": "chat", "profile": GPT_OSS, "hosts": ["spark-2"]},
        ],
    )
    main, chat = plan["deployments"]
    assert main["profile"]["revision"] == MODEL_COMMIT  # the lock's `model` is main's
    assert chat["profile"]["revision"] == "main"  # no record yet: its first run records it
    wanted = plan["lock"]["wanted"]
    assert wanted["model"] == {"profile": QWEN30, "id": PROFILES[QWEN30]["model"], "revision": "main"}
    assert wanted["models"] == {
        "main": {"profile": QWEN30, "id": PROFILES[QWEN30]["model"], "revision": "main"},
        "chat": {"profile": GPT_OSS, "id": PROFILES[GPT_OSS]["model"], "revision": "main"},
    }
    # The default plan on that lock asks for exactly what it records: a no-op run leaves it byte-identical.
    assert "deployment" not in plan_of_only(lock=lock, profile_name=QWEN30)["lock"]["wanted"]["model"]


def test_deployments_replacing_the_default_one_are_no_lock_conflict_and_are_not_pinned_by_it():
    """site.yml adds and removes deployments (issue 25): the default deployment "main" of a TP=2 profile
    replaced by two single-node ones is not an inventory drifting from the lock; the old `model` pins
    none of them, and the first names itself in the lock it will write."""
    lock = parse_lock(json.dumps(lock_for(TP2, revision="main")))
    with pytest.raises(ClusterError):  # the same profile change on "main" itself is still an upgrade's
        plan_of_only(lock=lock, deployments=[{"name": "main", "profile": QWEN30, "hosts": ["spark-1"]}])
    plan = plan_of_only(
        lock=lock,
        deployments=[
            {"name": "code", "profile": QWEN30, "hosts": ["spark-1"]},
            {"name": "chat", "profile": GPT_OSS, "hosts": ["spark-2"]},
        ],
    )
    assert [d["profile"]["revision"] for d in plan["deployments"]] == ["main", "main"]
    assert plan["lock"]["wanted"]["model"]["deployment"] == "code"
    # Once written, that lock holds "code" to its profile like the default's was held.
    written = {**lock_for(QWEN30), "model": {**lock_for(QWEN30)["model"], "deployment": "code"}}
    moved = [{"name": "code", "profile": GPT_OSS, "hosts": ["spark-1"]}]
    assert _one(_problems(lock=written, deployments=moved), "model.profile", "run playbooks/upgrade.yml")


def test_the_lock_holds_each_deployment_to_its_recorded_profile_by_name():
    deployments = [
        {"name": "code", "profile": QWEN30, "hosts": ["spark-1"]},
        {"name": "chat", "profile": GPT_OSS, "hosts": ["spark-2"]},
    ]
    recorded = {"profile": GPT_OSS, "id": PROFILES[GPT_OSS]["model"], "revision": "main", "resolved_revision": "c" * 40}
    lock = {**lock_for(QWEN30), "models": {"chat": recorded}}
    # The recorded commit of a moving revision is served.
    assert plan_of_only(lock=lock, deployments=deployments)["deployments"][1]["profile"]["revision"] == "c" * 40
    # Another profile for `chat` than the lock records is an upgrade's move.
    moved = [deployments[0], {**deployments[1], "profile": "qwen3.6-27b-fp8"}]
    msg = _one(_problems(lock=lock, deployments=moved), "models.chat.profile")
    assert '"gpt-oss-120b-mxfp4"' in msg and "run playbooks/upgrade.yml" in msg
    assert (
        plan_of_only(lock=lock, deployments=moved, upgrade=True)["deployments"][1]["profile_name"] == "qwen3.6-27b-fp8"
    )


# ------------------------------------------------------------------------ one deployment's upgrade
def test_an_upgrade_of_one_deployment_may_move_it_alone():
    """upgrade.yml -e sparkops_deployment=NAME: NAME's lock record moves; another deployment or the image
    (every deployment's) moving too is refused, naming what moved, before anything stops."""
    deployments = [
        {"name": "code", "profile": QWEN30, "hosts": ["spark-1"]},
        {"name": "chat", "profile": GPT_OSS, "hosts": ["spark-2"]},
    ]
    recorded = {"profile": GPT_OSS, "id": PROFILES[GPT_OSS]["model"], "revision": "main", "resolved_revision": "c" * 40}
    lock = {
        **lock_for(QWEN30),
        "model": {**lock_for(QWEN30)["model"], "deployment": "code"},
        "models": {"chat": recorded},
    }
    chat_moved = [deployments[0], {**deployments[1], "profile": "qwen3.6-27b-fp8"}]
    plan = plan_of_only(lock=lock, deployments=chat_moved, upgrade=True, upgrade_deployment="chat")
    assert plan["deployments"][1]["profile_name"] == "qwen3.6-27b-fp8"
    # Naming the other deployment leaves chat's move unaccounted for: refused, naming chat's record.
    msg = _one(
        _problems(lock=lock, deployments=chat_moved, upgrade=True, upgrade_deployment="code"),
        "sparkops_deployment=code upgrades code alone",
    )
    assert "models.chat.profile" in msg and "without sparkops_deployment" in msg
    # The first deployment's record is the lock's `model`: moving it under its own name is allowed.
    code_moved = [{**deployments[0], "profile": "qwen3.6-27b-fp8"}, deployments[1]]
    assert plan_of_only(lock=lock, deployments=code_moved, upgrade=True, upgrade_deployment="code")
    msg = _one(_problems(lock=lock, deployments=code_moved, upgrade=True, upgrade_deployment="chat"), "model.profile")
    # The image serves every deployment: never one deployment's upgrade.
    moved_image = {**lock, "image": {**lock["image"], "ref": "0" * 40}}
    msg = _one(
        _problems(lock=moved_image, deployments=chat_moved, upgrade=True, upgrade_deployment="chat"), "image.ref"
    )
    assert "One image serves every deployment" in msg
    # An unknown name is refused with the names there are.
    msg = _one(_problems(lock=lock, deployments=deployments, upgrade=True, upgrade_deployment="nope"), "'nope'")
    assert "code, chat" in msg
    # Outside an upgrade the name is the benchmark's and changes nothing here.
    assert plan_of_only(lock=lock, deployments=deployments, upgrade_deployment="nope")


def _switch_plan(gateway_enabled=True, code_hosts=("spark-3", "spark-4")):
    return plan_of_only(
        switch(4),
        gateway_enabled=gateway_enabled,
        deployments=[
            {"name": "big", "profile": TP2, "hosts": ["spark-1", "spark-2"]},
            {"name": "code", "profile": QWEN30, "hosts": list(code_hosts)},
        ],
    )


def test_two_single_node_replicas_behind_the_gateway_upgrade_blue_green_half_by_half():
    strategy = upgrade_strategy(_switch_plan(), "code")
    assert strategy["mode"] == "blue-green"
    green, blue = strategy["halves"]
    assert [(r["id"], r["host"]) for r in green] == [("code-0", "spark-3")]
    assert [(r["id"], r["host"]) for r in blue] == [("code-1", "spark-4")]


def test_three_replicas_replace_one_while_two_serve():
    plan = plan_of_only(
        switch(4),
        gateway_enabled=True,
        deployments=[{"name": "code", "profile": QWEN30, "hosts": ["spark-2", "spark-3", "spark-4"]}],
    )
    green, blue = upgrade_strategy(plan, "code")["halves"]
    assert [r["host"] for r in green] == ["spark-2"] and [r["host"] for r in blue] == ["spark-3", "spark-4"]


@pytest.mark.parametrize(
    ("name", "gateway", "code_hosts", "why"),
    [
        ("code", False, ("spark-3", "spark-4"), "the gateway is off"),
        ("code", True, ("spark-3",), "code has one replica"),
        ("big", True, ("spark-3", "spark-4"), "big has one replica"),
    ],
)
def test_without_a_second_replica_behind_the_gateway_the_upgrade_swaps_every_replica_at_once(
    name, gateway, code_hosts, why
):
    strategy = upgrade_strategy(_switch_plan(gateway, code_hosts), name)
    assert strategy["mode"] == "swap" and why in strategy["why"]
    (every,) = strategy["halves"]
    plan = _switch_plan(gateway, code_hosts)
    assert [r["id"] for r in every] == [f"{name}-{r['index']}" for d in plan["deployments"] if d["name"] == name
                                        for r in d["replicas"]]  # fmt: skip


def test_replicas_spanning_nodes_swap_rather_than_split_a_group():
    plan = plan_of_only(
        switch(4),
        gateway_enabled=True,
        deployments=[{"name": "big", "profile": TP2, "hosts": ["spark-1", "spark-2", "spark-3", "spark-4"]}],
    )
    strategy = upgrade_strategy(plan, "big")
    assert strategy["mode"] == "swap" and "span nodes" in strategy["why"]


def test_an_unknown_deployment_has_no_upgrade_strategy():
    with pytest.raises(ValueError, match="'nope' is no deployment of this cluster; it serves big, code"):
        upgrade_strategy(_switch_plan(), "nope")
