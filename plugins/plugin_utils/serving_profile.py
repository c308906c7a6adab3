"""Serving profiles: validation against the SM121 hard rules and the `vllm serve` argv they yield.

A serving profile is a plain dict (see PROFILE_FIELDS for every key, its type and default). Pure
functions only, stdlib only; controller-only (plugin_utils): the filters in plugins/filter/serving.py
use it:

- normalize_profile(profile) -> dict: defaults filled, types checked (ValueError listing every problem).
- profile_violations(profile, gpus_total, node_memory_gib=128, gpus_per_node=1) -> list[str]: every
  type problem and every broken hard rule, each message naming the rule and what to change.
- vllm_serve_args(profile, host, port, gpus_per_node=1) -> list[str]: the exact argv. The API key is
  never in it nor in the container's environment: vllm_serve adds `--middleware` (its
  sparkops_vllm_auth module, which reads the key from a file mounted read-only) to this argv.
- contract_violations(profile, contract, gpus_per_node=1) -> list[str]: what the vLLM release of
  `contract` (plugin_utils/vllm_contract.py) would refuse in the profile's argv and VLLM_* env, and the
  SM121 rules that release's knobs cannot enforce (a release without the knob a rule needs is refused).

- profile_findings(...) -> {"refused": [...], "allowed": [...]}: the same, with the rules the operator
  allowed (sparkops_allow_rules) moved to "allowed", each with its reason, so every run can warn.
- check_allow_rules(entries) -> (dict rule -> reason, problems): the escape-hatch list validated.

Hard rules on SM121 (GB10), keyed by name (RULES); each may be allowed, with a recorded reason, by
an entry of sparkops_allow_rules. Other refusals (types, fit, the pinned vLLM's contract, a profile
that needs a newer vLLM) cannot be allowed: vLLM itself would refuse, or the model would not load.
"""

from __future__ import annotations

import json
import math
import re

from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (
    check_serve_args,
    has_choice,
    has_env,
)

MAX_GPU_MEMORY_UTILIZATION = 0.90
# What a node needs on top of its share of the weights before vLLM can serve at all: a minimal KV
# cache, activations, CUDA graphs and the CUDA context. Conservative on purpose: the reference
# profile (57.6 GiB of weights a node) leaves ~54 GiB, far above it.
KV_HEADROOM_GIB = 10.0
MXFP4_FAMILIES = ("gpt-oss",)
# Quantization methods whose weights are FP4 (CUTLASS FP4 checks apply to these). The rules key on
# `quantization` (the --quantization flag) or `weights_quantization` (what the checkpoint's own
# config.json says, for checkpoints vLLM reads the method from), never on the model's name.
FP4_QUANTIZATIONS = ("mxfp4", "nvfp4", "modelopt_fp4", "fp4", "modelopt_mxfp4", "petit_nvfp4")
# FP8 weight formats: vLLM 0.19.0's fp8, fbgemm_fp8 and modelopt (ModelOpt's FP8)
# (vllm/model_executor/layers/quantization/__init__.py:13-35), ptpc_fp8 of earlier releases, and
# "fp8"/"modelopt_fp8" as weights_quantization describes a compressed-tensors or ModelOpt FP8 checkpoint.
FP8_QUANTIZATIONS = ("fp8", "fbgemm_fp8", "ptpc_fp8", "modelopt", "modelopt_fp8", "fp8_e4m3")
# The attention backends that are FlashInfer's (vllm/v1/attention/backends/registry.py of 0.19.0).
FLASHINFER_ATTENTION = ("FLASHINFER", "FLASHINFER_MLA", "FLASHINFER_MLA_SPARSE")

# The SM121 hard rules, by name: what each protects against and what to use instead. The name is
# what sparkops_allow_rules entries refer to.
RULES: dict[str, str] = {
    "no-enforce-eager": (
        "no --enforce-eager on SM121: CUDA graphs off cost about 55% of tok/s; use a profile (or vLLM build) "
        "that captures CUDA graphs, lowering max_cudagraph_capture_size if capture runs out of memory"
    ),
    "gpu-memory-utilization-max": (
        "gpu_memory_utilization <= 0.90 on GB10: the GPU shares the node's 128 GiB with the OS, page cache "
        "and Ray; use 0.90 or less (the reference profile uses 0.87)"
    ),
    "no-cutlass-fp4": (
        "no CUTLASS FP4 kernels on SM121 (silent garbage or a crash on NGC 26.04 and vLLM 0.19.0 builds); use "
        "Marlin (moe_backend: marlin, env VLLM_NVFP4_GEMM_BACKEND=marlin, VLLM_MXFP4_USE_MARLIN=1 for gpt-oss)"
    ),
    "mxfp4-only-gpt-oss": (
        "quantization mxfp4 only for gpt-oss: mxfp4 checkpoints and kernels are validated on SM121 only for "
        "gpt-oss; use the model's own quantization (gptq_marlin, fp8, an NVFP4 checkpoint with Marlin) or null"
    ),
    "fp8-no-flashinfer-attention": (
        "no FlashInfer attention with an FP8 checkpoint on SM121 (it crashes); use attention_backend: TRITON_ATTN"
    ),
    "not-recommended": (
        "a shipped profile marked not_recommended: it runs, but the reason in the profile says why you should "
        "not; pick a recommended profile"
    ),
    "hybrid-prefix-caching": (
        "no prefix caching on a hybrid (Gated DeltaNet or Mamba) model: vLLM 0.19.0 leaves it off for them by "
        "default because it is experimental, and turned on it caches the recurrent state in its experimental "
        "mamba 'align' mode (Qwen3.5/3.6); set enable_prefix_caching: false"
    ),
}

# Model families whose architectures vLLM 0.19.0 marks hybrid (attention beside Gated DeltaNet or Mamba
# layers): Qwen3_5ForConditionalGeneration and its MoE subclass (model_executor/models/qwen3_5.py:574, :801,
# IsHybrid; Qwen3.6 ships the same architectures: its model card's layout is 10 x (3 x Gated DeltaNet + 1 x
# Gated Attention), each followed by MoE for the 35B-A3B), Qwen3NextForCausalLM (qwen3_next.py) and
# NemotronHForCausalLM (nemotron_h.py). For them vLLM 0.19.0 turns prefix caching OFF by default
# (config/model.py:1785-1790 "Hybrid models do not support prefix caching since the feature is still
# experimental", applied by engine/arg_utils.py:2143-2144). Turned on, config/vllm.py:1612-1613 runs
# HybridAttentionMambaModelConfig (models/config.py:156-188), which runs MambaModelConfig
# (models/config.py:436-466): mamba_cache_mode becomes "all" only for models with
# SupportsMambaPrefixCaching (interfaces.py:947-971; NemotronH has it, the Qwen3.5 classes do not), else
# "align", which needs chunked prefill (:456-459), and vLLM logs that prefix caching for Mamba layers
# "is experimental".
HYBRID_FAMILIES = ("qwen3.5", "qwen3.6", "qwen3-next", "nemotron-h")

