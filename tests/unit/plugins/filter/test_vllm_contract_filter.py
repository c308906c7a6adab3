"""The vllm_contract / vllm_serve_problems / serving_profiles_contract_violations filters."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.filter.serving import FilterModule as ServingFilters
from ansible_collections.sparkops.cluster.plugins.filter.vllm_contract import FilterModule
from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import CONTRACTS_DIR

F = FilterModule().filters()
S = ServingFilters().filters()


def test_contract_by_version_and_from_help_text():
    c = F["vllm_contract"]("0.19.0")
    assert c["vllm_version"] == "0.19.0" and "--moe-backend" in c["serve_options"]
    text = (CONTRACTS_DIR / "vllm-0.19.0.help.txt").read_text()
    parsed = F["vllm_contract"]("0.19.0", help_text=text)
    assert set(parsed["serve_options"]) == set(c["serve_options"])
    with pytest.raises(AnsibleFilterError, match="no recorded vLLM contract for version 0.12.0"):
        F["vllm_contract"]("0.12.0")


def test_serve_problems_by_version_or_contract():
    argv = ["vllm", "serve", "m", "--moe-backend", "marlin"]
    assert F["vllm_serve_problems"](argv, {"VLLM_API_KEY": "k"}, "0.19.0") == []
    c = F["vllm_contract"]("0.19.0")
    found = F["vllm_serve_problems"]([*argv, "--linear-backend", "marlin"], {}, c)
    assert found == [
        "--linear-backend: unrecognized argument for vLLM 0.19.0 `vllm serve` (it would exit 2); "
        "it is new in vLLM 0.33.0: 0.19.0 does not have it yet"
    ]


def test_profiles_contract_violations_names_each_refused_profile():
    good = {
        "model": "m/m",
        "model_family": "x",
        "weights_gib": 1,
        "env": {"VLLM_MXFP4_USE_MARLIN": "1"},
    }
    bad = dict(good, extra_args=["--no-such-flag"])
    found = S["serving_profiles_contract_violations"]({"good": good, "bad": bad}, "0.19.0")
    assert list(found) == ["bad"] and "--no-such-flag" in found["bad"][0]
    newer = S["serving_profiles_contract_violations"]({"good": good}, "0.33.0")
    assert "VLLM_MXFP4_USE_MARLIN: vLLM 0.33.0 does not read" in newer["good"][0]
    with pytest.raises(AnsibleFilterError, match="no recorded vLLM contract"):
        S["serving_profiles_contract_violations"]({"good": good}, "0.1.0")
