"""The vLLM contract: fixtures recorded from the official wheels, the help-text parser on the real help
text of 0.19.0, and check_serve_args on what real vLLM 0.19.0 accepts and refuses."""

from __future__ import annotations

import json
import os
import re

import pytest
from ansible_collections.sparkops.cluster.plugins.plugin_utils import vllm_contract
from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (
    CONTRACTS_DIR,
    check_serve_args,
    contract_from_help,
    load_contract,
    recorded_versions,
    shared_contract,
)
from conftest import ROOT

KEYS = {"vllm_version", "source", "serve_options", "value_sets", "env_vars", "metrics"}


@pytest.fixture(scope="module")
def v019() -> dict:
    return load_contract("0.19.0")


@pytest.fixture(scope="module")
def help019() -> str:
    return (CONTRACTS_DIR / "vllm-0.19.0.help.txt").read_text()


def test_every_fixture_has_the_agreed_keys_and_provenance():
    versions = recorded_versions()
    assert len(versions) >= 2, versions
    assert "0.19.0" in versions
    for version in versions:
        c = load_contract(version)
        assert set(c) >= KEYS, (version, sorted(KEYS - set(c)))
        src = c["source"]
        assert src["wheel"].startswith(f"vllm-{version}-") and src["wheel"].endswith(".whl")
        assert re.fullmatch(r"[0-9a-f]{64}", src["sha256"])
        assert (CONTRACTS_DIR / src["help_text"]).is_file()
        for opt, spec in c["serve_options"].items():
            assert opt.startswith("--") and {"takes_value", "choices", "aliases"} <= set(spec), opt
        assert all(name.startswith("VLLM_") for name in c["env_vars"])


def test_0_19_0_fixture_matches_what_the_release_is_known_to_have(v019):
    opts = v019["serve_options"]
    # issue 12: real vLLM 0.19.0 has 295 serve options; the options the reference profile uses exist
    assert len(opts) == 295
    for flag in ("--attention-backend", "--moe-backend", "--max-cudagraph-capture-size", "--enable-expert-parallel"):
        assert flag in opts, flag
    assert "-tp" in opts["--tensor-parallel-size"]["aliases"]
    assert "-ep" in opts["--enable-expert-parallel"]["aliases"]
    assert opts["--enable-prefix-caching"]["aliases"] == ["--no-enable-prefix-caching"]
    assert opts["--enable-prefix-caching"]["takes_value"] is False
    assert "marlin" in opts["--moe-backend"]["choices"]
    vs = v019["value_sets"]
    assert "gptq_marlin" in vs["quantization"] and "mxfp4" in vs["quantization"]
    assert "aqlm" not in vs["quantization"] and "marlin" not in vs["quantization"]
    assert "TRITON_ATTN" in vs["attention_backend"]
    assert "XFORMERS" not in vs["attention_backend"] and "PALLAS" not in vs["attention_backend"]
    assert vs["distributed_executor_backend"] == ["external_launcher", "mp", "ray", "uni"]
    assert "fp8" in vs["kv_cache_dtype"]
    for name in ("VLLM_API_KEY", "VLLM_MXFP4_USE_MARLIN", "VLLM_NVFP4_GEMM_BACKEND", "VLLM_USE_FLASHINFER_MOE_FP4"):
        assert name in v019["env_vars"], name
    assert "VLLM_DISTRIBUTED_EXECUTOR_CONFIG" not in v019["env_vars"]


def test_0_19_0_metrics_are_the_release_s_own(v019):
    fams = {m["name"]: m for m in v019["metrics"]}
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
    ):
        assert fams[name]["type"] == "histogram" and fams[name]["buckets"], name
        assert set(fams[name]["labels"]) == {"engine", "model_name"}
    assert fams["vllm:prompt_tokens_total"]["type"] == "counter"
    assert fams["vllm:kv_cache_usage_perc"]["type"] == "gauge"
    assert "finished_reason" in fams["vllm:request_success_total"]["labels"]
    # gone in the V1 engine: a dashboard querying them would show nothing
    assert "vllm:gpu_cache_usage_perc" not in fams
    assert "vllm:time_per_output_token_seconds" not in fams


