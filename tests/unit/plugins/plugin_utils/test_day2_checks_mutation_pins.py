"""day2_checks.py at its edges: the overall verdict of a doctor run where nothing applied, the report's
order (worst first, N/A last), the memory plan's bounds (a floor of 0, a plan that leaves exactly the floor),
the checks that apply only on Sparks, the watchdog's last hour.

Equivalent mutants (tests/mutation/equivalents.py lists them; `make mutation` does not run them):
- check_cabling's `(reads or {})` without `or {}`: build_verdicts, its one caller, always passes a dict.
- build_verdicts' `inputs.get("allowed_rules") or []` without `or []`: check_allowed_rules takes None as
  it takes [] (no rule let through: PASS).
- check_ray's `ray.get("gpus_total", 0) or 0` without `or 0`: ray_cluster_status gives gpus_total as a
  number (0.0 when Ray sees no GPU), never None; a missing key already gives 0.
- check_cabling's `r.get("ports") or []` without `or []`: only reads whose ports is not None are kept, and
  fabric_discover's ports is a list (plugins/modules/fabric_discover.py:303); an empty one iterates as [].
- check_rays' `check_ray(ray or {}, ...)` without `or {}`: check_ray treats every falsy reading as {} (`not
  ray`, then `(ray or {})` for the message).
- check_exposure's `probe.get("unauth_probes") or {}` without `or {}`: keyless_answers reads `probes or {}`.
- check_watchdog's `float(e.get("epoch", 0))` with 1 or -1 for 0: the watchdog writes every event with its epoch
  (roles/watchdog/files/sparkops_watchdog.py:92), and now_epoch is the controller's clock (doctor.yml's
  now().timestamp()): an event at epoch 0 or 1 is decades old either way, never in the last hour.
- check_listening's fallback `("ipv4", "ipv6")` for an unknown address without one family: a socket is
  `wildcard` only for ss's `*`, `0.0.0.0` and `[::]` (module_utils/firewall.py:281,310), all three in
  `families`; the fallback is never taken.
- build_verdicts' `(f.get("gpu") or {}).get("reason") or ""` without `or ""`: check_gpu_clocks says
  `reason or 'no GPU'`, so None and "" read the same.
- check_quality's `r.get("msg") or r.get("failure_kind") or "not asked"` without the failure_kind: a result
  not judged that has a failure_kind failed, and every failed vllm_quality result carries msg
  (plugins/modules/vllm_quality.py:170,178,228); wrong_answers, the one kind without msg, has its verdict.
- watchdog_stopped's `or "unknown"`: the watchdog saves every status with the verdict's reason, never empty
  (roles/watchdog/files/sparkops_watchdog.py:747-749), and gave_up_reason when it gives up (:761).
- build_verdicts' `(f or {}).get("discover")` without `or {}`: doctor.yml gives every node a dict
  (doctor_node_inputs is a combine, and `default={}` for a node not reached), and {}.get works.
"""

from __future__ import annotations

from ansible_collections.sparkops.cluster.plugins.plugin_utils import day2_checks as d
from test_day2_checks import SIM_SETTINGS


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
    settings = SIM_SETTINGS
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


def _doctor(**inputs):
    return d.build_verdicts({"now_epoch": 1_800_000_000, "settings": SIM_SETTINGS, "nodes": {}, **inputs})


def test_a_busy_gpu_whose_max_clock_was_not_read_is_not_judged_slow():
    # nvidia-smi printed N/A for the max clocks: nothing to compare the current clock with.
    gpu = {"bus_id": "0000000F:01:00.0", "clocks_mhz": {"Graphics": 700}, "max_clocks_mhz": {}, "pstate": "P0"}
    v = d.check_gpu_clocks("spark-1", [dict(gpu, reasons_active=[])])
    assert (v["verdict"], v["evidence"]) == ("PASS", "0000000F:01:00.0: 700 of None MHz, P0, active: none")


def test_the_disk_headroom_is_a_warning_below_it_and_a_pass_from_it():
    path = "/var/lib/sparkops/hf"
    v = d.check_disk("spark-1", 40 * d.GIB, 40, path)
    assert (v["verdict"], v["evidence"]) == ("PASS", f"40.0 GiB free at {path}, headroom wanted 40 GiB")
    v = d.check_disk("spark-1", 40 * d.GIB - 1, 40, path)
    assert (v["verdict"], v["action"]) == ("WARN", f"free space under {path} (old revisions: `hf cache scan`)")
    v = d.check_disk("spark-1", None, 40, path)
    assert (v["verdict"], v["evidence"], v["action"]) == ("WARN", f"free space at {path} unknown", f"df -h {path}")


