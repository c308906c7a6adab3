"""The doctor's verdicts and the preflight memory plan (plugins/plugin_utils/day2_checks.py)."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.sparkops.cluster.plugins.module_utils import hw_links as hw
from ansible_collections.sparkops.cluster.plugins.plugin_utils import day2_checks as d

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "hw"
GIB = 2**30


def test_memory_plan_reference_profile_passes_and_tight_one_is_refused():
    assert d.memory_plan_problems({"gpu_memory_utilization": 0.87}, 128, 6, 4) == []
    (msg,) = d.memory_plan_problems({"gpu_memory_utilization": 0.90}, 128, 6, 8)
    assert "below the memory floor of 8 GiB" in msg and "sparkops_memory_floor_gib" in msg
    assert "lower gpu_memory_utilization to 0.89" in msg


def test_kernel_known_bad_is_critical_with_reason():
    bad = [{"version": "7.0.0-1019-nvidia", "reason": "NCCL over RoCE broken"}]
    v = d.check_kernel("spark-1", "7.0.0-1019-nvidia", bad)
    assert v["verdict"] == "CRITICAL" and "NCCL over RoCE broken" in v["evidence"] and "apt purge" in v["action"]
    assert d.check_kernel("spark-1", "6.17.0-1029-nvidia", bad)["verdict"] == "PASS"


def test_nic_x2_function_is_critical_and_sim_is_not_applicable():
    good = {
        "device": "rocep1s0f1",
        "bdf": "0000:01:00.1",
        "firmware": "28.45.4028",
        "sta_width": 4,
        "cap_width": 4,
        "sta_speed_gts": 32.0,
    }
    narrow = dict(good, device="roceP2p1s0f1", bdf="0002:01:00.1", sta_width=2)
    v = d.check_nic("spark-1", [good, narrow], "dgx_spark", 4, "28.45.4028")
    assert v["verdict"] == "CRITICAL" and "roceP2p1s0f1 (0002:01:00.1) runs PCIe x2" in v["evidence"]
    assert "fwupdmgr" in v["action"]
    assert d.check_nic("spark-1", [good], "dgx_spark", 4, "28.45.4028")["verdict"] == "PASS"
    old = dict(good, firmware="28.39.3560")
    assert d.check_nic("spark-1", [good, old], "dgx_spark", 4, "28.45.4028")["verdict"] == "WARN"
    na = d.check_nic("spark-sim-1", [], "simulated", 4, "")
    assert na["verdict"] == "N/A" and "not applicable" in na["evidence"]
    assert d.check_nic("spark-1", [], "dgx_spark", 4, "")["verdict"] == "CRITICAL"


def test_gpu_clocks_on_recorded_outputs():
    idle = hw.parse_nvidia_smi_clocks((FIX / "h100_580.159.04_clock_performance_idle.txt").read_text())
    load = hw.parse_nvidia_smi_clocks((FIX / "h100_580.159.04_clock_performance_load.txt").read_text())
    # Idle at 375 MHz is not a throttle; SW power cap at 66% of max under load is normal.
    assert d.check_gpu_clocks("n", idle)["verdict"] == "PASS"
    v = d.check_gpu_clocks("n", load)
    assert v["verdict"] == "PASS" and "1305 of 1980 MHz" in v["evidence"] and "SW Power Cap" in v["evidence"]
    # The field report: busy at ~0.7 of 2.2 GHz.
    slow = [dict(load[0], clocks_mhz={"Graphics": 700}, max_clocks_mhz={"Graphics": 2200})]
    assert d.check_gpu_clocks("n", slow)["verdict"] == "CRITICAL"
    hot = [dict(load[0], reasons_active=["HW Thermal Slowdown"])]
    assert d.check_gpu_clocks("n", hot)["verdict"] == "WARN"
    assert d.check_gpu_clocks("n", [], "nvidia-smi not found")["verdict"] == "N/A"


def test_memory_floor_marker_is_critical_and_names_what_stopped():
    marker = {
        "at": "2026-11-23T19:00:00Z",
        "available_bytes": 200 * 2**20,
        "floor_bytes": 256 * 2**20,
        "stopped": "sparkops-ray",
    }
    v = d.check_memory("spark-sim-2", 10 * GIB, 0.25, marker)
    assert v["verdict"] == "CRITICAL" and "sparkops-ray was stopped" in v["evidence"] and "200 MiB" in v["evidence"]
    assert d.check_memory("n", 10 * GIB, 4, None)["verdict"] == "PASS"
    assert d.check_memory("n", 5 * GIB, 4, None)["verdict"] == "WARN"
    assert d.check_memory("n", 3 * GIB, 4, None)["verdict"] == "CRITICAL"


def test_crashed_container_named_with_count_and_log():
    (v,) = d.check_containers(
        "spark-sim-1",
        [
            {
                "name": "sparkops-vllm",
                "status": "exited",
                "exit_code": 1,
                "restart_count": 3,
                "log_tail": ["a", "ValueError: no weights"],
            }
        ],
    )
    assert v["verdict"] == "CRITICAL"
    assert "exit code 1, restarted 3 times by Docker" in v["evidence"] and "ValueError: no weights" in v["evidence"]
    (ok,) = d.check_containers("n", [{"name": "sparkops-ray", "status": "running", "restart_count": 0}])
    assert ok["verdict"] == "PASS"


def test_ray_membership_and_endpoint():
    ray = {"nodes_alive": 1, "gpus_total": 1.0, "dead_node_ips": ["10.213.0.12"]}
    v = d.check_ray(ray, 2, 2)
    assert v["verdict"] == "CRITICAL" and "1 of 2 nodes" in v["evidence"] and "10.213.0.12" in v["evidence"]
    assert d.check_ray({"nodes_alive": 2, "gpus_total": 2.0}, 2, 2)["verdict"] == "PASS"
    assert d.check_ray({"failed": True, "msg": "no container"}, 2, 2)["verdict"] == "CRITICAL"
    assert d.check_endpoint({"healthy": True, "ttft_s": 0.1})["verdict"] == "PASS"
    bad = d.check_endpoint({"healthy": False, "checks": {"completion": {"ok": False, "message": "timed out"}}})
    assert bad["verdict"] == "CRITICAL" and "timed out" in bad["evidence"]
    dead = d.check_endpoint(
        {"healthy": False, "failure_kind": "engine_dead", "checks": {"health": {"ok": False, "message": "503 ..."}}}
    )
    assert dead["verdict"] == "CRITICAL" and dead["evidence"].startswith("[engine_dead] health: 503")
    assert "engine is dead" in dead["action"] and "`docker logs`" in dead["action"]
    refused = d.check_endpoint({"healthy": False, "failure_kind": "refused", "msg": "connection refused"})
    assert "listens only once its engine is up" in refused["action"] and "engine is dead" not in refused["action"]


def test_api_exposure():
    assert (
        d.check_exposure({"mgmt_reachable": False, "unauth_status": 401}, "10.0.0.1", "192.168.1.5")["verdict"]
        == "PASS"
    )
    assert (
        d.check_exposure({"mgmt_reachable": True, "unauth_status": 200}, "0.0.0.0", "192.168.1.5")["verdict"]
        == "CRITICAL"
    )
    assert (
        d.check_exposure({"mgmt_reachable": True, "unauth_status": 401}, "10.0.0.1", "192.168.1.5")["verdict"] == "WARN"
    )
    assert (
        d.check_exposure({"mgmt_reachable": True, "unauth_status": 401}, "0.0.0.0", "192.168.1.5")["verdict"] == "PASS"
    )


def test_api_exposure_is_critical_when_invocations_or_tokenize_answer_without_the_key():
    def probes(mgmt_inv, mgmt_tok, fast_inv, fast_tok):
        return {  # as the uri loops register them: the loop item is the URL
            "control node": [
                {"item": "http://192.168.1.5:8000/invocations", "status": mgmt_inv},
                {"item": "http://192.168.1.5:8000/tokenize", "status": mgmt_tok},
            ],
            "head": [
                {"item": "http://10.0.0.1:8000/invocations", "status": fast_inv},
                {"url": "http://10.0.0.1:8000/tokenize", "status": fast_tok},
            ],
        }

    def level(pr):
        probe = {"mgmt_reachable": False, "unauth_status": 401, "unauth_probes": pr}
        return d.check_exposure(probe, "10.0.0.1", "192.168.1.5")

    assert level(probes(None, -1, 401, 401))["verdict"] == "PASS"  # mgmt firewalled, fast link asks the key
    assert level(probes(401, 403, 401, 401))["verdict"] == "PASS"
    assert level({})["verdict"] == "PASS"
    for i, answered in ((0, 200), (1, 200), (2, 200), (3, 200), (2, 400), (3, 404), (0, 500), (1, "405")):
        statuses = [None, None, 401, 401]
        statuses[i] = answered
        v = level(probes(*statuses))
        assert v["verdict"] == "CRITICAL", (i, answered)
        assert f"-> {int(answered)}" in v["evidence"] and "--middleware" in v["action"]
    assert d.keyless_answers({"x": [{"url": "u", "status": "junk"}, {"status": 0}, {"status": None}]}) == []
    assert d.keyless_answers({"head": [{"item": "http://h/tokenize", "status": 200}]}) == [
        "head POST http://h/tokenize -> 200"
    ]


def test_watchdog_states():
    now = 10_000.0
    ev = [
        {"event": "restart_begun", "epoch": now - 100, "ts": "t", "message": "m"},
        {"event": "gave_up", "epoch": now - 10, "ts": "t2", "message": "limit"},
    ]
    v = d.check_watchdog({"status": "gave_up", "reason": "vLLM exited"}, ev, True, now)
    assert (
        v["verdict"] == "CRITICAL"
        and "1 group restart(s) in the last hour" in v["evidence"]
        and "gave_up: limit" in v["evidence"]
    )
    assert d.check_watchdog({"status": "watching", "reason": "healthy"}, [], True, now)["verdict"] == "PASS"
    assert d.check_watchdog({"status": "watching", "reason": "healthy"}, [], False, now)["verdict"] == "CRITICAL"
    assert d.check_watchdog(None, [], False, now)["verdict"] == "CRITICAL"


def test_overall_ignores_not_applicable_and_markdown_has_every_check():
    vs = [d.verdict("a", "c", "N/A", "not applicable: x"), d.verdict("b", "c", "PASS", "ok")]
    assert d.overall(vs) == "PASS"
    assert d.overall(vs + [d.verdict("c", "c", "WARN", "w")]) == "WARN"
    md = d.render_markdown("sim", vs, "now")
    assert "Overall: **PASS**" in md and "| N/A | a | c | not applicable: x |" in md


# doctor's settings on the simulated pair (doctor.yml's, with no GPU expected): each test overrides what it is about.
SIM_SETTINGS = {
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


def test_unreachable_node_gets_one_critical_verdict():
    inputs = {
        "now_epoch": 0,
        "settings": {**SIM_SETTINGS, "expected_gpus": 2},
        "nodes": {"spark-sim-2": {}},
    }
    vs = d.build_verdicts(inputs)
    (node,) = [v for v in vs if v["scope"] == "spark-sim-2"]
    assert node["check"] == "node reachable" and node["verdict"] == "CRITICAL"


def test_doctor_shows_the_rules_sparkops_allow_rules_lets_through():
    """An allowed SM121 rule is a WARN verdict naming the rule and the operator's reason; none is a PASS."""
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving_profile import allowed_rule_warnings

    profile = {"model": "org/m", "model_family": "x", "weights_gib": 10, "extra_args": ["--enforce-eager"]}
    lines = allowed_rule_warnings("mine", profile, [{"rule": "no-enforce-eager", "reason": "debug, ops, img:1"}])
    v = d.check_allowed_rules(lines)
    assert v["verdict"] == "WARN" and v["check"] == "SM121 rules"
    assert "no-enforce-eager" in v["evidence"] and "debug, ops, img:1" in v["evidence"]
    assert d.check_allowed_rules([])["verdict"] == "PASS"
    inputs = {
        "now_epoch": 0,
        "settings": {**SIM_SETTINGS, "expected_nodes": 1, "expected_gpus": 1},
        "nodes": {},
        "allowed_rules": lines,
    }
    (shown,) = [x for x in d.build_verdicts(inputs) if x["check"] == "SM121 rules"]
    assert shown["verdict"] == "WARN" and "debug, ops, img:1" in shown["evidence"]


