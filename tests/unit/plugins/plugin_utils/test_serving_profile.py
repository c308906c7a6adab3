"""Serving profiles: every SM121 hard rule refused with its message, the reference argv exact."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving_profile import (
    KV_HEADROOM_GIB,
    PROFILE_FIELDS,
    RULES,
    allowed_rule_warnings,
    check_allow_rules,
    contract_violations,
    normalize_profile,
    profile_findings,
    profile_violations,
    vllm_serve_args,
)
from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import load_contract, recorded_versions
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


# Shipped profiles refused on purpose, and the words of why (README's table says the same).
NOT_RECOMMENDED = {
    "qwen3.5-397b-a17b-nvfp4-tp2": ("not-recommended", "does not fit"),
    "qwen3-235b-a22b-gptq-int4-tp2-eagle3": ("not-recommended", "unvalidated on GB10"),
    # today's models on the vllm-0.33.0 stack: refused until a Spark measurement is recorded
    "glm-5.3-flash-nvfp4-tp2-mtp": ("not-recommended", "unmeasured on sparkops's stack"),
    "deepseek-v4-flash-tp2": ("not-recommended", "unmeasured on sparkops's stack", "mxfp4-only-gpt-oss"),
    "qwen3.8-27b-nvfp4-mtp": ("not-recommended", "unmeasured on sparkops's stack"),
}
NEEDS_NEWER_VLLM = {"nemotron-3-super-120b-a12b-nvfp4": "0.19.1"}


def test_every_shipped_profile_passes_on_its_own_gpu_count(profiles):
    for name, profile in profiles.items():
        world = profile["tensor_parallel_size"] * profile["pipeline_parallel_size"]
        found = profile_violations(profile, gpus_total=world)
        if name in NOT_RECOMMENDED:
            for needle in NOT_RECOMMENDED[name]:
                assert any(needle in f for f in found), (name, found)
            continue
        assert found == [], name
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
    # every default, as the argv and the rules read them
    assert {k: p[k] for k in PROFILE_FIELDS if k not in ("model", "model_family", "weights_gib", "env")} == {
        "revision": "main",
        "served_model_name": "org/m",
        "gated": False,
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 1,
        "enable_expert_parallel": False,
        "quantization": None,
        "weights_quantization": None,
        "kv_cache_dtype": "auto",
        "attention_backend": None,
        "moe_backend": None,
        "gpu_memory_utilization": 0.85,
        "max_model_len": 32768,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 8192,
        "max_cudagraph_capture_size": None,
        "enable_prefix_caching": True,
        "speculative_config": None,
        "chat_template_kwargs": {},
        "extra_args": [],
        "image": None,
        "min_vllm_version": None,
        "not_recommended": None,
    }


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

STACKS_FILE = ROOT / "roles" / "sparkops_defaults" / "defaults" / "main" / "stacks.yml"


def _pinned() -> str:
    """The default stack's vLLM (versions.yml derives sparkops_vllm_version from it)."""
    stacks = yaml.safe_load(STACKS_FILE.read_text())
    return stacks["sparkops_stacks"][stacks["sparkops_stack"]]["vllm_version"]


def test_every_shipped_profile_fits_the_contract_of_the_release_it_is_written_for(profiles):
    """Fails if a shipped profile uses an option, a value or a VLLM_* variable its vLLM lacks: the pinned
    release, or the one its min_vllm_version names when that release has a recorded contract (0.33.0)."""
    recorded = set(recorded_versions())
    for name, profile in profiles.items():
        wanted = profile.get("min_vllm_version")
        version = wanted if wanted in recorded else _pinned()
        contract = load_contract(version)
        assert contract_violations(profile, contract) == [], (name, version)
        assert contract_violations(profile, contract, gpus_per_node=2) == [], (name, version)


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
    # (prefix caching on: the 0.33.0 contract was recorded from `--help`, which hides --no-enable-prefix-caching,
    # registered but hidden by EnableDisableAction; that gap is not what this test is about)
    fixed = dict(
        nvfp4,
        env={"VLLM_MARLIN_USE_ATOMIC_ADD": "1"},
        extra_args=["--linear-backend", "marlin"],
        enable_prefix_caching=True,
    )
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


# ------------------------------------------------------------------ issue 31: new profiles and rules
def test_every_shipped_profile_passes_the_memory_plan(profiles):
    """The node keeps its floor under every shipped profile (sparkops_defaults: 128 GiB, 6 overhead, 4 floor)."""
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.day2_checks import memory_plan_problems

    for name, profile in profiles.items():
        assert memory_plan_problems(profile, 128.0, 6.0, 4.0) == [], name


def test_the_pinned_vllm_refuses_a_profile_written_for_a_newer_one(profiles):
    contract = load_contract(_pinned())
    for name, version in NEEDS_NEWER_VLLM.items():
        profile = profiles[name]
        found = profile_violations(profile, 1, contract=contract)
        assert any(f"needs vLLM {version} or newer" in f and profile["image"] in f for f in found), found
        assert any("until the pin moves" in f for f in found), found
        # the flags themselves are in the pinned contract: only the version holds it back
        assert contract_violations(profile, contract) == [], name
        # allowing every rule does not let it through: a version refusal is not a rule
        everything = [{"rule": r, "reason": "test"} for r in RULES]
        assert profile_violations(profile, 1, contract=contract, allow_rules=everything) != []
        newer = dict(contract, vllm_version=version)
        assert profile_violations(profile, 1, contract=newer) == [], name
    other = profiles["qwen3.6-35b-a3b-fp8"]
    assert profile_violations(other, 1, contract=contract) == []


