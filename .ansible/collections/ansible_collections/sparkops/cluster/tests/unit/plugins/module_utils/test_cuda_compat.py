"""cuda_compat on real image environments quoted in public material:
- vllm/vllm-openai:v0.28.0: CUDA_VERSION=13.0.2 and NVIDIA_REQUIRE_CUDA "cuda>=13.0 ... driver>=535" (public
  deployment pre-check notes); the full brand list of the nvidia/cuda 13.0 base (a public Go test pinning the
  reference image's environment);
- "NVIDIA_REQUIRE_CUDA=cuda>=13.0 driver>=580.95.05" (public RHEL AI CUDA 13.0 image notes).
Minimum drivers: NVIDIA CUDA Toolkit Release Notes, "CUDA Toolkit and Corresponding Driver Versions"."""

from __future__ import annotations

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import cuda_compat as cc

BRANDS = " ".join(
    f"brand={b},driver>=535,driver<536"
    for b in ("unknown", "grid", "tesla", "nvidia", "quadro", "quadrortx", "nvidiartx", "vapps", "vpc", "vcs", "vws")
)
VLLM_ENV = [
    "PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "NVARCH=x86_64",
    f"NVIDIA_REQUIRE_CUDA=cuda>=13.0 {BRANDS}",
    "NV_CUDA_CUDART_VERSION=13.0.96-1",
    "CUDA_VERSION=13.0.2",
]


def test_requirement_from_env_list():
    req = cc.image_cuda_requirement(VLLM_ENV)
    assert req["min_cuda"] == "13.0" and req["source"] == "NVIDIA_REQUIRE_CUDA"
    assert req["cuda_version"] == "13.0.2"
    assert req["min_driver"] is None  # driver>=535 only inside brand clauses
    assert len(req["brand_clauses"]) == 11
    assert req["brand_clauses"][2] == "brand=tesla,driver>=535,driver<536"
    assert req["disabled"] is False


def test_requirement_with_plain_driver_clause_and_from_labels():
    req = cc.image_cuda_requirement({"NVIDIA_REQUIRE_CUDA": "cuda>=13.0 driver>=580.95.05"})
    assert (req["min_cuda"], req["min_driver"]) == ("13.0", "580.95.05")
    only_version = cc.image_cuda_requirement({"CUDA_VERSION": "12.9.1"})
    assert (only_version["min_cuda"], only_version["source"]) == ("12.9", "CUDA_VERSION")
    none = cc.image_cuda_requirement(["PATH=/usr/bin"])
    assert none["min_cuda"] is None and none["source"] is None
    assert cc.image_cuda_requirement(["NVIDIA_DISABLE_REQUIRE=1", "CUDA_VERSION=13.1.0"])["disabled"] is True


def test_parse_require_cuda_alternatives():
    alts = cc.parse_require_cuda("cuda>=12.8 brand=tesla,driver>=470,driver<471")
    assert alts[0] == [{"kind": "cuda", "op": ">=", "value": "12.8"}]
    assert [c["kind"] for c in alts[1]] == ["brand", "driver", "driver"]


def test_table_values_from_release_notes():
    assert cc.MIN_DRIVER["12.0"] == "525.60.13"
    assert cc.MIN_DRIVER["12.8"] == "570.26"
    assert cc.MIN_DRIVER["12.9"] == "575.51.03"
    assert cc.MIN_DRIVER["13.0"] == "580.65.06"
    assert cc.MIN_DRIVER["13.1"] == "590.44.01"
    assert cc.min_driver_for_cuda("13.0.2") == "580.65.06"


def test_met_on_spark_580_driver():
    res = cc.driver_supports_cuda("580.159.04", "13.0.2")
    assert (res["ok"], res["status"], res["min_driver"]) == (True, "met", "580.65.06")
    assert cc.driver_supports_cuda("580.142", "12.9")["status"] == "met"


def test_not_met_names_both_versions():
    res = cc.driver_supports_cuda("580.159.04", "13.1")
    assert (res["ok"], res["status"], res["min_driver"]) == (False, "not met", "590.44.01")
    assert "580.159.04" in res["reason"] and "590.44.01" in res["reason"] and "13.1" in res["reason"]
    old = cc.driver_supports_cuda("575.57.08", "13.0")
    assert old["status"] == "not met" and "575.57.08 is older than 580.65.06" in old["reason"]


def test_driver_cuda_version_decides_when_known():
    # the CUDA Version the H100's 580.159.04 driver reported in the recorded nvidia-smi banner: 13.0
    assert cc.driver_supports_cuda("580.159.04", "13.0", driver_cuda_version="13.0")["status"] == "met"
    res = cc.driver_supports_cuda("580.159.04", "13.1", driver_cuda_version="13.0")
    assert res["status"] == "not met"
    assert "supports CUDA up to 13.0, but the image needs CUDA 13.1" in res["reason"]
    # beyond the table, the driver's own CUDA version still answers
    assert cc.driver_supports_cuda("600.10", "13.4", driver_cuda_version="13.5")["status"] == "met"


def test_unknown_cases():
    assert cc.driver_supports_cuda("580.159.04", None)["status"] == "unknown"
    assert cc.driver_supports_cuda(None, "13.0")["status"] == "unknown"
    res = cc.driver_supports_cuda("580.159.04", "14.0")
    assert res["status"] == "unknown" and res["ok"] is None
    assert cc.driver_supports_cuda("580.159.04", "cuda")["status"] == "unknown"


def test_same_across_nodes():
    ok = cc.same_across_nodes({"spark1": "580.159.04", "spark2": "580.159.04"})
    assert ok["ok"] is True and ok["odd_nodes"] == [] and ok["value"] == "580.159.04"
    odd = cc.same_across_nodes({"spark1": "580.159.04", "spark2": "590.44.01", "spark3": "580.159.04"})
    assert (odd["ok"], odd["value"], odd["odd_nodes"]) == (False, "580.159.04", ["spark2"])
    assert "spark2 has 590.44.01" in odd["message"]
    missing = cc.same_across_nodes({"a": "sha256:1", "b": None})
    assert missing["ok"] is False and missing["missing"] == ["b"] and "b reported nothing" in missing["message"]
    tie = cc.same_across_nodes({"a": "x", "b": "y"})
    assert tie["value"] == "x" and tie["odd_nodes"] == ["b"]
    assert cc.same_across_nodes({})["ok"] is False


def test_version_tuple_rejects_garbage():
    assert cc.version_tuple("580.95.05") == (580, 95, 5)
    with pytest.raises(ValueError):
        cc.version_tuple("abc")
