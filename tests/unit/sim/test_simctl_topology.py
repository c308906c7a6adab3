"""simctl's topologies: the networks and inventory it makes are a valid cluster of that topology."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "plugins" / "plugin_utils"))
from cluster import build_cluster  # noqa: E402


def load_simctl(state: Path):
    spec = importlib.util.spec_from_file_location("simctl_under_test", ROOT / "sim" / "simctl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.STATE = state
    return mod


def inputs_from(inv: Path) -> dict:
    data = yaml.safe_load((inv / "hosts.yml").read_text())
    kids = data["all"]["children"]["spark_cluster"]["children"]
    hostvars = {**kids["spark_head"]["hosts"], **kids["spark_workers"]["hosts"]}
    settings = {}
    for f in sorted((inv / "group_vars" / "all").glob("*.yml")):
        settings.update(yaml.safe_load(f.read_text()) or {})
    return {
        "groups": {
            "spark_cluster": list(kids["spark_head"]["hosts"]) + list(kids["spark_workers"]["hosts"]),
            "spark_head": list(kids["spark_head"]["hosts"]),
        },
        "hostvars": hostvars,
        "settings": {k: v for k, v in settings.items() if k in ("sparkops_topology", "sparkops_hardware")},
    }


@pytest.mark.parametrize(("n", "topology"), [(3, "ring"), (4, "ring"), (8, "ring"), (4, "switch"), (3, "switch")])
def test_sim_topology_is_a_valid_cluster(tmp_path, n, topology):
    sim = load_simctl(tmp_path)
    sim.configure(n, topology)
    assert len(sim.NODES) == n
    inv = sim.write_topology_inventory(n, topology)
    assert inv == tmp_path / "inventories" / f"{topology}-{n}"
    model = build_cluster(inputs_from(inv))
    assert model["topology"] == topology
    assert model["size"] == n
    # one Docker network per fast subnet of the model, with its MTU
    fast_nets = {subnet for name, (subnet, mtu) in sim.NETWORKS.items() if mtu == 9000}
    assert fast_nets == {s["cidr"] for s in model["segments"]}
    if topology == "ring":
        assert len(model["cables"]) == n
        assert all(node["sysctls"]["net.ipv4.ip_forward"] == "1" for node in sim.NODES)
    addrs = [a for node in sim.NODES for a, _, _ in node["fast"]]
    assert len(addrs) == len(set(addrs))
    assert json.loads(json.dumps(model)) == model


def test_default_pair_is_untouched(tmp_path):
    sim = load_simctl(tmp_path)
    before = json.dumps(sim.NODES)
    sim.configure(2, "pair")
    assert json.dumps(sim.NODES) == before
    assert sim.write_topology_inventory(2, "pair") == ROOT / "inventory" / "sim"


@pytest.mark.parametrize(("n", "topology"), [(3, "pair"), (2, "ring"), (9, "switch")])
def test_impossible_topologies_are_refused(tmp_path, n, topology):
    sim = load_simctl(tmp_path)
    with pytest.raises(SystemExit):
        sim.configure(n, topology)
