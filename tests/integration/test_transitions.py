"""The transition chain's last step: from where the chain ended (two replicas of `chat` behind the gateway,
upgraded) back to the reference deployment (TP=2 over Ray, gateway off) in one site.yml.

The chain (conftest.CHAIN) runs reference -> mp TP=2 (test_serving_plan.py) -> two single-node
deployments, then one (test_deployments.py) -> two deployments behind the gateway -> two replicas of one
model, upgraded blue-green (test_gateway.py) -> back here. Each step is one converge from the previous
step's end; this one proves the way back: it serves, the gateway is gone, what runs is what plan.yml
prints, and a rerun changes nothing. Both runs are given an API key and a Hub token of their own, with -v: neither
secret reaches Ansible's output or any file outside the controller's credentials folder.
"""

from __future__ import annotations

import json
import secrets
import time

import pytest
from conftest import NODES, ROOT, assert_watchdog_running, node_sh, recap, run_playbook
from test_day2_faults import events_since
from test_faults_and_day2 import health
from test_serving_plan import container, failure, plan

pytestmark = pytest.mark.usefixtures("sim_cluster")


def assert_no_secret_in_files(*secret_values: str) -> None:
    allowed = ROOT / "credentials"
    for path in ROOT.rglob("*"):
        if not path.is_file() or allowed in path.parents or ".venv" in path.parts or ".git" in path.parts:
            continue
        if path.stat().st_size > 50_000_000:
            continue
        data = path.read_bytes()
        found = [i for i, value in enumerate(secret_values) if value.encode() in data]
        assert not found, f"secret {found} found in {path}"


def test_back_to_the_reference_in_one_run_and_a_rerun_changes_nothing(tmp_path):
    # Made here, not written in this file, so the file scan cannot find them in the tests.
    token, key = "hf_" + secrets.token_hex(16), "sk-" + secrets.token_hex(20)
    given = {"sparkops_api_key": key, "sparkops_hf_token": token}

    def masked(text: str) -> str:
        return text.replace(key, "<key>").replace(token, "<token>")

    t0, since = time.monotonic(), time.time()
    back = run_playbook("site.yml", extra_vars=given, args=["-v"], timeout=1800)
    assert back.returncode == 0, masked(failure(back))
    # Each node's watchdog watched its own replica: both were stopped before Ray and vLLM moved (no restart
    # of a group the run was replacing), and watchdog.yml started them on the new plan.
    said = " ".join(back.stdout.split())
    for node in NODES:
        assert f"The watchdog on {node} stops until watchdog.yml starts it on the new plan" in said, node
        tried = [e for e in events_since(since, node) if e["event"] in ("restart_begun", "restart_backoff")]
        assert tried == [], (node, tried)
        assert_watchdog_running(node)
    watches = {n: json.loads(node_sh(n, "cat /etc/sparkops/watchdog.json").stdout) for n in NODES}
    assert str(watches[NODES[1]]["watch"]).lower() == "false" and watches[NODES[0]]["executor"] == "ray"
    assert [w["name"] for w in watches[NODES[0]]["workers"]] == [NODES[1]]
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
    assert not health(key=key).get("failed")  # served with the given key
    again = run_playbook("site.yml", extra_vars=given, args=["-v"], timeout=1800)
    assert again.returncode == 0, masked(failure(again))
    counts = recap(again.stdout)
    assert "stops until watchdog.yml" not in again.stdout
    print(f"no-op site.yml on two nodes (with -v): {again.elapsed:.1f} s")
    assert set(counts) == set(NODES) and all(c["changed"] == 0 for c in counts.values()), masked(again.stdout[-3000:])
    state = json.loads(node_sh(NODES[0], "cat /var/lib/sparkops/deployment.json").stdout)
    assert state["profile_name"] == "sim-tiny-tp2", state  # inventory/sim's reference profile
    for res in (back, again):
        out = res.stdout + res.stderr
        assert token not in out, "the Hub token reached Ansible's output"
        assert key not in out, "the API key reached Ansible's output"
    assert_no_secret_in_files(token, key)
