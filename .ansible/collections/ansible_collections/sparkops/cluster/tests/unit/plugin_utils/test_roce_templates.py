"""roce_network's templates rendered from a model (pair and ring): netplan routes and the fabric env."""

from __future__ import annotations

import sys
from pathlib import Path

import jinja2
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "plugins" / "plugin_utils"))
sys.path.insert(0, str(HERE))

import cluster_inventories as inv  # noqa: E402
from cluster import build_cluster  # noqa: E402

TEMPLATES = ROOT / "roles" / "roce_network" / "templates"


def render(name: str, model: dict, host: str, **extra) -> str:
    # Ansible's template module defaults: trim_blocks on, lstrip_blocks off.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), trim_blocks=True, undefined=jinja2.StrictUndefined
    )
    values = {
        "sparkops_cluster": model,
        "sparkops_node": model["nodes"][host],
        "inventory_hostname": host,
        "ansible_managed": "managed",
        "roce_network_gid_index": 3,
        "roce_network_nccl_debug": "INFO",
        "roce_network_nccl_debug_subsys": "INIT,NET",
        "roce_network_env_extra": {},
    }
    values.update(extra)
    return env.get_template(name).render(**values)


def test_netplan_for_a_ring_node_carries_its_routes():
    model = build_cluster(inv.ring(4))
    doc = yaml.safe_load(render("netplan-fast.yaml.j2", model, "spark-1"))
    eths = doc["network"]["ethernets"]
    assert set(eths) == {"enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1"}
    assert all(e["mtu"] == 9000 and e["dhcp4"] is False for e in eths.values())
    assert eths["enp1s0f0np0"]["addresses"] == ["10.1.0.1/24"]
    assert eths["enp1s0f0np0"]["routes"] == [
        {"to": "10.2.0.0/24", "via": "10.1.0.2", "mtu": 9000},
        {"to": "10.2.1.0/24", "via": "10.1.0.2", "mtu": 9000},
    ]
    assert [r["to"] for r in eths["enp1s0f1np1"]["routes"]] == ["10.3.0.0/24", "10.3.1.0/24"]
    assert "routes" not in eths["enP2p1s0f0np0"]


def test_netplan_for_a_pair_has_no_routes():
    model = build_cluster(inv.pair())
    eths = yaml.safe_load(render("netplan-fast.yaml.j2", model, "spark-2"))["network"]["ethernets"]
    assert eths["enP2p1s0f1np1"]["addresses"] == ["192.168.101.12/24"]
    assert all("routes" not in e for e in eths.values())


def test_fabric_env_fits_the_topology():
    pair = dict(
        line.split("=", 1)
        for line in render("fabric.env.j2", build_cluster(inv.pair()), "spark-1").splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert pair["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
    assert pair["VLLM_HOST_IP"] == "192.168.100.11"
    assert "NCCL_ALGO" not in pair and "NCCL_IB_MERGE_NICS" not in pair
    ring = render("fabric.env.j2", build_cluster(inv.ring(4)), "spark-3", roce_network_env_extra={"X": "1"})
    assert "NCCL_ALGO=Ring\n" in ring
    assert "NCCL_IB_SUBNET_AWARE_ROUTING=1\n" in ring
    assert "NCCL_SOCKET_IFNAME=enp1s0f1np1\n" in ring
    assert ring.rstrip().endswith("X=1")