def test_newest_release_drops_the_fp4_env_knobs_0_19_0_has():
    newest = load_contract(recorded_versions()[-1])
    assert newest["vllm_version"] != "0.19.0"
    for name in ("VLLM_MXFP4_USE_MARLIN", "VLLM_NVFP4_GEMM_BACKEND", "VLLM_USE_FLASHINFER_MOE_FP4"):
        assert name not in newest["env_vars"], name


def test_load_contract_refuses_unknown_and_malformed_versions():
    with pytest.raises(ValueError, match=r"no recorded vLLM contract for version 0\.12\.0 .*record_vllm_contract"):
        load_contract("0.12.0")
    with pytest.raises(ValueError, match="must look like 0.19.0"):
        load_contract("../../etc/passwd")


def test_help_parser_on_real_0_19_0_help_agrees_with_the_parser_recording(v019, help019):
    parsed = contract_from_help(help019, "0.19.0")
    rec, got = v019["serve_options"], parsed["serve_options"]
    assert set(got) == set(rec)
    for opt in rec:
        assert got[opt]["takes_value"] == rec[opt]["takes_value"], opt
        assert sorted(got[opt]["aliases"]) == sorted(rec[opt]["aliases"]), opt
        if rec[opt]["choices"] and opt != "--collect-detailed-traces":  # its metavar lists only single values
            assert got[opt]["choices"] == rec[opt]["choices"], opt
        assert got[opt]["nargs"] == (rec[opt]["nargs"] if rec[opt]["nargs"] in ("+", "*", "?") else None), opt
    assert parsed["value_sets"]["moe_backend"] == v019["value_sets"]["moe_backend"]
    assert parsed["env_vars"] == v019["env_vars"]  # from the recorded fixture of the same version
    assert "recorded fixture" in parsed["source"]["env_vars"]
    assert parsed["speculative_config"] == v019["speculative_config"]  # not in the help text either


def test_help_parser_on_the_newest_recorded_release_too():
    newest = recorded_versions()[-1]
    rec = load_contract(newest)
    parsed = contract_from_help((CONTRACTS_DIR / rec["source"]["help_text"]).read_text(), newest)
    # help prints every option the parser accepts except the ones it hides (0.33.0's --no-enable-x forms)
    printed = {o for o, spec in rec["serve_options"].items() if not spec["hidden"]}
    assert set(parsed["serve_options"]) == printed
    assert all(parsed["serve_options"][o]["takes_value"] == rec["serve_options"][o]["takes_value"] for o in printed)


def test_help_parser_without_a_fixture_marks_env_unknown(help019):
    parsed = contract_from_help(help019, "9.9.9")
    assert parsed["env_vars"] is None and parsed["metrics"] is None and parsed["speculative_config"] is None
    assert check_serve_args(["m"], {"VLLM_FOO": "1"}, parsed) == [
        "VLLM_FOO: cannot be checked, the VLLM_* variables of vLLM 9.9.9 are unknown"
    ]
    given = contract_from_help(help019, "9.9.9", env_vars=["VLLM_FOO", "HOME"])
    assert given["env_vars"] == ["VLLM_FOO"]


def test_help_parser_refuses_other_text():
    with pytest.raises(ValueError, match="not `vllm serve --help=all` output"):
        contract_from_help("usage: ray start [OPTIONS]\n  --head  start the head\n", "0.19.0")


def test_reference_argv_is_accepted_by_0_19_0(v019):
    argv = (  # noqa: SIM905 - one command line, as typed
        "vllm serve Qwen/Qwen3-235B-A22B-GPTQ-Int4 --tensor-parallel-size 2 --enable-expert-parallel "
        "--quantization gptq_marlin --kv-cache-dtype fp8 --attention-backend TRITON_ATTN "
        "--gpu-memory-utilization 0.87 --max-cudagraph-capture-size 2048 --enable-prefix-caching "
        "--distributed-executor-backend ray --served-model-name a b --max_model_len 32768 -tp 2 "
        '--compilation-config.mode 3 --default-chat-template-kwargs {"enable_thinking":false}'
    ).split()
    assert check_serve_args(argv, {"VLLM_API_KEY": "k", "NCCL_DEBUG": "INFO"}, v019) == []


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["m", "--no-such-flag", "1"], "--no-such-flag: unrecognized argument for vLLM 0.19.0"),
        (["m", "--quantization", "aqlm"], "--quantization aqlm: not a value vLLM 0.19.0 knows"),
        (["m", "--quantization", "marlin"], "--quantization marlin: not a value vLLM 0.19.0 knows"),
        (["m", "--attention-backend", "XFORMERS"], "--attention-backend XFORMERS: not a value vLLM 0.19.0"),
        (["m", "--moe-backend", "cutlass_fp4"], "--moe-backend cutlass_fp4: invalid choice for vLLM 0.19.0"),
        (["m", "--kv-cache-dtype=fp4"], "--kv-cache-dtype fp4: invalid choice"),
        (["m", "--enforce-eager=yes"], "--enforce-eager: takes no value in vLLM 0.19.0"),
        (["m", "--max-model-len"], "--max-model-len: expects a value in vLLM 0.19.0"),
        (["m", "--distributed-executor-backend", "rays"], "--distributed-executor-backend rays: not a value"),
        (["a", "b"], "takes one model, got 2 positional arguments"),
    ],
)
def test_what_0_19_0_refuses_is_named_with_option_and_version(v019, argv, expected):
    problems = check_serve_args(argv, {}, v019)
    assert any(expected in p for p in problems), problems


