"""The day-2 playbooks a user runs after `make sim`, run the way the README says, on the simulated
cluster: status (issue 13/15: it failed on every run), verify, benchmark,
a copy of the inventory outside the checkout, and the ready-to-paste curl (issue 16).
Upgrade runs in test_faults_and_day2.py, teardown then site in test_day2_faults.py (from the pair a
fault left). Each test leaves the cluster serving, but the dead worker's: the head reboot after it starts
from it, and its site.yml repairs both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    NODES,
    ROOT,
    VENV_BIN,
    WORKER_FAST,
    ansible_env,
    assert_watchdog_running,
    failure,
    node_sh,
    run_playbook,
    stop_worker_ray_unwatched,
)
from test_faults_and_day2 import health

pytestmark = pytest.mark.usefixtures("sim_cluster")

HEAD_FAST = "10.213.0.11"


def flat(text: str) -> str:
    return " ".join(text.split())


def ray_line(output: str) -> str:
    """The `ray: ...` line status.yml prints (debug lists one string per line)."""
    m = re.search(r"ray: (ok|DEGRADED): (.*?)(?:'|\"|$)", flat(output))
    assert m, output[-3000:]
    return m.group(0)


def test_status_runs_and_agrees_with_verify_on_a_dead_worker():
    """A worker's Ray gone: status reports it (read-only), verify fails naming it with the same membership, and
    the health check sees the dead engine. The pair is left so: the next test reboots the head as well, and one
    site.yml repairs both."""
    res = run_playbook("playbooks/status.yml", timeout=300)
    assert res.returncode == 0, failure(res)
    out = flat(res.stdout)
    assert "ray: ok: 2/2 nodes alive, 2.0/2.0 GPUs" in out, res.stdout[-3000:]
    assert f"endpoint: http://{HEAD_FAST}:8000/v1 HEALTHY" in out
    for node in NODES:
        assert f"node {node}: driver" in out
    print(f"\nstatus.yml on a healthy cluster: {res.elapsed:.1f} s")

    stop_worker_ray_unwatched()
    status = run_playbook("playbooks/status.yml", timeout=300)
    assert status.returncode == 0, "status is read-only: it reports, it does not fail\n" + status.stdout[-4000:]
    line = ray_line(status.stdout)
    assert line.startswith("ray: DEGRADED: 1/2 nodes alive, 1.0/2.0 GPUs"), line
    assert WORKER_FAST in line, line
    print(f"status.yml with the worker's Ray stopped: {line}")

    verify = run_playbook("playbooks/verify.yml", extra_vars={"ray_cluster_join_timeout_s": 15}, timeout=300)
    assert verify.returncode != 0
    # The same membership, from the same reading, in both (GPUs in use may change in between).
    sentence = line.split("DEGRADED: ", 1)[1].split(" (")[0]
    assert sentence == "1/2 nodes alive, 1.0/2.0 GPUs", line
    assert f"{sentence} " in flat(verify.stdout), (sentence, verify.stdout[-3000:])
    assert f"dead: {WORKER_FAST}" in flat(verify.stdout)
    deadline = time.monotonic() + 90
    seen = None
    while time.monotonic() < deadline:
        # vLLM 0.19.0 (and its test double) only finds a dead TP member when a step runs: ask for a token
        seen = health(timeout_s=5, checks=["health", "completion"])
        if seen.get("failed") and seen.get("failure_kind") in ("server_error", "engine_dead", "refused"):
            break
        time.sleep(3)
    assert seen and seen.get("failed"), f"endpoint still healthy with a worker gone: {seen}"
    assert seen["failure_kind"] in ("server_error", "engine_dead", "refused"), seen


def test_head_node_restart_with_a_dead_worker_and_one_site_run_brings_serving_back():
    """The head reboots while the worker's Ray is still down (the previous test's end; whatever state an earlier
    failure left, the run below repairs it): its firewall is back from the boot restore before any run, and one
    site.yml brings the pair back to serving with both watchdogs running."""
    subprocess.run(["docker", "restart", "-t", "5", "spark-sim-1"], check=True, capture_output=True)
    # The boot restore ran before the node's Docker (and so Ray, vLLM, the watchdog) started: every chain is
    # back, for IPv4 and IPv6, with its INPUT jump, before site.yml runs. The node's boot is over when its
    # entrypoint hands over to sshd (sim/node/entrypoint.sh: the restore, then dockerd, then sshd).
    deadline = time.monotonic() + 90
    while node_sh("spark-sim-1", "pgrep -x sshd", check=False).returncode != 0:
        assert time.monotonic() < deadline, "the restarted head did not finish its boot in 90 s"
        time.sleep(0.5)
    for tool in ("iptables", "ip6tables"):
        rules = node_sh("spark-sim-1", f"{tool} -S").stdout
        for chain in ("SPARKOPS-API", "SPARKOPS-RAY", "SPARKOPS-MONITORING"):
            assert f"-N {chain}" in rules and f"-j {chain}" in rules, (tool, chain, rules)
    repair = run_playbook("site.yml")
    assert repair.returncode == 0, failure(repair)
    assert not health().get("failed")
    for node in NODES:
        assert_watchdog_running(node)


def test_benchmark_on_the_sim_is_marked_as_the_test_double():
    res = run_playbook(
        "playbooks/benchmark.yml",
        extra_vars={"benchmark_concurrency": [1, 2], "benchmark_max_tokens": 32},
        timeout=600,
    )
    assert res.returncode == 0, failure(res)
    m = re.search(r"JSON: (\S+\.json)", res.stdout)
    assert m, res.stdout[-3000:]
    path = Path(m.group(1))
    assert ".." not in str(path)
    doc = json.loads(path.read_text())
    assert doc["source"] == "test-double" and doc["reference"] is None and doc["model"] == "sim-tiny"
    assert [r["concurrency"] for r in doc["rows"]] == [1, 2]
    assert all(r["reference"] is None for r in doc["rows"])
    md = path.with_suffix(".md").read_text()
    assert md.splitlines()[0].endswith(": vLLM TEST DOUBLE") and "reference tok/s" not in md
    assert "+333" not in res.stdout and "vLLM TEST DOUBLE" in res.stdout
    print(f"\nbenchmark.yml (levels 1, 2; 32 tokens): {res.elapsed:.1f} s")


def test_benchmark_sweep_finds_the_doubles_knee():
    """Issue 26: the default sweep (32-token answers to keep it short) on the simulated pair: the double,
    paced on the two-Spark seed figures, meets the SLO at 1 and 2 users (17.0, 12.1 tok/s each), misses it
    at 4 (9.1) and gives under half of it at 16 (4.8), where the sweep stops."""
    res = run_playbook("playbooks/benchmark.yml", extra_vars={"benchmark_max_tokens": 32}, timeout=900)
    assert res.returncode == 0, failure(res)
    path = Path(re.search(r"JSON: (\S+\.json)", res.stdout).group(1))
    doc = json.loads(path.read_text())
    runs = doc["runs"]
    assert [r["max_concurrency"] for r in runs] == [1, 2, 4, 8, 16], runs
    for key in ("completed", "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms"):
        assert all(key in r for r in runs), key
    assert all(r["failed"] == 0 and (r["prefix_cache_hit_rate"] or 0) > 0.5 for r in runs), runs
    assert doc["capacity"]["users_at_slo"] == 2, doc["capacity"]
    assert doc["capacity"]["stopped"].startswith("SLO clearly broken at concurrency 16"), doc["capacity"]
    # The calibration's 5% is tests/unit/sim/test_double_pacing.py's (long answers, nothing else running).
    # Here a 32-token answer carries its TTFT, and the watchdog's probes and a loaded 2-core machine slow
    # every level a little (CI: 15.7 tok/s at 1, -7.6%): the shape must hold, each level within 12%.
    measured = {r["max_concurrency"]: r["per_user_tok_s"] for r in runs}
    assert [measured[c] for c in (1, 2, 4, 8, 16)] == sorted(measured.values(), reverse=True), measured
    for c, per_user in ((1, 17.0), (2, 12.1), (4, 9.1)):
        assert abs(measured[c] / per_user - 1) < 0.12, (c, measured[c])
    assert path.with_suffix(".png").is_file()
    print(f"\nbenchmark.yml sweep (32 tokens): {[(r['max_concurrency'], r['per_user_tok_s']) for r in runs]}")


def make(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`make` as a user runs it: no SPARKOPS_SIM_STATE in the environment. (`-o .venv/.installed`: in
    this session's worktrees .venv is a link to a shared venv, which make must not try to rebuild.)"""
    env = ansible_env()
    env.pop("SPARKOPS_SIM_STATE", None)
    return subprocess.run(
        ["make", "-s", "-o", ".venv/.installed", *args],
        check=False, cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout,
    )  # fmt: skip