_INT = "int"
_NUM = "number"
_BOOL = "bool"
_STR = "str"
_OPT_STR = "str or null"
_OPT_INT = "int or null"
_OPT_DICT = "dict or null"
_DICT = "dict"
_STR_DICT = "dict of strings"
_STR_LIST = "list of strings"

_REQUIRED = object()

# key -> (kind, default). _REQUIRED marks keys without a default.
PROFILE_FIELDS: dict[str, tuple[str, object]] = {
    "model": (_STR, _REQUIRED),
    "revision": (_STR, "main"),
    "served_model_name": (_OPT_STR, None),
    "model_family": (_STR, _REQUIRED),
    "gated": (_BOOL, False),
    "weights_gib": (_NUM, _REQUIRED),
    "tensor_parallel_size": (_INT, 1),
    "pipeline_parallel_size": (_INT, 1),
    "enable_expert_parallel": (_BOOL, False),
    "quantization": (_OPT_STR, None),
    # The checkpoint's own quantization (its config.json), when vLLM reads it from there and
    # `quantization` stays null: nvfp4, mxfp4, fp8, gptq-int4, ... The FP4/FP8 rules key on it.
    "weights_quantization": (_OPT_STR, None),
    "kv_cache_dtype": (_STR, "auto"),
    "attention_backend": (_OPT_STR, None),
    "moe_backend": (_OPT_STR, None),
    "gpu_memory_utilization": (_NUM, 0.85),
    "max_model_len": (_INT, 32768),
    "max_num_seqs": (_INT, 16),
    "max_num_batched_tokens": (_INT, 8192),
    "max_cudagraph_capture_size": (_OPT_INT, None),
    "enable_prefix_caching": (_BOOL, True),
    "speculative_config": (_OPT_DICT, None),
    "chat_template_kwargs": (_DICT, {}),
    "env": (_STR_DICT, {}),
    "extra_args": (_STR_LIST, []),
    # The image the profile's source ran, when it is not the one sparkops builds (data for the
    # operator and the refusal message; the pinned image is what runs).
    "image": (_OPT_STR, None),
    # The oldest vLLM release the profile is written for; refused while sparkops_vllm_version is older.
    "min_vllm_version": (_OPT_STR, None),
    # Why this profile should not be used (refused by the rule not-recommended unless allowed).
    "not_recommended": (_OPT_STR, None),
}

# Flags the profile owns: setting them again in extra_args would fight the key.
MANAGED_FLAGS = {
    "--revision": "revision",
    "--served-model-name": "served_model_name",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size",
    "--enable-expert-parallel": "enable_expert_parallel",
    "--no-enable-expert-parallel": "enable_expert_parallel",
    "--quantization": "quantization",
    "-q": "quantization",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--attention-backend": "attention_backend",
    "--moe-backend": "moe_backend",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--max-model-len": "max_model_len",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--max-cudagraph-capture-size": "max_cudagraph_capture_size",
    "--enable-prefix-caching": "enable_prefix_caching",
    "--no-enable-prefix-caching": "enable_prefix_caching",
    "--speculative-config": "speculative_config",
    "--default-chat-template-kwargs": "chat_template_kwargs",
    "--distributed-executor-backend": "tensor_parallel_size/pipeline_parallel_size (ray is added when needed)",
    "--host": "the host argument",
    "--port": "the port argument",
    "--api-key": "vllm_serve's key file and middleware (a key in argv shows in `ps` and `docker inspect`)",
}

_EAGER_RULE = "hard rule no-enforce-eager ('no --enforce-eager on SM121': CUDA graphs off cost about -55% tok/s)"
_GMU_RULE = "hard rule gpu-memory-utilization-max ('gpu_memory_utilization <= 0.90 on GB10')"
_CUTLASS_RULE = "hard rule no-cutlass-fp4 ('no CUTLASS FP4 kernels on SM121')"
_MXFP4_RULE = "hard rule mxfp4-only-gpt-oss ('quantization mxfp4 only for gpt-oss')"
_FP8_ATTN_RULE = "hard rule fp8-no-flashinfer-attention ('FlashInfer attention with FP8 weights crashes on SM121')"
_NOT_RECOMMENDED_RULE = "rule not-recommended"
_HYBRID_PC_RULE = "rule hybrid-prefix-caching ('prefix caching on a hybrid model is experimental in vLLM 0.19.0')"
_ALLOW_HINT = (
    " (to go past it on a build you have validated: sparkops_allow_rules: "
    "[{{rule: {rule}, reason: '<why, who validated, on which image>'}}])"
)

_TRUE_STRINGS = ("1", "true", "yes", "on")
_FALSE_STRINGS = ("0", "false", "no", "off")
_INT_RE = re.compile(r"^[+-]?\d+$")


