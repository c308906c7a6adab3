"""perftest parsers and the cable verdict, on real ib_write_bw outputs.

Every fixture is verbatim public output; its source is named next to the file name below and in
tests/fixtures/perftest/README.md:

* spark-eugr_client_q4_rdmacm_gbits.txt - eugr/spark-vllm-docker docs/NETWORKING.md (commit
  10fa84e1adbd29d72e44d95da62891d17aadd841): DGX Spark client, `ib_write_bw 192.168.177.12 -d rocep1s0f1
  --report_gbits -q 4 -R --force-link IB`, DGX OS perftest (version not recorded).
* spark-playbooks_client_{rocep1s0f0,roceP2p1s0f0}_run_infinitely_gbits.txt - NVIDIA/dgx-spark-playbooks
  nvidia/connect-two-sparks/assets/performance_benchmarking_guide.md (commit 0db7c141da60870ca6ed5c99436320f4e35cd531,
  lines 853-881 and 886-915): DGX Spark clients on both twins, RoCE GID 3, `--run_infinitely`.
* spark-sparkring_bidir_{healthy,degraded}_result.txt - FujitsuPolycom/sparkring: the healthy line from
  performance/records/transport/fabric-cable-bandwidth-20261002.md (commit 11c9b277...), the degraded line
  from runtime/host/test_fabric_bandwidth.py (commit b61c4e38...), "lines that ib_write_bw printed on a
  four-Spark ring" (`ib_write_bw -b -d DEV -x 3 -s 1048576 -D 5 -F --report_gbits`); result table only.
* perftest-issue234_server_duration_mbsec_truncated.txt - linux-rdma/perftest issue #234 (2023-12, older
  perftest, MB/sec): server side, `ib_write_bw -D 10 -d mlx5_0`, cut off in the stored copy after the
  first two columns of the result row.
* perftest-issue273_postlist_duration_gbits.txt - linux-rdma/perftest issue #273 (2024-08): 60 s duration
  run, Gb/sec, peak printed as 0.00.
* perftest-issue132_client_all_sizes_gbits_partial.txt - linux-rdma/perftest issue #132 (comment
  2023-08-24): `ib_write_bw -a -d mlx5_0 --report_gbits node1`, quoted with "> " (removed), the stored copy
  ends inside the 16-byte row.
* ucx-issue8851_ib_read_bw_all_sizes_mbsec_partial.txt - openucx/ucx issue #8851 (2023-02): ib_read_bw -a,
  MB/sec (same report format), stored copy ends after the 16-byte row.
* perftest-pr228_client_couldnt_connect.txt - linux-rdma/perftest pull #228 (2023-11): client with no server.
* perftest-issue393_client_qp_rtr_failed.txt - linux-rdma/perftest issue #393 (2026-06).
* perftest-issue132_{server_exchange_failed,client_qp_rts_failed}.txt - linux-rdma/perftest issue #132.
* perftest-issue139_server_create_qp_failed.txt - linux-rdma/perftest issue #139 (2022-02; ib_write_lat,
  same library code).
* ngc-issue108_client_bidir_q2_duration_header_partial.txt - Mellanox/ngc_multinode_perf issue #108
  (2024-04): `ib_write_bw ... -D 30 --report_gbit -b -q 2`, header only (the stored copy is cut there).
* debian12-perftest-4.5+0.17_no_rdma_device.txt - recorded here, 2026-11-23: Debian 12's perftest
  4.5+0.17-1 (prints "Version: 6.06"), `ib_write_bw --report_gbits` on a machine without RDMA devices.
"""

from __future__ import annotations

import math

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import perftest as pt
from conftest import FIXTURES

PERF = FIXTURES / "perftest"


def parse(name: str) -> dict:
    return pt.parse_ib_write_bw((PERF / name).read_text())


# --- units ------------------------------------------------------------------------------------------