def test_report_and_make_sim_info_print_a_curl_that_works_and_never_the_key():
    res = run_playbook("playbooks/report.yml", timeout=300)
    assert res.returncode == 0, failure(res)
    assert "synthetic shards seeded by sim/simctl.py" in flat(res.stdout)  # not a Hub link that 404s
    info = make("sim-info")
    assert info.returncode == 0, info.stdout + info.stderr
    assert "served model name: `sim-tiny`" in info.stdout
    assert ".." not in info.stdout
    curls = [line.strip() for line in info.stdout.splitlines() if line.strip().startswith("curl -sS ")]
    assert len(curls) == 1, info.stdout
    curl = curls[0]
    assert '"model": "sim-tiny"' in curl and "$(cat /" in curl
    key_file = re.search(r"\$\(cat (\S+)\)", curl).group(1)
    key = Path(key_file).read_text().strip()
    assert key not in res.stdout and key not in info.stdout, "the API key itself must never be printed"
    out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["model"] == "sim-tiny" and answer["choices"][0]["message"]["content"], answer


def test_make_status_target():
    status = make("status")
    assert status.returncode == 0, failure(status)
    assert "ray: ok: 2/2 nodes alive" in flat(status.stdout)


def test_a_copy_of_the_inventory_outside_the_checkout_connects(tmp_path):
    copy = Path("/tmp") / f"sparkops-inv-{os.getpid()}" / "sim"
    shutil.rmtree(copy.parent, ignore_errors=True)
    shutil.copytree(ROOT / "inventory" / "sim", copy)
    try:
        play = tmp_path / "ping.yml"
        play.write_text(
            "- hosts: spark_cluster\n  gather_facts: false\n  tasks:\n    - name: Ping\n      ansible.builtin.ping:\n"
        )
        env = ansible_env()
        env.pop("SPARKOPS_SIM_STATE", None)  # what a user's shell has
        res = subprocess.run(
            [str(VENV_BIN / "ansible-playbook"), "-i", str(copy), str(play)],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False,
        )  # fmt: skip
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        assert res.stdout.count("ok: [spark-sim-") == 2
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)
