"""The transition chain's last step: from where the chain ended (two replicas of `chat` behind the gateway,
upgraded) back to the reference deployment (TP=2 over Ray, gateway off) in one site.yml.

The chain (conftest.CHAIN) runs reference -> mp TP=2 (test_serving_plan.py) -> two single-node
deployments, then one (test_deployments.py) -> two deployments behind the gateway -> two replicas of one
model, upgraded blue-green (test_gateway.py) -> back here. Each step is one converge from the previous
step's end; this one proves the way back: it serves, the gateway is gone, what runs is what plan.yml
prints, and a rerun changes nothing.
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import NODES, node_sh, recap, run_playbook
from test_day2_faults import completion_ok, wait_serving
from test_serving_plan import container, failure, plan

pytestmark = pytest.mark.usefixtures("sim_cluster")


def test_back_to_the_reference_in_one_run_and_a_rerun_changes_nothing(tmp_path):
    t0 = time.monotonic()
    back = run_playbook("site.yml", timeout=1800)
    assert back.returncode == 0, failure(back)
    print(f"\n[chain] two replicas behind the gateway -> the reference (TP=2 over Ray): {time.monotonic() - t0:.0f} s")
    dep = plan(tmp_path)
    for member in dep["members"]:
        node = member["host"]
        assert container(node, "sparkops-ray")["State"]["Running"], f"Ray did not come back on {node}"
        running = container(node, "sparkops-vllm")
        if member["vllm"] is None:
            assert running is None or not running["State"]["Running"], f"a vLLM still runs on {node}"
        else:
            assert running["Config"]["Cmd"] == member["vllm"]["argv"], node  # what runs is what plan.yml prints
    gateway = node_sh(NODES[0], "/etc/init.d/sparkops-gateway status", check=False)
    assert gateway.returncode != 0, "the gateway still runs after site.yml without it"
    wait_serving(60)
    assert completion_ok()
    again = run_playbook("site.yml", timeout=1800)
    assert again.returncode == 0, failure(again)
    counts = recap(again.stdout)
    print(f"no-op site.yml on two nodes: {again.elapsed:.1f} s")
    assert set(counts) == set(NODES) and all(c["changed"] == 0 for c in counts.values()), counts
    state = json.loads(node_sh(NODES[0], "cat /var/lib/sparkops/deployment.json").stdout)
    assert state["profile_name"] == "sim-tiny-tp2", state  # inventory/sim's reference profile