def test_units_gbits_is_decimal_and_byte_units_are_mebibytes():
    assert pt.to_gbps(111.71, "Gb/sec") == 111.71
    # 2^20 byte/s = 8 * 1048576 bit/s = 0.008388608 Gb/s, for both the old and the new spelling.
    assert pt.to_gbps(1000.0, "MB/sec") == pytest.approx(8.388608, rel=1e-12)
    assert pt.to_gbps(1000.0, "MiB/sec") == pytest.approx(8.388608, rel=1e-12)
    assert pt.to_gbps(None, "Gb/sec") is None
    assert pt.to_gbps(5.0, None) is None
    with pytest.raises(ValueError, match="unknown perftest unit"):
        pt.to_gbps(1.0, "GB/sec")


def test_mib_header_of_newer_perftest_is_read_as_mebibytes():
    # The MiB/sec header is perftest's RESULT_FMT since linux-rdma/perftest commit 1d202bb (2024-03-19);
    # the row below is the sparkring healthy row re-expressed in MiB/s (213.05 Gb/s = 25397.6 MiB/s).
    text = (PERF / "spark-sparkring_bidir_healthy_result.txt").read_text()
    text = text.replace("Gb/sec", "MiB/sec").replace("213.05", "25397.60")
    r = pt.parse_ib_write_bw(text)
    assert r["units_seen"] == ["MiB/sec"]
    assert r["bw_avg_gbps"] == pytest.approx(213.05, abs=0.01)


# --- Spark outputs ------------------------------------------------------------------------------------


def test_spark_client_four_qps_rdma_cm_gbits():
    r = parse("spark-eugr_client_q4_rdmacm_gbits.txt")
    assert r["side"] == "client"
    assert r["device"] == "rocep1s0f1"
    assert (r["qps"], r["mtu"], r["link_type"], r["transport"]) == (4, 1024, "IB", "IB")
    assert r["connection_type"] == "RC"
    assert r["rdma_cm"] is True and r["gid_index"] is None and r["data_exchange"] == "rdma_cm"
    assert (r["msg_size_bytes"], r["iterations"]) == (65536, 20000)
    assert (r["bw_peak_gbps"], r["bw_avg_gbps"], r["msg_rate_mpps"]) == (111.72, 111.71, 0.213070)
    assert r["bw_peak_measured"] is True
    assert r["units_seen"] == ["Gb/sec"] and len(r["rows"]) == 1
    assert r["bidirectional"] is False and r["test"] == "RDMA_Write BW Test"
    assert r["error"] is None and r["duration_s"] is None


@pytest.mark.parametrize(
    ("name", "device", "avg", "iterations"),
    [
        ("spark-playbooks_client_rocep1s0f0_run_infinitely_gbits.txt", "rocep1s0f0", 92.57, 882821),
        ("spark-playbooks_client_roceP2p1s0f0_run_infinitely_gbits.txt", "roceP2p1s0f0", 97.28, 927807),
    ],
)
def test_spark_twins_roce_run_infinitely(name, device, avg, iterations):
    r = parse(name)
    assert r["device"] == device and r["side"] == "client"
    assert (r["link_type"], r["gid_index"], r["rdma_cm"], r["mtu"], r["qps"]) == ("Ethernet", 3, False, 1024, 1)
    # Every repeated row is kept; the result is the last row of the (only) size.
    assert len(r["rows"]) in (5, 6) and all(row["msg_size_bytes"] == 65536 for row in r["rows"])
    assert (r["bw_avg_gbps"], r["iterations"]) == (avg, iterations)
    # "WARNING: BW peak won't be measured" and 0.00: not a measurement.
    assert r["bw_peak_measured"] is False and r["bw_peak_gbps"] is None
    assert r["rows"][-1]["bw_peak"] == 0.0


def test_spark_twins_sum_to_the_playbooks_total():
    total = sum(
        parse(n)["rows"][0]["bw_avg_gbps"]
        for n in (
            "spark-playbooks_client_rocep1s0f0_run_infinitely_gbits.txt",
            "spark-playbooks_client_roceP2p1s0f0_run_infinitely_gbits.txt",
        )
    )
    assert total == pytest.approx(189.85)  # "Total throughput = 92.57 + 97.28 = 189.85 Gbps"