def test_nccl_busbw_verdict_from_verify_s_report():
    na = d.check_nccl_busbw({"verdict": "PASS"}, "simulated")
    assert na["verdict"] == "N/A" and "no torch" in na["evidence"]
    none = d.check_nccl_busbw({}, "dgx_spark")
    assert none["verdict"] == "WARN" and "verify.yml" in none["action"]
    report = {"verdict": "FAIL", "message": "best all_gather bus bandwidth 3.10 GB/s", "nodes": 2, "measured": "t"}
    bad = d.check_nccl_busbw(report, "dgx_spark")
    assert bad["verdict"] == "CRITICAL" and "3.10 GB/s" in bad["evidence"] and "NCCL_IB_HCA" in bad["action"]
    assert d.check_nccl_busbw({**report, "verdict": "PASS"}, "dgx_spark")["verdict"] == "PASS"
    inputs = {
        "now_epoch": 0,
        "settings": {**SIM_SETTINGS, "hardware": "dgx_spark", "expected_gpus": 2},
        "nodes": {},
        "nccl_busbw": report,
    }
    (gate,) = [v for v in d.build_verdicts(inputs) if v["check"] == "NCCL bus bandwidth"]
    assert gate["verdict"] == "CRITICAL"


GAVE_UP_STATE = {
    "status": "gave_up",
    "reason": "given up: hang: no token within 60 s",
    "gave_up_reason": "hang: no token within 60 s",
    "gave_up_at": "2026-11-27T10:00:00Z",
    "restarts_in_hour": 3,
    "retries_after_budget": 1,
    "next_retry_at": "2026-11-27T10:30:00Z",
    "config": {"max_restarts_per_hour": 3},
}