def _describe(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def _coerce(key: str, kind: str, value, errors: list[str]):
    """Return `value` as `kind`, or append a message to `errors` and return None.

    A None never reaches here for a key with a default (_validate gives it the default, None for the
    optional kinds); for a required key it is a wrong type."""
    if kind in (_STR, _OPT_STR):
        if isinstance(value, str) and value.strip():
            return str(value)
        errors.append(f"{key} must be a non-empty string, got {_describe(value)}")
        return None
    if kind in (_INT, _OPT_INT):
        if isinstance(value, bool):
            errors.append(f"{key} must be an integer, got {_describe(value)}")
            return None
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and _INT_RE.match(value.strip()):
            return int(value.strip())
        errors.append(f"{key} must be an integer, got {_describe(value)}")
        return None
    if kind == _NUM:
        if isinstance(value, bool):
            errors.append(f"{key} must be a number, got {_describe(value)}")
            return None
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                errors.append(f"{key} must be a number, got {_describe(value)}")
                return None
        else:
            errors.append(f"{key} must be a number, got {_describe(value)}")
            return None
        if not math.isfinite(number):
            errors.append(f"{key} must be a finite number, got {_describe(value)}")
            return None
        return number
    if kind == _BOOL:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE_STRINGS + _FALSE_STRINGS:
            return value.strip().lower() in _TRUE_STRINGS
        errors.append(f"{key} must be true or false, got {_describe(value)}")
        return None
    if kind in (_DICT, _OPT_DICT):
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                errors.append(f"{key} must be JSON-serialisable, got {_describe(value)}")
                return None
            return dict(value)
        errors.append(f"{key} must be a mapping with string keys, got {_describe(value)}")
        return None
    if kind == _STR_DICT:
        if not isinstance(value, dict):
            errors.append(f"{key} must be a mapping of environment variable names to values, got {_describe(value)}")
            return None
        out = {}
        for name, item in value.items():
            # \Z, not $: "$" also matches before a final newline, which would end the variable's line.
            if not isinstance(name, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*\Z", name):
                errors.append(f"{key}: {name!r} is not a valid environment variable name")
                continue
            if name.upper() == "VLLM_API_KEY":
                errors.append(
                    f"{key}: VLLM_API_KEY would put the key in the container's config (`docker inspect`) and vLLM "
                    "asks it on /v1 only: remove it (vllm_serve passes the key as a file to its middleware)"
                )
                continue
            if isinstance(item, bool):
                out[name] = "1" if item else "0"
            elif isinstance(item, (str, int, float)):
                out[name] = str(item)
            else:
                errors.append(f"{key}.{name} must be a string or a number, got {_describe(item)}")
        return out
    if kind == _STR_LIST:
        if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
            return [str(item) for item in value]
        errors.append(f"{key} must be a list of strings (one argv element each), got {_describe(value)}")
        return None
    raise AssertionError(f"unknown kind {kind}")  # pragma: no cover


def _validate(profile) -> tuple[dict, list[str]]:
    """Normalise `profile`; return (normalised, problems). Problems are type and range errors."""
    if not isinstance(profile, dict):
        return {}, [f"a serving profile must be a mapping, got {_describe(profile)}"]
    errors: list[str] = []
    for key in profile:
        if key not in PROFILE_FIELDS:
            if key == "enforce_eager":
                errors.append(f"enforce_eager is refused by the {_EAGER_RULE}: remove the key")
            else:
                errors.append(
                    f"unknown key {key!r} in the serving profile; known keys: {', '.join(PROFILE_FIELDS)} "
                    "(other vllm serve flags go in extra_args, other environment variables in env)"
                )
    out: dict = {}
    for key, (kind, default) in PROFILE_FIELDS.items():
        if key not in profile or (profile[key] is None and default is not _REQUIRED):
            if default is _REQUIRED:
                errors.append(f"{key} is required in a serving profile")
                out[key] = None
            else:
                out[key] = json.loads(json.dumps(default))
            continue
        out[key] = _coerce(key, kind, profile[key], errors)
    if out.get("served_model_name") is None and out.get("model"):
        out["served_model_name"] = out["model"]
    for key in (
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_cudagraph_capture_size",
    ):
        if isinstance(out.get(key), int) and out[key] < 1:
            errors.append(f"{key} must be at least 1, got {out[key]}")
    weights = out.get("weights_gib")
    if isinstance(weights, float) and weights <= 0:
        errors.append(f"weights_gib must be above 0 (the total on-disk size of the weights in GiB), got {weights}")
    gmu = out.get("gpu_memory_utilization")
    if isinstance(gmu, float) and not 0 < gmu <= 1:
        errors.append(
            f"gpu_memory_utilization must be a fraction in (0, 1], got {gmu}; the {_GMU_RULE} asks for "
            f"{MAX_GPU_MEMORY_UTILIZATION} or less (the reference profile uses 0.87)"
        )
    revision = out.get("revision")
    if isinstance(revision, str) and re.search(r"\s", revision):
        errors.append(f"revision must be a branch, tag or commit without spaces, got {revision!r}")
    return out, errors


def normalize_profile(profile) -> dict:
    """Return a copy of `profile` with every default filled and every type checked.

    Raises ValueError naming every problem found (unknown keys, wrong types, out-of-range values).
    """
    out, errors = _validate(profile)
    if errors:
        raise ValueError("invalid serving profile: " + "; ".join(errors))
    return out


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def _quant_methods(p: dict) -> tuple[str, str]:
    return (p.get("quantization") or "").lower(), (p.get("weights_quantization") or "").lower()


def _is_fp4(p: dict) -> bool:
    """FP4 weights, by the profile's quantization keys (not the model's name: see _name_hint)."""
    return any(q in FP4_QUANTIZATIONS for q in _quant_methods(p))


def _is_fp8(p: dict) -> bool:
    return any(q in FP8_QUANTIZATIONS for q in _quant_methods(p))


def _truthy_env(value: str) -> bool:
    return value.strip().lower() in _TRUE_STRINGS


def _name_hint(p: dict) -> list[tuple[str | None, str]]:
    """A model whose name says FP4/FP8 but whose profile says nothing about its quantization.

    The rules key on the quantization keys; a checkpoint that carries its method in config.json
    (quantization: null) must say it in weights_quantization, or the FP4/FP8 rules would not see it.
    """
    if any(_quant_methods(p)):
        return []
    name = (p.get("model") or "").lower()
    for needle, value in (("fp4", "nvfp4 (or mxfp4)"), ("fp8", "fp8")):
        if needle in name:
            return [
                (
                    None,
                    f"model {p['model']} looks like a {needle.upper()} checkpoint but neither quantization nor "
                    f"weights_quantization says so: set weights_quantization: {value} (what the checkpoint's "
                    "config.json says) so the SM121 rules for its kernels apply",
                )
            ]
    return []


def _rule_violations(p: dict) -> list[tuple[str | None, str]]:
    """(rule name or None, message) for every refusal that holds whatever the cluster (p is normalised).

    A rule name marks an SM121 hard rule (RULES), which sparkops_allow_rules may allow; None marks a
    refusal that cannot be allowed.
    """
    out: list[tuple[str | None, str]] = []
    args = p["extra_args"]
    flags = [_flag_name(a) for a in args]

    # no --enforce-eager
    eager = "no-enforce-eager"
    if "--enforce-eager" in flags:
        out.append((eager, f"extra_args contains --enforce-eager, refused by the {_EAGER_RULE}: remove it"))
    for name, value in p["env"].items():
        if name.upper() == "VLLM_ENFORCE_EAGER" and _truthy_env(value):
            out.append((eager, f"env {name}={value} asks for eager mode, refused by the {_EAGER_RULE}: remove it"))

    # gpu_memory_utilization <= 0.90 (0 < x <= 1 is a type check in _validate)
    gmu = p["gpu_memory_utilization"]
    if 0 < gmu <= 1 and gmu > MAX_GPU_MEMORY_UTILIZATION:
        out.append(
            (
                "gpu-memory-utilization-max",
                f"gpu_memory_utilization {gmu} is above {MAX_GPU_MEMORY_UTILIZATION}, refused by the {_GMU_RULE}: "
                "the GPU shares the node's 128 GiB with the OS, page cache and Ray; set 0.90 or less "
                "(the reference profile uses 0.87)",
            )
        )

    # no CUTLASS FP4
    cutlass = "no-cutlass-fp4"
    fp4 = _is_fp4(p)
    env = {k.upper(): v for k, v in p["env"].items()}
    marlin_hint = (
        "use Marlin instead (moe_backend: marlin, env VLLM_NVFP4_GEMM_BACKEND=marlin, VLLM_MXFP4_USE_MARLIN=1 "
        "for gpt-oss)"
    )
    for name in ("VLLM_NVFP4_GEMM_BACKEND", "VLLM_MXFP4_BACKEND"):
        if name in env and "cutlass" in env[name].lower():
            out.append(
                (
                    cutlass,
                    f"env {name}={env[name]} selects a CUTLASS FP4 kernel, refused by the {_CUTLASS_RULE}: "
                    f"{marlin_hint}",
                )
            )
    for name in (
        "VLLM_USE_FLASHINFER_MOE_FP4",
        "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8",
        "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8_CUTLASS",
    ):
        if name in env and _truthy_env(env[name]):
            out.append(
                (
                    cutlass,
                    f"env {name}={env[name]} turns on FlashInfer's CUTLASS FP4 MoE path (the only FlashInfer FP4 "
                    f"MoE kernels built for SM12x), refused by the {_CUTLASS_RULE}: set it to 0 or drop it, and "
                    f"{marlin_hint}",
                )
            )
    if fp4 and env.get("VLLM_FLASHINFER_MOE_BACKEND", "").strip().lower() == "throughput":
        out.append(
            (
                cutlass,
                "env VLLM_FLASHINFER_MOE_BACKEND=throughput on an FP4 model selects FlashInfer's CUTLASS MoE "
                f"kernels, refused by the {_CUTLASS_RULE}: drop it and {marlin_hint}",
            )
        )
    what = p["quantization"] or p["weights_quantization"] or p["model"]
    if fp4:
        for key in ("moe_backend", "attention_backend"):
            value = p[key]
            if value and "cutlass" in value.lower():
                out.append(
                    (
                        cutlass,
                        f"{key} {value} on an FP4 model ({what}) is a CUTLASS FP4 kernel, refused by the "
                        f"{_CUTLASS_RULE}: {marlin_hint}",
                    )
                )
    for i, arg in enumerate(args):
        name = _flag_name(arg)
        if name not in ("--mxfp4-backend", "--nvfp4-backend", "--fp4-backend", "--linear-backend"):
            continue
        value = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
        # --linear-backend picks the kernel of every quantized linear layer: CUTLASS is an FP4 kernel
        # only for FP4 weights (an FP8 model's CUTLASS GEMM is fine on SM121).
        if "cutlass" in value.lower() and (fp4 or name != "--linear-backend"):
            out.append(
                (
                    cutlass,
                    f"extra_args {name} {value} selects a CUTLASS FP4 kernel, refused by the {_CUTLASS_RULE}: "
                    f"{marlin_hint}",
                )
            )

    # mxfp4 only for gpt-oss
    if "mxfp4" in _quant_methods(p) and p["model_family"].lower() not in MXFP4_FAMILIES:
        out.append(
            (
                "mxfp4-only-gpt-oss",
                f"quantization mxfp4 on model_family {p['model_family']!r}, refused by the {_MXFP4_RULE}: "
                "mxfp4 checkpoints and kernels are validated on SM121 only for gpt-oss; use the model's own "
                "quantization (e.g. gptq_marlin, fp8, an NVFP4 checkpoint with Marlin) or null",
            )
        )

    # FP8 weights with FlashInfer attention crash on SM121. Left unset, vLLM 0.19.0 on capability
    # 12.x tries FLASH_ATTN, then FLASHINFER (vllm/platforms/cuda.py:107-113), and FlashInfer's
    # backend claims 7.5-12.1 (vllm/v1/attention/backends/flashinfer.py:393-396): so an FP8 profile
    # must name its backend.
    if _is_fp8(p):
        fp8_rule = "fp8-no-flashinfer-attention"
        backend = (p["attention_backend"] or "").upper()
        env_backend = env.get("VLLM_ATTENTION_BACKEND", "").strip().upper()
        if backend in FLASHINFER_ATTENTION or env_backend in FLASHINFER_ATTENTION:
            chosen = backend if backend in FLASHINFER_ATTENTION else f"env VLLM_ATTENTION_BACKEND={env_backend}"
            out.append(
                (
                    fp8_rule,
                    f"attention {chosen} on an FP8 checkpoint ({what}), refused by the {_FP8_ATTN_RULE}: "
                    "use attention_backend: TRITON_ATTN",
                )
            )
        elif not backend:
            out.append(
                (
                    fp8_rule,
                    f"attention_backend is unset on an FP8 checkpoint ({what}): vLLM may pick FLASHINFER on SM121 "
                    f"(it is second in its SM12x list), refused by the {_FP8_ATTN_RULE}: set attention_backend: "
                    "TRITON_ATTN",
                )
            )

    if p["enable_prefix_caching"] and p["model_family"].lower() in HYBRID_FAMILIES:
        out.append(
            (
                "hybrid-prefix-caching",
                f"enable_prefix_caching is true on model_family {p['model_family']!r}, a hybrid of attention and "
                "Gated DeltaNet/Mamba layers, refused by the "
                f"{_HYBRID_PC_RULE}: vLLM leaves it off for such models by default, and on it caches their "
                "recurrent state in an experimental mode ('align' for Qwen3.5/3.6); set enable_prefix_caching: "
                "false, or allow the rule with the reason you validated it",
            )
        )

    if p["not_recommended"]:
        out.append(
            (
                "not-recommended",
                f"profile of {p['model']} is marked not recommended ({_NOT_RECOMMENDED_RULE}): "
                f"{p['not_recommended']}; pick a recommended profile",
            )
        )

    out += _name_hint(p)
    out += [(None, m) for m in _speculative_shape(p)]

    # flags owned by profile keys
    for flag in flags:
        if flag in MANAGED_FLAGS:
            out.append((None, f"extra_args sets {flag}, which the profile owns: set {MANAGED_FLAGS[flag]} instead"))

    # expert parallelism needs something to spread experts over
    if p["enable_expert_parallel"] and p["tensor_parallel_size"] < 2:
        out.append(
            (
                None,
                "enable_expert_parallel is true but tensor_parallel_size is "
                f"{p['tensor_parallel_size']}: vLLM spreads experts over the tensor-parallel ranks, so EP needs "
                "tensor_parallel_size >= 2; set enable_expert_parallel: false or raise tensor_parallel_size",
            )
        )
    if p["max_num_batched_tokens"] < p["max_num_seqs"]:
        out.append(
            (
                None,
                f"max_num_batched_tokens {p['max_num_batched_tokens']} is below max_num_seqs {p['max_num_seqs']}: "
                "a decode step batches one token per sequence; raise max_num_batched_tokens",
            )
        )
    return out


def _cluster_violations(p: dict, gpus_total: int, node_memory_gib: float, gpus_per_node: int) -> list[str]:
    out: list[str] = []
    tp, pp = p["tensor_parallel_size"], p["pipeline_parallel_size"]
    world = tp * pp
    if world > gpus_total:
        out.append(
            f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} = {world} GPUs, but the cluster has "
            f"{gpus_total} (one GPU per Spark): lower tensor_parallel_size/pipeline_parallel_size or add nodes"
        )
    per_gpu_weights = p["weights_gib"] / world
    gmu = p["gpu_memory_utilization"]
    budget = node_memory_gib * gmu / gpus_per_node
    need = per_gpu_weights + KV_HEADROOM_GIB
    if need > budget:
        out.append(
            f"the model does not fit: weights_gib {p['weights_gib']:g} / (TP {tp} x PP {pp}) = "
            f"{per_gpu_weights:.1f} GiB per GPU, + {KV_HEADROOM_GIB:g} GiB headroom for KV cache, activations "
            f"and CUDA graphs = {need:.1f} GiB; vLLM may use only node_memory_gib {node_memory_gib:g} x "
            f"gpu_memory_utilization {gmu:g}"
            + (f" / {gpus_per_node} GPUs a node" if gpus_per_node != 1 else "")
            + f" = {budget:.1f} GiB per GPU. Raise tensor_parallel_size or pipeline_parallel_size (more nodes), "
            "pick a smaller quantization, or raise gpu_memory_utilization (at most 0.90)"
        )
    return out


def _check_cluster_args(gpus_total, node_memory_gib, gpus_per_node) -> None:
    if isinstance(gpus_total, bool) or not isinstance(gpus_total, int) or gpus_total < 1:
        raise ValueError(f"gpus_total must be a positive integer, got {gpus_total!r}")
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be a positive integer, got {gpus_per_node!r}")
    if isinstance(node_memory_gib, bool) or not isinstance(node_memory_gib, (int, float)) or node_memory_gib <= 0:
        raise ValueError(f"node_memory_gib must be a positive number, got {node_memory_gib!r}")


def check_allow_rules(entries) -> tuple[dict[str, str], list[str]]:
    """Validate sparkops_allow_rules: a list of {rule: <name in RULES>, reason: <non-empty text>}.

    Returns ({rule: reason}, problems). A problem names the entry and what to write instead; an
    entry with a problem allows nothing.
    """
    if entries is None:
        return {}, []
    if not isinstance(entries, (list, tuple)):
        return {}, [f"sparkops_allow_rules must be a list of {{rule, reason}} mappings, got {_describe(entries)}"]
    allowed: dict[str, str] = {}
    problems: list[str] = []
    known = ", ".join(RULES)
    for i, entry in enumerate(entries):
        where = f"sparkops_allow_rules[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{where} must be a mapping {{rule: <name>, reason: <text>}}, got {_describe(entry)}")
            continue
        extra = sorted(str(k) for k in entry if k not in ("rule", "reason"))
        if extra:
            problems.append(f"{where} has unknown key(s) {', '.join(extra)}: only rule and reason are read")
            continue
        rule, reason = entry.get("rule"), entry.get("reason")
        if not isinstance(rule, str) or rule not in RULES:
            problems.append(f"{where}: {rule!r} is not a rule name; the rules that may be allowed are: {known}")
            continue
        if not isinstance(reason, str) or not reason.strip():
            problems.append(
                f"{where} allows {rule} without a reason: write why, who validated it and on which image "
                "(it is printed on every run and shown by doctor, status and the health report)"
            )
            continue
        if rule in allowed:
            problems.append(f"{where} allows {rule} a second time: keep one entry per rule")
            continue
        allowed[rule] = reason.strip()
    return allowed, problems