def test_new_profiles_carry_what_their_sources_ran(profiles):
    mtp = profiles["qwen3.5-122b-a10b-nvfp4-mtp"]
    argv = vllm_serve_args(mtp, "0.0.0.0", 8000)
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {"method": "mtp", "num_speculative_tokens": 2}
    assert mtp["model"] == "Sehyo/Qwen3.5-122B-A10B-NVFP4"
    for flag, value in (("--max-model-len", "131072"), ("--max-num-seqs", "4"), ("--gpu-memory-utilization", "0.9")):
        assert argv[argv.index(flag) + 1] == value
    assert argv[argv.index("--tool-call-parser") + 1] == "qwen3_coder"
    nemotron = profiles["nemotron-3-super-120b-a12b-nvfp4"]
    assert nemotron["image"] == "vllm/vllm-openai:cu130-nightly"
    assert (nemotron["gpu_memory_utilization"], nemotron["max_model_len"], nemotron["max_num_seqs"]) == (
        0.85,
        131072,
        4,
    )
    for name in ("qwen3.6-35b-a3b-fp8", "qwen3.6-27b-fp8"):
        assert profiles[name]["attention_backend"] == "TRITON_ATTN", name
    for name, profile in profiles.items():
        if name.startswith("sim-"):
            continue
        assert profile["revision"] == "main", name  # resolved and locked at the first deployment


def _fp8(reference, **kw):
    return dict(reference, quantization=None, weights_quantization="fp8", enable_expert_parallel=False, **kw)


@pytest.mark.parametrize("backend", ["FLASHINFER", "flashinfer", "FLASHINFER_MLA", "FLASHINFER_MLA_SPARSE"])
def test_fp8_with_flashinfer_attention_refused(reference, backend):
    found = profile_violations(_fp8(reference, attention_backend=backend), 2)
    assert len(found) == 1 and "fp8-no-flashinfer-attention" in found[0], found
    assert "use attention_backend: TRITON_ATTN" in found[0]


def test_fp8_rule_keys_on_quantization_flag_too(reference):
    for quant in ("fp8", "fbgemm_fp8", "ptpc_fp8", "modelopt", "modelopt_fp8", "fp8_e4m3"):
        p = dict(reference, quantization=quant, attention_backend="FLASHINFER")
        assert any("fp8-no-flashinfer-attention" in f for f in profile_violations(p, 2)), quant
    p = dict(reference, quantization="fp8", env={"VLLM_ATTENTION_BACKEND": "FLASHINFER"})
    assert any("env VLLM_ATTENTION_BACKEND=FLASHINFER" in f for f in profile_violations(p, 2))


def test_fp8_without_an_attention_backend_refused(reference):
    found = profile_violations(_fp8(reference, attention_backend=None), 2)
    assert len(found) == 1 and "attention_backend is unset on an FP8 checkpoint" in found[0], found


def test_fp8_with_triton_and_non_fp8_with_flashinfer_pass(reference):
    assert profile_violations(_fp8(reference, attention_backend="TRITON_ATTN"), 2) == []
    # a GPTQ-Int4 model (fp8 only in its KV cache) may use FlashInfer attention
    assert profile_violations(dict(reference, attention_backend="FLASHINFER"), 2) == []


def test_a_name_that_says_fp4_or_fp8_needs_weights_quantization(reference):
    for model, needle in (
        ("org/Some-NVFP4", "weights_quantization: nvfp4"),
        ("org/Some-FP8", "weights_quantization: fp8"),
    ):
        found = profile_violations(dict(reference, model=model, quantization=None), 2)
        assert len(found) == 1 and needle in found[0], found
        # stating it (whatever it is) satisfies the check; the rules then key on what was stated
        assert profile_violations(dict(reference, model=model, quantization=None, weights_quantization="gptq"), 2) == []


# ------------------------------------------------------------------ issue 30: serving_profile survivors
def test_the_fp4_rule_keys_on_quantization_not_the_name(profiles):
    """gpt-oss's name has no 'fp4': only quantization mxfp4 makes a CUTLASS MoE backend a CUTLASS FP4 kernel."""
    gptoss = dict(profiles["gpt-oss-120b-mxfp4"], moe_backend="flashinfer_cutlass")
    assert "fp4" not in gptoss["model"].lower()
    found = profile_violations(gptoss, 1)
    assert len(found) == 1 and "no-cutlass-fp4" in found[0] and "moe_backend flashinfer_cutlass" in found[0], found
    for quant in ("nvfp4", "modelopt_fp4", "fp4", "modelopt_mxfp4", "petit_nvfp4"):
        p = dict(profiles["qwen3-30b-a3b"], quantization=quant, moe_backend="cutlass")
        assert any("no-cutlass-fp4" in f for f in profile_violations(p, 1)), quant
        p = dict(profiles["qwen3-30b-a3b"], weights_quantization=quant, moe_backend="cutlass")
        assert any("no-cutlass-fp4" in f for f in profile_violations(p, 1)), quant
    # not FP4: CUTLASS MoE is no FP4 kernel
    assert profile_violations(dict(profiles["qwen3-30b-a3b"], moe_backend="cutlass"), 1) == []


