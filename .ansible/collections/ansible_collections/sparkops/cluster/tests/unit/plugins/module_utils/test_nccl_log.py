"""nccl_log on real NCCL INFO logs from public material (sources: tests/fixtures/nccl/README.md):
- two DGX Sparks over both twins (public Japanese lab notes, hosts spark-fb97/spark-4440, NCCL 2.28.9);
- two Sparks falling back to sockets over enP7s7 (public cluster post-mortem, NCCL 2.29.7);
- two Sparks on one twin only (public vLLM run notes, NCCL_IB_HCA=rocep1s0f1);
- NVIDIA/nccl#676 (Socket), NVIDIA/nccl-tests#185 (RoCE, plugin lines), NVIDIA/nccl-tests#373 (IBext_v8 plugin,
  merged NICs), a two-host shrink test with NCCL_IB_GID_INDEX=3."""

from __future__ import annotations

from ansible_collections.sparkops.cluster.plugins.module_utils import nccl_log as nl
from conftest import FIXTURES

NCCL = FIXTURES / "nccl"
TWINS = ["rocep1s0f1", "roceP2p1s0f1"]


def parse(name: str) -> dict:
    return nl.parse_nccl_transport((NCCL / name).read_text())


def test_spark_both_twins_is_ib_on_both_hosts():
    p = parse("spark_2node_roce_both_twins_nccl2.28.9.log")
    assert p["transports"] == ["IB"]
    assert p["nccl_version"] == "2.28.9+cuda13.0"
    assert sorted(p["endpoints"]) == ["spark-4440:24302", "spark-fb97:23491"]
    ep = p["endpoints"]["spark-4440:24302"]
    assert ep["hcas"] == TWINS
    assert ep["oob"] == "enp1s0f1np1:192.168.100.16"
    assert ep["channel_net_devs"] == ["NET/IB/0", "NET/IB/1"]
    assert ep["ranks"] == [1] and p["endpoints"]["spark-fb97:23491"]["ranks"] == [0]
    assert p["hosts"]["spark-fb97"]["transports"] == ["IB"]
    assert "NET/Plugin: Could not find: libnccl-net.so" in p["plugin_lines"]
    assert "Initialized NET plugin IB" in p["plugin_lines"]
    v = nl.transport_verdict(p, TWINS)
    assert v["ok"] is True, v
    assert "roceP2p1s0f1, rocep1s0f1" in v["message"]


def test_spark_socket_fallback_fails_the_verdict():
    p = parse("spark_2node_socket_enP7s7_nccl2.29.7.log")
    assert p["transports"] == ["Socket"]
    assert p["nccl_version"] == "2.29.7+cuda13.2"
    ep = p["endpoints"]["192.168.0.111"]
    assert ep["socket_ifs"] == ["enP7s7:192.168.0.111"] and ep["hcas"] == []
    v = nl.transport_verdict(p)
    assert v["ok"] is False
    assert "NET/Socket over enP7s7:192.168.0.111" in v["message"]
    assert "--ulimit memlock=-1" in v["message"]


def test_spark_single_twin_fails_with_expected_hcas_only():
    p = parse("spark_2node_single_twin_vllm.log")
    assert p["transports"] == ["IB"]
    assert sorted(p["endpoints"]) == ["10.0.0.1", "10.0.0.2"]
    assert p["endpoints"]["10.0.0.1"]["hcas"] == ["rocep1s0f1"]
    assert nl.transport_verdict(p)["ok"] is True  # IB, and no twin list to compare with
    v = nl.transport_verdict(p, TWINS)
    assert v["ok"] is False
    assert len(v["problems"]) == 2
    assert "missing roceP2p1s0f1" in v["message"]
    assert "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in v["message"]


def test_nccl676_socket_with_using_network_line():
    p = parse("nccl676_2nodes_socket_nccl2.11.4.log")
    assert p["nccl_version"] == "2.11.4+cuda11.4"
    ep = p["endpoints"]["gpu01:124172"]
    assert (ep["transport"], ep["network"], ep["socket_ifs"]) == ("Socket", "Socket", ["enp225s0f1:10.10.10.2"])
    assert nl.transport_verdict(p)["ok"] is False


def test_nccl_tests185_roce_and_plugin_lines():
    p = parse("nccl_tests185_dgxh100_roce_nccl2.19.3.log")
    assert p["nccl_version"] == "2.19.3+cuda12.3"
    assert {k: v["hcas"] for k, v in p["endpoints"].items()} == {
        "dgxh100-4:460770": ["mlx5_10", "mlx5_11"],
        "dgxh100-3:2152176": ["mlx5_10", "mlx5_11"],
    }
    assert any(line.startswith("NET/Plugin : No plugin found") for line in p["plugin_lines"])
    assert nl.transport_verdict(p)["ok"] is True
    wrong = nl.transport_verdict(p, TWINS)
    assert wrong["ok"] is False and "uses only mlx5_10, mlx5_11" in wrong["message"]


def test_ibext_plugin_and_merged_devices_count_as_ib():
    p = parse("nccl_tests373_ibext_merged_roce.log")
    ep = p["endpoints"]["bigo:1884"]
    assert ep["network"] == "IBext_v8" and ep["transport"] == "IB"
    assert ep["hcas"] == ["mlx5_2", "mlx5_3", "mlx5_0", "mlx5_1"]
    assert ep["channel_net_devs"] == ["NET/IBext_v8/1"]
    assert "P2P plugin IBext_v8" in p["plugin_lines"]
    assert nl.transport_verdict(p)["ok"] is True


def test_gid_index_and_channel_only_transport():
    p = parse("two_hosts_gid_index3_nccl.log")
    assert p["gid_index"] == 3
    assert p["hosts"]["ubuntu4"]["gid_index"] == 3
    assert all(ep["transport"] == "IB" for ep in p["endpoints"].values())
    assert nl.transport_verdict(p)["ok"] is True
    v = nl.transport_verdict(p, TWINS)  # every channel on NET/IB/2: one NIC, not two twins
    assert v["ok"] is False and "channels ran over only NET/IB/2 of 2 expected HCAs" in v["message"]


def test_empty_log_and_transport_class():
    v = nl.transport_verdict(nl.parse_nccl_transport("hello\n"))
    assert v["ok"] is False and "NCCL_DEBUG=INFO" in v["message"]
    assert nl.transport_class("IBext_v8") == "IB"
    assert nl.transport_class("Socket") == "Socket"
    assert nl.transport_class("AWS Libfabric") == "AWS Libfabric"