def test_sparkring_bidirectional_result_lines():
    healthy = parse("spark-sparkring_bidir_healthy_result.txt")
    degraded = parse("spark-sparkring_bidir_degraded_result.txt")
    assert (healthy["msg_size_bytes"], healthy["bw_avg_gbps"]) == (1048576, 213.05)
    assert (degraded["iterations"], degraded["bw_avg_gbps"], degraded["msg_rate_mpps"]) == (39035, 118.66, 0.014145)
    # Only the result table: nothing about the header is invented.
    assert healthy["side"] is None and healthy["device"] is None and healthy["qps"] is None
    assert healthy["bw_peak_measured"] is False and healthy["bw_peak_gbps"] is None


# --- other versions and modes -------------------------------------------------------------------------


def test_older_perftest_server_duration_mb_sec_cut_short():
    r = parse("perftest-issue234_server_duration_mbsec_truncated.txt")
    assert r["side"] == "server"
    assert (r["device"], r["link_type"], r["gid_index"], r["mtu"], r["rdma_cm"]) == (
        "mlx5_0",
        "Ethernet",
        3,
        4096,
        False,
    )
    assert r["unit"] == "MB/sec" and r["units_seen"] == ["MB/sec"]
    # The row is cut after two columns: no figure, no crash.
    assert r["rows"] == [] and r["bw_avg_gbps"] is None and r["bw_peak_measured"] is None
    assert r["error"] is None


def test_duration_run_peak_zero_is_not_measured():
    r = parse("perftest-issue273_postlist_duration_gbits.txt")
    assert (r["msg_size_bytes"], r["iterations"], r["bw_avg_gbps"]) == (8, 224958464, 0.48)
    assert r["bw_peak_measured"] is False and r["bw_peak_gbps"] is None
    assert r["test"] == "RDMA_Write Post List BW Test" and r["tx_depth"] == 256 and r["gid_index"] == 2


def test_all_sizes_takes_the_largest_complete_row():
    r = parse("perftest-issue132_client_all_sizes_gbits_partial.txt")
    assert [row["msg_size_bytes"] for row in r["rows"]] == [2, 4, 8]  # the cut 16-byte row is not a row
    assert r["rows"][0]["bw_peak_gbps"] == 0.042350 and r["rows"][0]["bw_avg_gbps"] == 0.042185
    assert (r["msg_size_bytes"], r["bw_avg_gbps"], r["bw_peak_gbps"]) == (8, 0.17, 0.17)
    assert r["link_type"] == "IB" and r["gid_index"] is None and r["side"] == "client"


def test_mb_sec_rows_are_converted():
    r = parse("ucx-issue8851_ib_read_bw_all_sizes_mbsec_partial.txt")
    assert r["units_seen"] == ["MB/sec"] and len(r["rows"]) == 4
    first = r["rows"][0]
    assert (first["bw_peak"], first["bw_avg"], first["unit"]) == (4.86, 4.67, "MB/sec")
    assert first["bw_avg_gbps"] == pytest.approx(4.67 * 1048576 * 8 / 1e9)
    assert r["msg_size_bytes"] == 16 and r["bw_avg_gbps"] == pytest.approx(38.95 * 0.008388608)


def test_bidirectional_multi_qp_header_without_rows():
    r = parse("ngc-issue108_client_bidir_q2_duration_header_partial.txt")
    assert r["bidirectional"] is True and r["test"] == "RDMA_Write Bidirectional BW Test"
    assert (r["qps"], r["device"]) == (2, "mlx5_3")
    assert r["bw_peak_measured"] is False and r["bw_avg_gbps"] is None and r["rows"] == []


# --- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "error", "kind", "side"),
    [
        (
            "perftest-pr228_client_couldnt_connect.txt",
            "Couldn't connect to 192.168.125.211:18515",
            "connect_failed",
            "client",
        ),
        ("perftest-issue393_client_qp_rtr_failed.txt", "Failed to modify QP to RTR", "qp_setup_failed", None),
        ("perftest-issue132_client_qp_rts_failed.txt", "Failed to modify QP to RTS", "qp_setup_failed", None),
        (
            "perftest-issue132_server_exchange_failed.txt",
            "Failed to exchange data between server and client",
            "exchange_failed",
            None,
        ),
        ("perftest-issue139_server_create_qp_failed.txt", "Couldn't create IB resources", "qp_setup_failed", "server"),
        (
            "debian12-perftest-4.5+0.17_no_rdma_device.txt",
            "Unable to find the Infiniband/RoCE device",
            "no_rdma_device",
            None,
        ),
    ],
)
def test_error_outputs(name, error, kind, side):
    r = parse(name)
    assert (r["error"], r["error_kind"], r["side"]) == (error, kind, side)
    assert r["bw_avg_gbps"] is None and r["rows"] == []