@pytest.mark.parametrize("value", ["1", "on", "true", "yes", "TRUE", " On "])
def test_every_true_form_of_vllm_enforce_eager_refused(reference, value):
    found = profile_violations(dict(reference, env={"VLLM_ENFORCE_EAGER": value}), 2)
    assert len(found) == 1 and "no-enforce-eager" in found[0], found


@pytest.mark.parametrize("value", ["0", "off", "false", "no"])
def test_false_forms_of_vllm_enforce_eager_pass(reference, value):
    assert profile_violations(dict(reference, env={"VLLM_ENFORCE_EAGER": value}), 2) == []


@pytest.mark.parametrize("model", ["", "   "])
def test_empty_model_refused(reference, model):
    found = profile_violations(dict(reference, model=model), 2)
    assert found == [f"model must be a non-empty string, got {model!r} (str)"], found


@pytest.mark.parametrize("value", ["marlin", "triton", "auto"])
def test_linear_backend_other_than_cutlass_passes_on_fp4(profiles, value):
    nvfp4 = dict(profiles["qwen3.5-122b-a10b-nvfp4"], extra_args=["--linear-backend", value])
    assert profile_violations(nvfp4, 1) == []
    cutlass = dict(profiles["qwen3.5-122b-a10b-nvfp4"], extra_args=[f"--linear-backend={value}_cutlass"])
    assert any("no-cutlass-fp4" in f for f in profile_violations(cutlass, 1))


# ------------------------------------------------------------------ the escape hatch
def test_a_rule_refused_without_an_allow_and_warned_with_one(profiles):
    nvfp4 = dict(profiles["qwen3.5-122b-a10b-nvfp4"], moe_backend="flashinfer_cutlass")
    refused = profile_violations(nvfp4, 1)
    assert len(refused) == 1 and "sparkops_allow_rules" in refused[0] and "rule: no-cutlass-fp4" in refused[0]
    allow = [{"rule": "no-cutlass-fp4", "reason": "eugr FlashInfer 0.6.9 validated by ops on vllm-node:fc08740"}]
    found = profile_findings(nvfp4, 1, allow_rules=allow)
    assert found["refused"] == []
    assert found["allowed"] == [
        {"rule": "no-cutlass-fp4", "reason": allow[0]["reason"], "message": refused[0].split(" (to go past it")[0]}
    ]
    assert vllm_serve_args(nvfp4, "0.0.0.0", 8000, allow_rules=allow)[-2:] != []
    with pytest.raises(ValueError, match="no-cutlass-fp4"):
        vllm_serve_args(nvfp4, "0.0.0.0", 8000)
    # allowing one rule does not allow another
    both = dict(nvfp4, gpu_memory_utilization=0.95)
    refused = profile_violations(both, 1, allow_rules=allow)
    assert len(refused) == 1 and "gpu-memory-utilization-max" in refused[0], refused


def test_the_contract_knob_rules_are_allowed_by_the_same_name(profiles):
    contract = load_contract(_pinned())
    loose = dict(profiles["qwen3.5-122b-a10b-nvfp4"], moe_backend=None)
    assert any("set moe_backend: marlin" in f for f in contract_violations(loose, contract))
    allow = [{"rule": "no-cutlass-fp4", "reason": "validated"}]
    assert contract_violations(loose, contract, allow_rules=allow) == []
    found = profile_findings(loose, 1, contract=contract, allow_rules=allow)
    assert found["refused"] == [] and [a["rule"] for a in found["allowed"]] == ["no-cutlass-fp4"]


def test_not_recommended_is_a_rule_that_can_be_allowed(profiles):
    big = profiles["qwen3.5-397b-a17b-nvfp4-tp2"]
    allow = [{"rule": "not-recommended", "reason": "we measured it ourselves"}]
    found = profile_findings(big, 2, allow_rules=allow)
    assert [a["rule"] for a in found["allowed"]] == ["not-recommended"]
    # the fit refusal is no rule: it stays
    assert len(found["refused"]) == 1 and "does not fit" in found["refused"][0]


