"""nccl_transport on the recorded real NCCL logs in tests/fixtures/nccl (sources in its README)."""

import shutil

from ansible_collections.sparkops.cluster.plugins.modules import nccl_transport
from conftest import FIXTURES
from module_runner import run_module

NCCL = FIXTURES / "nccl"
TWINS = ["rocep1s0f1", "roceP2p1s0f1"]


def test_both_twins_over_roce_passes_from_files(tmp_path):
    shutil.copy(NCCL / "spark_2node_roce_both_twins_nccl2.28.9.log", tmp_path / "worker-1.err")
    out = run_module(nccl_transport, {"paths": [str(tmp_path / "worker-*.err")], "expected_hcas": TWINS})
    assert not out.get("failed"), out
    assert out["ok"] is True
    assert out["transports"] == ["IB"]
    assert out["files_read"] == [str(tmp_path / "worker-1.err")]


def test_socket_fallback_fails_naming_sockets():
    text = (NCCL / "spark_2node_socket_enP7s7_nccl2.29.7.log").read_text()
    out = run_module(nccl_transport, {"text": text, "expected_hcas": TWINS})
    assert out["failed"]
    assert "Socket" in out["msg"]
    assert out["ok"] is False


def test_one_twin_only_fails_naming_the_missing_one():
    text = (NCCL / "spark_2node_single_twin_vllm.log").read_text()
    out = run_module(nccl_transport, {"text": text, "expected_hcas": TWINS})
    assert out["failed"]
    assert "roceP2p1s0f1" in out["msg"]


def test_no_nccl_lines_is_a_failure_not_a_pass(tmp_path):
    (tmp_path / "worker-1.err").write_text("INFO 11-23 vLLM test double: nothing about NCCL here\n")
    out = run_module(nccl_transport, {"paths": [str(tmp_path / "*.err")], "expected_hcas": TWINS})
    assert out["failed"]
    assert "no NCCL transport lines" in out["msg"]


def test_report_only_mode_does_not_fail():
    text = (NCCL / "spark_2node_socket_enP7s7_nccl2.29.7.log").read_text()
    out = run_module(nccl_transport, {"text": text, "fail_on_mismatch": False}, check_mode=True)
    assert not out.get("failed")
    assert out["ok"] is False