def test_port_in_use_message_from_perftest_source():
    # Text of perftest's src/perftest_communication.c ("Couldn't listen to port %d"); no public sample found.
    r = pt.parse_ib_write_bw("Couldn't listen to port 18515\n Unable to open file descriptor for socket connection\n")
    assert r["error_kind"] == "port_in_use" and r["side"] == "server" and "Couldn't listen" in r["error"]


def test_empty_and_none_do_not_crash():
    for text in ("", None, "garbage\n 12 ab"):
        r = pt.parse_ib_write_bw(text)
        assert r["bw_avg_gbps"] is None and r["rows"] == [] and r["error"] is None and r["side"] is None


def test_nan_column_is_none():
    text = (PERF / "spark-sparkring_bidir_healthy_result.txt").read_text().replace("0.00 ", "-nan ")
    r = pt.parse_ib_write_bw(text)
    assert r["rows"][0]["bw_peak"] is None and r["bw_avg_gbps"] == 213.05
    assert not math.isnan(r["bw_avg_gbps"])


# --- thresholds ------------------------------------------------------------------------------------------


def test_line_rate_threshold():
    assert pt.line_rate_threshold(200, 0.95) == 190.0
    assert pt.line_rate_threshold(1, 0.5) == 0.5
    for bad in ((0, 0.9), (200, 0), (200, 1.5), (None, 0.9), (200, None), (-1, 0.9)):
        with pytest.raises(ValueError):
            pt.line_rate_threshold(*bad)


# --- cable verdict -------------------------------------------------------------------------------------


def twin(name: str, device: str, **extra) -> dict:
    return parse(name) | {"device": device} | extra


HEALTHY = "spark-sparkring_bidir_healthy_result.txt"
DEGRADED = "spark-sparkring_bidir_degraded_result.txt"


def test_healthy_cable():
    v = pt.cable_verdict([twin(HEALTHY, "rocep1s0f1"), twin(HEALTHY, "roceP2p1s0f1")])
    assert v["verdict"] == "healthy" and v["reason"] is None and v["advice"] == []
    assert v["total_gbps"] == pytest.approx(426.10) and v["min_gbps"] == 213.05
    assert [t["verdict"] for t in v["twins"]] == ["healthy", "healthy"]


def test_degraded_cable_gives_the_repair_advice():
    v = pt.cable_verdict({"rocep1s0f1": parse(HEALTHY), "roceP2p1s0f1": parse(DEGRADED)})
    assert v["verdict"] == "degraded" and v["reason"] is None
    assert v["twins"][1] == {
        "device": "roceP2p1s0f1",
        "gbps": 118.66,
        "verdict": "degraded",
        "reason": None,
        "error": None,
    }
    assert v["total_gbps"] == pytest.approx(331.71)
    text = " ".join(v["advice"]).lower()
    assert "reboot" in text and "both" in text and "reseat" in text
    assert "does not clear" in text and ("link" in text and "driver" in text)
    assert "roceP2p1s0f1 118.66 Gb/s degraded" in v["message"]


def test_both_twins_degraded_sum_above_threshold_is_still_degraded():
    # 2 x 118.66 = 237 Gb/s would pass a 190 threshold on the sum; the figure is judged per twin.
    v = pt.cable_verdict([twin(DEGRADED, "rocep1s0f1"), twin(DEGRADED, "roceP2p1s0f1")])
    assert v["verdict"] == "degraded" and v["total_gbps"] > 190


def test_threshold_edges():
    at = {"device": "a", "bw_avg_gbps": 190.0}
    below = {"device": "b", "bw_avg_gbps": 189.99}
    assert pt.cable_verdict([at, at])["verdict"] == "healthy"
    assert pt.cable_verdict([at, below])["verdict"] == "degraded"
    assert pt.cable_verdict([at, below], threshold_gbps=180)["verdict"] == "healthy"