@pytest.mark.parametrize(
    ("entries", "needle"),
    [
        ([{"rule": "no-such-rule", "reason": "x"}], "'no-such-rule' is not a rule name"),
        ([{"rule": "no-cutlass-fp4", "reason": ""}], "without a reason"),
        ([{"rule": "no-cutlass-fp4", "reason": "   "}], "without a reason"),
        ([{"rule": "no-cutlass-fp4"}], "without a reason"),
        ([{"rule": "no-cutlass-fp4", "reason": "a", "by": "me"}], "unknown key(s) by"),
        ([{"rule": "no-cutlass-fp4", "reason": "a"}, {"rule": "no-cutlass-fp4", "reason": "b"}], "a second time"),
        (["no-cutlass-fp4"], "must be a mapping"),
        ({"rule": "no-cutlass-fp4", "reason": "a"}, "must be a list"),
    ],
)
def test_bad_allow_entries_refused_and_allow_nothing(profiles, entries, needle):
    allowed, problems = check_allow_rules(entries)
    assert any(needle in p for p in problems), problems
    nvfp4 = dict(profiles["qwen3.5-122b-a10b-nvfp4"], moe_backend="flashinfer_cutlass")
    refused = profile_violations(nvfp4, 1, allow_rules=entries)
    assert any(needle in r for r in refused), refused
    if not isinstance(entries, list) or len(entries) == 1:
        assert any("no-cutlass-fp4" in r and "refused by" in r for r in refused), refused


def test_every_rule_has_a_name_and_what_to_use_instead():
    assert set(RULES) == {
        "no-enforce-eager",
        "gpu-memory-utilization-max",
        "no-cutlass-fp4",
        "mxfp4-only-gpt-oss",
        "fp8-no-flashinfer-attention",
        "not-recommended",
        "hybrid-prefix-caching",
    }
    assert check_allow_rules([{"rule": r, "reason": "ok"} for r in RULES]) == ({r: "ok" for r in RULES}, [])


def test_allowed_rule_warnings_name_the_reason_and_what_it_lets_through(profiles):
    nvfp4 = dict(profiles["qwen3.5-122b-a10b-nvfp4"], moe_backend="flashinfer_cutlass")
    allow = [
        {"rule": "no-cutlass-fp4", "reason": "validated by ops on vllm-node:fc08740"},
        {"rule": "no-enforce-eager", "reason": "debug build"},
    ]
    lines = allowed_rule_warnings("mine", nvfp4, allow)
    assert len(lines) == 2
    assert "no-cutlass-fp4" in lines[0] and "validated by ops on vllm-node:fc08740" in lines[0]
    assert "lets through in profile mine: moe_backend flashinfer_cutlass" in lines[0]
    assert "no-enforce-eager" in lines[1] and "does not need it" in lines[1]
    assert allowed_rule_warnings("mine", nvfp4, []) == []
    assert any("not a rule name" in x for x in allowed_rule_warnings("mine", nvfp4, [{"rule": "x", "reason": "y"}]))


# ----------------------------------------------------------------------- EAGLE-3 speculative decoding

EAGLE3 = "qwen3-235b-a22b-gptq-int4-tp2-eagle3"
DRAFTER_COMMIT = "33f3c01ce807376d1171301b9a148b1b28f239ba"


@pytest.fixture
def eagle3(profiles) -> dict:
    return copy.deepcopy(profiles[EAGLE3])


def test_eagle3_profile_is_the_reference_plus_a_pinned_drafter(profiles, eagle3):
    spec = eagle3.pop("speculative_config")
    assert spec == {
        "method": "eagle3",
        "model": "nvidia/Qwen3-235B-A22B-Eagle3",
        "revision": DRAFTER_COMMIT,
        "num_speculative_tokens": 2,
    }
    reference = copy.deepcopy(profiles["qwen3-235b-a22b-gptq-int4-tp2"])
    for key in ("speculative_config", "not_recommended", "weights_gib"):
        reference.pop(key, None)
        eagle3.pop(key, None)
    assert eagle3 == reference  # every other setting is the measured reference's


def test_eagle3_argv_carries_the_speculative_config_json(eagle3):
    allow = [{"rule": "not-recommended", "reason": "measured on two Sparks"}]
    argv = vllm_serve_args(eagle3, "0.0.0.0", 8000, allow_rules=allow)
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "eagle3",
        "model": "nvidia/Qwen3-235B-A22B-Eagle3",
        "num_speculative_tokens": 2,
        "revision": DRAFTER_COMMIT,
    }
    assert argv[argv.index("--revision") + 1] == "main"  # the target's own revision is the lock's business


def test_eagle3_is_refused_as_unvalidated_until_allowed(eagle3):
    contract = load_contract(_pinned())
    found = profile_violations(eagle3, 2, contract=contract)
    assert len(found) == 1 and "unvalidated on GB10" in found[0] and "not-recommended" in found[0], found
    allow = [{"rule": "not-recommended", "reason": "measured on two Sparks, acceptance 0.6"}]
    assert profile_violations(eagle3, 2, contract=contract, allow_rules=allow) == []


