from ansible_collections.sparkops.cluster.plugins.filter.fastpath import (
    container_rdma_gaps,
    image_cuda_check,
    same_across_nodes,
)

SPARK_CONTAINER = {
    "HostConfig": {
        "NetworkMode": "host",
        "Devices": [{"PathOnHost": "/dev/infiniband", "PathInContainer": "/dev/infiniband"}],
        "Ulimits": [{"Name": "memlock", "Soft": -1, "Hard": -1}],
    },
    "Config": {"Env": ["NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1", "NCCL_SOCKET_IFNAME=enp1s0f1np1"]},
}


def test_container_with_everything_rdma_needs_has_no_gaps():
    assert container_rdma_gaps(SPARK_CONTAINER) == []


def test_container_without_devices_or_memlock_names_both():
    bare = {"HostConfig": {"NetworkMode": "host"}, "Config": {"Env": SPARK_CONTAINER["Config"]["Env"]}}
    gaps = container_rdma_gaps(bare)
    assert any("/dev/infiniband" in g for g in gaps)
    assert any("memlock" in g for g in gaps)
    assert len(gaps) == 2


def test_container_on_bridge_network_without_env_file():
    gaps = container_rdma_gaps({"HostConfig": {**SPARK_CONTAINER["HostConfig"], "NetworkMode": "bridge"}})
    assert any("host network" in g for g in gaps)
    assert any("NCCL_IB_HCA" in g for g in gaps)


def test_image_needing_cuda_13_1_on_a_580_driver_is_not_met():
    out = image_cuda_check(["CUDA_VERSION=13.1.0", "NVIDIA_REQUIRE_CUDA=cuda>=13.1"], "580.95.05", image="x:1")
    assert out["status"] == "not met"
    assert "580.95.05" in out["message"] and "13.1" in out["message"]


def test_image_needing_cuda_13_0_on_a_580_driver_is_met():
    out = image_cuda_check(["CUDA_VERSION=13.0.1", "NVIDIA_REQUIRE_CUDA=cuda>=13.0"], "580.95.05")
    assert out["status"] == "met"


def test_image_without_requirement_is_unknown():
    assert image_cuda_check(["PATH=/usr/bin"], "580.95.05")["status"] == "unknown"


def test_same_across_nodes_names_the_odd_node():
    out = same_across_nodes({"a": "580.95.05", "b": "580.95.05", "c": "590.44.01"})
    assert not out["ok"]
    assert out["odd_nodes"] == ["c"]


def test_nccl_busbw_verdict_filter_reads_the_probe_and_judges_it():
    from ansible_collections.sparkops.cluster.plugins.filter.fastpath import nccl_busbw_verdict  # noqa: PLC0415
    from conftest import FIXTURES  # noqa: PLC0415

    one_gpu = nccl_busbw_verdict((FIXTURES / "nccl" / "busbw_probe_h200_ws1_default.txt").read_text())
    assert one_gpu["verdict"] == "FAIL" and one_gpu["world_size"] == 1 and "world size 1" in one_gpu["message"]
    two = (
        "#  Rank  0 Group  0 Pid 1 on host-a device  0 [0000:01:00] GPU\n"
        "#  Rank  1 Group  0 Pid 1 on host-b device  0 [0000:01:00] GPU\n"
        "  1073741824     134217728     float    none      -1   40000.0   26.84   13.42      0\n"
    )
    assert nccl_busbw_verdict(two)["verdict"] == "FAIL"  # 13.42 GB/s < 21.875
    passed = nccl_busbw_verdict(two, threshold_gbs="12.5")  # a templated threshold arrives as text
    assert passed["verdict"] == "PASS" and passed["peak_busbw_gbs"] == 13.42 and passed["rows"] == 1
    assert nccl_busbw_verdict(None)["message"].startswith("no bandwidth rows")