def test_doctor_says_the_watchdog_stopped_restarting_why_and_when_it_tries_next():
    """issue 43: after a spent budget only VllmEndpointDown said anything; doctor names the stop and its reason."""
    v = d.check_watchdog(GAVE_UP_STATE, [], True, 10_000.0)
    assert v["verdict"] == "CRITICAL"
    assert v["evidence"].startswith(
        "the watchdog stopped restarting: hang: no token within 60 s (restarted 3 times in the last hour, "
        "max_restarts_per_hour=3); next try at 2026-11-27T10:30:00Z (1 tries since)"
    ), v["evidence"]
    assert d.watchdog_stopped({"status": "watching"}) is None
    assert d.watchdog_stopped({"status": "gave_up", "reason": "x"}).endswith("it waits for a completion to answer")


def test_the_status_line_says_the_watchdog_stopped_restarting():
    from ansible_collections.sparkops.cluster.plugins.filter.day2 import FilterModule  # noqa: PLC0415

    line = FilterModule().filters()["watchdog_status_line"]
    assert line(GAVE_UP_STATE).startswith("STOPPED RESTARTING - hang: no token within 60 s (restarted 3 times")
    assert "next try at 2026-11-27T10:30:00Z" in line(GAVE_UP_STATE)
    assert line({"status": "watching", "reason": "healthy", "last_probe_at": "t"}) == "watching: healthy (last probe t)"
    assert line({}).startswith("no watchdog state")
    assert line(None).startswith("no watchdog state")