def test_floor_turns_a_far_too_slow_twin_into_failed():
    slow = {"device": "b", "bw_avg_gbps": 26.0}
    ok = {"device": "a", "bw_avg_gbps": 213.0}
    assert pt.cable_verdict([ok, slow])["verdict"] == "degraded"
    v = pt.cable_verdict([ok, slow], degraded_floor_gbps=50)
    assert (v["verdict"], v["reason"]) == ("failed", "below_floor")
    with pytest.raises(ValueError):
        pt.cable_verdict([ok], degraded_floor_gbps=300)
    with pytest.raises(ValueError):
        pt.cable_verdict([ok], threshold_gbps=0)


@pytest.mark.parametrize(
    ("failed_twin", "reason"),
    [
        ({"not_installed": True, "error_kind": "not_installed"}, "not_installed"),
        ({"reason": "not_installed"}, "not_installed"),
        ({"server": {"error_kind": "port_in_use"}}, "server_not_started"),
        ({"server": {"started": False}}, "server_not_started"),
        (PERF / "perftest-pr228_client_couldnt_connect.txt", "peer_unreachable"),
        ({"timed_out": True, "error_kind": "timed_out"}, "timed_out"),
        (PERF / "perftest-issue234_server_duration_mbsec_truncated.txt", "no_result"),
        (PERF / "perftest-issue393_client_qp_rtr_failed.txt", "qp_setup_failed"),
        (PERF / "debian12-perftest-4.5+0.17_no_rdma_device.txt", "no_rdma_device"),
    ],
)
def test_failed_cable_reasons(failed_twin, reason):
    bad = pt.parse_ib_write_bw(failed_twin.read_text()) if not isinstance(failed_twin, dict) else failed_twin
    v = pt.cable_verdict([twin(HEALTHY, "rocep1s0f1"), bad | {"device": "roceP2p1s0f1"}])
    assert (v["verdict"], v["reason"]) == ("failed", reason)
    assert v["twins"][1]["reason"] == reason and v["twins"][0]["verdict"] == "healthy"
    assert v["total_gbps"] is None and v["min_gbps"] == 213.05
    assert v["advice"] == [pt.REASON_ADVICE[reason]]
    assert f"roceP2p1s0f1 failed ({reason})" in v["message"]


def test_no_twins_and_one_twin():
    assert pt.cable_verdict([])["verdict"] == "failed" and pt.cable_verdict([])["reason"] == "no_result"
    one = pt.cable_verdict([twin(HEALTHY, "rocep1s0f1")])
    assert one["verdict"] == "healthy" and any("one twin" in n for n in one["notes"])


def test_one_way_result_is_noted():
    one_way = parse("spark-eugr_client_q4_rdmacm_gbits.txt")
    v = pt.cable_verdict([one_way, one_way], threshold_gbps=100)
    assert v["verdict"] == "healthy" and any("one way" in n for n in v["notes"])


# --- partial input and the repair advice --------------------------------------------------------------


ROW_HEADER = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"


@pytest.mark.parametrize(
    ("row", "avg", "peak", "measured"),
    [
        (" 1048576    38096            0.00               -nan 		   0.025397\n", None, None, False),
        (" 1048576    38096            0.00               213.05 		   0.025397\n", 213.05, None, False),
        (" 1048576    38096            0.00               0.00 		   0.000000\n", 0.0, 0.0, True),
        (" 1048576    38096            214.10             213.05 		   0.025397\n", 213.05, 214.10, True),
    ],
)
def test_zero_peak_is_measured_only_next_to_a_zero_average(row, avg, peak, measured):
    r = pt.parse_ib_write_bw(ROW_HEADER + row)
    assert (r["bw_avg_gbps"], r["bw_peak_gbps"], r["bw_peak_measured"]) == (avg, peak, measured)
    if avg is None:
        assert pt.failure_reason(r) == "no_result"
        v = pt.cable_verdict([twin(HEALTHY, "rocep1s0f1"), r | {"device": "roceP2p1s0f1"}])
        assert (v["verdict"], v["reason"]) == ("failed", "no_result")


