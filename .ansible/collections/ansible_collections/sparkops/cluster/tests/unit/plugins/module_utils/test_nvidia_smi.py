"""nvidia_smi parsers on real outputs: an H100 on driver 580.159.04 recorded here, GB10 (DGX Spark) rows and
banners from public notes. Sources: tests/fixtures/nvidia_smi/README.md."""

from __future__ import annotations

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import nvidia_smi as ns
from conftest import FIXTURES

SMI = FIXTURES / "nvidia_smi"


def fx(name: str) -> str:
    return (SMI / name).read_text()


def test_h100_query_row_in_gpu_facts_field_order():
    # recorded: nvidia-smi --query-gpu=<ns.QUERY_FIELDS> --format=csv,noheader,nounits
    gpus = ns.gpus_from_rows(ns.parse_query_csv(fx("h100_580.159.04_query.csv")))
    assert gpus == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "driver_version": "580.159.04",
            "compute_capability": "9.0",
            "memory_total_mib": 81559,
            "memory_used_mib": 0,
            "uuid": "GPU-2dbfaaf6-8c19-b69d-f6ab-5f3880bbf446",
            "pci_bus_id": "00000000:00:06.0",
        }
    ]


def test_header_and_units_are_tolerated():
    fields = ["index", "name", "driver_version", "compute_cap", "memory.total", "uuid", "pci.bus_id"]
    rows = ns.parse_query_csv(fx("h100_580.159.04_query_header.csv"), fields)
    assert len(rows) == 1  # the "memory.total [MiB]" header line is skipped
    gpu = ns.gpus_from_rows(rows)[0]
    assert gpu["memory_total_mib"] == 81559  # "81559 MiB"
    assert gpu["index"] == 0


def test_gb10_memory_is_na_unified_memory():
    fields = ["name", "driver_version", "memory.total", "memory.used", "memory.free"]
    rows = ns.parse_query_csv(fx("gb10_580.159.03_query_memory.csv"), fields)
    assert rows == [
        {
            "name": "NVIDIA GB10",
            "driver_version": "580.159.03",
            "memory.total": None,
            "memory.used": None,
            "memory.free": None,
        }
    ]
    gpu = ns.gpus_from_rows(rows)[0]
    assert gpu["memory_total_mib"] is None and gpu["memory_used_mib"] is None
    rows = ns.parse_query_csv(fx("gb10_580.173.02_query_memory.csv"), ["name", "driver_version", "memory.total"])
    assert rows[0]["memory.total"] is None and rows[0]["driver_version"] == "580.173.02"


def test_gb10_bus_id_row_with_units():
    fields = ["name", "driver_version", "pci.bus_id", "utilization.gpu", "power.draw"]
    row = ns.parse_query_csv(fx("gb10_580.178.04_query_busid.csv"), fields)[0]
    assert row["pci.bus_id"] == "0000000F:01:00.0"
    assert ns.gpus_from_rows([row])[0]["pci_bus_id"] == "0000000F:01:00.0"


def test_wrong_column_count_and_empty_output_raise():
    with pytest.raises(ns.NvidiaSmiError, match="expected 8 comma-separated values"):
        ns.parse_query_csv(fx("gb10_580.159.03_query_memory.csv"))
    with pytest.raises(ns.NvidiaSmiError, match="no GPU rows"):
        ns.parse_query_csv("\n")


def test_banner_driver_and_cuda_version():
    assert ns.parse_banner(fx("h100_580.159.04_nvidia-smi.txt")) == {
        "smi_version": "580.159.04",
        "driver_version": "580.159.04",
        "cuda_driver_version": "13.0",
    }
    gb10 = ns.parse_banner(fx("gb10_580.142_nvidia-smi.txt"))
    assert (gb10["driver_version"], gb10["cuda_driver_version"]) == ("580.142", "13.0")
    assert ns.parse_banner("nothing here") == {"smi_version": None, "driver_version": None, "cuda_driver_version": None}


def test_proc_version_open_proprietary_and_gcc_line_ignored():
    h100 = ns.parse_proc_version(fx("h100_580.159.04_proc_version.txt"))
    assert h100 == {"kernel_module_version": "580.159.04", "kernel_module_flavor": "open", "arch": "x86_64"}
    gb10 = ns.parse_proc_version(fx("gb10_580.126.09_proc_version.txt"))
    assert gb10 == {"kernel_module_version": "580.126.09", "kernel_module_flavor": "open", "arch": "aarch64"}
    prop = ns.parse_proc_version(fx("proprietary_580.82.07_proc_version.txt"))
    assert prop == {"kernel_module_version": "580.82.07", "kernel_module_flavor": "proprietary", "arch": "x86_64"}
    assert ns.parse_proc_version("GCC version:  gcc version 13.3.0")["kernel_module_version"] is None


def test_no_driver_and_mismatch_messages():
    reason = ns.no_driver_reason(fx("no_driver.txt"))
    assert reason.startswith("nvidia-smi: NVIDIA-SMI has failed because it couldn't communicate")
    assert ns.no_driver_reason(fx("h100_580.159.04_bad_field.txt")) is None
    assert ns.driver_mismatch(fx("nvml_mismatch.txt")) == "580.126"
    assert ns.driver_mismatch(fx("no_driver.txt")) is None


def test_branch_and_branch_status():
    assert ns.driver_branch("580.159.04") == "580"
    assert ns.driver_branch("580.142") == "580"
    assert ns.driver_branch(None) is None and ns.driver_branch("N/A") is None
    assert ns.branch_status("580", "580.159.04", "580.159.04") == {
        "on_branch": True,
        "branches": ["580"],
        "reason": None,
    }
    off = ns.branch_status("580", "590.44.01", "580.126.09")
    assert off["on_branch"] is False and off["branches"] == ["580", "590"]
    assert "590.44.01 is not on the 580 branch" in off["reason"]
    assert ns.branch_status("580", None, None)["on_branch"] is False


def test_query_args_match_recorded_command():
    assert ns.query_args() == [
        "--query-gpu=driver_version,name,compute_cap,memory.total,memory.used,pci.bus_id,uuid,index",
        "--format=csv,noheader,nounits",
    ]