def test_optimization_level_forms_like_flexible_argument_parser(v019):
    for argv in (["m", "-O3"], ["m", "-O", "3"], ["m", "-O=2"], ["m", "--optimization-level", "1"]):
        assert check_serve_args(argv, {}, v019) == [], argv


def test_attention_backend_is_case_insensitive_and_auto_like_vllm(v019):
    assert check_serve_args(["m", "--attention-backend", "triton_attn"], {}, v019) == []
    assert check_serve_args(["m", "--attention-backend", "auto"], {}, v019) == []
    assert check_serve_args(["m", "--distributed-executor-backend", "my.pkg.Executor"], {}, v019) == []


def test_unknown_vllm_env_is_named_with_a_suggestion(v019):
    problems = check_serve_args(["m"], {"VLLM_DISTRIBUTED_EXECUTOR_CONFIG": "{}", "VLLM_API_KEYS": "x"}, v019)
    assert any(p.startswith("VLLM_DISTRIBUTED_EXECUTOR_CONFIG: vLLM 0.19.0 does not read") for p in problems)
    assert any("VLLM_API_KEYS" in p and "did you mean VLLM_API_KEY?" in p for p in problems)


def test_bad_arguments_are_refused_clearly(v019):
    with pytest.raises(ValueError, match="argv must be a list"):
        check_serve_args("vllm serve m", {}, v019)
    with pytest.raises(ValueError, match="contract must be"):
        check_serve_args([], {}, {"x": 1})
    with pytest.raises(ValueError, match="env must be a mapping"):
        check_serve_args([], ["VLLM_X"], v019)


@pytest.mark.skipif(not (ROOT / "sim").is_dir(), reason="checkout only: sim/ does not ship in the collection")
def test_standin_copy_is_the_pinned_fixture():
    """The test double in the simulated cluster loads sim/standin/vllm-contract.json: the same contract."""
    copy = json.loads((ROOT / "sim" / "standin" / "vllm-contract.json").read_text())
    help_all = copy.pop("help_all")
    assert copy == load_contract(copy["vllm_version"])
    assert help_all == (CONTRACTS_DIR / f"vllm-{copy['vllm_version']}.help.txt").read_text()


def test_the_shared_contract_is_parsed_once_read_again_when_its_file_changes_and_refuses_as_load_contract(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(vllm_contract, "CONTRACTS_DIR", tmp_path)
    monkeypatch.setattr(vllm_contract, "_SHARED", {})
    path = tmp_path / "vllm-0.19.0.json"
    path.write_text((CONTRACTS_DIR / "vllm-0.19.0.json").read_text())
    first = shared_contract("0.19.0")
    assert first == load_contract("0.19.0") and shared_contract(" 0.19.0 ") is first  # one parse per process
    changed = json.loads(path.read_text())
    changed["env_vars"] = ["VLLM_ONLY_IN_THE_NEW_FILE"]
    path.write_text(json.dumps(changed))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    assert shared_contract("0.19.0")["env_vars"] == ["VLLM_ONLY_IN_THE_NEW_FILE"]
    for bad in ("0.12.0", "../../etc/passwd"):
        with pytest.raises(ValueError, match="no recorded vLLM contract|must look like"):
            shared_contract(bad)
