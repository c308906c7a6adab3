"""A 4-node ring on the simulated cluster: site.yml converges serving TP=2 x PP=2 over the four
nodes, jumbo pings go along the cables and non-neighbours are reached through the routes (a TTL of 1
does not reach them, 2 does), and a second run changes nothing.

Heavy on a small machine (four nodes, each with its own dockerd, Ray and the vLLM test double: about
10 minutes on 2 cores), so `make test` runs it as its own stage after the pair's integration tests
(tests/run-stages.sh sets SPARKOPS_SIM_TOPOLOGIES=1; SPARKOPS_SIM_TOPOLOGIES=0 skips it). It puts the
2-node pair back afterwards (`simctl up`), which the other integration tests use.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT, SIM_STATE, node_sh, recap, run_playbook

pytestmark = pytest.mark.skipif(
    os.environ.get("SPARKOPS_SIM_TOPOLOGIES") != "1", reason="set SPARKOPS_SIM_TOPOLOGIES=1 (4 nodes; heavy)"
)


def simctl(*args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "sim" / "simctl.py"), "up", *args], check=True, timeout=900)


@pytest.fixture(scope="module")
def ring4():
    simctl("--nodes", "4", "--topology", "ring")
    try:
        yield SIM_STATE / "inventories" / "ring-4"
    finally:
        simctl()  # back to the 2-node pair


# World size 4 over the ring: two pipeline stages of two tensor-parallel ranks each.
RING_PROFILE = {"sparkops_serving_profile": "sim-tiny-tp2-pp2"}


def test_ring_of_four_converges_with_routed_jumbo_pings(ring4):
    res = run_playbook("site.yml", inventory=ring4, extra_vars=RING_PROFILE, timeout=1500)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    print(f"ring-4 converge: {res.elapsed:.0f} s")
    assert set(recap(out)) == {f"spark-sim-{i}" for i in range(1, 5)}
    # spark-sim-1's neighbours are 2 and 4; 3 is reached through a route, and pinged through it
    # (roce_network's check names every lane it pinged; the callback may wrap long lines).
    assert "enp1s0f0np0 -> spark-sim-3 10.214.2.13 (routed)" in " ".join(out.split())
    routes = node_sh("spark-sim-1", "ip -4 route show proto static").stdout
    assert "10.214.2.0/24 via 10.214.0.12 dev enp1s0f0np0" in routes
    one_hop = node_sh("spark-sim-1", "ping -c 1 -W 2 -t 1 10.214.2.13", check=False)
    assert one_hop.returncode != 0 and "Time to live exceeded" in one_hop.stdout
    two_hops = node_sh("spark-sim-1", "ping -M do -s 8972 -c 1 -W 2 -t 2 10.214.2.13", check=False)
    assert two_hops.returncode == 0, two_hops.stdout
    env = node_sh("spark-sim-1", "cat /etc/sparkops/fabric.env").stdout
    assert "NCCL_ALGO=Ring" in env and "NCCL_IB_MERGE_NICS=0" in env
    # vLLM (the double, over real Ray) placed one GPU bundle on each of the four nodes.
    log = node_sh("spark-sim-1", "docker logs sparkops-vllm 2>&1").stdout
    assert "placement group placed on 4 nodes" in log, log[-2000:]
    served = run_playbook("playbooks/verify.yml", inventory=ring4, extra_vars=RING_PROFILE, timeout=600)
    assert served.returncode == 0, served.stdout[-3000:]
    again = run_playbook("site.yml", inventory=ring4, extra_vars=RING_PROFILE, timeout=900)
    assert again.returncode == 0
    assert all(r["changed"] == 0 for r in recap(again.stdout).values()), again.stdout[-3000:]
    print(f"ring-4 no-op: {again.elapsed:.0f} s")
