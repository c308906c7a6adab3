"""The watchdog's decisions and memory arithmetic (roles/watchdog/files/sparkops_watchdog.py), pure parts."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
from fs_helpers import on_tmpfs

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


def test_a_group_restart_drops_the_model_pages_on_every_node_and_reports_a_node_it_cannot_reach(tmp_path):
    """drop_model_page_cache runs page_cache.py (the module's own code) on the head and, over SSH, on each
    worker; here the "SSH" runs the command locally for one worker and fails for the other."""
    if on_tmpfs(tmp_path):
        pytest.skip("tmpfs keeps its pages whatever fadvise says")
    model = tmp_path / "models--org--m" / "blobs"
    model.mkdir(parents=True)
    (model / ("a" * 64)).write_bytes(os.urandom(4 << 20))
    (model / ("a" * 64)).read_bytes()
    dog = wd.Watchdog.__new__(wd.Watchdog)
    dog.cfg = {
        "node": "head",
        "workers": [{"name": "w-ok", "address": "10.0.0.2"}, {"name": "w-down", "address": "10.0.0.3"}],
        "drop_model_page_cache": True,
        "model_cache_dir": str(model.parent),
        "page_cache_script": str(ROOT / "plugins/module_utils/page_cache.py"),
        "docker_timeout_s": 60,
    }
    dog.events = wd.Events(str(tmp_path / "events.jsonl"), "head")
    calls = []

    def fake_ssh(address, script, timeout):
        calls.append((address, script))
        if address == "10.0.0.3":
            return subprocess.CompletedProcess([], 255, "", "ssh: connect to host 10.0.0.3: No route to host")
        return wd.sh(["sh", "-c", script], timeout)

    dog.ssh = fake_ssh
    dog.drop_model_page_cache()
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    by_node = {e["on"]: e for e in events}
    assert by_node["head"]["event"] == "page_cache_dropped" and by_node["head"]["resident_before"] >= 4 << 20
    assert by_node["head"]["resident_after"] == 0
    # The worker's command is the same script over SSH; the first call already dropped the pages.
    assert by_node["w-ok"]["event"] == "page_cache_dropped" and by_node["w-ok"]["files"] == 1
    assert by_node["w-down"]["event"] == "page_cache_error" and "No route to host" in by_node["w-down"]["message"]
    assert [call[0] for call in calls] == ["10.0.0.2", "10.0.0.3"]
    assert calls[0][1].startswith("python3 ") and calls[0][1].endswith(str(model.parent))
    dog.cfg["drop_model_page_cache"] = False
    calls.clear()
    dog.drop_model_page_cache()
    assert calls == []


def test_a_dead_engine_restarts_at_once_but_not_in_grace():
    """vLLM 0.19.0's EngineCore does not recover after EngineDeadError: no K failed probes to wait for."""
    r = wd.decide(obs("dead", detail="HTTP 500: engine dead"), {"restart_epochs": []}, CFG, 1000)
    assert r["action"] == "restart" and r["reason"] == "engine dead: HTTP 500: engine dead"
    assert wd.decide(obs("dead", in_grace=True), {"restart_epochs": []}, CFG, 1000)["action"] == "none"


# /metrics as vLLM 0.19.0 exports the counter (prometheus_client text; labels from v1/metrics/loggers.py)
METRICS = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="sim-tiny"} 1234.0
vllm:generation_tokens_created{engine="0",model_name="sim-tiny"} 1.79e+09
vllm:num_requests_running{engine="0",model_name="sim-tiny"} 16.0
"""


def test_generation_tokens_reads_the_counter_and_nothing_else():
    assert wd.generation_tokens(METRICS) == 1234.0
    two = METRICS + 'vllm:generation_tokens_total{engine="1",model_name="sim-tiny"} 6.0\n'
    assert wd.generation_tokens(two) == 1240.0
    assert wd.generation_tokens("vllm:num_requests_running 3.0\n") is None


def test_a_probe_queued_behind_a_busy_engine_is_not_a_hang():
    """The paced double under a 16-user benchmark: the probe waited past the hang timeout in the queue while
    the engine generated tokens for everyone else; restarting it (the simulated cluster did) kills the
    benchmark. A hung engine generates nothing: that still restarts."""
    assert wd.busy_not_hung(1234.0, 1300.0)
    assert not wd.busy_not_hung(1234.0, 1234.0)  # nothing generated: hung
    assert not wd.busy_not_hung(None, 1300.0) and not wd.busy_not_hung(1234.0, None)  # unreadable: as before
    r = wd.decide(obs("busy", detail="queued"), {"consecutive_failures": 1, "restart_epochs": []}, CFG, 1000)
    assert r["action"] == "none" and r["reason"] == "healthy" and r["state"]["consecutive_failures"] == 0
    r = wd.decide(obs("busy", workers={"spark-sim-2": "stopped"}), {"restart_epochs": []}, CFG, 1000)
    assert r["action"] == "restart" and "worker lost" in r["reason"]  # busy never hides a lost worker


def test_an_mp_group_restart_stops_every_rank_then_starts_the_head_before_the_ranks(monkeypatch):
    """vLLM's multi-node executor: a headless rank cannot join a new head, so every rank stops; the head
    (rank 0) starts first so its rendezvous listens, then the ranks; Ray is never touched."""
    dog = wd.Watchdog.__new__(wd.Watchdog)
    dog.cfg = {
        "node": "head",
        "executor": "mp",
        "vllm_container": "sparkops-vllm",
        "ray_container": "sparkops-ray",
        "workers": [{"name": "w1", "address": "10.0.0.2"}, {"name": "w2", "address": "10.0.0.3"}],
        "drop_model_page_cache": False,
        "docker_timeout_s": 60,
        "stop_grace_s": 5,
        "ready_timeout_s": 30,
        "hang_timeout_s": 4,
        "interval_s": 1,
        "floor_marker": "/var/lib/sparkops/memory-floor.json",
    }
    steps = []
    monkeypatch.setattr(
        wd,
        "sh",
        lambda argv, timeout: steps.append(("local", " ".join(argv))) or subprocess.CompletedProcess(argv, 0, "", ""),
    )
    dog.ssh = lambda address, script, timeout: (
        steps.append((address, script)) or subprocess.CompletedProcess([], 0, "", "")
    )
    monkeypatch.setattr(wd, "probe", lambda cfg, key, timeout: ("ok", "", 0.1))
    dog.api_key = "k"
    assert dog._restart_steps() == (True, "")
    assert steps == [
        ("local", "docker stop -t 5 sparkops-vllm"),
        ("10.0.0.2", "docker stop -t 5 sparkops-vllm"),
        ("10.0.0.3", "docker stop -t 5 sparkops-vllm"),
        ("local", "docker start sparkops-vllm"),
        ("10.0.0.2", "docker start sparkops-vllm"),
        ("10.0.0.3", "docker start sparkops-vllm"),
    ]
    # A worker's state is its rank's container, not Ray's.
    assert "sparkops-vllm" in wd.worker_state_script(dog.cfg) and "sparkops-ray" not in wd.worker_state_script(dog.cfg)
    dog.cfg["executor"] = "ray"
    assert "sparkops-ray" in wd.worker_state_script(dog.cfg)


def test_a_single_node_replica_restart_is_its_vllm_alone_and_never_touches_ray(monkeypatch):
    """A deployment's single-node replica (serving.py executor `single`) runs vLLM without Ray: its
    watchdog restarts that vLLM only, with no worker and no Ray container to restart or wait for."""
    dog = wd.Watchdog.__new__(wd.Watchdog)
    dog.cfg = {
        "node": "spark-2",
        "executor": "single",
        "vllm_container": "sparkops-vllm",
        "ray_container": "sparkops-ray",
        "workers": [],
        "drop_model_page_cache": False,
        "docker_timeout_s": 60,
        "stop_grace_s": 5,
        "ready_timeout_s": 30,
        "hang_timeout_s": 4,
        "interval_s": 1,
        "floor_marker": "/var/lib/sparkops/memory-floor.json",
    }
    steps = []
    monkeypatch.setattr(
        wd,
        "sh",
        lambda argv, timeout: steps.append(" ".join(argv)) or subprocess.CompletedProcess(argv, 0, "", ""),
    )
    dog.ssh = lambda address, script, timeout: pytest.fail("a single-node replica has no worker to reach")
    monkeypatch.setattr(wd, "probe", lambda cfg, key, timeout: ("ok", "", 0.1))
    dog.api_key = "k"
    assert dog._restart_steps() == (True, "")
    assert steps == ["docker stop -t 5 sparkops-vllm", "docker start sparkops-vllm"]
    assert not wd.runs_ray(dog.cfg) and wd.worker_container(dog.cfg) == "sparkops-vllm"


def test_the_groups_chains_follow_its_executor():
    assert wd.group_chains({"executor": "ray"}) == {
        "head": ["SPARKOPS-API", "SPARKOPS-RAY"],
        "workers": ["SPARKOPS-RAY"],
    }
    assert wd.group_chains({"executor": "mp"}) == {"head": ["SPARKOPS-API", "SPARKOPS-MP"], "workers": ["SPARKOPS-MP"]}
    assert wd.group_chains({"executor": "single"}) == {"head": ["SPARKOPS-API"], "workers": []}
    with pytest.raises(ValueError, match="not a SPARKOPS chain"):
        wd.firewall_check_script(["SPARKOPS-API; reboot"])


FAKE_IPTABLES = """#!/bin/sh
# iptables/ip6tables stand-in: the chains named in $HAVE_<tool> exist, and INPUT jumps to each
tool=$(basename "$0")
have=$(eval echo \\"\\${HAVE_$tool}\\")
case "$*" in
  "-w -S INPUT") for c in $have; do echo "-A INPUT -p tcp -m multiport --dports 1 -j $c"; done ;;
  "-w -n -L "*) for c in $have; do [ "$c" = "$4" ] && exit 0; done; exit 1 ;;