def _quality(ok: bool, mean: float, right: int, **extra) -> dict:
    answers = {n: {"ok": i < right, "got": "x"} for i, n in enumerate(("arithmetic", "fact", "json"))}
    return {
        "item": {"name": "chat-0", "url": "http://10.0.0.1:8000"},
        "ok": ok,
        "failure_kind": None if ok else "wrong_answers",
        "figures": {"mean_logprob": mean, "perplexity": 2.7, "prompt_tokens": 120, "known_answers": answers},
        "verdict": {"ok": ok, "reasons": [] if ok else ["mean log-likelihood -10.4 is below the floor -6.0"]},
        **extra,
    }


def test_a_replica_that_answers_wrongly_is_critical_with_its_figures_and_a_right_one_passes():
    wrong, right = d.check_quality([_quality(False, -10.4, 0)])[0], _quality(True, -1.8, 3)
    assert (wrong["check"], wrong["scope"], wrong["verdict"]) == ("answer quality", "cluster", "CRITICAL")
    assert "-10.4 nats/token" in wrong["evidence"] and "known answers right: 0/3" in wrong["evidence"]
    assert "below the floor" in wrong["evidence"] and "weights" in wrong["action"]
    passed = d.check_quality([right])[0]
    assert passed["verdict"] == "PASS" and "known answers right: 3/3" in passed["evidence"]
    # Two replicas: each named; one wrong one is enough for the overall verdict.
    both = d.check_quality([right, {**_quality(False, -10.4, 1), "item": {"name": "chat-1", "url": "u1"}}])
    assert [v["scope"] for v in both] == ["chat-0 (http://10.0.0.1:8000)", "chat-1 (u1)"]
    assert d.overall(both) == "CRITICAL"


def test_a_replica_that_could_not_be_asked_is_not_judged_here():
    refused = {"item": {"name": "chat-0", "url": "u"}, "failed": True, "failure_kind": "refused", "msg": "refused"}
    unreachable = {"item": {"name": "chat-0", "url": "u"}, "unreachable": True, "msg": "ssh: no route"}
    for result in (refused, unreachable):
        (got,) = d.check_quality([result])
        assert got["verdict"] == "N/A" and got["evidence"].startswith("not judged:"), got