def _version_tuple(version: str) -> tuple[int, ...] | None:
    """(major, minor, patch) from a release or dev string ("0.19.2rc1.dev154" -> (0, 19, 2)); None if none."""
    match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    if not match:
        return None
    return tuple(int(g or 0) for g in match.groups())


def _version_violations(p: dict, contract: dict) -> list[tuple[str | None, str]]:
    """A profile written for a newer vLLM than the pinned one is refused (it cannot be allowed: the
    pinned image would refuse its flags or fail to load the model)."""
    wanted = p["min_vllm_version"]
    if not wanted:
        return []
    version = contract.get("vllm_version", "?")
    want, have = _version_tuple(wanted), _version_tuple(version)
    if want is None:
        return [(None, f"min_vllm_version {wanted!r} is not a version (write e.g. '0.20.0')")]
    if have is not None and have >= want:
        return []
    image = f" (its source ran the image {p['image']})" if p["image"] else ""
    return [
        (
            None,
            f"profile of {p['model']} needs vLLM {wanted} or newer{image}, but sparkops pins vLLM {version} "
            f"(sparkops_vllm_version, from sparkops_stack): it is refused until the pin moves to {wanted} or later "
            "(a stack of that release: sparkops_stack, docs/stacks.md; playbooks/upgrade.yml moves the image and "
            "the pin together)",
        )
    ]