def test_every_cable_healthy_passes_and_a_degraded_one_is_named_for_a_reboot():
    good = {"verdict": "healthy", "total_gbps": 426.1}
    low = {"verdict": "degraded", "total_gbps": 238.2}
    v = d.check_cables({"spark-1 <-> spark-2": good, "spark-1 <-> spark-3": good}, "dgx_spark", 190)
    assert v["verdict"] == "PASS"
    assert v["evidence"] == (
        "spark-1 <-> spark-2: 426.1 Gb/s (healthy); spark-1 <-> spark-3: 426.1 Gb/s (healthy); threshold 190 Gb/s"
    )
    v = d.check_cables({"spark-1 <-> spark-2": good, "spark-1 <-> spark-3": low}, "dgx_spark", 190)
    assert v["verdict"] == "CRITICAL"
    assert v["action"].startswith("reboot both ends of spark-1 <-> spark-3; if still low")


def test_on_sparks_a_cable_below_200g_is_named_and_the_test_bed_s_slower_links_pass():
    from discovery_world import World, names_of, ring_cables  # noqa: PLC0415 - the cabling tests' world
    from test_doctor_cabling import RING4, discovery_of  # noqa: PLC0415

    names = names_of(4)
    world = World(names, ring_cables(names))
    world.speed[("spark-2", "enp1s0f1np1")] = 100000  # a 100G cable
    v = d.check_cabling(discovery_of(RING4, "ring"), world.nodes())
    assert v["verdict"] == "CRITICAL" and "enp1s0f1np1 of spark-2 port 1" in v["evidence"]
    assert "runs at 100000 Mb/s, not 200000" in v["evidence"]
    reads = World(names, ring_cables(names)).nodes()
    for r in reads.values():
        for p in r["ports"]:
            p["speed_mbps"] = 10000  # the test bed's veths
    v = d.check_cabling(dict(discovery_of(RING4, "ring"), hardware="simulated"), reads)
    assert (v["verdict"], v["evidence"]) == ("PASS", "ring: 4 cable(s) where the inventory says")


def test_a_ray_reading_that_carries_an_error_is_a_failed_read_whatever_its_counts():
    v = d.check_ray({"nodes_alive": 2, "gpus_total": 2.0, "error": "GCS at 10.0.0.1:6379 not answering"}, 2, 2.0)
    assert v["verdict"] == "CRITICAL"
    assert v["evidence"] == "Ray could not be read: GCS at 10.0.0.1:6379 not answering"


def test_a_lost_node_is_critical_even_where_no_gpus_are_expected():
    # The simulated cluster: Ray has no GPUs and none are expected; one of the two nodes is gone.
    v = d.check_ray({"nodes_alive": 1, "gpus_total": 0.0, "dead_node_ips": ["10.0.0.12"]}, 2, 0.0)
    assert (v["verdict"], v["evidence"]) == ("CRITICAL", "1 of 2 nodes alive, 0 of 0 GPUs; dead: 10.0.0.12")
    assert v["action"].startswith("bring the missing node back")


def test_a_quality_probe_that_failed_without_a_kind_is_not_judged_wrong():
    # The module crashed (or its task failed before it ran): no failure_kind, no figures, no verdict.
    crashed = {"item": {"name": "chat-0", "url": "u"}, "failed": True, "msg": "MODULE FAILURE", "rc": 1}
    (v,) = d.check_quality([crashed])
    assert (v["verdict"], v["evidence"]) == ("N/A", "not judged: MODULE FAILURE")


def test_every_report_row_carries_the_next_action_and_an_empty_cell_when_there_is_none():
    verdicts = [
        d.verdict("disk for the weights", "spark-1", d.WARN, "3.0 GiB free", "df -h /"),
        d.verdict("kernel", "spark-1", d.PASS, "kernel 6.8 is not on the known-bad list"),
    ]
    rows = d.render_markdown("pair", verdicts, "now").splitlines()[-2:]
    assert rows == [
        "| WARN | disk for the weights | spark-1 | 3.0 GiB free | df -h / |",
        "| PASS | kernel | spark-1 | kernel 6.8 is not on the known-bad list |  |",
    ]