def test_speculative_drafter_is_read_from_the_profile(eagle3, reference, profiles):
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving_profile import speculative_drafter

    assert speculative_drafter(eagle3) == {"model": "nvidia/Qwen3-235B-A22B-Eagle3", "revision": DRAFTER_COMMIT}
    assert speculative_drafter(reference) is None
    assert speculative_drafter(profiles["qwen3.5-122b-a10b-nvfp4-mtp"]) is None  # MTP: the model's own head
    ngram = dict(reference, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    assert speculative_drafter(ngram) is None
    local = dict(reference, speculative_config={"method": "eagle3", "model": "/models/head", "revision": "x"})
    assert speculative_drafter(local) is None  # a path on the nodes, not a Hub repository to download


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ({"num_speculative_tokens": 0}, ("num_speculative_tokens must be an integer of at least 1", "0")),
        ({"num_speculative_tokens": True}, ("num_speculative_tokens must be an integer of at least 1",)),
        ({"num_speculative_tokens": None}, ("method eagle3 has no num_speculative_tokens",)),
        ({"model": None}, ("method eagle3 has no model", "without speculative model")),
        ({"revision": "main"}, ("must pin the drafter nvidia/Qwen3-235B-A22B-Eagle3 by its 40-hex commit",)),
        ({"revision": None}, ("must pin the drafter",)),
        ({"method": None}, ("has no method",)),
        ({"tensor_parallel_size": 2}, ("use draft_tensor_parallel_size",)),
        ({"draft_tensor_parallel_size": 4}, ("must be 1 or the target's tensor_parallel_size 2",)),
    ],
)
def test_a_bad_speculative_config_is_refused_whatever_the_release(eagle3, change, needles):
    spec = {k: v for k, v in {**eagle3["speculative_config"], **change}.items() if v is not None}
    found = profile_violations(dict(eagle3, speculative_config=spec, not_recommended=None), 2)
    _one(found, *needles)
    with pytest.raises(ValueError, match="speculative_config"):
        vllm_serve_args(dict(eagle3, speculative_config=spec, not_recommended=None), "0.0.0.0", 8000)


@pytest.mark.parametrize(
    ("change", "family", "needles"),
    [
        ({"method": "eagle4"}, "qwen3", ("method 'eagle4' is not a method of vLLM 0.19.0", "eagle3")),
        ({"num_lookahead": 2}, "qwen3", ("num_lookahead", "does not know", "revision")),
        ({}, "mistral", ("eagle3 on model_family 'mistral'", "qwen")),
    ],
)
def test_the_pinned_vllm_refuses_what_its_speculative_config_does_not_know(eagle3, change, family, needles):
    contract = load_contract("0.19.0")
    bad = dict(eagle3, speculative_config={**eagle3["speculative_config"], **change}, model_family=family)
    _one(contract_violations(bad, contract, allow_rules=[{"rule": "not-recommended", "reason": "x"}]), *needles)


def test_a_contract_without_speculative_facts_says_it_cannot_check(eagle3):
    contract = copy.deepcopy(load_contract("0.19.0"))
    del contract["speculative_config"]
    _one(contract_violations(eagle3, contract), "no recorded speculative_config", "--speculative-from")


