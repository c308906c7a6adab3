"""nccl_log on real NCCL INFO logs from public material (sources: tests/fixtures/nccl/README.md):
- two DGX Sparks over both twins (public Japanese lab notes, hosts spark-fb97/spark-4440, NCCL 2.28.9);
- two Sparks falling back to sockets over enP7s7 (public cluster post-mortem, NCCL 2.29.7);
- two Sparks on one twin only (public vLLM run notes, NCCL_IB_HCA=rocep1s0f1);
- NVIDIA/nccl#676 (Socket), NVIDIA/nccl-tests#185 (RoCE, plugin lines), NVIDIA/nccl-tests#373 (IBext_v8 plugin,
  merged NICs), a two-host shrink test with NCCL_IB_GID_INDEX=3."""

from __future__ import annotations

import pytest
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


# Small logs in the line formats of the fixtures above (the module docstring lists them).
def info(host: str, pid: int, msg: str) -> str:
    return f"{host}:{pid}:{pid} [0] NCCL INFO {msg}"


def channels(host: str, pid: int, nets: list[str]) -> list[str]:
    return [info(host, pid, f"Channel {i:02d}/0 : 0[0] -> 1[0] [send] via {net}") for i, net in enumerate(nets)]


def test_ib_no_device_alone_is_no_rdma_proof():
    p = nl.parse_nccl_transport("spark-a:11:11 [0] NCCL INFO NET/IB : No device found.\n")
    ep = p["endpoints"]["spark-a:11"]
    assert (ep["transport"], ep["ib_no_device"], ep["hcas"]) == (None, True, [])
    assert p["transports"] == [] and p["hosts"]["spark-a"]["transports"] == []
    v = nl.transport_verdict(p)
    assert v["ok"] is False
    assert v["problems"] == ["spark-a:11: no transport chosen in the log (NET/IB No device found: True)"]
    assert nl.transport_verdict(p, TWINS)["ok"] is False


def test_no_device_flag_needs_both_net_ib_and_no_device():
    p = parse("spark_2node_roce_both_twins_nccl2.28.9.log")  # NET/IB lines, none says "No device found"
    assert all(ep["ib_no_device"] is False for ep in p["endpoints"].values())
    other = nl.parse_nccl_transport(
        info("h", 1, "NET/Socket : No device found.") + "\n" + info("h", 1, "NCCL_IB_GID_INDEX set to 3.")
    )
    assert other["endpoints"]["h:1"]["ib_no_device"] is False


def test_socket_channels_outnumbering_ib_are_judged_socket():
    """No "Using network" line: the transport is the one most channels ran over."""
    log = "\n".join(channels("h", 7, ["NET/Socket/0", "NET/Socket/0", "NET/Socket/0", "NET/IB/0"]))
    ep = nl.parse_nccl_transport(log)["endpoints"]["h:7"]
    assert ep["channel_transports"] == {"Socket": 3, "IB": 1}
    assert ep["transport"] == "Socket"
    assert ep["channel_net_devs"] == ["NET/IB/0", "NET/Socket/0"]
    v = nl.transport_verdict(nl.parse_nccl_transport(log))
    assert v["ok"] is False and "NET/Socket over a TCP interface" in v["message"]


def test_some_channels_over_sockets_fail_even_when_most_are_ib():
    log = "\n".join(channels("h", 7, ["NET/IB/0", "NET/IB/1", "NET/IB/0", "NET/Socket/0"]))
    p = nl.parse_nccl_transport(log)
    assert p["endpoints"]["h:7"]["transport"] == "IB"
    v = nl.transport_verdict(p)
    assert v["ok"] is False
    assert v["problems"] == [f"h:7: 1 of 4 channels over NET/Socket; {nl.SOCKET_HINT}"]


def test_channel_ties_go_to_the_first_name():
    ep = nl.parse_nccl_transport("\n".join(channels("h", 7, ["NET/Socket/0", "NET/IB/0"])))["endpoints"]["h:7"]
    assert ep["transport"] == "IB"  # sorted names, max keeps the first of equal counts


@pytest.mark.parametrize("network", ["Libfabric", "AWS Libfabric", "Plugin_x"])
def test_a_network_plugin_other_than_ib_is_not_ib_verbs(network):
    log = "\n".join([info("h", 3, f"Using network {network}"), *channels("h", 3, [f"NET/{network}/0"])])
    p = nl.parse_nccl_transport(log)
    assert p["transports"] == [network]
    v = nl.transport_verdict(p, TWINS)
    assert v["ok"] is False
    assert v["problems"] == [f"h:3: transport {network}, not IB verbs"]


def test_every_failing_endpoint_is_named():
    """Problems of every endpoint, whichever comes first in sorted order."""
    log = "\n".join(
        [
            info("a", 1, "Using network Libfabric"),
            info("b", 2, "Using network Socket"),
            info("c", 3, "NET/IB : No device found."),
            *channels("cc", 8, ["NET/IB/0", "NET/IB/1", "NET/Socket/0"]),
            info("d", 4, "NET/Socket : Using [0]enP7s7:192.168.0.111<0>"),
            info("e", 5, "Using network Libfabric"),
            info("f", 6, "NET/IB : No device found."),
            info("g", 7, "NET/IB : Using [0]rocep1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.100.16<0>"),
        ]
    )
    v = nl.transport_verdict(nl.parse_nccl_transport(log), TWINS)
    assert [problem.split(":", maxsplit=1)[0] for problem in v["problems"]] == ["a", "b", "c", "cc", "d", "e", "f", "g"]
    assert v["problems"][3].startswith("cc:8: 1 of 3 channels over NET/Socket")
    assert "NET/Socket over a TCP interface" in v["problems"][1]
    assert "NET/Socket over enP7s7:192.168.0.111" in v["problems"][4]
    assert v["message"] == "; ".join(v["problems"])


