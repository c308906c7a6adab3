"""day2_checks.py at its edges: the overall verdict of a doctor run where nothing applied, the report's
order (worst first, N/A last), the memory plan's bounds (a floor of 0, a plan that leaves exactly the floor)."""

from __future__ import annotations

from ansible_collections.sparkops.cluster.plugins.plugin_utils import day2_checks as d


def test_a_run_where_no_check_applied_is_overall_pass():
    na = d.verdict("RDMA GIDs", "spark-1", d.NA, "not applicable: no RDMA device")
    assert d.overall([na, na]) == d.PASS
    assert d.overall([]) == d.PASS
    assert d.overall([na, d.verdict("kernel", "spark-1", d.WARN, "x")]) == d.WARN


def test_the_report_lists_the_worst_first_and_not_applicable_last():
    verdicts = [
        d.verdict("RDMA GIDs", "spark-1", d.NA, "not applicable: no RDMA device"),
        d.verdict("kernel", "spark-1", d.PASS, "kernel 6.8 is not on the known-bad list"),
        d.verdict("disk for the weights", "spark-1", d.WARN, "3.0 GiB free", "df -h /"),
        d.verdict("driver branch", "spark-1", d.CRITICAL, "driver 570: off branch 580", "upgrade"),
    ]
    md = d.render_markdown("pair", verdicts, "2026-01-01T00:00Z")
    rows = [line.split(" | ")[0] for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == ["| verdict", "| CRITICAL", "| WARN", "| PASS", "| N/A"]
    assert "Overall: **CRITICAL** (2026-01-01T00:00Z)" in md


def test_a_floor_of_zero_and_no_overhead_are_settings_a_user_may_choose():
    assert d.memory_plan_problems({"gpu_memory_utilization": 0.9}, 128, 0, 0) == []
    assert d.memory_plan_problems({"gpu_memory_utilization": 0.9}, 128, 6, 0) == []
    (msg,) = d.memory_plan_problems({}, 0, 6, 4)
    assert msg == "memory settings must be positive (node 0, overhead 6, floor 4 GiB)"
    (msg,) = d.memory_plan_problems({}, 128, -1, 4)
    assert msg == "memory settings must be positive (node 128, overhead -1, floor 4 GiB)"
    (msg,) = d.memory_plan_problems({}, 128, 6, -1)
    assert msg == "memory settings must be positive (node 128, overhead 6, floor -1 GiB)"


def test_a_plan_that_leaves_exactly_the_floor_passes():
    # 128 GiB x (1 - 0.875) = 16 GiB, less 6 GiB of host processes: exactly the 10 GiB floor.
    assert d.memory_plan_problems({"gpu_memory_utilization": 0.875}, 128, 6, 10) == []
    (msg,) = d.memory_plan_problems({"gpu_memory_utilization": 0.875}, 128, 6, 10.5)
    assert msg.startswith("gpu_memory_utilization 0.875 leaves 10.0 GiB of 128 GiB for the OS after 6 GiB")
    assert msg.endswith("lower gpu_memory_utilization to 0.87 or less")


def test_the_default_utilisation_is_vllms_0_9():
    # No gpu_memory_utilization in the profile: vLLM's default 0.9 leaves 12.8 GiB of 128, less 6: 6.8 < 8.
    (msg,) = d.memory_plan_problems({}, 128, 6, 8)
    assert msg.startswith("gpu_memory_utilization 0.9 leaves 6.8 GiB of 128 GiB")


def _function(device, bdf, firmware):
    return {"device": device, "bdf": bdf, "firmware": firmware, "sta_width": 4, "cap_width": 4, "sta_speed_gts": 32.0}


def test_every_function_on_the_same_old_firmware_is_a_warning_and_a_newer_one_passes():
    old = [
        _function("rocep1s0f1", "0000:01:00.1", "28.39.3560"),
        _function("roceP2p1s0f1", "0002:01:00.1", "28.39.3560"),
    ]
    v = d.check_nic("spark-1", old, "dgx_spark", 4, "28.45.4028")
    assert v["verdict"] == "WARN" and v["evidence"].startswith("rocep1s0f1 firmware 28.39.3560 older than 28.45.4028")
    assert v["action"] == "`sudo fwupdmgr update` on this node"
    newer = [_function("rocep1s0f1", "0000:01:00.1", "28.46.1006")]
    assert d.check_nic("spark-1", newer, "dgx_spark", 4, "28.45.4028")["verdict"] == "PASS"
    assert d.check_nic("spark-1", old, "dgx_spark", 4, "")["verdict"] == "PASS"  # no minimum set


def test_the_driver_verdict_follows_the_gpu_and_the_branch():
    on = d.check_driver("spark-1", {"gpu_present": True, "driver_version": "580.95.05", "on_branch": True}, "580")
    assert (on["verdict"], on["evidence"]) == ("PASS", "driver 580.95.05 on branch 580")
    off = d.check_driver("spark-1", {"gpu_present": True, "driver_version": "570.1", "on_branch": False}, "580")
    assert (off["verdict"], off["evidence"]) == ("CRITICAL", "driver 570.1: off branch 580")
    assert "nvidia_driver_version=<580.x>" in off["action"]
    sim = d.check_driver("spark-sim-1", {"gpu_present": False, "reason": "simulated node"}, "580")
    assert (sim["verdict"], sim["evidence"]) == ("N/A", "not applicable: simulated node")


def test_a_failed_gid_check_without_details_still_says_it_failed():
    v = d.check_gids("spark-1", {"rdma_present": True, "gid_ok": False})
    assert (v["verdict"], v["evidence"]) == ("CRITICAL", "GID check failed")
    v = d.check_gids(
        "spark-1",
        {"rdma_present": True, "gid_ok": False, "gid_checks": {"enp1s0f0np0": {"ok": False, "reason": "no GID 3"}}},
    )
    assert v["evidence"] == "enp1s0f0np0: no GID 3"