esac
"""


def test_the_firewall_check_names_each_missing_chain_and_family(tmp_path):
    """The check script as the head runs it (sh -c), against stand-ins of iptables and ip6tables."""
    for tool in ("iptables", "ip6tables"):
        (tmp_path / tool).write_text(FAKE_IPTABLES)
        (tmp_path / tool).chmod(0o755)
    script = wd.firewall_check_script(["SPARKOPS-API", "SPARKOPS-RAY"])
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "HAVE_iptables": "SPARKOPS-API SPARKOPS-RAY", "HAVE_ip6tables": ""}
    res = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert wd.parse_firewall_check("head", res) == [
        "head: ip6tables chain SPARKOPS-API is missing",
        "head: ip6tables chain SPARKOPS-API has no jump from INPUT",
        "head: ip6tables chain SPARKOPS-RAY is missing",
        "head: ip6tables chain SPARKOPS-RAY has no jump from INPUT",
    ]
    env["HAVE_ip6tables"] = env["HAVE_iptables"]
    res = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert wd.parse_firewall_check("head", res) == []
    # an SSH that failed (255, nothing printed) is reported, never taken for "all in place"
    lost = subprocess.CompletedProcess([], 255, "", "ssh: connect to host 10.0.0.2 port 22: No route to host")
    assert wd.parse_firewall_check("w1", lost)[0].startswith("w1: could not read its firewall")


def test_a_group_whose_chain_is_missing_is_not_started_and_the_event_says_which(monkeypatch, tmp_path):
    """After a reboot without the boot restore (or an iptables -F): the watchdog starts nothing, says which
    chain on which node once (event firewall_missing), and stays blocked until the chains are back."""
    dog = wd.Watchdog.__new__(wd.Watchdog)
    dog.cfg = {
        "node": "head",
        "executor": "ray",
        "vllm_container": "sparkops-vllm",
        "ray_container": "sparkops-ray",
        "workers": [{"name": "w1", "address": "10.0.0.2"}],
        "restart_backoff_s": 0,
        "ssh_timeout_s": 5,
        "state_file": str(tmp_path / "state.json"),
        "interval_s": 1,
        "hang_timeout_s": 4,
        "failures_before_restart": 2,
        "max_restarts_per_hour": 3,
    }
    dog.state = {"restart_epochs": [], "consecutive_failures": 0, "own_start_epoch": 0}
    dog.state_path = str(tmp_path / "state.json")
    dog.events = wd.Events(str(tmp_path / "events.jsonl"), "head")
    ran = []
    monkeypatch.setattr(
        wd, "sh", lambda argv, timeout: ran.append(argv) or subprocess.CompletedProcess(argv, 0, "", "")
    )
    worker_out = {"stdout": "ip6tables:SPARKOPS-RAY:chain ip6tables:SPARKOPS-RAY:jump\n"}
    dog.ssh = lambda address, script, timeout: subprocess.CompletedProcess([], 0, worker_out["stdout"], "")
    monkeypatch.setattr(dog, "_restart_steps", lambda: pytest.fail("started a group without its firewall"))
    dog.restart_group("hang")
    dog.restart_group("hang")
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["firewall_missing"]  # once, not every round
    assert events[0]["missing"] == ["w1: ip6tables chain SPARKOPS-RAY is missing",
                                    "w1: ip6tables chain SPARKOPS-RAY has no jump from INPUT"]  # fmt: skip
    assert dog.state["status"] == "blocked" and dog.state["restart_epochs"] == []
    assert all(argv[:2] == ["sh", "-c"] and "docker" not in " ".join(argv) for argv in ran)
    # the chains are back: the restart goes ahead
    worker_out["stdout"] = ""
    monkeypatch.setattr(dog, "_restart_steps", lambda: (True, ""))
    dog.restart_group("hang")
    assert dog.state["status"] == "watching" and "firewall_missing" not in dog.state


# --- a spent restart budget: stop, say why, try again after a growing back-off (issue 43)
RETRY_CFG = {**CFG, "retry_after_budget_s": 100, "retry_after_budget_max_s": 350}


def test_retry_delay_doubles_up_to_its_cap():
    assert [wd.retry_delay(k, RETRY_CFG) for k in range(5)] == [100, 200, 350, 350, 350]
    assert wd.retry_delay(0, {}) == 600  # the role's defaults: 600 s, at most 3600 s
    assert wd.retry_delay(9, {}) == 3600


def test_given_up_tries_again_when_its_back_off_runs_out():
    st = {"status": "gave_up", "gave_up_reason": "hang: no token within 4 s", "restart_epochs": [10.0, 20.0],
          "retries_after_budget": 1, "next_retry_epoch": 500.0}  # fmt: skip
    assert wd.decide(obs("hang"), st, RETRY_CFG, 499)["action"] == "none"
    due = wd.decide(obs("hang"), st, RETRY_CFG, 500)
    assert (
        due["action"] == "retry"
        and due["reason"] == "try 2 after the restart budget was spent: hang: no token within 4 s"
    )
    # a state from before tries existed starts its back-off now instead of never
    old = {"status": "gave_up", "reason": "vLLM exited", "restart_epochs": []}
    held = wd.decide(obs("failed"), old, RETRY_CFG, 1000)
    assert held["action"] == "none" and held["state"]["next_retry_epoch"] == 1100


class FakeDog(wd.Watchdog):
    """The watch loop's round() with observation and the group restart replaced (no HTTP, no Docker)."""

    def __init__(self, tmp_path, restarts_work=False):
        self.cfg = {**RETRY_CFG, "interval_s": 1, "state_file": str(tmp_path / "state.json"), "node": "head"}
        self.state_path = self.cfg["state_file"]
        self.events = wd.Events(str(tmp_path / "events.jsonl"), "head")
        self.state = {"restart_epochs": [], "consecutive_failures": 0, "own_start_epoch": 0}
        self.probe, self.restarts_work, self.restarts = "hang", restarts_work, []
        self.tmp = tmp_path

    def observe(self):
        return {"probe": self.probe, "probe_detail": "", "probe_s": 4.0, "workers": {}, "floor_tripped": [],
                "in_grace": False}  # fmt: skip

    def restart_group(self, reason, backoff=True):
        self.restarts.append((reason, backoff))
        self.state["restart_epochs"].append(wd.time.time())
        self.state["status"] = "watching" if self.restarts_work else "degraded"

    def names(self):
        return [json.loads(x)["event"] for x in (self.tmp / "events.jsonl").read_text().splitlines()]