def test_peak_warning_without_rows_is_not_measured():
    r = pt.parse_ib_write_bw(" Warning: BW peak won't be measured in this run.\n")
    assert r["bw_peak_measured"] is False and r["rows"] == []
    assert pt.parse_ib_write_bw("")["bw_peak_measured"] is None


def test_degraded_advice_starts_with_rebooting_both_ends():
    """The repair that clears a degraded Spark cable is a reboot of both ends; restarting the link does not."""
    v = pt.cable_verdict([twin(HEALTHY, "rocep1s0f1"), twin(DEGRADED, "roceP2p1s0f1")])
    assert v["advice"] == [
        "Reboot the Sparks at both ends of this cable, then measure again.",
        "Restarting the link or the network driver does not clear this state.",
        "If the cable is still degraded after the reboot, reseat it at both ends (and try another cable).",
    ]


@pytest.mark.parametrize(
    "results",
    [
        "list",
        "dict",
    ],
)
def test_a_missing_twin_fails_the_cable_without_a_crash(results):
    good = twin(HEALTHY, "rocep1s0f1")
    given = [good, None] if results == "list" else {"rocep1s0f1": good, "roceP2p1s0f1": None}
    v = pt.cable_verdict(given)
    assert (v["verdict"], v["reason"]) == ("failed", "no_result")
    assert v["twins"][1]["verdict"] == "failed" and v["twins"][1]["gbps"] is None
    assert v["total_gbps"] is None and v["min_gbps"] == 213.05
    assert v["advice"] == [pt.REASON_ADVICE["no_result"]]
    device = "?" if results == "list" else "roceP2p1s0f1"
    assert f"{device} failed (no_result)" in v["message"]


def test_no_results_at_all_fail_the_cable():
    for given in (None, [], {}):
        v = pt.cable_verdict(given)
        assert (v["verdict"], v["reason"], v["twins"]) == ("failed", "no_result", [])
        assert v["total_gbps"] is None and v["min_gbps"] is None
        assert "no twin results" in v["message"]


# Every reason a twin can fail for, named here and not read from pt.REASONS: an explicit reason (the
# ib_write_bw module's) is honoured only when it is one of these.
ALL_REASONS = [
    "not_installed",
    "server_not_started",
    "peer_unreachable",
    "timed_out",
    "no_result",
    "qp_setup_failed",
    "no_rdma_device",
    "below_floor",
]


@pytest.mark.parametrize("reason", ALL_REASONS)
def test_an_explicit_reason_is_honoured_and_has_advice(reason):
    assert pt.failure_reason({"reason": reason, "bw_avg_gbps": 200.0}) == reason
    assert pt.REASON_ADVICE[reason].endswith(".")
    v = pt.cable_verdict([twin(HEALTHY, "rocep1s0f1"), {"device": "roceP2p1s0f1", "reason": reason}])
    assert (v["verdict"], v["reason"], v["advice"]) == ("failed", reason, [pt.REASON_ADVICE[reason]])


def test_an_unknown_reason_is_not_taken_at_its_word():
    assert pt.failure_reason({"reason": "cosmic_rays", "bw_avg_gbps": 200.0}) is None
    assert pt.failure_reason({"reason": "cosmic_rays"}) == "no_result"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (" Unable to init the socket connection\n", "Couldn't connect"),
        ("Couldn't connect to 192.168.100.11:18515\n", "Couldn't connect to 192.168.100.11:18515"),
        (" Failed to resolve RDMA CM address\n", "Couldn't connect over RDMA CM"),
    ],
)
def test_every_connect_failure_is_a_client_that_cannot_reach_its_peer(text, error):
    r = pt.parse_ib_write_bw(text)
    assert (r["error"], r["error_kind"], r["side"]) == (error, "connect_failed", "client")
    assert pt.failure_reason(r) == "peer_unreachable"


def test_a_row_before_any_header_is_not_a_result():
    r = pt.parse_ib_write_bw(" 65536      5000           1.00               2.00 		   0.1\n" + ROW_HEADER)
    assert r["rows"] == [] and r["unit"] == "Gb/sec" and r["bw_avg_gbps"] is None


