"""Serving profiles: every SM121 hard rule refused with its message, the reference argv exact."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving_profile import (
    KV_HEADROOM_GIB,
    PROFILE_FIELDS,
    contract_violations,
    normalize_profile,
    profile_violations,
    vllm_serve_args,
)
from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import load_contract
from conftest import ROOT

PROFILES_FILE = ROOT / "roles" / "sparkops_defaults" / "defaults" / "main" / "serving_profiles.yml"


@pytest.fixture(scope="module")
def profiles() -> dict:
    return yaml.safe_load(PROFILES_FILE.read_text())["sparkops_serving_profiles"]


@pytest.fixture
def reference(profiles) -> dict:
    return copy.deepcopy(profiles["qwen3-235b-a22b-gptq-int4-tp2"])


REFERENCE_ARGV = [
    "vllm",
    "serve",
    "Qwen/Qwen3-235B-A22B-GPTQ-Int4",
    "--revision",
    "main",
    "--served-model-name",
    "qwen3-235b-a22b",
    "--tensor-parallel-size",
    "2",
    "--pipeline-parallel-size",
    "1",
    "--enable-expert-parallel",
    "--quantization",
    "gptq_marlin",
    "--kv-cache-dtype",
    "fp8",
    "--attention-backend",
    "TRITON_ATTN",
    "--gpu-memory-utilization",
    "0.87",
    "--max-model-len",
    "32768",
    "--max-num-seqs",
    "16",
    "--max-num-batched-tokens",
    "8192",
    "--max-cudagraph-capture-size",
    "2048",
    "--enable-prefix-caching",
    "--distributed-executor-backend",
    "ray",
    "--host",
    "0.0.0.0",
    "--port",
    "8000",
]


def _one(violations: list[str], *needles: str) -> str:
    hits = [v for v in violations if all(n in v for n in needles)]
    assert len(hits) == 1, f"expected one violation with {needles}, got {violations}"
    return hits[0]


# ------------------------------------------------------------------------------- reference profile


def test_reference_passes_on_two_gpus(reference):
    assert profile_violations(reference, gpus_total=2) == []


def test_reference_argv_is_exact(reference):
    assert vllm_serve_args(reference, "0.0.0.0", 8000) == REFERENCE_ARGV


def test_reference_settings_match_the_seed(reference):
    p = normalize_profile(reference)
    assert p["weights_gib"] / p["tensor_parallel_size"] == pytest.approx(57.6, abs=0.1)
    assert p["gpu_memory_utilization"] == 0.87
    assert p["max_cudagraph_capture_size"] == 2048


def test_api_key_never_in_argv(reference):
    reference["env"] = {"SOME_SETTING": "x"}
    argv = vllm_serve_args(reference, "0.0.0.0", 8000)
    assert not any("api-key" in a or "API_KEY" in a for a in argv)
    reference["extra_args"] = ["--api-key", "secret"]
    with pytest.raises(ValueError, match="key file and middleware"):
        vllm_serve_args(reference, "0.0.0.0", 8000)
    reference["extra_args"] = []
    reference["env"] = {"vllm_api_key": "secret"}
    with pytest.raises(ValueError, match="VLLM_API_KEY would put the key in the container's config"):
        vllm_serve_args(reference, "0.0.0.0", 8000)


def test_every_shipped_profile_passes_on_its_own_gpu_count(profiles):
    for name, profile in profiles.items():
        world = profile["tensor_parallel_size"] * profile["pipeline_parallel_size"]
        assert profile_violations(profile, gpus_total=world) == [], name
        argv = vllm_serve_args(profile, "0.0.0.0", 8000)
        assert argv[:3] == ["vllm", "serve", profile["model"]], name
        assert ("--distributed-executor-backend" in argv) == (world > 1), name


def test_sim_profile_has_the_reference_argv_shape(profiles):
    sim = vllm_serve_args(profiles["sim-tiny-tp2"], "0.0.0.0", 8000)
    ref = vllm_serve_args(profiles["qwen3-235b-a22b-gptq-int4-tp2"], "0.0.0.0", 8000)
    assert [a for a in sim if a.startswith("--")] == [a for a in ref if a.startswith("--")]
    revision = sim[sim.index("--revision") + 1]
    assert len(revision) == 40 and int(revision, 16) >= 0


def test_gpt_oss_uses_marlin_moe(profiles):
    p = profiles["gpt-oss-120b-mxfp4"]
    argv = vllm_serve_args(p, "0.0.0.0", 8000)
    assert argv[argv.index("--quantization") + 1] == "mxfp4"
    assert argv[argv.index("--moe-backend") + 1] == "marlin"
    assert p["env"]["VLLM_MXFP4_USE_MARLIN"] == "1"


def test_nvfp4_profile_avoids_cutlass(profiles):
    p = profiles["qwen3.5-122b-a10b-nvfp4"]
    assert "NVFP4" in p["model"]
    assert p["moe_backend"] == "marlin"
    assert p["env"]["VLLM_NVFP4_GEMM_BACKEND"] == "marlin"
    # flipping it to the CUTLASS path is refused
    bad = copy.deepcopy(p)
    bad["moe_backend"] = "flashinfer_cutlass"
    assert any("CUTLASS FP4" in v for v in profile_violations(bad, gpus_total=1))


# ------------------------------------------------------------------------------------- hard rules


@pytest.mark.parametrize("arg", ["--enforce-eager", "--enforce-eager=true"])
def test_enforce_eager_refused(reference, arg):
    reference["extra_args"] = ["--trust-remote-code", arg]
    msg = _one(profile_violations(reference, gpus_total=2), "--enforce-eager")
    assert "-55%" in msg and "SM121" in msg and "remove" in msg
    with pytest.raises(ValueError, match="enforce-eager"):
        vllm_serve_args(reference, "0.0.0.0", 8000)


def test_enforce_eager_key_refused(reference):
    reference["enforce_eager"] = True
    msg = _one(profile_violations(reference, gpus_total=2), "enforce_eager")
    assert "-55%" in msg


@pytest.mark.parametrize("gmu", [0.91, 0.95, 1.0])
def test_gpu_memory_utilization_above_090_refused(reference, gmu):
    reference["gpu_memory_utilization"] = gmu
    msg = _one(profile_violations(reference, gpus_total=2), "gpu_memory_utilization")
    assert "0.9" in msg and "set 0.90 or less" in msg


@pytest.mark.parametrize("gmu", [0, -0.5, 1.5])
def test_gpu_memory_utilization_out_of_range_refused(reference, gmu):
    reference["gpu_memory_utilization"] = gmu
    msg = _one(profile_violations(reference, gpus_total=2), "gpu_memory_utilization")
    assert "(0, 1]" in msg
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        normalize_profile(reference)


def test_gpu_memory_utilization_090_allowed(reference):
    reference["gpu_memory_utilization"] = 0.90
    assert profile_violations(reference, gpus_total=2) == []


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"VLLM_NVFP4_GEMM_BACKEND": "cutlass"}, "VLLM_NVFP4_GEMM_BACKEND"),
        ({"VLLM_NVFP4_GEMM_BACKEND": "flashinfer-cutlass"}, "VLLM_NVFP4_GEMM_BACKEND"),
        ({"VLLM_USE_FLASHINFER_MOE_FP4": "1"}, "VLLM_USE_FLASHINFER_MOE_FP4"),
        ({"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS": 1}, "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS"),
        ({"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": True}, "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8"),
    ],
)
def test_cutlass_fp4_env_refused(reference, env, needle):
    reference["env"] = env
    msg = _one(profile_violations(reference, gpus_total=2), needle)
    assert "CUTLASS FP4" in msg and "Marlin" in msg


def test_cutlass_fp4_env_switched_off_allowed(reference):
    reference["env"] = {"VLLM_USE_FLASHINFER_MOE_FP4": "0", "VLLM_NVFP4_GEMM_BACKEND": "marlin"}
    assert profile_violations(reference, gpus_total=2) == []


def test_cutlass_moe_backend_refused_for_fp4_only(profiles):
    nvfp4 = copy.deepcopy(profiles["qwen3.5-122b-a10b-nvfp4"])
    nvfp4["moe_backend"] = "cutlass"
    _one(profile_violations(nvfp4, gpus_total=1), "moe_backend cutlass", "CUTLASS FP4")
    bf16 = copy.deepcopy(profiles["qwen3-30b-a3b"])
    bf16["moe_backend"] = "cutlass"  # not FP4: CUTLASS for BF16/FP8 MoE is not the rule's business
    assert profile_violations(bf16, gpus_total=1) == []


def test_cutlass_mxfp4_backend_in_extra_args_refused(profiles):
    oss = copy.deepcopy(profiles["gpt-oss-120b-mxfp4"])
    oss["extra_args"] = ["--mxfp4-backend", "CUTLASS"]
    msg = _one(profile_violations(oss, gpus_total=1), "--mxfp4-backend")
    assert "CUTLASS FP4" in msg


def test_mxfp4_outside_gpt_oss_refused(reference):
    reference["quantization"] = "mxfp4"
    msg = _one(profile_violations(reference, gpus_total=2), "mxfp4", "qwen3")
    assert "gpt-oss" in msg
    with pytest.raises(ValueError, match="mxfp4"):
        vllm_serve_args(reference, "0.0.0.0", 8000)


def test_mxfp4_for_gpt_oss_allowed(profiles):
    assert profile_violations(profiles["gpt-oss-120b-mxfp4"], gpus_total=1) == []


# --------------------------------------------------------------------------------- cluster checks


def test_tp_too_large_for_one_gpu_refused(reference):
    msg = _one(profile_violations(reference, gpus_total=1), "tensor_parallel_size 2")
    assert "= 2 GPUs" in msg and "has 1" in msg


def test_pipeline_parallel_counts(reference):
    reference["pipeline_parallel_size"] = 2
    _one(profile_violations(reference, gpus_total=2), "= 4 GPUs")
    assert profile_violations(reference, gpus_total=4) == []


def test_too_big_to_fit_refused(reference):
    # The reference on one node: 115.2 GiB + headroom > 128 x 0.87
    reference["tensor_parallel_size"] = 1
    reference["enable_expert_parallel"] = False
    msg = _one(profile_violations(reference, gpus_total=1), "does not fit")
    assert "115.2" in msg and f"{115.2 + KV_HEADROOM_GIB:.1f}" in msg
    assert f"{128 * 0.87:.1f}" in msg
    assert "tensor_parallel_size" in msg


def test_fit_depends_on_node_memory(reference):
    assert profile_violations(reference, gpus_total=2, node_memory_gib=128) == []
    msg = _one(profile_violations(reference, gpus_total=2, node_memory_gib=64), "does not fit")
    assert "57.6 GiB per GPU" in msg


def test_gpus_per_node_shares_node_memory(reference):
    msg = _one(profile_violations(reference, gpus_total=2, gpus_per_node=2), "does not fit")
    assert "/ 2 GPUs a node" in msg
    argv = vllm_serve_args(reference, "0.0.0.0", 8000, gpus_per_node=2)
    assert "--distributed-executor-backend" not in argv


def test_expert_parallel_needs_tp(reference):
    reference["tensor_parallel_size"] = 1
    reference["weights_gib"] = 50
    msg = _one(profile_violations(reference, gpus_total=2), "enable_expert_parallel")
    assert "tensor_parallel_size >= 2" in msg


# ------------------------------------------------------------------------------ keys and types


def test_unknown_key_refused(reference):
    reference["tensor_paralel_size"] = 2
    msg = _one(profile_violations(reference, gpus_total=2), "tensor_paralel_size")
    assert "unknown key" in msg and "extra_args" in msg


def test_wrong_type_refused(reference):
    reference["tensor_parallel_size"] = "two"
    msg = _one(profile_violations(reference, gpus_total=2), "tensor_parallel_size")
    assert "integer" in msg and "'two'" in msg
    with pytest.raises(ValueError, match="tensor_parallel_size must be an integer"):
        normalize_profile(reference)


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("enable_prefix_caching", "maybe", "true or false"),
        ("extra_args", "--foo --bar", "list of strings"),
        ("speculative_config", "mtp", "mapping"),
        ("env", {"BAD NAME": "1"}, "not a valid environment variable name"),
        ("max_num_seqs", True, "integer"),
        ("weights_gib", -1, "above 0"),
        ("revision", "a b", "without spaces"),
    ],
)
def test_other_type_errors(reference, key, value, needle):
    reference[key] = value
    _one(profile_violations(reference, gpus_total=2), key, needle)


def test_missing_required_keys(reference):
    del reference["model"]
    del reference["weights_gib"]
    with pytest.raises(ValueError) as exc:
        normalize_profile(reference)
    assert "model is required" in str(exc.value) and "weights_gib is required" in str(exc.value)


def test_normalize_fills_defaults_and_coerces():
    p = normalize_profile(
        {
            "model": "org/m",
            "model_family": "x",
            "weights_gib": "10",
            "tensor_parallel_size": "2",
            "env": {"A": 1, "B": True},
        }
    )
    assert set(p) == set(PROFILE_FIELDS)
    assert p["served_model_name"] == "org/m"
    assert p["tensor_parallel_size"] == 2 and p["weights_gib"] == 10.0
    assert p["env"] == {"A": "1", "B": "1"}
    assert p["revision"] == "main" and p["extra_args"] == [] and p["chat_template_kwargs"] == {}


def test_not_a_mapping():
    assert "must be a mapping" in profile_violations(["model"], gpus_total=1)[0]


def test_bad_cluster_arguments(reference):
    with pytest.raises(ValueError, match="gpus_total"):
        profile_violations(reference, gpus_total=0)
    with pytest.raises(ValueError, match="port"):
        vllm_serve_args(reference, "0.0.0.0", 70000)


# ------------------------------------------------------------------------------ argv details


def test_optional_flags_and_json(reference):
    reference["enable_prefix_caching"] = False
    reference["speculative_config"] = {"num_speculative_tokens": 1, "method": "mtp"}
    reference["chat_template_kwargs"] = {"enable_thinking": False}
    reference["extra_args"] = ["--trust-remote-code"]
    argv = vllm_serve_args(reference, "10.0.0.1", "8001")
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    assert argv[argv.index("--speculative-config") + 1] == '{"method":"mtp","num_speculative_tokens":1}'
    assert json.loads(argv[argv.index("--default-chat-template-kwargs") + 1]) == {"enable_thinking": False}
    assert argv[-5:] == ["--host", "10.0.0.1", "--port", "8001", "--trust-remote-code"]


def test_managed_flag_in_extra_args_refused(reference):
    reference["extra_args"] = ["--max-model-len", "1024"]
    msg = _one(profile_violations(reference, gpus_total=2), "--max-model-len")
    assert "set max_model_len instead" in msg


# --- profiles against the vLLM release they are served with (recorded contracts) ---------------------

VERSIONS_FILE = ROOT / "roles" / "sparkops_defaults" / "defaults" / "main" / "versions.yml"


def _pinned() -> str:
    return yaml.safe_load(VERSIONS_FILE.read_text())["sparkops_vllm_version"]


def test_every_shipped_profile_fits_the_pinned_vllm_contract(profiles):
    """Fails if a shipped profile uses an option, a value or a VLLM_* variable the pinned vLLM lacks."""
    contract = load_contract(_pinned())
    for name, profile in profiles.items():
        assert contract_violations(profile, contract) == [], name
        assert contract_violations(profile, contract, gpus_per_node=2) == [], name


def test_a_profile_with_an_option_the_pinned_vllm_lacks_is_refused(reference):
    contract = load_contract(_pinned())
    bad = dict(reference, extra_args=["--linear-backend", "marlin"], env={"VLLM_DISTRIBUTED_EXECUTOR_CONFIG": "{}"})
    found = contract_violations(bad, contract)
    assert any(f.startswith(f"--linear-backend: unrecognized argument for vLLM {_pinned()}") for f in found), found
    assert any(f.startswith("VLLM_DISTRIBUTED_EXECUTOR_CONFIG: vLLM") for f in found), found
    found = profile_violations(bad, 2, contract=contract)
    assert any("--linear-backend" in f for f in found), found


def test_fp4_knobs_are_the_ones_each_release_has(profiles):
    nvfp4 = profiles["qwen3.5-122b-a10b-nvfp4"]
    gptoss = profiles["gpt-oss-120b-mxfp4"]
    old, new = load_contract("0.19.0"), load_contract("0.33.0")
    assert contract_violations(nvfp4, old) == []
    on_new = contract_violations(nvfp4, new)
    # 0.33.0 dropped the env knobs: named as unknown, and the linear-layer rule asks for its new knob
    assert any(f.startswith("VLLM_NVFP4_GEMM_BACKEND: vLLM 0.33.0 does not read") for f in on_new), on_new
    assert any("add extra_args ['--linear-backend', 'marlin']" in f for f in on_new), on_new
    fixed = dict(nvfp4, env={"VLLM_MARLIN_USE_ATOMIC_ADD": "1"}, extra_args=["--linear-backend", "marlin"])
    assert contract_violations(fixed, new) == []
    assert any("VLLM_MXFP4_USE_MARLIN" in f for f in contract_violations(gptoss, new))
    # Marlin MoE must be pinned where the release has the option
    loose = dict(nvfp4, moe_backend=None)
    assert any("set moe_backend: marlin" in f for f in contract_violations(loose, old))


def test_a_release_without_the_knob_a_rule_needs_is_refused(profiles):
    """A vLLM with no --moe-backend and no FP4 env switches cannot keep FP4 off CUTLASS: refused, not passed."""
    old = copy.deepcopy(load_contract("0.19.0"))
    old["vllm_version"] = "0.0.1-test"
    del old["serve_options"]["--moe-backend"]
    old["env_vars"] = [n for n in old["env_vars"] if n not in ("VLLM_MXFP4_USE_MARLIN", "VLLM_NVFP4_GEMM_BACKEND")]
    nvfp4 = dict(profiles["qwen3.5-122b-a10b-nvfp4"], moe_backend=None, env={})
    found = contract_violations(nvfp4, old)
    assert any("vLLM 0.0.1-test has no knob to put FP4 MoE on Marlin" in f for f in found), found
    assert any("vLLM 0.0.1-test has no knob to put FP4 linear layers on Marlin" in f for f in found), found
    # a non-FP4 profile needs no such knob
    assert contract_violations(dict(profiles["qwen3-30b-a3b"]), old) == []