@pytest.mark.skipif(not (ROOT / "sim").is_dir(), reason="checkout only: sim/ does not ship in the collection")
def test_the_recorded_speculative_facts_are_0_19_0s_source():
    """The fixture's key is what the recorder reads from vLLM 0.19.0's own vllm/config/speculative.py."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location("recorder", ROOT / "sim" / "record_vllm_contract.py")
    recorder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recorder)
    recorded = load_contract("0.19.0")["speculative_config"]
    # Where the release's package is unpacked (the project's workstation), the fixture must match it.
    upstream = Path("/work/upstream/vllm-0.19.0/vllm/config/speculative.py")
    if upstream.is_file():
        assert recorder.speculative_from_source(upstream.read_text()) == recorded
    assert "eagle3" in recorded["methods"] and "revision" in recorded["fields"]
    assert "qwen" in recorded["aux_hidden_states_models"]
    text = (
        "from typing import Literal\nA = Literal['x', 'y']\nM = Literal['z', A]\n"
        "class SpeculativeConfig:\n    method: M | None = None\n    model: str | None = None\n"
        "    target_model_config: object = None\n"
        "    def _verify_args(self):\n        aux_hidden_states_supported = ['llama']\n"
    )
    assert recorder.speculative_from_source(text) == {
        "fields": ["method", "model"],
        "methods": ["x", "y", "z"],
        "aux_hidden_states_models": ["llama"],
        "source": recorded["source"],
    }
    with pytest.raises(ValueError, match="no class SpeculativeConfig"):
        recorder.speculative_from_source("x = 1\n")


# ------------------------------------------------------------------ issue 30: every type, its coercion and its message
_BASE = {"model": "org/m", "model_family": "x", "weights_gib": 10}


@pytest.mark.parametrize(
    ("key", "value", "want"),
    [
        ("tensor_parallel_size", 2.0, 2),
        ("tensor_parallel_size", " 3 ", 3),
        ("tensor_parallel_size", "+2", 2),
        ("max_cudagraph_capture_size", None, None),
        ("max_cudagraph_capture_size", "512", 512),
        ("gpu_memory_utilization", "0.8", 0.8),
        ("gpu_memory_utilization", 1, 1.0),
        ("enable_prefix_caching", " Off ", False),
        ("enable_prefix_caching", "yes", True),
        ("gated", "0", False),
        ("served_model_name", None, "org/m"),
        ("quantization", None, None),
        ("env", {"A": False, "B": 1.5, "C": "x"}, {"A": "0", "B": "1.5", "C": "x"}),
        ("extra_args", ("--a", "b"), ["--a", "b"]),
        ("speculative_config", {"method": "mtp"}, {"method": "mtp"}),
    ],
)
def test_values_are_coerced_to_their_kind(key, value, want):
    assert normalize_profile({**_BASE, key: value})[key] == want


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("model", 5, "model must be a non-empty string, got 5 (int)"),
        ("tensor_parallel_size", True, "tensor_parallel_size must be an integer, got True (bool)"),
        ("tensor_parallel_size", 2.5, "tensor_parallel_size must be an integer, got 2.5 (float)"),
        ("tensor_parallel_size", [2], "tensor_parallel_size must be an integer, got [2] (list)"),
        ("max_cudagraph_capture_size", "many", "max_cudagraph_capture_size must be an integer, got 'many' (str)"),
        ("weights_gib", True, "weights_gib must be a number, got True (bool)"),
        ("weights_gib", "ten", "weights_gib must be a number, got 'ten' (str)"),
        ("weights_gib", [10], "weights_gib must be a number, got [10] (list)"),
        ("weights_gib", "nan", "weights_gib must be a finite number, got 'nan' (str)"),
        ("weights_gib", float("inf"), "weights_gib must be a finite number, got inf (float)"),
        ("gated", 1, "gated must be true or false, got 1 (int)"),
        (
            "chat_template_kwargs",
            {1: True},
            "chat_template_kwargs must be a mapping with string keys, got {1: True} (dict)",
        ),
        (
            "chat_template_kwargs",
            {"a": {1, 2}},
            "chat_template_kwargs must be JSON-serialisable, got {'a': {1, 2}} (dict)",
        ),
        ("speculative_config", ["mtp"], "speculative_config must be a mapping with string keys, got ['mtp'] (list)"),
        ("env", ["A=1"], "env must be a mapping of environment variable names to values, got ['A=1'] (list)"),
        ("env", {"A": [1]}, "env.A must be a string or a number, got [1] (list)"),
        ("env", {"1A": "x"}, "env: '1A' is not a valid environment variable name"),
        ("env", {1: "x"}, "env: 1 is not a valid environment variable name"),  # YAML reads `1: x` as an int
        ("env", {"VLLM_X\n": "1"}, "env: 'VLLM_X\\n' is not a valid environment variable name"),
        (
            "extra_args",
            ["--a", 1],
            "extra_args must be a list of strings (one argv element each), got ['--a', 1] (list)",
        ),
        ("weights_gib", 0, "weights_gib must be above 0 (the total on-disk size of the weights in GiB), got 0.0"),
    ],
)
def test_each_wrong_type_has_its_own_message(key, value, message):
    with pytest.raises(ValueError) as exc:
        normalize_profile({**_BASE, key: value})
    assert str(exc.value) == f"invalid serving profile: {message}"


@pytest.mark.parametrize(
    "key",
    [
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_cudagraph_capture_size",
    ],
)
def test_every_count_is_at_least_1(key):
    assert normalize_profile({**_BASE, key: 1})[key] == 1
    with pytest.raises(ValueError, match=f"{key} must be at least 1, got 0"):
        normalize_profile({**_BASE, key: 0})


@pytest.mark.parametrize(("gmu", "ok"), [(0, False), (0.01, True), (1, True), (1.01, False)])
def test_gpu_memory_utilization_is_a_fraction(gmu, ok):
    if ok:
        assert normalize_profile({**_BASE, "gpu_memory_utilization": gmu})["gpu_memory_utilization"] == gmu
    else:
        with pytest.raises(ValueError, match=r"must be a fraction in \(0, 1\]"):
            normalize_profile({**_BASE, "gpu_memory_utilization": gmu})


@pytest.mark.parametrize(
    ("flag", "key"),
    [
        ("--revision", "revision"),
        ("--served-model-name", "served_model_name"),
        ("--tensor-parallel-size", "tensor_parallel_size"),
        ("-tp", "tensor_parallel_size"),
        ("--pipeline-parallel-size", "pipeline_parallel_size"),
        ("-pp", "pipeline_parallel_size"),
        ("--enable-expert-parallel", "enable_expert_parallel"),
        ("--no-enable-expert-parallel", "enable_expert_parallel"),
        ("--quantization", "quantization"),
        ("-q", "quantization"),
        ("--kv-cache-dtype", "kv_cache_dtype"),
        ("--attention-backend", "attention_backend"),
        ("--moe-backend", "moe_backend"),
        ("--gpu-memory-utilization", "gpu_memory_utilization"),
        ("--max-model-len", "max_model_len"),
        ("--max-num-seqs", "max_num_seqs"),
        ("--max-num-batched-tokens", "max_num_batched_tokens"),
        ("--max-cudagraph-capture-size", "max_cudagraph_capture_size"),
        ("--enable-prefix-caching", "enable_prefix_caching"),
        ("--no-enable-prefix-caching", "enable_prefix_caching"),
        ("--speculative-config", "speculative_config"),
        ("--default-chat-template-kwargs", "chat_template_kwargs"),
        ("--distributed-executor-backend", "tensor_parallel_size/pipeline_parallel_size"),
        ("--host", "the host argument"),
        ("--port", "the port argument"),
        ("--api-key", "vllm_serve's key file"),
    ],
)
def test_every_flag_the_profile_owns_is_refused_in_extra_args(reference, flag, key):
    """A flag given twice: vLLM's argparse takes the last one, so extra_args would win over the checked key."""
    reference["extra_args"] = [f"{flag}=x"]
    msg = _one(profile_violations(reference, gpus_total=2), f"extra_args sets {flag},")
    assert f"which the profile owns: set {key}" in msg