def test_a_spent_budget_is_not_down_for_the_rest_of_the_hour(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(wd.time, "time", lambda: clock[0])
    dog, last = FakeDog(tmp_path), None
    for _round in range(3):  # two restarts (the budget), then the third failure gives up
        last = dog.round(last)
        clock[0] += 10
    assert last == "gave_up" and len(dog.restarts) == 2
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["gave_up_reason"].startswith("hang") and state["restarts_in_hour"] == 2
    assert state["next_retry_epoch"] == 1020 + 100 and state["next_retry_at"] == "1970-01-01T00:18:40Z"
    gave_up = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()][-1]
    assert gave_up["event"] == "gave_up" and "not restarting again until 1970-01-01T00:18:40Z" in gave_up["message"]
    # Before the back-off runs out nothing happens; then one try, outside the budget and without the in-hour wait.
    clock[0] = 1119
    assert dog.round(last) == "gave_up" and len(dog.restarts) == 2
    clock[0] = 1120
    last = dog.round(last)
    assert last == "gave_up" and dog.restarts[-1] == (
        "try 1 after the restart budget was spent: " + state["gave_up_reason"],
        False,
    )
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["retries_after_budget"] == 1 and state["next_retry_epoch"] == 1120 + 200  # twice as long
    assert dog.names()[-2:] == ["retry_after_budget", "retry_scheduled"]
    # The next try brings serving back: watching, the given-up fields gone, "recovered" said.
    dog.restarts_work = True
    clock[0] = 1320
    last = dog.round(last)
    assert last == "watching" and len(dog.restarts) == 4
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["status"] == "watching" and not set(wd.GAVE_UP_FIELDS) & set(state)
    assert "recovered" in dog.names()