def test_endpoint_fields_and_versions():
    p = parse("spark_2node_roce_both_twins_nccl2.28.9.log")
    ep = p["endpoints"]["spark-4440:24302"]
    assert (ep["host"], ep["pid"]) == ("spark-4440", "24302")
    assert ep["ib_hca_env"] is None  # NCCL_IB_HCA not set in that run
    assert ep["nccl_version"] == "2.28.9+cuda13.0"
    assert p["nccl_versions"] == ["2.28.9+cuda13.0"]
    assert p["gid_index"] is None
    assert nl.transport_verdict(p)["problems"] == []


def test_first_version_per_endpoint_and_every_version_listed():
    log = "\n".join(
        [
            info("a", 1, "NCCL version 2.28.9+cuda13.0"),
            info("a", 1, "NCCL version 2.27.3+cuda12.9"),
            info("b", 2, "NCCL version 2.27.3+cuda12.9"),
            info("a", 1, "Using network IB"),
            info("b", 2, "Using network IB"),
        ]
    )
    p = nl.parse_nccl_transport(log)
    assert p["endpoints"]["a:1"]["nccl_version"] == "2.28.9+cuda13.0"
    assert p["endpoints"]["b:2"]["nccl_version"] == "2.27.3+cuda12.9"
    assert p["nccl_versions"] == ["2.28.9+cuda13.0", "2.27.3+cuda12.9"]
    assert p["nccl_version"] == "2.28.9+cuda13.0"


def test_ib_hca_env_and_several_gid_indexes():
    log = "\n".join(
        [
            info("a", 1, "NCCL_IB_HCA set by environment to rocep1s0f1,roceP2p1s0f1"),
            info("a", 1, "NCCL_IB_GID_INDEX set by environment to 3."),
            info("b", 2, "NCCL_IB_GID_INDEX set by environment to 1."),
            info("a", 1, "Using network IB"),
        ]
    )
    p = nl.parse_nccl_transport(log)
    assert p["endpoints"]["a:1"]["ib_hca_env"] == "rocep1s0f1,roceP2p1s0f1"
    assert p["gid_index"] == [1, 3]  # hosts disagree: both are shown
    assert p["endpoints"]["b:2"]["transport"] is None  # kept for its GID index, but no transport proof
    assert p["hosts"]["b"]["gid_index"] == 1


def test_plugin_lines_of_every_marker():
    p = parse("nccl_tests373_ibext_merged_roce.log")
    assert p["plugin_lines"] == [  # each once, and no other line
        "Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
        "P2P plugin IBext_v8",
        "Using non-device net plugin version 0",
    ]


def test_prefixless_lines_without_an_address_are_unknown():
    p = nl.parse_nccl_transport("NCCL INFO Using network IB\nNCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0\n")
    assert list(p["endpoints"]) == ["unknown"]
    assert p["endpoints"]["unknown"]["hcas"] == ["mlx5_0"]
    assert p["hosts"] == {"unknown": {"transports": ["IB"], "hcas": ["mlx5_0"], "socket_ifs": [], "gid_index": None}}


def test_prefixless_endpoint_is_named_by_its_oob_address():
    p = parse("spark_2node_single_twin_vllm.log")
    ep = p["endpoints"]["10.0.0.1"]
    assert ep["host"] is None and ep["oob"] == "enp1s0f1np1:10.0.0.1"
    assert sorted(p["hosts"]) == ["enp1s0f1np1:10.0.0.1", "enp1s0f1np1:10.0.0.2"]


def test_none_and_empty_parse_to_nothing():
    for text in (None, ""):
        p = nl.parse_nccl_transport(text)
        assert p == {
            "endpoints": {},
            "hosts": {},
            "transports": [],
            "nccl_versions": [],
            "nccl_version": None,
            "gid_index": None,
            "plugin_lines": [],
        }
    v = nl.transport_verdict({})
    assert v == {
        "ok": False,
        "message": "no NCCL transport lines found: run with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET)",
        "problems": ["no transport lines"],
    }
    assert nl.transport_class(None) is None and nl.transport_class("") is None
    assert nl.transport_class(" socket ") == "Socket"


def test_a_passing_verdict_has_no_problems():
    v = nl.transport_verdict(parse("spark_2node_roce_both_twins_nccl2.28.9.log"), TWINS)
    assert v == {
        "ok": True,
        "message": "NCCL used IB verbs (RDMA) over roceP2p1s0f1, rocep1s0f1 on all 2 endpoint(s)",
        "problems": [],
    }
    no_hcas = nl.transport_verdict(nl.parse_nccl_transport(info("h", 1, "Using network IB")))
    assert no_hcas["message"] == "NCCL used IB verbs (RDMA) on all 1 endpoint(s)"


def test_the_last_using_line_wins_when_there_are_no_channels():
    """Two communicators in one process: the later choice is the transport."""
    ib = info("h", 1, "NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:10.0.0.1<0>")
    sock = info("h", 1, "NET/Socket : Using [0]enP7s7:192.168.0.111<0>")
    assert nl.parse_nccl_transport(sock + "\n" + ib)["endpoints"]["h:1"]["transport"] == "IB"
    assert nl.parse_nccl_transport(ib + "\n" + sock)["endpoints"]["h:1"]["transport"] == "Socket"
    only_ib = nl.parse_nccl_transport(ib)
    assert only_ib["endpoints"]["h:1"]["hcas"] == TWINS
    # No channel lines: nothing says fewer devices than the twins carried the traffic.
    assert nl.transport_verdict(only_ib, TWINS)["ok"] is True