def test_a_node_whose_firewall_was_not_read_has_only_its_allowed_ports_on_the_any_address():
    ssh = {"address": "0.0.0.0", "port": 22, "wildcard": True, "process": "sshd"}  # noqa: S104
    api = {"address": "*", "port": 8000, "wildcard": True, "process": "python3"}
    assert d.check_listening("spark-1", [ssh], None, ["22"])["verdict"] == d.PASS
    v = d.check_listening("spark-1", [ssh, api], None, ["22"])
    assert v["verdict"] == d.CRITICAL and v["evidence"].endswith("*:8000 (python3) unguarded for IPv4/IPv6")


def test_doctor_judges_the_one_health_reading_when_no_replicas_are_given():
    (v,) = [v for v in _doctor(health={"healthy": True, "ttft_s": 0.4}) if v["check"] == "endpoint"]
    assert (v["verdict"], v["evidence"]) == ("PASS", "completion answered, first token in 0.4 s")
    (v,) = [v for v in _doctor() if v["check"] == "endpoint"]  # nothing read at all
    assert (v["verdict"], v["evidence"]) == ("CRITICAL", "no completion")


def test_doctor_judges_the_exposure_it_probed():
    (v,) = [v for v in _doctor(exposure={"mgmt_reachable": True, "unauth_status": 200}) if v["check"] == "API exposure"]
    assert v["verdict"] == "CRITICAL" and v["evidence"].endswith("gets 200 (no key required)")


def test_a_known_bad_kernel_list_left_empty_in_the_inventory_passes_the_kernel():
    # `sparkops_kernel_known_bad:` with nothing after it is null, not [].
    v = d.check_kernel("spark-1", "6.11.0-1016-nvidia", None)
    assert (v["verdict"], v["evidence"]) == ("PASS", "kernel 6.11.0-1016-nvidia is not on the known-bad list")


def test_a_group_restart_just_under_an_hour_ago_still_counts():
    now = 1_800_000_000.0
    events = [{"event": "restart_begun", "epoch": now - 3599.5, "ts": "t1", "message": "hang"}]
    v = d.check_watchdog({"status": "watching", "reason": "ok"}, events, True, now)
    assert v["verdict"] == "WARN" and "1 group restart(s) in the last hour" in v["evidence"]


def test_the_watchdog_verdict_shows_when_it_gave_up_among_the_recent_events():
    events = [
        {"event": "restart_ended", "epoch": 1.0, "ts": "t1", "message": "group up"},
        {"event": "recovered", "epoch": 2.0, "ts": "t2", "message": "answers again"},
        {"event": "gave_up", "epoch": 3.0, "ts": "t3", "message": "3 restarts in the hour"},
    ]
    v = d.check_watchdog({"status": "watching", "reason": "ok"}, events, True, 1_800_000_000.0)
    assert v["evidence"].endswith("; recent: t1 restart_ended: group up | t3 gave_up: 3 restarts in the hour")


def test_doctor_without_a_ray_reading_says_ray_could_not_be_read():
    (v,) = [v for v in _doctor() if v["check"] == "Ray membership"]
    assert (v["verdict"], v["evidence"]) == ("CRITICAL", "Ray could not be read: no answer")


def test_a_ring_cabled_on_any_port_as_its_inventory_says_passes():
    # discover.yml with sparkops_discover_allow_any_port: true wrote this inventory: spark-3's cables are
    # crossed (port 0 to port 0, port 1 to port 1); doctor compares with the inventory, not the convention.
    from discovery_world import World, names_of  # noqa: PLC0415 - the cabling tests' world
    from test_discovery import model_of_discovery  # noqa: PLC0415

    names = names_of(4)
    crossed = [
        (("spark-1", 0), ("spark-2", 1)),
        (("spark-2", 0), ("spark-3", 0)),
        (("spark-3", 1), ("spark-4", 1)),
        (("spark-4", 0), ("spark-1", 1)),
    ]
    model = model_of_discovery(World(names, crossed), allow_any_port=True)
    discovery = {
        "hosts": model["hosts"],
        "head": model["head"],
        "topology": model["topology"],
        "links": {h: model["nodes"][h]["links"] for h in model["hosts"]},
        "hardware": "dgx_spark",
    }
    v = d.check_cabling(discovery, World(names, crossed).nodes())
    assert (v["verdict"], v["evidence"]) == ("PASS", "ring: 4 cable(s) where the inventory says")