def test_a_cutlass_linear_backend_is_refused_only_on_fp4_weights(profiles, reference):
    """--linear-backend picks every quantized linear layer's kernel: CUTLASS is an FP4 kernel only for FP4."""
    assert profile_violations(dict(reference, extra_args=["--linear-backend", "cutlass"]), 2) == []
    nvfp4 = dict(profiles["qwen3.5-122b-a10b-nvfp4"], extra_args=["--linear-backend", "cutlass"])
    assert any(
        "extra_args --linear-backend cutlass selects a CUTLASS FP4 kernel" in f for f in profile_violations(nvfp4, 1)
    )
    # the FP4-only flags are refused whatever the weights
    for flag in ("--mxfp4-backend", "--nvfp4-backend", "--fp4-backend"):
        found = profile_violations(dict(reference, extra_args=[flag, "CUTLASS"]), 2)
        assert found == [
            f"extra_args {flag} CUTLASS selects a CUTLASS FP4 kernel, refused by the hard rule no-cutlass-fp4 "
            "('no CUTLASS FP4 kernels on SM121'): use Marlin instead (moe_backend: marlin, env "
            "VLLM_NVFP4_GEMM_BACKEND=marlin, VLLM_MXFP4_USE_MARLIN=1 for gpt-oss) (to go past it on a build you "
            "have validated: sparkops_allow_rules: [{rule: no-cutlass-fp4, reason: '<why, who validated, on which "
            "image>'}])"
        ], found
    # a flag at the end without its value is no CUTLASS choice
    assert profile_violations(dict(reference, extra_args=["--fp4-backend"]), 2) == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"gpus_total": 0}, "gpus_total must be a positive integer, got 0"),
        ({"gpus_total": True}, "gpus_total must be a positive integer, got True"),
        ({"gpus_total": 2, "gpus_per_node": 0}, "gpus_per_node must be a positive integer, got 0"),
        ({"gpus_total": 2, "gpus_per_node": True}, "gpus_per_node must be a positive integer, got True"),
        ({"gpus_total": 2, "node_memory_gib": 0}, "node_memory_gib must be a positive number, got 0"),
        ({"gpus_total": 2, "node_memory_gib": "128"}, "node_memory_gib must be a positive number, got '128'"),
    ],
)
def test_cluster_arguments_are_refused_before_any_division(reference, kwargs, match):
    with pytest.raises(ValueError, match=match):
        profile_violations(reference, **kwargs)
    assert profile_violations(reference, 2, node_memory_gib=128.0, gpus_per_node=1) == []


def test_every_allow_entry_is_judged_after_a_bad_one():
    entries = [
        "no-cutlass-fp4",
        {"rule": "no-cutlass-fp4", "reason": "a", "by": "me"},
        {"rule": "no-such-rule", "reason": "x"},
        {"rule": "no-enforce-eager", "reason": " "},
        {"rule": "not-recommended", "reason": " validated on sim-v2 by ops "},
        {"rule": "not-recommended", "reason": "again"},
        {"rule": "no-enforce-eager", "reason": "ok"},
    ]
    allowed, problems = check_allow_rules(entries)
    assert allowed == {"not-recommended": "validated on sim-v2 by ops", "no-enforce-eager": "ok"}
    assert [p.split(" ", 1)[0].rstrip(":") for p in problems] == [f"sparkops_allow_rules[{i}]" for i in (0, 1, 2, 3, 5)]
    assert check_allow_rules(None) == ({}, [])


def test_a_small_node_is_judged_not_refused_as_an_argument(reference):
    found = profile_violations(reference, 2, node_memory_gib=1)
    assert len(found) == 1 and found[0].startswith("the model does not fit"), found
    assert "vLLM may use only node_memory_gib 1 x gpu_memory_utilization 0.87 = 0.9 GiB per GPU" in found[0]


@pytest.mark.parametrize(("wanted", "ok"), [("0.19", True), ("0.19.0", True), ("v0.19.0", True), ("0.19.1", False)])
def test_min_vllm_version_without_a_patch_number_is_patch_0(reference, wanted, ok):
    contract = load_contract(_pinned())
    found = profile_violations(dict(reference, min_vllm_version=wanted), 2, contract=contract)
    assert (found == []) is ok, found


