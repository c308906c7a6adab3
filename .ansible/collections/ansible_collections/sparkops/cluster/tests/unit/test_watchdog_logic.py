"""The watchdog's decisions and memory arithmetic (roles/watchdog/files/sparkops_watchdog.py), pure parts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("sparkops_watchdog", ROOT / "roles/watchdog/files/sparkops_watchdog.py")
wd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wd)

CFG = {"hang_timeout_s": 4, "failures_before_restart": 2, "max_restarts_per_hour": 2}
OK_WORKERS = {"spark-sim-2": "running"}


def obs(probe="ok", workers=None, **kw):
    return {
        "probe": probe,
        "probe_detail": kw.pop("detail", ""),
        "workers": workers or OK_WORKERS,
        "floor_tripped": [],
        "in_grace": False,
        **kw,
    }


def test_healthy_resets_failures():
    r = wd.decide(obs(), {"consecutive_failures": 1, "restart_epochs": []}, CFG, 1000)
    assert r["action"] == "none" and r["state"]["consecutive_failures"] == 0


def test_k_failures_before_restart():
    r1 = wd.decide(obs("failed", detail="HTTP 500"), {"consecutive_failures": 0, "restart_epochs": []}, CFG, 1000)
    assert r1["action"] == "none" and r1["state"]["consecutive_failures"] == 1
    r2 = wd.decide(obs("failed", detail="HTTP 500"), r1["state"], CFG, 1002)
    assert r2["action"] == "restart" and "2 failed probes in a row: HTTP 500" in r2["reason"]


def test_hang_restarts_at_once_even_in_grace():
    r = wd.decide(obs("hang", in_grace=True), {"restart_epochs": []}, CFG, 1000)
    assert r["action"] == "restart" and "no token within 4 s" in r["reason"]


def test_grace_hides_startup_failures_but_not_a_lost_worker():
    assert wd.decide(obs("failed", in_grace=True), {"restart_epochs": []}, CFG, 1000)["action"] == "none"
    r = wd.decide(obs("failed", workers={"spark-sim-2": "exited"}, in_grace=True), {"restart_epochs": []}, CFG, 1000)
    assert r["action"] == "restart" and "worker lost: spark-sim-2 exited" in r["reason"]


def test_unreachable_node_blocks_instead_of_looping():
    r = wd.decide(obs("failed", workers={"spark-sim-2": "unreachable"}), {"restart_epochs": []}, CFG, 1000)
    assert r["action"] == "blocked" and "spark-sim-2" in r["reason"]


def test_floor_trip_blocks():
    r = wd.decide(obs("failed", floor_tripped=["spark-sim-2"]), {"restart_epochs": []}, CFG, 1000)
    assert r["action"] == "blocked" and "memory floor" in r["reason"]


def test_at_most_m_per_hour_then_give_up():
    st = {"restart_epochs": [100.0, 200.0], "consecutive_failures": 5}
    assert wd.decide(obs("hang"), st, CFG, 1000)["action"] == "give_up"
    # An hour later the old restarts no longer count.
    assert wd.decide(obs("hang"), st, CFG, 100 + 3600 + 150)["action"] == "restart"


def test_available_bytes_bounded_by_cgroup():
    meminfo = "MemTotal:       131072000 kB\nMemFree:        1000 kB\nMemAvailable:   100000000 kB\n"
    assert wd.available_bytes(meminfo, None, None) == 100000000 * 1024
    assert wd.available_bytes(meminfo, 2 * 2**30, 2**30 + 5) == 2**30 - 5
    # A "limit" above the host's memory is no limit.
    assert wd.available_bytes(meminfo, 1 << 50, 10) == 100000000 * 1024


def test_docker_time():
    assert wd.parse_docker_time("2026-11-23T19:00:00.123456789Z") == 1795460400.123456
    assert wd.parse_docker_time("0001-01-01T00:00:00Z") == 0.0


def test_given_up_stays_given_up_until_healthy():
    st = {"status": "gave_up", "reason": "vLLM exited", "restart_epochs": [], "consecutive_failures": 9}
    held = wd.decide(obs("failed"), st, CFG, 100_000)
    assert held["action"] == "none" and held["reason"].startswith("given up")
    assert wd.decide(obs("hang"), st, CFG, 100_000)["action"] == "none"
    back = wd.decide(obs("ok"), st, CFG, 100_000)
    assert back["reason"] == "healthy" and back["state"]["consecutive_failures"] == 0
