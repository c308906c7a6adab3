"""The vLLM container's environment, rendered from the one place it is built (roles/vllm_serve/tasks/container.yml).

The expression is rendered with Jinja2 and a `combine` like Ansible's (a later dict wins), on the shipped defaults.
"""

from __future__ import annotations

import ast
from pathlib import Path

import jinja2
import yaml

ROOT = Path(__file__).resolve().parents[2]
TASKS = yaml.safe_load((ROOT / "roles/vllm_serve/tasks/container.yml").read_text())
CLUSTER = yaml.safe_load((ROOT / "roles/sparkops_defaults/defaults/main/cluster.yml").read_text())


def vllm_env(profile_env: dict | None = None) -> dict:
    expr = TASKS[0]["vars"]["vllm_serve_env"]
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["combine"] = lambda a, b: {**a, **b}
    text = env.from_string(expr).render(
        sparkops_container_cache_env=CLUSTER["sparkops_container_cache_env"],
        sparkops_profile={"env": profile_env or {}},
        sparkops_cluster={"nodes": {"head": {"primary": {"ip": "10.0.0.11"}}}},
        vllm_serve_head="head",
        vllm_serve_auth_env={"SPARKOPS_API_KEY_FILE": "/opt/sparkops-auth/api_key"},
    )
    return ast.literal_eval(text)


def test_ray_log_dedup_is_off_so_the_last_rank_is_timed_when_it_prints():
    """Ray's driver-side dedup (on by default, 5 s window) holds back the second rank's start-up lines."""
    env = vllm_env()
    assert env["RAY_DEDUP_LOGS"] == "0"
    assert env["RAY_ADDRESS"] == "auto" and env["VLLM_HOST_IP"] == "10.0.0.11"
    assert "VLLM_API_KEY" not in env  # the key is a file the middleware reads, never the container's config


def test_the_plan_and_the_run_use_the_same_environment():
    """Both tasks of container.yml share one definition: the env the plan compares is the env that runs."""
    named = [t for t in TASKS if "community.docker.docker_container" in t]
    assert len(named) == 2
    assert all(t["vars"]["vllm_serve_env"] == TASKS[0]["vars"]["vllm_serve_env"] for t in named)
    assert all(t["community.docker.docker_container"]["env"] == "{{ vllm_serve_env }}" for t in named)
