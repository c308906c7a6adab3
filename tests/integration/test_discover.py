"""Discovery on the simulated pair (issue 27): from an inventory that names only the hosts, discover.yml
reads each node's ports and hears the other end by LLDP (the real lldpd of the node image, over the test
bed's bridges), and writes an inventory whose links and topology equal inventory/sim's hand-written ones;
plan.yml takes it. The pool is the test bed's own subnets, so the proposed addresses are Docker's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, failure, links_by_host, run_playbook, subnet_ends

pytestmark = pytest.mark.usefixtures("sim_cluster")


def discover_pair(out: Path):
    """discover.yml on the pair's hosts-only inventory, writing out/hosts.yml (the pool: the test bed's subnets)."""
    hosts_only = (
        subprocess.run(
            [sys.executable, str(ROOT / "sim" / "simctl.py"), "hosts-only", "--nodes", "2", "--topology", "pair"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    extra = {"sparkops_discover_out": str(out), "sparkops_discover_pool": "10.213.0.0/23"}
    return hosts_only, run_playbook("playbooks/discover.yml", inventory=hosts_only, extra_vars=extra, timeout=300)


def test_discovery_writes_the_hand_written_pair_and_plan_takes_it(tmp_path):
    out = tmp_path / "discovered"
    hosts_only, res = discover_pair(out)
    assert res.returncode == 0, failure(res)
    print(f"\ndiscover.yml on the pair: {res.elapsed:.1f} s")
    written = yaml.safe_load((out / "hosts.yml").read_text())
    hand = yaml.safe_load((ROOT / "inventory" / "sim" / "hosts.yml").read_text())
    assert links_by_host(written) == links_by_host(hand)
    assert subnet_ends(written) == subnet_ends(hand)
    assert "pair" in (out / "hosts.yml").read_text()
    # The same cables heard again: the file is the same, so a rerun keeps it and succeeds.
    again = run_playbook(
        "playbooks/discover.yml",
        inventory=hosts_only,
        extra_vars={"sparkops_discover_out": str(out), "sparkops_discover_pool": "10.213.0.0/23"},
        timeout=300,
    )
    assert again.returncode == 0, failure(again)
    # plan.yml accepts it with the simulated cluster's settings.
    (out / "group_vars").symlink_to(ROOT / "inventory" / "sim" / "group_vars")
    plan = run_playbook("playbooks/plan.yml", inventory=out, timeout=300)
    assert plan.returncode == 0, failure(plan)


# A neighbour's System Name TLV that, written raw into hosts.yml as a comment, would end the comment and write
# inventory YAML: a group whose host runs a ProxyCommand on the controller (lldpd passes the TLV's bytes).
HOSTILE = (
    "sw-200g\nevil:\n  hosts:\n    spark-sim-1:\n      ansible_ssh_common_args: \"-o ProxyCommand='touch /tmp/x'\"\n#"
)


def test_a_hostile_lldp_neighbour_writes_nothing_into_the_inventory(tmp_path):
    """A third device on the pair's first QSFP bridge (a container of the node image running the real lldpd)
    announces the hostile system name; discover.yml hears it on both nodes. Whatever it concludes, the
    inventory it writes holds only the Sparks, every line printable, and Ansible reads no other group or
    connection setting from it."""
    node_image = subprocess.run(
        ["docker", "inspect", "-f", "{{.Config.Image}}", "spark-sim-1"], capture_output=True, text=True, check=True
    ).stdout.strip()
    name = "sparkops-sim-evil-lldp"
    subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    start = ["docker", "run", "-d", "--rm", "--name", name, "--network", "sparkops-sim-qsfp0"]
    start += ["--cap-add", "NET_RAW", "--cap-add", "NET_ADMIN", "--entrypoint", "sh", node_image]
    subprocess.run([*start, "-c", "mkdir -p /run/lldpd && exec lldpd -d -I eth0"], check=True, capture_output=True)
    try:
        for argv in (["configure", "lldp", "tx-interval", "1"], ["configure", "system", "hostname", HOSTILE]):
            for _ in range(20):  # lldpd's control socket appears a moment after the start (bounded: 10 s)
                said = subprocess.run(["docker", "exec", name, "lldpcli", *argv], capture_output=True, check=False)
                if said.returncode == 0:
                    break
                time.sleep(0.5)
            else:
                pytest.fail(f"lldpcli {' '.join(argv[:3])} failed in the hostile neighbour's container")
        time.sleep(4)  # a few LLDP frames reach both nodes
        out = tmp_path / "discovered"
        _hosts_only, res = discover_pair(out)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    said = res.stdout + res.stderr
    assert "sw-200g" in said, said[-3000:]  # it heard the neighbour: the test is about its name, not its absence
    written = out / "hosts.yml"
    if written.exists():
        text = written.read_text()
        assert all(line.isprintable() for line in text.splitlines()), text
        data = yaml.safe_load(text)
        assert "evil" not in json.dumps(data) and "ProxyCommand" not in json.dumps(data), text
        listed = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "ansible-inventory"), "-i", str(written), "--list"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        inventory = json.loads(listed.stdout)
        assert "evil" not in inventory, sorted(inventory)
        assert sorted(inventory["_meta"]["hostvars"]) == ["spark-sim-1", "spark-sim-2"], inventory["_meta"]
        assert not any("ansible_ssh_common_args" in hv for hv in inventory["_meta"]["hostvars"].values())
    assert not Path("/tmp/x").exists()
