"""The serving plan's settings at their bounds (plugins/plugin_utils/serving.py): the gateway's and the mp
master's ports at 1 and 65535, a number or a switch given as text a user can't mean, each refusal naming its
inventory variable; and the inventory variables the plan reads (renaming one silently ignores it in every
inventory that sets it)."""

from __future__ import annotations

import pytest
from ansible_collections.sparkops.cluster.plugins.plugin_utils import serving
from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import ClusterError
from test_serving_plan import PROFILES, plan_of


def refused(**inputs) -> list[str]:
    with pytest.raises(ClusterError) as err:
        plan_of(**inputs)
    return err.value.problems


@pytest.mark.parametrize("port", [1, 65535])
def test_the_gateway_port_may_be_either_end_of_the_range(port):
    _cluster, plan = plan_of(gateway_port=port)
    assert plan["gateway"]["port"] == port and plan["gateway"]["url"].endswith(f":{port}")


@pytest.mark.parametrize("port", [0, 65536])
def test_a_gateway_port_out_of_the_range_is_refused_with_it(port):
    assert f"sparkops_gateway_port must be within 1-65535, got {port}" in refused(gateway_port=port)


@pytest.mark.parametrize("port", [1, 65535])
def test_the_mp_master_port_may_be_either_end_of_the_range(port):
    plan_of(mp_master_port=port)  # no refusal


@pytest.mark.parametrize("port", [0, 65536])
def test_an_mp_master_port_out_of_the_range_is_refused_with_it(port):
    assert f"sparkops_mp_master_port must be within 1-65535, got {port}" in refused(mp_master_port=port)


def test_settings_of_the_wrong_kind_are_refused_naming_the_variable_and_the_value():
    assert "sparkops_gateway_port must be an integer, got True" in refused(gateway_port=True)
    assert "sparkops_node_memory_gib must be a number, got 'lots'" in refused(node_memory_gib="lots")
    assert "sparkops_gateway_enabled must be true or false, got 'maybe'" in refused(gateway_enabled="maybe")


@pytest.mark.parametrize(
    ("text", "on"),
    [("yes", True), ("On", True), ("1", True), ("no", False), ("off", False), ("0", False), (0, False)],
)
def test_a_switch_takes_the_words_yaml_and_ini_inventories_use(text, on):
    # "0" is an INI inventory's `sparkops_gateway_enabled=0`; 0 a YAML inventory's integer (read as its text).
    assert plan_of(gateway_enabled=text)[1]["gateway"]["enabled"] is on


def test_the_plan_reads_the_inventory_variables_the_docs_name():
    expected = {
        "profile_name": "sparkops_serving_profile",
        "deployments": "sparkops_deployments",
        "profiles": "sparkops_all_serving_profiles",
        "gpus_per_node": "sparkops_gpus_per_node",
        "node_memory_gib": "sparkops_node_memory_gib",
        "memory_overhead_gib": "sparkops_memory_host_overhead_gib",
        "memory_floor_gib": "sparkops_memory_floor_gib",
        "allow_rules": "sparkops_allow_rules",
        "vllm_version": "sparkops_vllm_version",
        "executor": "sparkops_executor",
        "mp_master_port": "sparkops_mp_master_port",
        "hf_home": "sparkops_hf_home",
        "gateway_enabled": "sparkops_gateway_enabled",
        "gateway_port": "sparkops_gateway_port",
        "gateway_bind": "sparkops_gateway_bind",
        "upgrade_deployment": "sparkops_deployment",
    }
    assert {key: serving.INPUT_VARIABLES.get(key) for key in expected} == expected
    image = {
        "source": "spark_vllm_image_source",
        "name": "spark_vllm_image_name",
        "repo": "spark_vllm_image_repo",
        "ref": "spark_vllm_image_ref",
        "build_args": "spark_vllm_image_build_args",
        "registry_ref": "spark_vllm_image_registry_ref",
    }
    assert {key: serving.IMAGE_VARIABLES.get(key) for key in image} == image


