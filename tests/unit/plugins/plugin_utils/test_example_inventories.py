"""The example inventories (inventory/examples/*) plan as the README says, so they cannot rot.

Each example, copied out of the checkout, goes through playbooks/plan.yml (the cluster model and the
serving plan exactly as site.yml computes them, from the shipped defaults; no host is contacted: the
plan's hosts are never reached). It must plan without a refusal and give the deployments, replicas,
executors and gateway its comments promise; every variable it sets must be one a role declares.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkops.cluster.plugins.plugin_utils.gateway import litellm_config

ROOT = Path(__file__).resolve().parents[4]
EXAMPLES = ROOT / "inventory" / "examples"
PLAYBOOK = ROOT / "playbooks" / "plan.yml"
NAMES = sorted(p.name for p in EXAMPLES.iterdir() if (p / "hosts.yml").is_file())
# Connection variables are Ansible's own, declared by no role.
ANSIBLE_VARIABLES = {"ansible_host", "ansible_user", "ansible_port", "ansible_become"}


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """name -> (plan, output): plan.yml once per example for the whole module."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = _plan(name, tmp_path_factory.mktemp(name))
        return cache[name]

    return get


def _plan(name: str, tmp_path: Path) -> tuple[dict, str]:
    """plan.yml on a copy of the example (so nothing is written beside the checkout's): (plan, output)."""
    inv = tmp_path / name
    shutil.copytree(EXAMPLES / name, inv)
    target = tmp_path / "plan.json"
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}"
    res = subprocess.run(
        ["ansible-playbook", "-i", str(inv), str(PLAYBOOK), "-e", f"sparkops_plan_file={target}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, f"inventory/examples/{name} is refused by the plan:\n{out[-4000:]}"
    assert "UNREACHABLE" not in out
    return json.loads(target.read_text()), out


def _shape(plan: dict) -> list:
    """Each deployment as (name, profile, [(executor, hosts) per replica])."""
    return [
        (d["name"], d["profile_name"], [(r["executor"], r["hosts"]) for r in d["replicas"]])
        for d in plan["serving"]["deployments"]
    ]


def _declared_options() -> set:
    """Every option some role's argument spec declares (the variables an inventory may set)."""
    names = set()
    for spec in ROOT.glob("roles/*/meta/argument_specs.yml"):
        for entry in (yaml.safe_load(spec.read_text()).get("argument_specs") or {}).values():
            names |= set((entry or {}).get("options") or {})
    return names


def _hosts(data: dict) -> dict:
    """host -> its variables, from a hosts.yml's nested groups."""
    out = {}
    for group in (data or {}).values():
        out.update({h: v or {} for h, v in (group.get("hosts") or {}).items()})
        out.update(_hosts(group.get("children") or {}))
    return out


def _group_vars(name: str) -> dict:
    values = {}
    for path in sorted((EXAMPLES / name / "group_vars").rglob("*.yml")):
        values.update(yaml.safe_load(path.read_text()) or {})
    return values


def test_the_new_examples_are_there():
    assert {"shapes-pair", "replicas-switch-4", "gateway-keys"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_example_sets_only_declared_variables(name):
    declared = _declared_options() | ANSIBLE_VARIABLES
    hosts = _hosts(yaml.safe_load((EXAMPLES / name / "hosts.yml").read_text()))
    used = set(_group_vars(name)) | {v for hv in hosts.values() for v in hv}
    assert used and not used - declared, f"inventory/examples/{name} sets undeclared {sorted(used - declared)}"


@pytest.mark.parametrize("name", NAMES)
def test_every_example_plans_and_the_readme_points_at_it(name, planned):
    plan, _out = planned(name)
    assert plan["serving"]["targets"], name
    assert f"inventory/examples/{name}" in (ROOT / "README.md").read_text()


def test_shapes_pair_serves_two_single_node_models_one_per_spark(planned):
    plan, out = planned("shapes-pair")
    assert plan["topology"] == "pair"
    assert _shape(plan) == [
        ("chat", "gpt-oss-120b-mxfp4", [("single", ["spark-1"])]),
        ("code", "qwen3-30b-a3b", [("single", ["spark-2"])]),
    ]
    serving = plan["serving"]
    # No Ray anywhere: each node runs its own vLLM, its API on its own fast link.
    assert serving["ray_used"] is False
    assert [(t["served_model_name"], t["url"]) for t in serving["targets"]] == [
        ("gpt-oss-120b", "http://192.168.100.11:8000"),
        ("qwen3-30b-a3b", "http://192.168.100.12:8000"),
    ]
    assert "deployment chat: profile gpt-oss-120b-mxfp4" in out


def test_replicas_switch_4_serves_tp2_on_two_nodes_and_two_replicas_on_the_others(planned):
    plan, _out = planned("replicas-switch-4")
    assert (plan["topology"], plan["size"]) == ("switch", 4)
    assert _shape(plan) == [
        ("quality", "qwen3-235b-a22b-gptq-int4-tp2", [("mp", ["spark-1", "spark-2"])]),
        ("team", "qwen3.6-35b-a3b-fp8", [("single", ["spark-3"]), ("single", ["spark-4"])]),
    ]
    serving = plan["serving"]
    # The TP=2 group runs under vLLM's own executor: rank 1 headless, meeting rank 0 on its fast link.
    api, worker = serving["deployments"][0]["members"]
    assert "--headless" in worker["vllm"]["argv"] and "--headless" not in api["vllm"]["argv"]
    argv = worker["vllm"]["argv"]
    assert argv[argv.index("--master-addr") + 1] == "192.168.100.11"
    # No Ray at all (its join wait counts every node of the cluster: a two-node Ray group would wait for four).
    assert serving["ray_used"] is False
    assert all(m["ray"] is None for d in serving["deployments"] for r in d["replicas"] for m in r["members"])
    assert [(t["name"], t["host"]) for t in serving["targets"]] == [
        ("quality replica 0", "spark-1"),
        ("team replica 0", "spark-3"),
        ("team replica 1", "spark-4"),
    ]


def test_gateway_keys_puts_one_endpoint_on_the_head_for_the_lan(planned):
    plan, _out = planned("gateway-keys")
    gateway = plan["serving"]["gateway"]
    assert gateway["enabled"] is True and gateway["host"] == plan["head"] == "spark-1"
    assert gateway["client_url"] == "http://192.0.2.11:4000"
    settings = _group_vars("gateway-keys")
    # The clients' LAN holds the gateway's client address, so the gateway's firewall lets them in.
    lan = [ipaddress.ip_network(n) for n in settings["sparkops_client_networks"]]
    assert any(ipaddress.ip_address("192.0.2.11") in n for n in lan)
    assert all(n.subnet_of(ipaddress.ip_network("192.0.2.0/24")) for n in lan)  # documentation range only
    assert settings["sparkops_gateway_wheelhouse"]
    # What the gateway routes: each served model name to its deployment's replica.
    config = litellm_config(plan["serving"])
    assert [(e["model_name"], e["litellm_params"]["api_base"]) for e in config["model_list"]] == [
        ("gpt-oss-120b", "http://192.168.100.11:8000/v1"),
        ("qwen3-30b-a3b", "http://192.168.100.12:8000/v1"),
    ]


@pytest.mark.parametrize("name", ["ring-4", "switch-4"])
def test_the_four_node_examples_give_every_spark_work(name, planned):
    plan, out = planned(name)
    # Two replicas of the TP=2 reference, each on two neighbouring Sparks, under vLLM's own executor.
    assert _shape(plan) == [
        ("main", "qwen3-235b-a22b-gptq-int4-tp2", [("mp", ["spark-1", "spark-2"]), ("mp", ["spark-3", "spark-4"])])
    ]
    assert plan["serving"]["ray_used"] is False
    assert "serve nothing" not in out and "serve nothing" not in out.replace("\n", " ")


@pytest.mark.parametrize("name", NAMES)
def test_every_example_tells_clients_where_to_go_and_warns_of_nothing(name, planned):
    plan, out = planned(name)
    clients = plan["clients"]
    assert clients["lines"][0] == "Clients:"
    assert clients["warnings"] == [], clients["warnings"]
    # No warning: an example with the gateway installs it from PyPI (no wheelhouse to fill first).
    warned = [line for line in out.splitlines() if "[WARNING]" in line]
    assert warned == [], warned
    # Read as printed by either result format (YAML here; JSON, its quotes escaped, where no ansible.cfg says YAML).
    flat = " ".join(out.split()).replace('\\"', '"')
    for url in clients["urls"]:
        assert f"URL {url}" in flat
    assert 'send it as "Authorization: Bearer <key>"' in flat
    # Ray's head is printed only where Ray runs.
    assert ("ray head " in flat) == plan["serving"]["ray_used"]
    if plan["serving"]["gateway"]["enabled"]:
        assert clients["urls"] == [plan["serving"]["gateway"]["client_url"] + "/v1"]
    else:
        assert clients["urls"] == [t["url"] + "/v1" for t in plan["serving"]["targets"]]