def min_version_problems(profile, contract) -> list[str]:
    """The profile's min_vllm_version against `contract`'s release: [] when that release is new enough (or the
    profile has other problems, which profile_violations reports)."""
    p, errors = _validate(profile)
    if errors:
        return []
    return [m for _rule, m in _version_violations(p, contract)]


def _findings(
    p: dict, gpus_total: int, node_memory_gib: float, gpus_per_node: int, *, contract, allowed: dict[str, str]
) -> dict:
    found = _rule_violations(p) + [
        (None, m) for m in _cluster_violations(p, gpus_total, node_memory_gib, gpus_per_node)
    ]
    if contract is not None:
        found += _contract_findings(p, contract, gpus_per_node) + _version_violations(p, contract)
    return _split(found, allowed)


def _split(found: list[tuple[str | None, str]], allowed: dict[str, str]) -> dict:
    refused: list[str] = []
    allowed_out: list[dict] = []
    for rule, message in found:
        if rule in allowed:  # never None: allowed holds rule names only (check_allow_rules)
            allowed_out.append({"rule": rule, "reason": allowed[rule], "message": message})
        elif rule is not None:
            refused.append(message + _ALLOW_HINT.format(rule=rule))
        else:
            refused.append(message)
    return {"refused": refused, "allowed": allowed_out}