def test_a_registry_image_without_a_reference_yet_is_unresolved_and_names_none():
    out = serving.plan_image({"source": "registry", "name": "vllm-node"}, {}, upgrade=False)
    assert out["registry_ref"] == "" and out["resolved"] is False and out["tag"] == ""
    digest = "cd" * 32
    locked = {"image": {"registry_ref": f"nvcr.io/nvidia/vllm@sha256:{digest}"}}
    pinned = serving.plan_image({"source": "registry", "name": "vllm-node", "registry_ref": "x:1"}, locked, False)
    assert pinned["registry_ref"] == f"nvcr.io/nvidia/vllm@sha256:{digest}"  # the lock's digest wins
    assert pinned["resolved"] is True


def test_a_deployment_on_unknown_hosts_does_not_hide_the_next_deployments_problems():
    problems = refused(
        deployments=[
            {"name": "a", "profile": "qwen3-235b-a22b-gptq-int4-tp2", "hosts": ["nope"]},
            {"name": "b", "profile": "no-such-profile", "hosts": ["spark-1", "spark-2"]},
        ]
    )
    assert problems[0] == (
        "sparkops_deployments 'a': nope is not a host of group 'spark_cluster' (spark-1, spark-2): "
        "name hosts of the inventory"
    )
    assert problems[1].startswith("sparkops_deployments 'b': profile 'no-such-profile' is not a known profile.")


def test_every_ray_member_knows_the_nodes_of_its_ray_cluster():
    _cluster, plan = plan_of()
    dep = plan["deployments"][0]
    assert [m["ray"]["hosts"] for m in dep["members"]] == [dep["hosts"]] * len(dep["members"])


def test_an_mp_worker_runs_without_the_api_s_host_and_port_and_with_one_executor_flag():
    _cluster, plan = plan_of(executor="mp")
    api, worker = plan["deployments"][0]["members"]
    argv, api_argv = worker["vllm"]["argv"], api["vllm"]["argv"]
    assert "--host" not in argv and "--port" not in argv
    at = api_argv.index("--host")
    assert api_argv[at : at + 4] == ["--host", "192.168.100.11", "--port", "8000"]
    assert argv[:at] == api_argv[:at] and argv[at] == api_argv[at + 4]  # their values went with them
    for member in (api, worker):
        assert member["vllm"]["argv"].count("--distributed-executor-backend") == 1


def test_the_profile_as_given_is_the_inventory_s_with_the_revision_served():
    from test_serving_plan import PROFILES  # noqa: PLC0415

    dep = plan_of()[1]["deployments"][0]
    assert dep["profile_as_given"] == {**PROFILES[dep["profile_name"]], "revision": dep["profile"]["revision"]}


def test_a_replica_binds_its_primary_address_when_the_heads_bind_names_no_address_of_the_head():
    # vllm_serve_host set to an address the head does not hold (a VIP, say): a replica elsewhere binds its
    # own primary fast-link address, not an error.
    cluster, _plan = plan_of()
    cluster = dict(cluster, endpoint=dict(cluster["endpoint"], bind="10.9.9.9"))
    other = next(h for h in cluster["nodes"] if h != cluster["head"])
    ip = cluster["nodes"][other]["primary"]["ip"]
    port = cluster["endpoint"]["port"]
    assert serving._endpoint_on(cluster, other) == {
        "host": other,
        "bind": ip,
        "port": port,
        "url": f"http://{ip}:{port}",
    }


