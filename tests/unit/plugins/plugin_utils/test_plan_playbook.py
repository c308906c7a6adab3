"""playbooks/plan.yml on pair, switch and ring inventories and on a broken one, contacting no host.

The inventories' hosts are TEST-NET addresses (RFC 5737) that nothing answers: a run that tried to
connect would report them unreachable. No daemon is started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster_inventories as inv  # noqa: E402

PLAYBOOK = ROOT / "playbooks" / "plan.yml"


def write_inventory(tmp_path: Path, inputs: dict) -> Path:
    """An Ansible inventory directory from a cluster_inventories dict; hosts on 192.0.2.0/24."""
    head = inputs["groups"]["spark_head"]
    hosts = {}
    for i, (h, hv) in enumerate(inputs["hostvars"].items()):
        hosts[h] = {"ansible_host": f"192.0.2.{10 + i}", "sparkops_fast_links": hv["sparkops_fast_links"]}
    data = {
        "all": {
            "children": {
                "spark_cluster": {
                    "children": {
                        "spark_head": {"hosts": {h: hosts[h] for h in head if h in hosts}},
                        "spark_workers": {"hosts": {h: v for h, v in hosts.items() if h not in head}},
                    }
                }
            }
        }
    }
    invdir = tmp_path / "inv"
    (invdir / "group_vars" / "all").mkdir(parents=True)
    (invdir / "hosts.yml").write_text(yaml.safe_dump(data))
    settings = {k: v for k, v in inputs["settings"].items() if k.startswith("sparkops_topology")}
    settings["sparkops_cluster_name"] = "plan-test"
    (invdir / "group_vars" / "all" / "cluster.yml").write_text(yaml.safe_dump(settings))
    return invdir


def run_plan(invdir: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}"
    return subprocess.run(
        ["ansible-playbook", "-i", str(invdir), str(PLAYBOOK), *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("name", "inputs"),
    [("pair", inv.pair()), ("switch-4", inv.switch(4)), ("ring-4", inv.ring(4))],
)
def test_plan_writes_the_model_without_contacting_hosts(tmp_path, name, inputs):
    invdir = write_inventory(tmp_path, inputs)
    res = run_plan(invdir)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "unreachable=0" in out and "UNREACHABLE" not in out
    # default: in the state folder beside the inventory, never inside it
    plan = json.loads((tmp_path / "inv-state" / "sparkops-plan.json").read_text())
    assert not (invdir / "sparkops-plan.json").exists()
    assert plan["topology"] == inputs["settings"]["sparkops_topology"]
    assert plan["head"] == "spark-1"
    assert plan["workers"] == inv.names_of(len(inputs["hostvars"]))[1:]
    assert all(set(s) >= {"cidr", "hosts"} for s in plan["segments"])
    assert set(plan["nodes"]) == set(inputs["hostvars"])
    if name == "ring-4":
        assert plan["nodes"]["spark-1"]["peers"] == ["spark-2", "spark-4"]
        assert "route 10.2.0.0/24 via 10.1.0.2 dev enp1s0f0np0" in out
    else:
        assert plan["nodes"]["spark-2"]["peers"] == [h for h in plan["nodes"] if h != "spark-2"]


def test_plan_file_can_be_chosen(tmp_path):
    invdir = write_inventory(tmp_path, inv.pair())
    target = tmp_path / "elsewhere" / "plan.json"
    target.parent.mkdir()
    res = run_plan(invdir, "-e", f"sparkops_plan_file={target}")
    assert res.returncode == 0, res.stdout[-2000:]
    assert json.loads(target.read_text())["topology"] == "pair"
    assert not (invdir / "sparkops-plan.json").exists()
    assert not (tmp_path / "inv-state" / "sparkops-plan.json").exists()


def test_plan_refuses_a_broken_inventory_with_every_message(tmp_path):
    inputs = inv.ring(4)
    for h in inputs["hostvars"]:  # cable 2 (spark-2 - spark-3) missing
        links = inputs["hostvars"][h]["sparkops_fast_links"]
        links[:] = [ln for ln in links if not ln["address"].startswith("10.2.")]
    inputs["hostvars"]["spark-4"]["sparkops_fast_links"][0]["address"] = "10.1.0.1/24"
    invdir = write_inventory(tmp_path, inputs)
    res = run_plan(invdir)
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode != 0
    assert "spark-2 is cabled to 1 node(s) (spark-1)" in out
    assert "spark-3 is cabled to 1 node(s) (spark-4)" in out
    assert "Fast-link addresses must be unique across the cluster; duplicated: 10.1.0.1" in out
    assert "UNREACHABLE" not in out
    assert not (tmp_path / "inv-state" / "sparkops-plan.json").exists()


def test_plan_refuses_values_that_would_reach_a_shell_or_the_wrong_host(tmp_path):
    # Through cluster_facts (the action plugin hands these settings to the model): issue 23.
    inputs = inv.pair()
    inputs["hostvars"]["spark-2"]["sparkops_fast_links"][0]["netdev"] = "enp1s0f1np1;id"
    invdir = write_inventory(tmp_path, inputs)
    extra = {
        "roce_network_env_extra": {"X": "1\nLD_PRELOAD=/tmp/x.so"},
        "sparkops_weights_source_host": "spark-9",
        "vllm_serve_host": "192.0.2.11",  # the worker's management address
    }
    res = run_plan(invdir, "-e", json.dumps(extra))
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode != 0
    assert "'netdev' 'enp1s0f1np1;id' contains ';'" in out
    assert "roce_network_env_extra: the value of 'X' contains control characters" in out
    assert "sparkops_weights_source_host is 'spark-9', which is not a host" in out
    assert "vllm_serve_host is '192.0.2.11', which is none of the head spark-1's addresses" in out
    assert not (tmp_path / "inv-state" / "sparkops-plan.json").exists()