def test_the_average_unit_is_the_rows_unit():
    r = pt.parse_ib_write_bw(
        ROW_HEADER.replace("BW average[Gb/sec]", "BW average[MiB/sec]")
        + " 1048576    38096            0.00               25397.60 		   0.025397\n"
    )
    assert r["unit"] == "MiB/sec" and r["units_seen"] == ["MiB/sec"]
    assert r["bw_avg_gbps"] == pytest.approx(213.05, abs=0.01)


def test_a_full_line_rate_fraction_and_a_zero_floor_are_allowed():
    assert pt.line_rate_threshold(200, 1) == 200.0
    assert pt.cable_verdict([{"bw_avg_gbps": 1.0}], degraded_floor_gbps=0)["degraded_floor_gbps"] == 0
    with pytest.raises(ValueError, match="degraded_floor_gbps"):
        pt.cable_verdict([{"bw_avg_gbps": 1.0}], degraded_floor_gbps=-1)


def test_reasons_from_the_server_side_and_the_timeout_flag():
    assert pt.failure_reason({"server": {"error_kind": "no_rdma_device"}}) == "no_rdma_device"
    assert pt.failure_reason({"server": {"error_kind": "not_installed"}}) == "not_installed"
    assert pt.failure_reason({"timed_out": True}) == "timed_out"
    assert pt.failure_reason({"error_kind": "port_in_use"}) == "server_not_started"
    assert pt.failure_reason({"bw_avg_gbps": 0.0}) is None


def test_a_twin_at_the_floor_is_degraded_not_failed():
    v = pt.cable_verdict([{"device": "a", "bw_avg_gbps": 213.0}, {"device": "b", "bw_avg_gbps": 50.0}], 190, 50)
    assert (v["verdict"], v["reason"]) == ("degraded", None)
    assert (v["threshold_gbps"], v["degraded_floor_gbps"]) == (190.0, 50)
    assert v["message"] == (
        "cable degraded: a 213.00 Gb/s healthy, b 50.00 Gb/s degraded (healthy at 190 Gb/s or more per twin, "
        "both directions)"
    )


def test_repeated_headers_list_their_unit_once_and_the_warning_wins_over_a_peak():
    row = " 1048576    38096            214.10             213.05 		   0.025397\n"
    r = pt.parse_ib_write_bw(ROW_HEADER + row + ROW_HEADER + row)
    assert r["units_seen"] == ["Gb/sec"] and len(r["rows"]) == 2 and r["bw_peak_gbps"] == 214.10
    warned = pt.parse_ib_write_bw(" Warning: BW peak won't be measured in this run.\n" + ROW_HEADER + row)
    assert (warned["bw_peak_measured"], warned["bw_peak_gbps"], warned["bw_avg_gbps"]) == (False, None, 213.05)


def test_an_infinite_column_is_none():
    r = pt.parse_ib_write_bw(
        ROW_HEADER + " 1048576    38096            inf                213.05 		   0.025397\n"
    )
    assert r["rows"][0]["bw_peak"] is None and r["bw_avg_gbps"] == 213.05


def test_a_result_names_its_own_device_and_a_threshold_is_required():
    v = pt.cable_verdict({"port-1": {"device": "rocep1s0f1", "bw_avg_gbps": 213.0}, "roceP2p1s0f1": {"bw_avg_gbps": 1}})
    assert [t["device"] for t in v["twins"]] == ["rocep1s0f1", "roceP2p1s0f1"]
    with pytest.raises(ValueError, match="threshold_gbps"):
        pt.cable_verdict([{"bw_avg_gbps": 1.0}], threshold_gbps=None)


def test_hcas_that_cannot_connect_through_the_link_are_a_qp_setup_failure():
    # perftest prints this (to stderr) when ctx_connect cannot move the QPs to RTR/RTS.
    r = pt.parse_ib_write_bw(" Unable to Connect the HCA's through the link\n")
    assert (r["error"], r["error_kind"]) == ("Unable to Connect the HCA's through the link", "qp_setup_failed")
    assert pt.failure_reason(r) == "qp_setup_failed"