def test_a_rollback_of_two_deployments_plans_each_its_own_recorded_profile():
    # The record of each deployment joins the inventory's profiles: the second's must not drop the first's
    # (nor the profiles the inventory ships), or the first is refused as an unknown profile.
    two = [
        {"name": "chat", "profile": "gpt-oss-120b-mxfp4", "hosts": ["spark-1"]},
        {"name": "code", "profile": "qwen3-30b-a3b", "hosts": ["spark-2"]},
    ]
    image = "vllm-node:0123456789ab-4a9d9006"
    records = {
        "deployments": {
            d["name"]: {"profile_name": f"{d['profile']}-then", "image": image,
                        "profile": {**PROFILES[d["profile"]], "max_num_seqs": 3}}
            for d in two
        }
    }  # fmt: skip
    _cluster, plan = plan_of(deployments=two, records=records, rollback=True, upgrade=True)
    assert [d["profile_name"] for d in plan["deployments"]] == ["gpt-oss-120b-mxfp4-then", "qwen3-30b-a3b-then"]
    for dep in plan["deployments"]:
        argv = dep["members"][0]["vllm"]["argv"]
        assert argv[argv.index("--max-num-seqs") + 1] == "3", dep["name"]


# Equivalent mutants (tests/mutation/equivalents.py), nothing to pin:
# - build_serving's `first = served[0] if served else ({...}, None, None, 0)`: 0 -> 1 (and 0 -> -1, the 0
#   dropped). The plan reads only first[0] (the spec) and first[2] (the profile) of that tuple, never its
#   node count: no input tells them apart.
# - ray_groups' `rep['executor'] != 'ray' or not members`: or -> and (and either clause dropped). Its one
#   caller is build_serving, on its own plan, where a replica's members carry `ray` exactly when its executor
#   is ray (_replica_members sets member["ray"] for every member of a "ray" group and for no other, and a
#   group is never empty): both clauses are true or both false (test_serving_plan's
#   test_the_mp_executor_starts_no_ray: an mp replica's members carry no ray).


def test_a_dead_ray_node_is_in_the_row_the_health_report_and_status_show():
    # ray_cluster_status lists a node Ray's GCS holds dead; serving_report's health.json carries the row.
    _cluster, plan = plan_of()
    (group,) = plan["ray_groups"]
    dead = group["node_ips"][1]
    reading = {"item": group, "ready": False, "summary": "1/2 nodes alive", "nodes_alive": 1,
               "dead_node_ips": [dead], "missing_node_ips": [dead]}  # fmt: skip
    (row,) = serving.ray_rows([reading])
    assert row["dead_node_ips"] == [dead] and row["missing_node_ips"] == [dead] and row["state"] == "DEGRADED"
    (none_read,) = serving.ray_rows([{"item": group}])
    assert none_read["dead_node_ips"] == [] and none_read["missing_node_ips"] == []


def test_a_deployment_without_replicas_is_its_one_replica_for_each_node():
    # A deployment given without `replicas` (the form before replicas, as serving_targets and summary read
    # it too): each node still gets its member, as from the plan's one replica.
    _cluster, plan = plan_of()
    bare = {**plan, "deployments": [{k: v for k, v in plan["deployments"][0].items() if k != "replicas"}]}
    for host in ("spark-1", "spark-2"):
        assert serving.node_part(bare, host) == serving.node_part(plan, host) != []


@pytest.mark.parametrize(
    ("image", "shown"),
    [
        ({"source": "eugr", "name": "vllm-node", "ref": "main", "build_args": []},
         "vllm-node:<resolved by the image build from main>"),
        ({"source": "registry", "name": "vllm-node", "registry_ref": "nvcr.io/nvidia/vllm:25.11"},
         "vllm-node:<resolved by the image build from nvcr.io/nvidia/vllm:25.11>"),
    ],
    ids=["branch", "registry-tag"],
)  # fmt: skip
def test_a_plan_shown_before_its_image_is_resolved_says_what_resolves_it(image, shown):
    # A branch without a lock, or a registry tag without a digest: plan.yml shows the plan before the build.
    _cluster, plan = plan_of(image=image)
    assert plan["deployments"][0]["image"]["image"] == ""
    assert serving.summary(plan)[0].endswith(f"; image {shown}")
