"""The serving plan on the simulated pair: one plan for every entry point, and vLLM's own multi-node
executor (`sparkops_executor: mp`) converging and serving.

The molecule scenario and the reference-shape tests have converged the pair with Ray (the default) and
written the lock. The mp test is the first step of the transition chain (conftest.CHAIN): it leaves the
pair under mp for the next file.
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import NODES, failure, node_sh, recap, run_playbook
from test_day2_faults import HEAD, WORKER, completion_ok, wait_serving

pytestmark = pytest.mark.usefixtures("sim_cluster")
MP = {"sparkops_executor": "mp"}


def container(node: str, name: str) -> dict | None:
    res = node_sh(node, f"docker inspect {name}", check=False)
    return json.loads(res.stdout)[0] if res.returncode == 0 else None


def plan(tmp_path, extra_vars=None) -> dict:
    out = tmp_path / "plan.json"
    res = run_playbook("playbooks/plan.yml", extra_vars={"sparkops_plan_file": str(out), **(extra_vars or {})})
    assert res.returncode == 0, failure(res)
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
    assert res.returncode == 0, failure(res)
    counts = recap(res.stdout)
    assert all(c["changed"] == 0 for c in counts.values()), counts


def test_mp_executor_converges_serves_and_a_rerun_changes_nothing(tmp_path):
    """The first step of the transition chain (conftest.CHAIN): from the reference (TP=2 over Ray) to vLLM's
    own executor in one site.yml, which serves; a rerun changes nothing. The chain's next file starts from
    here. A killed rank and a hang under mp are the 4-node ring's drills (test_topologies.py)."""
    dep = plan(tmp_path, MP)
    assert [m["rank"] for m in dep["members"]] == [0, 1] and dep["executor"] == "mp"
    head_ip = dep["members"][0]["ip"]
    t0 = time.monotonic()
    res = run_playbook("site.yml", extra_vars=MP, timeout=900)
    assert res.returncode == 0, failure(res)
    print(f"\n[chain] reference -> mp TP=2: {time.monotonic() - t0:.0f} s")
    for node, rank, member in zip(NODES, (0, 1), dep["members"], strict=True):
        vllm = container(node, "sparkops-vllm")
        assert vllm and vllm["State"]["Running"], f"no running rank on {node}"
        cmd = vllm["Config"]["Cmd"]
        assert cmd == member["vllm"]["argv"], (node, cmd)  # what runs is what plan.yml printed
        assert cmd[cmd.index("--node-rank") + 1] == str(rank)
        assert cmd[cmd.index("--master-addr") + 1] == head_ip
        assert ("--headless" in cmd) == (rank > 0)
        assert container(node, "sparkops-ray") is None, f"Ray still on {node} under mp"
    logs = node_sh(WORKER, "docker logs sparkops-vllm 2>&1").stdout
    assert "headless rank 1 joined the head's rendezvous" in logs, logs[-2000:]
    wait_serving(60)
    assert completion_ok()
    again = run_playbook("site.yml", extra_vars=MP, timeout=900)
    assert again.returncode == 0, failure(again)
    counts = recap(again.stdout)
    assert all(c["changed"] == 0 for c in counts.values()), counts
