"""day2_checks.py at its edges: the overall verdict of a doctor run where nothing applied, the report's
order (worst first, N/A last), the memory plan's bounds (a floor of 0, a plan that leaves exactly the floor),
the checks that apply only on Sparks, the watchdog's last hour.

Equivalent mutants (tests/mutation/equivalents.py lists them; `make mutation` does not run them):
- check_cabling's `(reads or {})` without `or {}`: build_verdicts, its one caller, always passes a dict.
- build_verdicts' `inputs.get("allowed_rules") or []` without `or []`: check_allowed_rules takes None as
  it takes [] (no rule let through: PASS).
- check_ray's `ray.get("gpus_total", 0) or 0` without `or 0`: ray_cluster_status gives gpus_total as a
  number (0.0 when Ray sees no GPU), never None; a missing key already gives 0.
"""

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
    assert md.startswith("# sparkops doctor: pair\n\nOverall: **CRITICAL** (2026-01-01T00:00Z)\n\n| verdict |")


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


def test_nccl_transport_on_sparks_passes_only_when_every_log_says_ok():
    ok = {"ok": True, "message": "NET/IB on rocep1s0f1, roceP2p1s0f1"}
    socket = {"ok": False, "message": "NET/Socket: NCCL fell back to TCP"}
    v = d.check_nccl({"spark-1": ok, "spark-2": ok, "spark-3": None}, "dgx_spark")
    assert (v["verdict"], v["evidence"]) == ("PASS", f"spark-1: {ok['message']}; spark-2: {ok['message']}")
    v = d.check_nccl({"spark-1": ok, "spark-2": socket}, "dgx_spark")
    assert v["verdict"] == "CRITICAL" and "spark-2: NET/Socket: NCCL fell back to TCP" in v["evidence"]
    assert d.check_nccl({"spark-1": None}, "dgx_spark")["verdict"] == "WARN"
    assert d.check_nccl({"spark-1": ok}, "simulated")["verdict"] == "N/A"


def test_a_ray_group_without_gpus_that_expects_none_passes():
    # The simulated cluster's Ray has no GPUs: ray_cluster_status says gpus_total 0.0 and 0 are expected.
    v = d.check_ray({"nodes_alive": 2, "gpus_total": 0.0}, 2, 0.0)
    assert (v["verdict"], v["evidence"]) == ("PASS", "2 of 2 nodes alive, 0 of 0 GPUs")
    v = d.check_ray({"nodes_alive": 2, "gpus_total": 1.0, "dead_node_ips": []}, 2, 2.0)
    assert (v["verdict"], v["evidence"]) == ("CRITICAL", "2 of 2 nodes alive, 1 of 2 GPUs")


def test_an_api_served_on_the_management_address_on_purpose_passes():
    probe = {"mgmt_reachable": True, "unauth_status": 401}
    v = d.check_exposure(probe, "192.168.1.20", "192.168.1.20")
    assert v["verdict"] == "PASS" and v["evidence"].endswith("gets 401 (as configured)")
    assert d.check_exposure(probe, "0.0.0.0", "192.168.1.20")["verdict"] == "PASS"  # noqa: S104
    v = d.check_exposure(probe, "10.0.0.1", "192.168.1.20")
    assert v["verdict"] == "WARN" and v["evidence"].endswith("though vllm_serve_host is 10.0.0.1")


def test_only_a_2xx_answer_without_the_key_means_no_key_is_required():
    for status, level in ((200, "CRITICAL"), (299, "CRITICAL"), (300, "PASS"), (199, "PASS"), (401, "PASS")):
        v = d.check_exposure({"mgmt_reachable": False, "unauth_status": status}, "10.0.0.1", "192.168.1.20")
        assert v["verdict"] == level, status


def test_the_watchdog_counts_the_group_restarts_of_the_last_hour_only():
    now = 1_800_000_000.0
    events = [
        {"event": "restart_begun", "epoch": now - 7200, "ts": "t1", "message": "two hours ago"},
        {"event": "restart_begun", "epoch": now - 3600, "ts": "t2", "message": "an hour ago to the second"},
        {"event": "restart_begun", "epoch": now - 600, "ts": "t3", "message": "ten minutes ago"},
        {"event": "worker_lost", "epoch": now - 500, "ts": "t4", "message": "rank 1 gone"},
    ]
    v = d.check_watchdog({"status": "watching", "reason": "ok"}, events, True, now)
    assert "1 group restart(s) in the last hour" in v["evidence"]
    assert v["evidence"].endswith("; recent: t4 worker_lost: rank 1 gone")
    assert v["verdict"] == "WARN"  # a restart in the last hour


def test_an_unreachable_node_does_not_hide_the_checks_of_the_nodes_after_it():
    settings = {
        "hardware": "simulated",
        "driver_branch": "580",
        "memory_floor_gib": 0.25,
        "disk_headroom_gib": 1,
        "weights_path": "/w",
        "cable_threshold_gbps": 190,
        "expected_nodes": 2,
        "expected_gpus": 0,
        "serve_host": "10.0.0.1",
        "mgmt_address": "192.168.0.1",
    }
    facts = {"kernel": "6.8.0", "gpu": {"gpu_present": False, "reason": "simulated node"}}
    inputs = {"now_epoch": 0, "settings": settings, "nodes": {"spark-sim-1": {}, "spark-sim-2": facts}}
    vs = d.build_verdicts(inputs)
    assert [v["check"] for v in vs if v["scope"] == "spark-sim-1"] == ["node reachable"]
    second = {v["check"]: v["verdict"] for v in vs if v["scope"] == "spark-sim-2"}
    assert second["kernel"] == "PASS" and second["driver branch"] == "N/A"
    (clocks,) = [v for v in vs if v["scope"] == "spark-sim-2" and v["check"] == "GPU clocks and throttle reasons"]
    assert clocks["evidence"] == "not applicable: simulated node"  # the GPU probe's reason, not a guess


def test_a_ray_reading_with_no_counts_reads_as_nothing_alive():
    # A looped ray_cluster_status item Ansible skipped carries no counts: nothing is known alive.
    v = d.check_ray({"skipped": True, "changed": False}, 2, 2.0)
    assert (v["verdict"], v["evidence"]) == ("CRITICAL", "0 of 2 nodes alive, 0 of 2 GPUs")