def profile_findings(
    profile, gpus_total, node_memory_gib=128, gpus_per_node=1, *, contract=None, allow_rules=None
) -> dict:
    """{"refused": [messages], "allowed": [{rule, reason, message}]} for `profile` on the cluster.

    `allow_rules` is sparkops_allow_rules; a bad entry is itself refused. A hard rule whose name is
    allowed moves from refused to allowed, with the operator's reason, for the caller to warn about.
    """
    _check_cluster_args(gpus_total, node_memory_gib, gpus_per_node)
    allowed, problems = check_allow_rules(allow_rules)
    p, errors = _validate(profile)
    if errors:
        return {"refused": problems + errors, "allowed": []}
    out = _findings(p, gpus_total, float(node_memory_gib), gpus_per_node, contract=contract, allowed=allowed)
    out["refused"] = problems + out["refused"]
    return out


def profile_violations(
    profile, gpus_total, node_memory_gib=128, gpus_per_node=1, *, contract=None, allow_rules=None
) -> list[str]:
    """Every reason `profile` must not be served on a cluster of `gpus_total` GPUs; [] when it may.

    Type and range problems come first; the SM121 hard rules and the fit checks are only judged on a
    profile whose types are right. With `contract` (a vLLM contract), contract_violations too, and
    the profile's min_vllm_version against the contract's release. Rules named in `allow_rules`
    (sparkops_allow_rules) are not refused: profile_findings lists them for the warning.
    """
    return profile_findings(
        profile, gpus_total, node_memory_gib, gpus_per_node, contract=contract, allow_rules=allow_rules
    )["refused"]


def contract_violations(profile, contract, gpus_per_node=1, allow_rules=None) -> list[str]:
    """What vLLM of `contract` would refuse in `profile` (argv options and values, VLLM_* env), and the
    SM121 FP4 rules that this vLLM has no knob to enforce (unless allowed); [] when none.

    min_vllm_version is not judged here (this runs over every profile, not only the selected one), nor
    are bad allow_rules entries reported (profile_violations reports them once; here they allow nothing)."""
    allowed, _problems = check_allow_rules(allow_rules)
    p, errors = _validate(profile)
    if errors:
        return errors
    return _split(_contract_findings(p, contract, gpus_per_node), allowed)["refused"]


def _contract_findings(p: dict, contract: dict, gpus_per_node: int) -> list[tuple[str | None, str]]:
    argv = _argv(p, "127.0.0.1", 8000, gpus_per_node)  # host/port do not change what vLLM accepts
    found = [(None, m) for m in check_serve_args(argv, p["env"], contract)]
    found += [(None, m) for m in _speculative_contract(p, contract)]
    return found + [("no-cutlass-fp4", m) for m in _knob_violations(p, contract)]


# --speculative-config in vLLM 0.19.0: the JSON becomes SpeculativeConfig(**json)
# (vllm/engine/arg_utils.py:1489-1514). Methods that find their drafter without `model`
# (vllm/config/speculative.py:373-398): mtp uses the target itself, ngram/ngram_gpu/suffix/
# extract_hidden_states need none; any other method with num_speculative_tokens and no model raises
# "num_speculative_tokens was provided but without speculative model." (:395-398).
SPEC_METHODS_WITHOUT_MODEL = ("mtp", "ngram", "ngram_gpu", "suffix", "extract_hidden_states")
# MTP aliases vLLM maps to "mtp" (speculative.py:34-49, :367-371).
_SPEC_MTP_SUFFIX = "_mtp"
# Methods that take num_speculative_tokens from the drafter's config (n_predict, :562-568) or a default
# (suffix, :627-630); for every other method sparkops asks for it, as _verify_args refuses None (:777-782).
SPEC_METHODS_DEFAULT_TOKENS = ("mtp", "suffix", "medusa", "mlp_speculator")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")


def _spec_method(spec: dict) -> str | None:
    method = spec.get("method")
    if isinstance(method, str) and method.endswith(_SPEC_MTP_SUFFIX):
        return "mtp"
    return method if isinstance(method, str) else None