def test_the_mxfp4_marlin_switch_is_no_moe_knob_for_nvfp4(profiles):
    """A release without --moe-backend marlin but with VLLM_MXFP4_USE_MARLIN: that switch is mxfp4's only."""
    old = copy.deepcopy(load_contract("0.19.0"))
    old["vllm_version"] = "0.0.2-test"
    del old["serve_options"]["--moe-backend"]
    assert "VLLM_MXFP4_USE_MARLIN" in old["env_vars"]
    nvfp4 = dict(profiles["qwen3.5-122b-a10b-nvfp4"], moe_backend=None)
    found = contract_violations(nvfp4, old)
    assert any("vLLM 0.0.2-test has no knob to put FP4 MoE on Marlin" in f for f in found), found
    assert not any("set env VLLM_MXFP4_USE_MARLIN=1" in f for f in found), found
    gptoss = dict(profiles["gpt-oss-120b-mxfp4"], moe_backend=None, env={})
    assert any("set env VLLM_MXFP4_USE_MARLIN=1" in f for f in contract_violations(gptoss, old))


def test_every_env_entry_is_judged_after_the_api_key():
    with pytest.raises(ValueError) as exc:
        normalize_profile({**_BASE, "env": {"VLLM_API_KEY": "k", "1A": "x", "B": [1]}})
    problems = str(exc.value).removeprefix("invalid serving profile: ").split("; ")
    assert [p.split(" ", 1)[0] for p in problems] == ["env:", "env:", "env.B"]
    assert "VLLM_API_KEY would put the key" in problems[0] and "'1A'" in problems[1]


def test_an_mxfp4_model_on_a_release_with_neither_moe_knob_is_refused(profiles):
    bare = copy.deepcopy(load_contract("0.19.0"))
    bare["vllm_version"] = "0.0.3-test"
    del bare["serve_options"]["--moe-backend"]
    bare["env_vars"] = [n for n in bare["env_vars"] if n != "VLLM_MXFP4_USE_MARLIN"]
    gptoss = dict(profiles["gpt-oss-120b-mxfp4"], moe_backend=None, env={})
    found = contract_violations(gptoss, bare)
    assert any("vLLM 0.0.3-test has no knob to put FP4 MoE on Marlin" in f for f in found), found


def test_vllm_serve_args_refuses_a_node_without_gpus(reference):
    with pytest.raises(ValueError, match="gpus_per_node must be a positive integer, got 0"):
        vllm_serve_args(reference, "0.0.0.0", 8000, gpus_per_node=0)
    assert "--distributed-executor-backend" not in vllm_serve_args(reference, "0.0.0.0", 8000, gpus_per_node=2)


@pytest.mark.parametrize(("port", "ok"), [(0, False), (1, True), ("8000", True), (65535, True), (65536, False)])
def test_the_api_port_is_1_to_65535(reference, port, ok):
    if ok:
        argv = vllm_serve_args(reference, "0.0.0.0", port)
        assert argv[argv.index("--port") + 1] == str(int(port))
    else:
        with pytest.raises(ValueError, match=f"port must be within 1-65535, got {port}"):
            vllm_serve_args(reference, "0.0.0.0", port)


HYBRID_PROFILES = (
    "qwen3.5-122b-a10b-nvfp4",
    "qwen3.5-122b-a10b-nvfp4-mtp",
    "qwen3.5-397b-a17b-nvfp4-tp2",
    "qwen3.6-35b-a3b-fp8",
    "qwen3.6-27b-fp8",
    "nemotron-3-super-120b-a12b-nvfp4",
)


def test_shipped_hybrid_profiles_leave_prefix_caching_off_as_vllm_does(profiles):
    """issue 43: Qwen3.6-35B-A3B is the same Gated DeltaNet hybrid as the 27B (its model card: 10 x (3 x GDN + 1 x
    attention)); vLLM 0.19.0 leaves prefix caching off for hybrid models (config/model.py:1785-1790) and, turned
    on, runs the experimental mamba 'align' mode for Qwen3.5/3.6 (models/config.py:436-466)."""
    for name in HYBRID_PROFILES:
        p = profiles[name]
        assert p["model_family"] in ("qwen3.5", "qwen3.6", "nemotron-h"), name
        assert p["enable_prefix_caching"] is False, name
        assert "--no-enable-prefix-caching" in vllm_serve_args(
            p, "0.0.0.0", 8000, allow_rules=[{"rule": r, "reason": "test"} for r in RULES]
        ), name
    for name, p in profiles.items():
        if name not in HYBRID_PROFILES:
            assert p["model_family"].lower() not in ("qwen3.5", "qwen3.6", "qwen3-next", "nemotron-h"), name


def test_prefix_caching_on_a_hybrid_model_is_refused_and_may_be_allowed(profiles):
    on = dict(profiles["qwen3.6-35b-a3b-fp8"], enable_prefix_caching=True)
    found = profile_violations(on, 1)
    assert len(found) == 1 and "hybrid-prefix-caching" in found[0] and "enable_prefix_caching: false" in found[0]
    allow = [{"rule": "hybrid-prefix-caching", "reason": "align mode validated on our workload"}]
    assert profile_violations(on, 1, allow_rules=allow) == []
    # a plain transformer keeps it
    assert not [f for f in profile_violations(profiles["qwen3-30b-a3b"], 1) if "hybrid-prefix-caching" in f]


def test_the_qwen36_35b_comment_no_longer_calls_it_pure_moe():
    text = (ROOT / "roles/sparkops_defaults/defaults/main/serving_profiles.yml").read_text()
    assert "no GatedDeltaNet" not in text and "pure MoE" not in text
