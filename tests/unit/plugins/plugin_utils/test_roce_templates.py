"""roce_network's templates rendered from a model (pair and ring): netplan routes and the fabric env."""

from __future__ import annotations

import json
import os
import posixpath
import sys
from pathlib import Path

import jinja2
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT / "plugins" / "plugin_utils"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import cluster_inventories as inv  # noqa: E402
from cluster import build_cluster  # noqa: E402
from module_runner import run_module  # noqa: E402

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


# ------------------------------------------------------------------------------ netplan check
# A stand-in for `netplan generate --root-dir ROOT`: it reads the YAML files of ROOT's netplan folders,
# refuses one that does not parse or holds "bad-netdev" (as netplan refuses a broken definition, on
# stderr, rc 1), and records what it saw. The real one is not on the test machine.
FAKE_NETPLAN = """#!/usr/bin/env python3
import glob, json, os, sys
import yaml
assert sys.argv[1:3] == ["generate", "--root-dir"], sys.argv
root = sys.argv[3]
seen = {}
for path in sorted(glob.glob(root + "/**/*.yaml", recursive=True)):
    text = open(path).read()
    seen[os.path.relpath(path, root)] = text
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as err:
        sys.stderr.write(f"{path}: Invalid YAML: {err}\\n")
        sys.exit(1)
    if "bad-netdev" in text:
        sys.stderr.write(f"{path}:3:5: Error in network definition: bad-netdev: unknown key\\n")
        sys.exit(1)
json.dump(seen, open(os.environ["NETPLAN_SEEN"], "w"))
"""


def _validate_command(netplan_file: str) -> str:
    text = (ROOT / "roles" / "roce_network" / "vars" / "main.yml").read_text()
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update(quote=lambda v: __import__("shlex").quote(str(v)), dirname=posixpath.dirname,
                       basename=posixpath.basename)  # fmt: skip
    raw = yaml.safe_load(text)["roce_network_netplan_validate"]
    return env.from_string(raw).render(roce_network_netplan_file=netplan_file)


def _write_netplan(tmp_path, monkeypatch, content: str) -> dict:
    from ansible_collections.sparkops.cluster.plugins.modules import config_files

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "netplan").write_text(FAKE_NETPLAN.replace("#!/usr/bin/env python3", "#!" + sys.executable))
    (bin_dir / "netplan").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("NETPLAN_SEEN", str(tmp_path / "seen.json"))
    dest = tmp_path / "etc netplan" / "40-sparkops-fast.yaml"  # a space: the folder is passed quoted
    task = yaml.safe_load((ROOT / "roles/roce_network/tasks/backend-netplan.yml").read_text())[0]
    entry = task["sparkops.cluster.config_files"]["files"][0]
    assert entry["validate"] == "{{ roce_network_netplan_validate }}"  # the role writes through the check
    validate = _validate_command(str(dest))
    return run_module(config_files, {"files": [{"dest": str(dest), "content": content, "mode": "0600",
                                                "validate": validate}]})  # fmt: skip


def test_a_netplan_file_netplan_refuses_is_never_written(tmp_path, monkeypatch):
    folder = tmp_path / "etc netplan"
    folder.mkdir()
    old = "network:\n  version: 2\n  ethernets:\n    enp1s0f1np1: {mtu: 9000}\n"
    (folder / "40-sparkops-fast.yaml").write_text(old)
    (folder / "50-cloud-init.yaml").write_text("network: {version: 2}\n")
    res = _write_netplan(tmp_path, monkeypatch, "network:\n  version: 2\n  ethernets:\n    bad-netdev: {}\n")
    assert res["failed"], res
    assert "Error in network definition: bad-netdev" in res["msg"] and "Nothing was replaced" in res["msg"]
    assert (folder / "40-sparkops-fast.yaml").read_text() == old
    assert sorted(p.name for p in folder.iterdir()) == ["40-sparkops-fast.yaml", "50-cloud-init.yaml"]
    res = _write_netplan(tmp_path, monkeypatch, "network: [unclosed\n")
    assert res["failed"] and "Invalid YAML" in res["msg"]
    assert (folder / "40-sparkops-fast.yaml").read_text() == old


def test_a_netplan_file_netplan_takes_is_checked_with_the_nodes_other_files(tmp_path, monkeypatch):
    folder = tmp_path / "etc netplan"
    folder.mkdir()
    (folder / "40-sparkops-fast.yaml").write_text("network: {version: 2}\n")
    (folder / "50-cloud-init.yaml").write_text("network: {version: 2, renderer: networkd}\n")
    new = render("netplan-fast.yaml.j2", build_cluster(inv.pair()), "spark-1")
    res = _write_netplan(tmp_path, monkeypatch, new)
    assert not res.get("failed") and res["changed"], res
    assert (folder / "40-sparkops-fast.yaml").read_text() == new
    seen = json.loads((tmp_path / "seen.json").read_text())
    inside = str(folder).lstrip("/")
    # netplan saw the new file in its place, next to the node's other files
    assert seen[f"{inside}/40-sparkops-fast.yaml"] == new
    assert seen[f"{inside}/50-cloud-init.yaml"] == "network: {version: 2, renderer: networkd}\n"
