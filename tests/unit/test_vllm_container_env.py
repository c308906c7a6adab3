"""The vLLM container's environment: the serving plan's (plugins/plugin_utils/serving.py), used by both
tasks of roles/vllm_serve/tasks/container.yml (the check-mode plan and the run)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1].parent
sys.path.insert(0, str(ROOT / "tests" / "unit" / "plugins" / "plugin_utils"))
from test_serving_plan import CLUSTER_DEFAULTS, plan_of  # noqa: E402

# Its tasks, the block that starts them (not for upgrade.yml's plan alone) flattened.
TASKS = [
    inner
    for t in yaml.safe_load((ROOT / "roles/vllm_serve/tasks/container.yml").read_text())
    for inner in (t.get("block") or [t])
]


def test_ray_log_dedup_is_off_so_the_last_rank_is_timed_when_it_prints():
    """Ray's driver-side dedup (on by default, 5 s window) holds back the second rank's start-up lines."""
    cluster, plan = plan_of()
    env = plan["deployments"][0]["members"][0]["vllm"]["env"]
    assert env["RAY_DEDUP_LOGS"] == "0"
    assert env["RAY_ADDRESS"] == "auto" and env["VLLM_HOST_IP"] == cluster["nodes"]["spark-1"]["primary"]["ip"]
    assert "VLLM_API_KEY" not in env  # the key is a file the middleware reads, never the container's config
    for name, value in CLUSTER_DEFAULTS["sparkops_container_cache_env"].items():
        assert env[name] == value


def test_a_profile_s_env_is_passed_but_cannot_move_the_host_ip():
    profiles = yaml.safe_load((ROOT / "roles/sparkops_defaults/defaults/main/serving_profiles.yml").read_text())
    profiles = profiles["sparkops_serving_profiles"]
    ref = profiles["qwen3-235b-a22b-gptq-int4-tp2"]
    mine = {**profiles, "mine": {**ref, "env": {"VLLM_LOGGING_LEVEL": "DEBUG", "VLLM_HOST_IP": "10.9.9.9"}}}
    cluster, plan = plan_of(profiles=mine, profile_name="mine")
    env = plan["deployments"][0]["members"][0]["vllm"]["env"]
    assert env["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert env["VLLM_HOST_IP"] == cluster["nodes"]["spark-1"]["primary"]["ip"]


def test_the_plan_and_the_runs_use_the_same_environment():
    """The three tasks of container.yml (the plan of every member, the API member's run, another rank's
    run) share one definition: the env the plan compares is the env that runs."""
    named = [t for t in TASKS if t.get("community.docker.docker_container", {}).get("state") == "started"]
    assert len(named) == 3
    assert all(t["community.docker.docker_container"] == named[0]["community.docker.docker_container"] for t in named)
    assert named[0]["community.docker.docker_container"]["env"] == "{{ vllm_serve_member.vllm.env }}"
    assert named[0]["community.docker.docker_container"]["command"] == "{{ vllm_serve_member.vllm.argv }}"
    assert named[0].get("check_mode") is True
    # The plan loops over every vLLM member under the name the runs read this node's member by.
    assert named[0]["loop"] == "{{ sparkops_cluster.serving.vllm_members }}"
    assert named[0]["loop_control"]["loop_var"] == "vllm_serve_member"
    assert all("loop" not in t for t in named[1:])
