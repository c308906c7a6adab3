"""Discovery on the simulated pair (issue 27): from an inventory that names only the hosts, discover.yml
reads each node's ports and hears the other end by LLDP (the real lldpd of the node image, over the test
bed's bridges), and writes an inventory whose links and topology equal inventory/sim's hand-written ones;
plan.yml takes it. The pool is the test bed's own subnets, so the proposed addresses are Docker's."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from conftest import ROOT, links_by_host, run_playbook, subnet_ends

pytestmark = pytest.mark.usefixtures("sim_cluster")


def test_discovery_writes_the_hand_written_pair_and_plan_takes_it(tmp_path):
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
    out = tmp_path / "discovered"
    res = run_playbook(
        "playbooks/discover.yml",
        inventory=hosts_only,
        extra_vars={"sparkops_discover_out": str(out), "sparkops_discover_pool": "10.213.0.0/23"},
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-4000:]
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
    assert again.returncode == 0, again.stdout[-3000:]
    # plan.yml accepts it with the simulated cluster's settings.
    (out / "group_vars").symlink_to(ROOT / "inventory" / "sim" / "group_vars")
    plan = run_playbook("playbooks/plan.yml", inventory=out, timeout=300)
    assert plan.returncode == 0, plan.stdout[-3000:]
