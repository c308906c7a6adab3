"""The serving filters call the module_utils functions and fail the Ansible way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.filter.serving import FilterModule
from conftest import ROOT

PROFILE = {
    "model": "Qwen/Qwen3-30B-A3B",
    "model_family": "qwen3",
    "weights_gib": 56.9,
}


@pytest.fixture(scope="module")
def filters():
    return FilterModule().filters()


def test_filters_are_exposed(filters):
    assert set(filters) == {
        "serving_profile_violations",
        "serving_profiles_contract_violations",
        "vllm_serve_args",
        "normalize_serving_profile",
        "serving_allowed_rules",
        "serving_weight_repos",
        "watchdog_outdated",
    }


def test_weight_repos_names_the_drafter_after_the_model(filters):
    eagle = dict(
        PROFILE,
        revision="main",
        speculative_config={"method": "eagle3", "model": "org/head", "revision": "a" * 40, "num_speculative_tokens": 2},
    )
    assert filters["serving_weight_repos"](eagle) == [
        {"model": "Qwen/Qwen3-30B-A3B", "revision": "main", "what": "model"},
        {"model": "org/head", "revision": "a" * 40, "what": "drafter"},
    ]
    assert filters["serving_weight_repos"](PROFILE) == [
        {"model": "Qwen/Qwen3-30B-A3B", "revision": "main", "what": "model"}
    ]
    with pytest.raises(AnsibleFilterError, match="serving_weight_repos: a serving profile with a model"):
        filters["serving_weight_repos"]({"model_family": "x"})


def test_allow_rules_pass_through_every_rule_filter(filters):
    """sparkops_allow_rules reaches the pure code from each filter: an allowed rule is not refused."""
    eager = dict(PROFILE, extra_args=["--enforce-eager"])
    allow = [{"rule": "no-enforce-eager", "reason": "debugging a capture crash, ops, vllm-node:fc08740"}]
    assert filters["serving_profile_violations"](eager, 1) != []
    assert filters["serving_profile_violations"](eager, 1, allow_rules=allow) == []
    with pytest.raises(AnsibleFilterError, match="no-enforce-eager"):
        filters["vllm_serve_args"](eager, "0.0.0.0", 8000)
    assert "--enforce-eager" in filters["vllm_serve_args"](eager, "0.0.0.0", 8000, allow_rules=allow)
    lines = filters["serving_allowed_rules"](allow, "mine", eager)
    assert len(lines) == 1 and "debugging a capture crash" in lines[0] and "--enforce-eager" in lines[0]
    loose = dict(PROFILE, weights_quantization="nvfp4")
    cutlass = [{"rule": "no-cutlass-fp4", "reason": "validated"}]
    assert filters["serving_profiles_contract_violations"]({"x": loose}, "0.19.0") != {}
    assert filters["serving_profiles_contract_violations"]({"x": loose}, "0.19.0", allow_rules=cutlass) == {}
    bad = [{"rule": "no-enforce-eager", "reason": ""}]
    assert any("without a reason" in v for v in filters["serving_profile_violations"](eager, 1, allow_rules=bad))


def test_violations_filter(filters):
    assert filters["serving_profile_violations"](PROFILE, 1) == []
    bad = dict(PROFILE, tensor_parallel_size=2, extra_args=["--enforce-eager"])
    found = filters["serving_profile_violations"](bad, "1")
    assert any("--enforce-eager" in v for v in found)
    assert any("= 2 GPUs" in v for v in found)


def test_violations_filter_node_memory(filters):
    found = filters["serving_profile_violations"](PROFILE, 1, node_memory_gib=64)
    assert any("does not fit" in v for v in found)


def test_violations_filter_bad_gpus_total(filters):
    with pytest.raises(AnsibleFilterError, match="gpus_total"):
        filters["serving_profile_violations"](PROFILE, "many")


def test_normalize_filter(filters):
    out = filters["normalize_serving_profile"](PROFILE)
    assert out["served_model_name"] == "Qwen/Qwen3-30B-A3B"
    assert out["gpu_memory_utilization"] == 0.85
    with pytest.raises(AnsibleFilterError, match="tensor_parallel_size must be an integer"):
        filters["normalize_serving_profile"](dict(PROFILE, tensor_parallel_size="two"))


def test_vllm_serve_args_filter(filters):
    argv = filters["vllm_serve_args"](PROFILE, "0.0.0.0", "8000")
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-30B-A3B"]
    assert argv[argv.index("--port") + 1] == "8000"
    tp2 = filters["vllm_serve_args"](dict(PROFILE, tensor_parallel_size=2), "0.0.0.0", 8000, gpus_per_node=1)
    assert tp2[tp2.index("--distributed-executor-backend") + 1] == "ray"


def test_vllm_serve_args_filter_refuses_hard_rule(filters):
    with pytest.raises(AnsibleFilterError, match="gpu_memory_utilization 0.95"):
        filters["vllm_serve_args"](dict(PROFILE, gpu_memory_utilization=0.95), "0.0.0.0", 8000)


def _adhoc(expression: str) -> subprocess.CompletedProcess:
    """Evaluate a template with the real `ansible` CLI, resolving the filter by its FQCN."""
    cli = Path(sys.executable).with_name("ansible")
    if not cli.exists():
        pytest.skip("no ansible CLI next to this Python")
    return subprocess.run(
        [
            str(cli),
            "localhost",
            "-c",
            "local",
            "-i",
            "localhost,",
            "-m",
            "ansible.builtin.debug",
            "-a",
            f"msg={expression}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_filter_resolves_by_fqcn_in_ansible():
    profile = "{'model': 'a/b', 'model_family': 'x', 'weights_gib': 1, 'tensor_parallel_size': 2}"
    done = _adhoc("{{ " + profile + " | sparkops.cluster.vllm_serve_args('127.0.0.1', 8000) }}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--distributed-executor-backend" in done.stdout and "- ray" in done.stdout


def test_filter_error_stops_ansible():
    profile = "{'model': 'a/b', 'model_family': 'x', 'weights_gib': 1, 'extra_args': ['--enforce-eager']}"
    done = _adhoc("{{ " + profile + " | sparkops.cluster.vllm_serve_args('127.0.0.1', 8000) }}")
    assert done.returncode != 0
    assert "-55%" in done.stdout + done.stderr