def speculative_drafter(profile) -> dict | None:
    """{"model", "revision"} of the profile's drafter (a Hub repository vLLM loads besides the model), or
    None: no speculative_config, a method without a drafter (mtp, ngram, ...), or a local path."""
    spec = profile.get("speculative_config") if isinstance(profile, dict) else None
    if not isinstance(spec, dict) or _spec_method(spec) in SPEC_METHODS_WITHOUT_MODEL:
        return None
    model = spec.get("model")
    if not isinstance(model, str) or not re.match(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$", model):
        return None
    revision = spec.get("revision")
    return {"model": model, "revision": revision if isinstance(revision, str) and revision else "main"}


def weight_repos(profile) -> list[dict]:
    """The Hub repositories a node's cache must hold to serve `profile`: the model at its revision (the
    lock's commit once deployment_state has replaced a moving one), then the drafter, if any, at its pinned
    commit. vLLM runs with HF_HUB_OFFLINE=1, so whatever is not synced to every node cannot load there."""
    if not isinstance(profile, dict) or not isinstance(profile.get("model"), str):
        raise ValueError(f"a serving profile with a model is needed, got {_describe(profile)}")
    out = [{"model": profile["model"], "revision": str(profile.get("revision") or "main"), "what": "model"}]
    drafter = speculative_drafter(profile)
    if drafter:
        out.append({**drafter, "what": "drafter"})
    return out


def _speculative_shape(p: dict) -> list[str]:
    """What any vLLM would refuse in speculative_config, and sparkops's own pin: a drafter by commit."""
    spec = p["speculative_config"]
    if not spec:
        return []
    out = []
    where = "speculative_config"
    method = _spec_method(spec)
    if "method" not in spec:
        out.append(
            f"{where} has no method: name it (eagle3, eagle, mtp, ngram, draft_model, ...); vLLM would guess it "
            "from the drafter's name or fall back to draft_model (vllm/config/speculative.py:362-366)"
        )
    elif not isinstance(spec["method"], str):
        out.append(f"{where}.method must be a string, got {_describe(spec['method'])}")
    tokens = spec.get("num_speculative_tokens")
    if tokens is None:
        if method is not None and method not in SPEC_METHODS_DEFAULT_TOKENS:
            out.append(
                f"{where} with method {method} has no num_speculative_tokens: set it (2 is what GB10 measurements "
                "favour); vLLM refuses a missing one unless the drafter's config has n_predict "
                "(vllm/config/speculative.py:777-782)"
            )
    elif isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        out.append(
            f"{where}.num_speculative_tokens must be an integer of at least 1, got {_describe(tokens)} "
            "(vLLM: Field(gt=0), vllm/config/speculative.py:71, and _verify_args :784-788)"
        )
    model = spec.get("model")
    if method is not None and method not in SPEC_METHODS_WITHOUT_MODEL and not model:
        out.append(
            f"{where} with method {method} has no model: name the drafter (a Hub repository) and its revision; "
            "vLLM refuses it: 'num_speculative_tokens was provided but without speculative model.' "
            "(vllm/config/speculative.py:395-398)"
        )
    if model is not None and (not isinstance(model, str) or not model.strip()):
        out.append(f"{where}.model must be a non-empty string, got {_describe(model)}")
    elif isinstance(model, str) and method not in SPEC_METHODS_WITHOUT_MODEL:
        revision = spec.get("revision")
        if not isinstance(revision, str) or not _HEX40.match(revision):
            out.append(
                f"{where}.revision must pin the drafter {model} by its 40-hex commit, got {revision!r}: a drafter "
                "that moves under you changes the acceptance rate and the benchmark (vLLM loads the default "
                "branch without it, vllm/config/speculative.py:105-108)"
            )
    if "tensor_parallel_size" in spec:
        out.append(
            f"{where} sets tensor_parallel_size, which vLLM refuses: use draft_tensor_parallel_size "
            "(vllm/config/speculative.py:771-775)"
        )
    draft_tp = spec.get("draft_tensor_parallel_size")
    if draft_tp is not None and draft_tp not in (1, p["tensor_parallel_size"]):
        out.append(
            f"{where}.draft_tensor_parallel_size {draft_tp!r} must be 1 or the target's tensor_parallel_size "
            f"{p['tensor_parallel_size']} (vllm/config/speculative.py:720-727)"
        )
    lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        out.append(f"{where}.prompt_lookup_min {lo} must be <= prompt_lookup_max {hi} (speculative.py:414-418)")
    return out


def _speculative_contract(p: dict, contract: dict) -> list[str]:
    """speculative_config against the keys, methods and eagle3 targets of the pinned release.

    The contract's speculative_config (recorded from that release's vllm/config/speculative.py by
    sim/record_vllm_contract.py) lists them; a contract without it cannot check them and says so."""
    spec = p["speculative_config"]
    if not spec:
        return []
    version = contract.get("vllm_version", "?")
    known = contract.get("speculative_config")
    if not isinstance(known, dict):
        return [
            f"the vLLM {version} contract has no recorded speculative_config, so speculative_config cannot be "
            f"checked: record it (python3 sim/record_vllm_contract.py {version} --speculative-from <vllm package>)"
        ]
    out = []
    unknown = sorted(k for k in spec if k not in known["fields"])
    if unknown:
        out.append(
            f"speculative_config has key(s) {', '.join(unknown)} that vLLM {version} does not know (it forbids "
            f"extra keys); known: {', '.join(known['fields'])}"
        )
    method = spec.get("method")
    if isinstance(method, str) and method not in known["methods"]:
        out.append(
            f"speculative_config.method {method!r} is not a method of vLLM {version}; its methods: "
            f"{', '.join(known['methods'])}"
        )
    aux = known.get("aux_hidden_states_models") or []
    if method in ("eagle3", "extract_hidden_states") and aux:
        family = p["model_family"].lower().replace("-", "_")
        if not any(name in family for name in aux):
            out.append(
                f"speculative_config.method {method} on model_family {p['model_family']!r}: vLLM {version} runs "
                f"eagle3 only on targets whose model type contains one of {', '.join(aux)} "
                "(SpeculativeConfig._verify_args)"
            )
    return out


def allowed_rule_warnings(profile_name, profile, allow_rules, contract=None) -> list[str]:
    """One line per sparkops_allow_rules entry, for every run's warning and for doctor, status and the
    health report: the rule, the operator's reason, and what it lets through in `profile` (or that
    the selected profile does not need it)."""
    allowed, problems = check_allow_rules(allow_rules)
    p, errors = _validate(profile)
    if errors:
        return problems
    found = _rule_violations(p)
    if contract is not None:
        found += _contract_findings(p, contract, 1)
    lines = list(problems)
    for rule, reason in allowed.items():
        hits = [message for name, message in found if name == rule]
        what = (
            f"it lets through in profile {profile_name}: " + "; ".join(hits)
            if hits
            else f"profile {profile_name} does not need it (remove the entry when no profile you run does)"
        )
        lines.append(f"SM121 rule {rule} is allowed by sparkops_allow_rules, reason: {reason!r}; {what}")
    return lines


def _extra_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _knob_violations(p: dict, contract: dict) -> list[str]:
    """The no-CUTLASS-FP4 rule with the knobs this vLLM release really has.

    Left alone, vLLM picks FlashInfer/CUTLASS FP4 kernels for FP4 MoE and linear layers on SM12x, so an
    FP4 profile must pin both to Marlin with whatever knob the release has:
      MoE:    --moe-backend marlin (KernelConfig.moe_backend, 0.19.0 and later), else
              VLLM_MXFP4_USE_MARLIN=1 (mxfp4 only; in vllm/envs.py up to 0.19.x, gone by 0.33.0);
      linear: --linear-backend marlin (KernelConfig.linear_backend, 0.33.0), else
              VLLM_NVFP4_GEMM_BACKEND=marlin (vllm/envs.py of 0.19.0; gone by 0.33.0).
    gpt-oss (mxfp4) quantizes only its experts, so it needs the MoE knob alone.
    A release with no such knob is refused: the rule could not be enforced there.
    """
    if not _is_fp4(p):
        return []
    version = contract.get("vllm_version", "?")
    env = {k.upper(): v for k, v in p["env"].items()}
    what = p["quantization"] or p["weights_quantization"] or p["model"]
    mxfp4 = "mxfp4" in _quant_methods(p)
    out = []
    if has_choice(contract, "--moe-backend", "marlin"):
        if (p["moe_backend"] or "").lower() != "marlin":
            out.append(
                f"FP4 model ({what}) with moe_backend {p['moe_backend']!r}: on vLLM {version} set moe_backend: "
                f"marlin, else vLLM picks a CUTLASS FP4 MoE kernel on SM121 ({_CUTLASS_RULE})"
            )
    elif mxfp4 and has_env(contract, "VLLM_MXFP4_USE_MARLIN"):
        if not _truthy_env(env.get("VLLM_MXFP4_USE_MARLIN", "")):
            out.append(
                f"mxfp4 model on vLLM {version}, which has no --moe-backend marlin: set env "
                f"VLLM_MXFP4_USE_MARLIN=1 ({_CUTLASS_RULE})"
            )
    else:
        out.append(
            f"vLLM {version} has no knob to put FP4 MoE on Marlin (no --moe-backend with marlin, no "
            f"VLLM_MXFP4_USE_MARLIN for mxfp4), so the {_CUTLASS_RULE} cannot be enforced for {what}: "
            "pin a vLLM release that has one"
        )
    if mxfp4 and p["model_family"].lower() in MXFP4_FAMILIES:
        return out
    if has_choice(contract, "--linear-backend", "marlin"):
        value = _extra_value(p["extra_args"], "--linear-backend")
        if (value or "").lower() != "marlin":
            out.append(
                f"FP4 model ({what}): on vLLM {version} add extra_args ['--linear-backend', 'marlin'], else vLLM "
                f"picks a CUTLASS FP4 GEMM on SM121 ({_CUTLASS_RULE})"
            )
    elif has_env(contract, "VLLM_NVFP4_GEMM_BACKEND"):
        if env.get("VLLM_NVFP4_GEMM_BACKEND", "").strip().lower() != "marlin":
            out.append(
                f"FP4 model ({what}): on vLLM {version} set env VLLM_NVFP4_GEMM_BACKEND=marlin, else vLLM picks "
                f"a CUTLASS FP4 GEMM on SM121 ({_CUTLASS_RULE})"
            )
    else:
        out.append(
            f"vLLM {version} has no knob to put FP4 linear layers on Marlin (no --linear-backend with marlin, "
            f"no VLLM_NVFP4_GEMM_BACKEND), so the {_CUTLASS_RULE} cannot be enforced for {what}: pin a vLLM "
            "release that has one"
        )
    return out


def _json_arg(value: dict) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def vllm_serve_args(profile, host, port, gpus_per_node=1, allow_rules=None) -> list[str]:
    """The exact `vllm serve` argv for `profile`, listening on host:port.

    Raises ValueError for a profile with wrong types or one that breaks a hard rule not allowed by
    `allow_rules` (sparkops_allow_rules; cluster-size checks need profile_violations). Ray is the
    executor when TP x PP exceeds one node's GPUs.
    """
    p = normalize_profile(profile)
    allowed, problems = check_allow_rules(allow_rules)
    broken = problems + _split(_rule_violations(p), allowed)["refused"]
    if broken:
        raise ValueError("serving profile breaks a hard rule: " + "; ".join(broken))
    if not isinstance(host, str) or not host.strip():
        raise ValueError(f"host must be a non-empty string, got {host!r}")
    if isinstance(port, bool) or not (isinstance(port, int) or (isinstance(port, str) and port.isdigit())):
        raise ValueError(f"port must be an integer, got {port!r}")
    port = int(port)
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be within 1-65535, got {port}")
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be a positive integer, got {gpus_per_node!r}")
    return _argv(p, host, port, gpus_per_node)


def _argv(p: dict, host: str, port: int, gpus_per_node: int) -> list[str]:
    argv = [
        "vllm",
        "serve",
        p["model"],
        "--revision",
        p["revision"],
        "--served-model-name",
        p["served_model_name"],
        "--tensor-parallel-size",
        str(p["tensor_parallel_size"]),
        "--pipeline-parallel-size",
        str(p["pipeline_parallel_size"]),
    ]
    if p["enable_expert_parallel"]:
        argv.append("--enable-expert-parallel")
    if p["quantization"]:
        argv += ["--quantization", p["quantization"]]
    argv += ["--kv-cache-dtype", p["kv_cache_dtype"]]
    if p["attention_backend"]:
        argv += ["--attention-backend", p["attention_backend"]]
    if p["moe_backend"]:
        argv += ["--moe-backend", p["moe_backend"]]
    argv += [
        "--gpu-memory-utilization",
        format(p["gpu_memory_utilization"], "g"),
        "--max-model-len",
        str(p["max_model_len"]),
        "--max-num-seqs",
        str(p["max_num_seqs"]),
        "--max-num-batched-tokens",
        str(p["max_num_batched_tokens"]),
    ]
    if p["max_cudagraph_capture_size"] is not None:
        argv += ["--max-cudagraph-capture-size", str(p["max_cudagraph_capture_size"])]
    argv.append("--enable-prefix-caching" if p["enable_prefix_caching"] else "--no-enable-prefix-caching")
    if p["speculative_config"]:
        argv += ["--speculative-config", _json_arg(p["speculative_config"])]
    if p["chat_template_kwargs"]:
        argv += ["--default-chat-template-kwargs", _json_arg(p["chat_template_kwargs"])]
    if p["tensor_parallel_size"] * p["pipeline_parallel_size"] > gpus_per_node:
        argv += ["--distributed-executor-backend", "ray"]
    argv += ["--host", host, "--port", str(port)]
    argv += p["extra_args"]
    return argv
