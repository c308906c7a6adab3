"""The serving plan on the simulated pair (issue 24): one plan for every entry point, and vLLM's own
multi-node executor (`sparkops_executor: mp`) converging, serving, surviving a killed rank and a hang,
then the cluster going back to Ray.

The molecule scenario and the earlier integration tests have converged the pair with Ray (the
default) and written the lock; every test leaves it serving with Ray again.
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import NODES, node_sh, recap, reset_watchdog, run_playbook
from test_day2_faults import HEAD, WORKER, completion_ok, wait_event, wait_serving

pytestmark = pytest.mark.usefixtures("sim_cluster")
MP = {"sparkops_executor": "mp"}


def container(node: str, name: str) -> dict | None:
    res = node_sh(node, f"docker inspect {name}", check=False)
    return json.loads(res.stdout)[0] if res.returncode == 0 else None


def failure(res) -> str:
    """The failed tasks' lines of a run, else its end (a long run's failure is far from its end)."""
    lines = res.stdout.splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith(("fatal:", "failed:")) or "FAILED!" in line]
    return "\n".join("\n".join(lines[max(0, i - 3) : i + 25]) for i in at[:3]) or res.stdout[-4000:]


def plan(tmp_path, extra_vars=None) -> dict:
    out = tmp_path / "plan.json"
    res = run_playbook("playbooks/plan.yml", extra_vars={"sparkops_plan_file": str(out), **(extra_vars or {})})
    assert res.returncode == 0, res.stdout[-3000:]
    return json.loads(out.read_text())["serving"]["deployments"][0]


def test_serve_alone_starts_what_site_started_and_plan_shows_it(tmp_path):
    """On the locked pair, serve.yml alone (check mode) would change nothing that site.yml started, and
    plan.yml, contacting no node, shows the command line and the image the head really runs."""
    dep = plan(tmp_path)
    running = container(HEAD, "sparkops-vllm")
    assert running["Config"]["Cmd"] == dep["members"][0]["vllm"]["argv"]
    assert running["Config"]["Image"] == dep["image"]["image"] and dep["image"]["resolved"]
    argv = running["Config"]["Cmd"]
    locked = json.loads(node_sh(HEAD, "cat /var/lib/sparkops/deployment.json").stdout)
    assert argv[argv.index("--revision") + 1] == locked["model_revision"]
    res = run_playbook("playbooks/serve.yml", args=["--check"])
    assert res.returncode == 0, res.stdout[-4000:]
    counts = recap(res.stdout)
    assert all(c["changed"] == 0 for c in counts.values()), counts


def test_mp_executor_converges_serves_survives_a_killed_rank_and_goes_back_to_ray(tmp_path):
    dep = plan(tmp_path, MP)
    assert [m["rank"] for m in dep["members"]] == [0, 1] and dep["executor"] == "mp"
    head_ip = dep["members"][0]["ip"]
    t0 = time.monotonic()
    res = run_playbook("site.yml", extra_vars=MP, timeout=900)
    assert res.returncode == 0, failure(res)
    converge_s = time.monotonic() - t0
    try:
        for node, rank in zip(NODES, (0, 1), strict=True):
            vllm = container(node, "sparkops-vllm")
            assert vllm and vllm["State"]["Running"], f"no running rank on {node}"
            cmd = vllm["Config"]["Cmd"]
            assert cmd[cmd.index("--node-rank") + 1] == str(rank)
            assert cmd[cmd.index("--master-addr") + 1] == head_ip
            assert ("--headless" in cmd) == (rank > 0)
            assert container(node, "sparkops-ray") is None, f"Ray still on {node} under mp"
        logs = node_sh(WORKER, "docker logs sparkops-vllm 2>&1").stdout
        assert "headless rank 1 joined the head's rendezvous" in logs, logs[-2000:]
        assert completion_ok()
        again = run_playbook("site.yml", extra_vars=MP, timeout=900)
        assert again.returncode == 0, failure(again)
        counts = recap(again.stdout)
        assert all(c["changed"] == 0 for c in counts.values()), counts

        # A rank killed: vLLM finds it at the next step (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, 30 s in the
        # stand-in image), the engine dies, and the watchdog restarts the group, head first.
        reset_watchdog(HEAD)
        t1 = time.time()
        node_sh(WORKER, "docker kill sparkops-vllm")
        begun = wait_event("restart_begun", t1, timeout=120)
        ended = wait_event("restart_ended", t1, timeout=300, pred=lambda e: e.get("ok"))
        wait_serving(60)
        assert container(WORKER, "sparkops-vllm")["State"]["Running"]
        print(
            f"\n[mp] converge {converge_s:.0f} s; rank 1 killed: restart begun after {begun['epoch'] - t1:.1f} s "
            f"({begun['reason']}), serving again after {ended['epoch'] - t1:.1f} s (2-core machine)"
        )

        # The head hung (SIGSTOP): the watchdog's probe times out and the group restarts.
        reset_watchdog(HEAD)
        pid = node_sh(HEAD, "pgrep -f -o 'vllm_test_double.py'").stdout.split()[0]
        t2 = time.time()
        node_sh(HEAD, f"kill -STOP {pid}")
        wait_event("hang_seen", t2, timeout=30)
        wait_event("restart_ended", t2, timeout=300, pred=lambda e: e.get("ok"))
        wait_serving(60)
    finally:
        back = run_playbook("site.yml", timeout=900)
    assert back.returncode == 0, failure(back)
    for node in NODES:
        assert container(node, "sparkops-ray")["State"]["Running"], f"Ray did not come back on {node}"
    assert container(WORKER, "sparkops-vllm") is None or not container(WORKER, "sparkops-vllm")["State"]["Running"]
    assert completion_ok()