def test_a_completion_that_answers_while_given_up_ends_it(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(wd.time, "time", lambda: clock[0])
    dog, last = FakeDog(tmp_path), None
    for _round in range(3):
        last = dog.round(last)
    assert last == "gave_up"
    dog.probe = "ok"
    assert dog.round(last) == "watching"
    assert not set(wd.GAVE_UP_FIELDS) & set(json.loads((tmp_path / "state.json").read_text()))


def test_a_state_folder_too_deep_for_a_socket_connects_anew_instead_of_failing():
    deep = "/var/lib/" + "/".join(["sparkops-state-folder"] * 4)
    cfg = {"interval_s": 2, "state_file": f"{deep}/watchdog-state.json", "ssh_user": "root", "ssh_args": ["-i", "k"]}
    assert not wd.ssh_control_path_fits(cfg)
    assert wd.ssh_argv(cfg, "10.0.0.2", "true") == ["ssh", "-i", "k", "root@10.0.0.2", "true"]
    cfg["state_file"] = "/var/lib/sparkops/watchdog-state.json"
    argv = wd.ssh_argv(cfg, "10.0.0.2", "true")
    assert "ControlPath=/var/lib/sparkops/ssh/%C" in argv and "ControlPersist=30s" in argv
    assert argv[-2:] == ["root@10.0.0.2", "true"]
