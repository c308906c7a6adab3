"""The serving plan (plugins/plugin_utils/serving.py): one computation for every entry point.

The plan is built from the shipped defaults (roles/sparkops_defaults) on the inventories of
cluster_inventories.py; each test names what a user would see go wrong if the plan broke.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import ClusterError, build_cluster
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving import (
    build_serving,
    node_part,
    summary,
)
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving_profile import vllm_serve_args
from cluster_inventories import pair, ring, switch

ROOT = Path(__file__).resolve().parents[4]
DEFAULTS = ROOT / "roles/sparkops_defaults/defaults/main"
PROFILES = yaml.safe_load((DEFAULTS / "serving_profiles.yml").read_text())["sparkops_serving_profiles"]
_STACKS = yaml.safe_load((DEFAULTS / "stacks.yml").read_text())
_STACK = _STACKS["sparkops_stacks"][_STACKS["sparkops_stack"]]
# What versions.yml derives from the default stack (its values are templates over sparkops_stack_spec).
VERSIONS = {
    "sparkops_vllm_version": _STACK["vllm_version"],
    "spark_vllm_image_build_args": _STACK["image"]["build_args"],
}
CLUSTER_DEFAULTS = yaml.safe_load((DEFAULTS / "cluster.yml").read_text())
REF = "74c02c37c280c64d07119350a7d42225f1b154ba"  # the inventories' spark_vllm_image_ref
MODEL_COMMIT = "5157" + "0" * 35 + "1"
LOCKED_IMAGE = "0123456789abcdef0123456789abcdef01234567"


def plan_of(cluster_inputs=None, **inputs):
    cluster = build_cluster(cluster_inputs or pair())
    base = {
        "profile_name": "qwen3-235b-a22b-gptq-int4-tp2",
        "profiles": PROFILES,
        "vllm_version": VERSIONS["sparkops_vllm_version"],
        "container_names": CLUSTER_DEFAULTS["sparkops_container_names"],
        "container_cache_env": CLUSTER_DEFAULTS["sparkops_container_cache_env"],
        "image": {
            "source": "eugr",
            "name": "vllm-node",
            "repo": "https://github.com/eugr/spark-vllm-docker.git",
            "ref": REF,
            "build_args": VERSIONS["spark_vllm_image_build_args"],
        },
    }
    base.update(inputs)
    return cluster, build_serving(cluster, base)


def plan_of_only(cluster_inputs=None, **inputs):
    """The plan alone (plan_of without the cluster model)."""
    return plan_of(cluster_inputs, **inputs)[1]


def lock_for(profile="qwen3-235b-a22b-gptq-int4-tp2", ref=REF, revision="main", **image):
    return {
        "lock_version": 1,
        "image": {
            "source": "eugr",
            "repo": "https://github.com/eugr/spark-vllm-docker.git",
            "ref": ref,
            "build_args": VERSIONS["spark_vllm_image_build_args"],
            "registry_ref": "",
            **image,
        },
        "model": {
            "profile": profile,
            "id": PROFILES[profile]["model"],
            "revision": revision,
            "resolved_revision": MODEL_COMMIT,
        },
    }


def the_checkout_roles_tag(name, commit, build_args):
    """roles/spark_vllm_image/tasks/checkout.yml: name:commit[:12]-(build_args | to_json | hash('sha256'))[:8]."""
    return f"{name}:{commit[:12]}-{hashlib.sha256(json.dumps(build_args).encode()).hexdigest()[:8]}"


def test_the_reference_on_a_pair_is_ray_with_the_api_on_the_head_and_today_s_command_line():
    cluster, plan = plan_of()
    (dep,) = plan["deployments"]
    assert dep["executor"] == "ray" and dep["hosts"] == ["spark-1", "spark-2"]
    head, worker = dep["members"]
    assert (head["host"], head["role"], head["ray"]["head"]) == ("spark-1", "api", True)
    assert (worker["host"], worker["role"], worker["ray"]["head"], worker["vllm"]) == ("spark-2", "worker", False, None)
    # What vllm_serve ran before the plan existed: the profile's argv and the key middleware.
    today = vllm_serve_args(
        PROFILES["qwen3-235b-a22b-gptq-int4-tp2"], cluster["endpoint"]["bind"], cluster["endpoint"]["port"]
    ) + ["--middleware", "sparkops_vllm_auth.RequireApiKey"]
    assert head["vllm"]["argv"] == today
    assert (
        "--distributed-executor-backend" in today and today[today.index("--distributed-executor-backend") + 1] == "ray"
    )
    env = head["vllm"]["env"]
    assert env["RAY_ADDRESS"] == "auto" and env["RAY_DEDUP_LOGS"] == "0"
    assert env["VLLM_HOST_IP"] == cluster["nodes"]["spark-1"]["primary"]["ip"]
    assert env["SPARKOPS_API_KEY_FILE"] == "/opt/sparkops-auth/api_key" and "VLLM_API_KEY" not in env
    assert env["TRITON_CACHE_DIR"] == CLUSTER_DEFAULTS["sparkops_container_cache_env"]["TRITON_CACHE_DIR"]
    assert dep["model_cache_dir"].endswith("/hub/models--Qwen--Qwen3-235B-A22B-GPTQ-Int4")


def test_a_pinned_commit_names_the_image_exactly_as_the_image_role_does_without_a_clone():
    plan = plan_of_only()
    img = plan["deployments"][0]["image"]
    assert img["resolved"] is True
    assert img["image"] == the_checkout_roles_tag("vllm-node", REF, VERSIONS["spark_vllm_image_build_args"])
    other = plan_of_only(
        image={**plan_of()[1]["deployments"][0]["image"], "ref": REF, "build_args": ["--vllm-ref", "v0.20.0"]}
    )
    assert other["deployments"][0]["image"]["image"] != img["image"]  # other arguments, another image


def test_a_branch_is_resolved_by_the_lock_or_left_to_the_build():
    unlocked = plan_of_only(image={"source": "eugr", "name": "vllm-node", "ref": "main", "build_args": []})
    assert unlocked["deployments"][0]["image"]["resolved"] is False
    assert unlocked["deployments"][0]["image"]["image"] == ""
    lock = lock_for(ref="main", commit=LOCKED_IMAGE, build_args=[])
    branch = {"source": "eugr", "name": "vllm-node", "ref": "main", "build_args": [], "repo": lock["image"]["repo"]}
    locked = plan_of_only(
        image=branch,
        lock=lock,
    )
    assert locked["deployments"][0]["image"]["image"] == the_checkout_roles_tag("vllm-node", LOCKED_IMAGE, [])
    assert locked["deployments"][0]["image"]["id"] == ""  # the lock recorded no ID for this name
    tag = the_checkout_roles_tag("vllm-node", LOCKED_IMAGE, [])
    with_id = plan_of_only(
        image=branch,
        lock=lock_for(ref="main", commit=LOCKED_IMAGE, build_args=[], tag=tag, id="sha256:" + "e" * 64),
    )
    assert with_id["deployments"][0]["image"]["id"] == "sha256:" + "e" * 64


def test_with_a_lock_every_entry_point_serves_the_locked_model_commit():
    """serve.yml alone and site.yml hand the plan the same inventory and lock: same argv, same tag."""
    without = plan_of_only()
    with_lock = plan_of_only(lock=lock_for())
    argv = with_lock["deployments"][0]["members"][0]["vllm"]["argv"]
    assert argv[argv.index("--revision") + 1] == MODEL_COMMIT
    assert with_lock["deployments"][0]["profile_as_given"]["revision"] == MODEL_COMMIT
    assert with_lock["deployments"][0]["own_revision"] == "main"
    plain = without["deployments"][0]["members"][0]["vllm"]["argv"]
    assert plain[plain.index("--revision") + 1] == "main"
    # Two computations from the same inputs are the same plan (no hidden state between plays).
    assert plan_of(lock=lock_for())[1] == with_lock


def test_an_upgrade_plans_the_inventory_s_values_and_ignores_the_lock():
    lock = lock_for(ref="1" * 40, commit="1" * 40)
    with pytest.raises(ClusterError) as refused:
        plan_of(lock=lock)
    assert "pins what was deployed" in str(refused.value) and "image.ref" in str(refused.value)
    assert "playbooks/upgrade.yml" in str(refused.value)
    plan = plan_of_only(lock=lock, upgrade=True)
    dep = plan["deployments"][0]
    assert dep["image"]["commit"] == REF  # the inventory's ref, not the lock's commit
    argv = dep["members"][0]["vllm"]["argv"]
    assert argv[argv.index("--revision") + 1] == "main"


def test_the_mp_executor_runs_vllm_on_every_rank_with_the_head_as_master():
    cluster, plan = plan_of(executor="mp")
    dep = plan["deployments"][0]
    assert dep["executor"] == "mp"
    head_ip = cluster["nodes"]["spark-1"]["primary"]["ip"]
    r0, r1 = dep["members"]
    assert r0["ray"] is None and r1["ray"] is None
    for m in (r0, r1):
        argv = m["vllm"]["argv"]
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--node-rank") + 1] == str(m["rank"])
        assert argv[argv.index("--master-addr") + 1] == head_ip
        assert argv[argv.index("--master-port") + 1] == "29501"
        assert argv[argv.index("--distributed-executor-backend") + 1] == "mp"
        assert argv.count("--distributed-executor-backend") == 1
        # Without VLLM_HOST_IP vLLM's message queue binds the default route's address (the management LAN).
        assert m["vllm"]["env"]["VLLM_HOST_IP"] == cluster["nodes"][m["host"]]["primary"]["ip"]
        assert "RAY_ADDRESS" not in m["vllm"]["env"]
        # NCCL's lines to a file the fast-path proof reads (roles/fastpath/defaults: fastpath_nccl_log_globs).
        assert m["vllm"]["env"]["NCCL_DEBUG_FILE"].startswith("/tmp/ray/nccl-mp/")
    assert "--headless" not in r0["vllm"]["argv"] and "--headless" in r1["vllm"]["argv"]
    # A headless rank serves no API: no --host/--port (vllm/entrypoints/cli/serve.py:115-116).
    assert "--host" in r0["vllm"]["argv"] and "--host" not in r1["vllm"]["argv"] and "--port" not in r1["vllm"]["argv"]
    assert "--middleware" in r0["vllm"]["argv"] and "--middleware" not in r1["vllm"]["argv"]
    assert "SPARKOPS_API_KEY_FILE" not in r1["vllm"]["env"]  # a headless rank serves no HTTP
    assert [m["rank"] for m in node_part(plan, "spark-2")] == [1]


def test_a_single_node_profile_under_ray_keeps_ray_everywhere_and_vllm_on_the_head():
    plan = plan_of_only(profile_name="qwen3-30b-a3b")
    dep = plan["deployments"][0]
    assert dep["executor"] == "ray" and [m["ray"]["head"] for m in dep["members"]] == [True, False]
    assert "--distributed-executor-backend" not in dep["members"][0]["vllm"]["argv"]
    assert dep["members"][1]["vllm"] is None


def test_a_single_node_profile_without_ray_runs_alone_on_the_head():
    plan = plan_of_only(profile_name="qwen3-30b-a3b", executor="mp")
    dep = plan["deployments"][0]
    assert dep["executor"] == "single" and dep["hosts"] == ["spark-1"]
    (m,) = dep["members"]
    assert m["ray"] is None and "--distributed-executor-backend" not in m["vllm"]["argv"]
    assert "RAY_ADDRESS" not in m["vllm"]["env"]
    assert node_part(plan, "spark-2") == []


def test_every_problem_is_reported_at_once_with_preflight_s_messages():
    with pytest.raises(ClusterError) as err:
        plan_of(profile_name="no-such-profile", executor="slurm", gpus_per_node="two")
    text = str(err.value)
    assert "sparkops_serving_profile 'no-such-profile' is not a known profile" in text
    assert "sparkops_executor must be one of ray, mp" in text
    assert "sparkops_gpus_per_node must be an integer" in text
    gated = {**PROFILES, "gated-one": {**PROFILES["qwen3-30b-a3b"], "gated": True}}
    with pytest.raises(ClusterError) as err:
        plan_of(profiles=gated, profile_name="gated-one")
    assert "is a gated model and no Hugging Face token is set" in str(err.value)
    plan_of(profiles=gated, profile_name="gated-one", hf_token_set=True)
    plan_of(profiles=gated, profile_name="gated-one", weights_source="preseeded")
    greedy = {**PROFILES, "greedy": {**PROFILES["qwen3-30b-a3b"], "gpu_memory_utilization": 0.9}}
    with pytest.raises(ClusterError) as err:
        plan_of(profiles=greedy, profile_name="greedy", memory_floor_gib=20)
    assert "below the memory floor" in str(err.value)


def test_a_profile_the_pinned_vllm_refuses_is_named_even_when_another_is_served():
    broken = {**PROFILES, "typo": {**PROFILES["qwen3-30b-a3b"], "extra_args": ["--no-such-flag"]}}
    with pytest.raises(ClusterError) as err:
        plan_of(profiles=broken)
    text = str(err.value)
    # refused by the pinned release and by every other recorded one: broken everywhere, not another stack's
    assert "Serving profile 'typo' is refused by every stack's vLLM" in text and "--no-such-flag" in text


def test_a_rollback_plans_the_recorded_profile_and_image():
    """A record file of the single-deployment form (its top level only) is the first deployment's."""
    recorded = {**PROFILES["qwen3-235b-a22b-gptq-int4-tp2"], "max_num_seqs": 3}
    state = {"image": "vllm-node:0123456789ab-4a9d9006", "image_commit": LOCKED_IMAGE,
             "profile_name": "qwen3-235b-a22b-gptq-int4-tp2", "profile": recorded}  # fmt: skip
    plan = plan_of_only(records=state, rollback=True, upgrade=True)
    argv = plan["deployments"][0]["members"][0]["vllm"]["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "3"
    assert plan["image"]["image"] == "vllm-node:0123456789ab-4a9d9006" and plan["image"]["commit"] == LOCKED_IMAGE
    assert plan_of_only(records=state, upgrade=True)["image"]["image"] != plan["image"]["image"]


def test_a_registry_image_is_named_by_its_digest():
    digest = "ab" * 32
    plan = plan_of_only(
        image={"source": "registry", "name": "vllm-node", "registry_ref": f"nvcr.io/nvidia/vllm@sha256:{digest}"}
    )
    assert plan["deployments"][0]["image"]["image"] == f"vllm-node:registry-{digest[:12]}"
    by_tag = {"source": "registry", "name": "vllm-node", "registry_ref": "nvcr.io/nvidia/vllm:25.11"}
    tagged = plan_of_only(image=by_tag)
    assert tagged["deployments"][0]["image"]["resolved"] is False


@pytest.mark.parametrize("inventory", [switch(4), ring(4)], ids=["switch-4", "ring-4"])
def test_bigger_clusters_serve_tp2_on_the_head_and_the_next_node(inventory):
    plan = plan_of_only(inventory, executor="mp")
    dep = plan["deployments"][0]
    assert dep["hosts"] == ["spark-1", "spark-2"] and dep["nnodes"] == 2
    assert all(node_part(plan, h) == [] for h in ("spark-3", "spark-4"))
    ray = plan_of_only(inventory)
    assert [m["host"] for m in ray["deployments"][0]["members"] if m["ray"]] == [f"spark-{i}" for i in range(1, 5)]


def test_the_summary_shows_every_rank_s_command_line_and_the_exact_tag():
    plan = plan_of_only(executor="mp", lock=lock_for())
    text = "\n".join(summary(plan))
    assert the_checkout_roles_tag("vllm-node", REF, VERSIONS["spark_vllm_image_build_args"]) in text
    assert "spark-2 rank 1 (worker, sparkops-vllm): vllm serve" in text and "--headless" in text
    assert f"@ {MODEL_COMMIT}" in text and "executor mp" in text


# --- the profile refusals that site.yml runs on the simulated cluster used to prove, now on the plan -----
# (tests/integration/test_bad_inputs.py keeps a few of them to prove that the refusal changes no host).


def _bad(**changes):
    """The simulated cluster's profile under another name, with `changes` (the cases bad-input runs used)."""
    base = {**PROFILES["sim-tiny-tp2"], "served_model_name": "bad", **changes}
    return {"profiles": {**PROFILES, "bad": base}, "profile_name": "bad"}


PROFILE_REFUSALS = {
    "TP larger than the GPUs": (_bad(tensor_parallel_size=4), "tensor_parallel_size"),
    "enforce-eager": (_bad(extra_args=["--enforce-eager"]), "enforce-eager"),
    "gpu-memory-utilization 0.95": (_bad(gpu_memory_utilization=0.95), "gpu_memory_utilization <= 0.90"),
    "CUTLASS FP4": (_bad(quantization="modelopt_fp4", env={"VLLM_NVFP4_GEMM_BACKEND": "cutlass"}), "CUTLASS FP4"),
    "mxfp4 on a non-gpt-oss model": (
        _bad(quantization="mxfp4", moe_backend="marlin", env={"VLLM_NVFP4_GEMM_BACKEND": "marlin"}),
        "gpt-oss",
    ),
    "unknown rule in sparkops_allow_rules": (
        {**_bad(), "allow_rules": [{"rule": "no-such-rule", "reason": "x"}]},
        "'no-such-rule' is not a rule name",
    ),
    "allowed rule without a reason": (
        {**_bad(extra_args=["--enforce-eager"]), "allow_rules": [{"rule": "no-enforce-eager", "reason": ""}]},
        "allows no-enforce-eager without a reason",
    ),
    "FP8 checkpoint with FlashInfer attention": (
        _bad(quantization=None, weights_quantization="fp8", attention_backend="FLASHINFER"),
        "fp8-no-flashinfer-attention",
    ),
    "wrong type for TP": (_bad(tensor_parallel_size="two"), "must be an integer"),
    "model too big to fit": (_bad(weights_gib=400), "fit"),
}


@pytest.mark.parametrize("case", sorted(PROFILE_REFUSALS))
def test_a_bad_profile_is_refused_by_the_plan_with_what_to_fix(case):
    inputs, message = PROFILE_REFUSALS[case]
    with pytest.raises(ClusterError) as err:
        plan_of(**inputs)
    assert message in " ".join(str(err.value).split()), f"{case}: {err.value}"


def test_an_allowed_rule_is_served_and_said():
    inputs = {
        **_bad(extra_args=["--enforce-eager"]),
        "allow_rules": [{"rule": "no-enforce-eager", "reason": "measuring eager on GB10"}],
    }
    plan = plan_of_only(**inputs)
    dep = plan["deployments"][0]
    assert "--enforce-eager" in dep["members"][0]["vllm"]["argv"]
    assert any("measuring eager on GB10" in line for line in dep["allowed_rules"])


# ------------------------------------------------------------------- Ray's `ray start` (issue 24)
RAY_DEFAULTS = yaml.safe_load((DEFAULTS / "ray.yml").read_text())


def _ray_ports(ip):
    """The fixed part every node's `ray start` has (the shipped ports, one GPU)."""
    return [
        "ray", "start", "--block", "--disable-usage-stats", "--node-ip-address", ip, "--num-gpus", "1",
        "--node-manager-port", "6381", "--object-manager-port", "6382", "--metrics-export-port", "6383",
        "--dashboard-agent-grpc-port", "6384", "--dashboard-agent-listen-port", "52365",
        "--runtime-env-agent-port", "6385", "--min-worker-port", "20000", "--max-worker-port", "20999",
    ]  # fmt: skip


def _ray_inputs(**changes):
    """The plan's Ray inputs as cluster_facts reads them from the shipped defaults (ray.yml)."""
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving import RAY_OPTIONS

    out = {
        key: RAY_DEFAULTS[variable] for key, (variable, _default) in RAY_OPTIONS.items() if key != "ray_gpus_per_node"
    }
    out["ray_gpus_per_node"] = 1
    out.update(changes)
    return out


def test_the_ray_start_fallbacks_are_the_shipped_defaults():
    """One source of truth: a caller that gives no Ray option gets what roles/sparkops_defaults ships."""
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving import RAY_OPTIONS

    for variable, fallback in RAY_OPTIONS.values():
        assert variable in RAY_DEFAULTS, f"{variable} is not in roles/sparkops_defaults/defaults/main/ray.yml"
        if fallback is not None:
            assert fallback == RAY_DEFAULTS[variable], variable
    assert set(RAY_DEFAULTS) == {v for v, _default in RAY_OPTIONS.values()} | {"ray_cluster_gcs_port"}


def test_ray_start_on_the_head_and_a_worker_as_shipped():
    cluster, plan = plan_of(**_ray_inputs())
    head, worker = plan["deployments"][0]["members"]
    head_ip, worker_ip = (cluster["nodes"][h]["primary"]["ip"] for h in ("spark-1", "spark-2"))
    store = ["--object-store-memory", "1073741824"]
    assert head["ray"]["argv"] == [
        *_ray_ports(head_ip), *store, "--head", "--port", "6379",
        "--include-dashboard=true", "--dashboard-host", head_ip, "--dashboard-port", "8265",
    ]  # fmt: skip
    assert worker["ray"]["argv"] == [*_ray_ports(worker_ip), *store, "--address", f"{head_ip}:6379"]
    # The same plan without any Ray input (a caller that gives none) is the same command line.
    assert plan_of()[1]["deployments"][0]["members"][0]["ray"]["argv"] == head["ray"]["argv"]


def test_ray_start_without_the_dashboard_with_the_client_and_ray_s_own_object_store():
    cluster, plan = plan_of(
        pair(ray_cluster_gcs_port=7000),
        **_ray_inputs(ray_dashboard=False, ray_client="true", ray_client_port=10101, ray_object_store_bytes=""),
    )
    head, worker = plan["deployments"][0]["members"]
    head_ip = cluster["nodes"]["spark-1"]["primary"]["ip"]
    assert head["ray"]["argv"][len(_ray_ports(head_ip)) :] == [
        "--head", "--port", "7000", "--ray-client-server-port", "10101", "--include-dashboard=false",
    ]  # fmt: skip
    assert "--object-store-memory" not in head["ray"]["argv"]
    # A worker starts neither the dashboard nor the client server: it joins the head's GCS.
    assert worker["ray"]["argv"][len(_ray_ports(worker["ip"])) :] == ["--address", f"{head_ip}:7000"]


def test_ray_start_declares_the_gpus_and_an_object_store_of_its_own():
    plan = plan_of_only(**_ray_inputs(ray_gpus_per_node=2, ray_object_store_bytes=5000000))
    argv = plan["deployments"][0]["members"][1]["ray"]["argv"]
    assert argv[argv.index("--num-gpus") + 1] == "2"
    assert argv[argv.index("--object-store-memory") + 1] == "5000000"


def test_bad_ray_options_are_refused_with_the_variable_to_fix():
    with pytest.raises(ClusterError) as err:
        plan_of(
            **_ray_inputs(
                ray_dashboard="maybe", ray_object_store_bytes="1G", ray_min_worker_port=30000, ray_node_manager_port=0
            )
        )
    text = str(err.value)
    assert "ray_cluster_dashboard must be true or false, got 'maybe'" in text
    assert "ray_cluster_object_store_bytes must be a number of bytes or empty" in text
    assert "ray_cluster_min_worker_port (30000) is above ray_cluster_max_worker_port (20999)" in text
    assert "ray_cluster_node_manager_port must be within 1-65535, got 0" in text


def test_the_mp_executor_starts_no_ray():
    plan = plan_of_only(profile_name="qwen3-235b-a22b-gptq-int4-tp2", executor="mp")
    assert all(m["ray"] is None for m in plan["deployments"][0]["members"])


def test_the_gateway_listens_on_the_head_at_its_default_port_and_is_off_by_default():
    cluster, plan = plan_of()
    gw = plan["gateway"]
    head = cluster["head"]
    assert gw["host"] == head and gw["enabled"] is False
    assert gw["port"] == CLUSTER_DEFAULTS["sparkops_gateway_port"] == 4000
    assert gw["bind"] == "0.0.0.0"
    assert gw["url"] == f"http://{cluster['nodes'][head]['primary']['ip']}:4000"
    assert gw["client_url"] == f"http://{cluster['nodes'][head]['mgmt_address']}:4000"


def test_the_gateway_takes_its_port_bind_and_switch_from_the_inventory():
    cluster, plan = plan_of(gateway_enabled="true", gateway_port="4100", gateway_bind="10.0.0.11")
    assert plan["gateway"]["enabled"] is True
    assert plan["gateway"]["port"] == 4100
    assert plan["gateway"]["url"] == plan["gateway"]["client_url"] == "http://10.0.0.11:4100"


@pytest.mark.parametrize(
    ("bind", "said"),
    [
        (
            "203.0.113.9 --x",
            "sparkops_gateway_bind is '203.0.113.9 --x', which is none of the head spark-1's addresses",
        ),
        ("10.0.0.12", "sparkops_gateway_bind is '10.0.0.12', which is none of the head spark-1's addresses"),
        ("::", "sparkops_gateway_bind is '::', an IPv6 address."),
        ("fe80::1", "sparkops_gateway_bind is 'fe80::1', an IPv6 address."),
    ],
)
def test_a_gateway_bind_that_is_not_an_ipv4_address_of_the_head_is_refused(bind, said):
    with pytest.raises(ClusterError) as err:
        plan_of(gateway_bind=bind)
    (p,) = [p for p in err.value.problems if p.startswith("sparkops_gateway_bind")]
    assert p.startswith(said), p
    assert "192.168.100.11, 192.168.101.11, 10.0.0.11 or 0.0.0.0 (0.0.0.0: every IPv4 address)" in p


@pytest.mark.parametrize(
    ("inputs", "said"),
    [
        ({"gateway_port": 70000}, "sparkops_gateway_port must be within 1-65535"),
        ({"gateway_port": "x"}, "sparkops_gateway_port must be an integer"),
        ({"gateway_port": 8000}, "is vLLM's port on the head"),
        ({"gateway_enabled": "maybe"}, "sparkops_gateway_enabled must be true or false"),
    ],
)
def test_a_bad_gateway_setting_is_refused_with_its_name(inputs, said):
    with pytest.raises(ClusterError) as err:
        plan_of(**inputs)
    assert any(said in problem for problem in err.value.problems), err.value.problems


# ------------------------------------------------------------------ spark_vllm_image_ref before any clone
@pytest.mark.parametrize(
    "ref", ["v1';id>/tmp/x;'", "-c", "--upload-pack=touch /tmp/x", "a..b", "main\n", "x y", "a@{1}", ".hidden", "a/"]
)
def test_an_image_ref_that_is_no_plain_git_ref_is_refused_by_the_plan(ref):
    # The image role clones the ref (ansible.builtin.git version:): the plan refuses it first.
    with pytest.raises(ClusterError) as err:
        plan_of(image={**plan_inputs_image(), "ref": ref})
    (p,) = [p for p in err.value.problems if p.startswith("spark_vllm_image_ref")]
    assert p.startswith(f"spark_vllm_image_ref is {ref!r}, which is no git commit, branch or tag")


@pytest.mark.parametrize("ref", [REF, "main", "v0.19.0", "release/v1.2+cu130", "feature_x-y"])
def test_a_commit_branch_or_tag_is_taken(ref):
    plan = plan_of_only(image={**plan_inputs_image(), "ref": ref})
    assert plan["deployments"][0]["image"]["ref"] == ref


def plan_inputs_image():
    return {
        "source": "eugr",
        "name": "vllm-node",
        "repo": "https://github.com/eugr/spark-vllm-docker.git",
        "ref": REF,
        "build_args": VERSIONS["spark_vllm_image_build_args"],
    }
