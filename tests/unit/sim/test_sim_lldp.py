"""sim/simctl.py lets LLDP cross the test bed's fast bridges (discover.yml reads the cabling by LLDP) and bakes
lldpd into the node image."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

from conftest import ROOT


def load_simctl(monkeypatch, state: Path):
    monkeypatch.setenv("SPARKOPS_SIM_STATE", str(state))
    spec = importlib.util.spec_from_file_location("simctl_lldp_under_test", ROOT / "sim" / "simctl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_forward_lldp_sets_bit_14_and_keeps_the_others(tmp_path, monkeypatch):
    simctl = load_simctl(monkeypatch, tmp_path / "state")
    bridge = tmp_path / "net" / "br-0123456789ab" / "bridge"
    bridge.mkdir(parents=True)
    (bridge / "group_fwd_mask").write_text("0x8\n")  # what the kernel prints; another bit already set
    monkeypatch.setattr(simctl, "run", lambda cmd, **_k: subprocess.CompletedProcess(cmd, 0, "0123456789abcdef\n", ""))
    simctl.forward_lldp("sparkops-sim-qsfp0", str(tmp_path / "net"))
    assert int((bridge / "group_fwd_mask").read_text(), 0) == 0x4008
    simctl.forward_lldp("sparkops-sim-qsfp0", str(tmp_path / "net"))  # again: unchanged
    assert int((bridge / "group_fwd_mask").read_text(), 0) == 0x4008


def test_the_node_image_has_lldpd(tmp_path, monkeypatch):
    simctl = load_simctl(monkeypatch, tmp_path / "state")
    assert "lldpd" in simctl.NODE_PACKAGES


def test_hosts_only_inventory_names_the_hosts_and_how_to_reach_them(tmp_path, monkeypatch):
    import json

    simctl = load_simctl(monkeypatch, tmp_path / "state")
    simctl.configure(4, "ring")
    inv = simctl.write_hosts_only_inventory(4, "ring")
    assert inv == tmp_path / "state" / "inventories" / "ring-4-hosts-only"
    data = json.loads((inv / "hosts.yml").read_text().split("\n", 1)[1])
    cluster = data["all"]["children"]["spark_cluster"]["children"]
    assert cluster["spark_head"]["hosts"] == {"spark-sim-1": {"ansible_host": "192.168.213.11"}}
    assert list(cluster["spark_workers"]["hosts"]) == ["spark-sim-2", "spark-sim-3", "spark-sim-4"]
    assert "sparkops_fast_links" not in (inv / "hosts.yml").read_text()
    gv = inv / "group_vars" / "all"
    assert (gv / "connection.yml").exists() and (gv / "cluster.yml").exists()
    assert "sparkops_topology" not in (gv / "topology.yml").read_text()
    assert "sparkops_topology" not in (gv / "cluster.yml").read_text()
