"""simctl's cabling faults on the simulated ring (unplug, cross, replug): what they wire, that they are
idempotent, and that the discovery refuses exactly those cablings naming the cable (the same sentences
tests/integration/test_topologies.py reads on the running ring)."""

from __future__ import annotations

import importlib.util
import ipaddress
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.plugin_utils import discovery as d
from conftest import ROOT
from discovery_world import World, names_of, ring_cables

pytestmark = pytest.mark.skipif(
    not (ROOT / "sim" / "simctl.py").is_file(), reason="sim/ is not shipped in the built collection"
)


def load_simctl(monkeypatch, state: Path, n: int = 4):
    monkeypatch.setenv("SPARKOPS_SIM_STATE", str(state))
    spec = importlib.util.spec_from_file_location("simctl_for_cabling", ROOT / "sim" / "simctl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.configure(n, "ring")
    return mod


def cables_of(sim, wiring: dict) -> list:
    """The cables a wiring makes: each ring network's two ends as (host, QSFP port)."""
    ends: dict = {}
    for host, nets in wiring.items():
        for net, (_addr, ifname) in nets.items():
            ends.setdefault(net[: -len("t0")], set()).add((host, 0 if ifname in sim.PORT0 else 1))
    cables = set()
    for pair in ends.values():
        assert len(pair) == 2, pair
        cables.add(tuple(sorted(pair)))
    return sorted(cables)


def problems(names, cables) -> list:
    with pytest.raises(d.DiscoveryError) as err:
        d.infer(World(names, cables).nodes(), names, {"speed_mbps": 200000})
    return err.value.problems


def test_the_plain_wiring_is_the_ring_simctl_up_makes(monkeypatch, tmp_path):
    sim = load_simctl(monkeypatch, tmp_path)
    names = names_of(4, "spark-sim")
    assert cables_of(sim, sim.ring_wiring(4)) == sorted(tuple(sorted(c)) for c in ring_cables(names))


@pytest.mark.parametrize(("n", "c", "e"), [(4, 0, 2), (4, 1, 3), (5, 0, 3)])
def test_crossing_swaps_the_port_1_ends_and_keeps_every_netdev(monkeypatch, tmp_path, n, c, e):
    sim = load_simctl(monkeypatch, tmp_path, n)
    plain, crossed = sim.ring_wiring(n), sim.ring_wiring(n, (c, e))
    names = names_of(n, "spark-sim")
    b, dd = names[(c + 1) % n], names[(e + 1) % n]
    want = [cab for cab in ring_cables(names) if cab not in (ring_cables(names)[c], ring_cables(names)[e])]
    want += [((names[c], 0), (dd, 1)), ((names[e], 0), (b, 1))]
    assert cables_of(sim, crossed) == sorted(tuple(sorted(x)) for x in want)
    for host in names:
        # A Spark still shows its four netdevs; every address lies in its network's subnet, none twice.
        assert sorted(ifname for _a, ifname in crossed[host].values()) == sorted(sim.PORT0 + sim.PORT1)
        for net, (addr, _ifname) in crossed[host].items():
            assert ipaddress.ip_address(addr) in ipaddress.ip_network(sim.NETWORKS[net][0])
    addrs = [a for nets in crossed.values() for a, _ifname in nets.values()]
    assert len(addrs) == len(set(addrs))
    assert crossed != plain


def test_the_discovery_refuses_the_crossed_ring_naming_the_cables(monkeypatch, tmp_path):
    sim = load_simctl(monkeypatch, tmp_path)
    names = names_of(4, "spark-sim")
    text = "\n".join(got := problems(names, cables_of(sim, sim.ring_wiring(4, (0, 2)))))
    assert "the cables make 2 separate loops (spark-sim-1 - spark-sim-4; spark-sim-2 - spark-sim-3)" in text
    assert "the cable spark-sim-1 port 0 (enp1s0f0np0/enP2p1s0f0np0) - spark-sim-4 port 1" in text
    assert "the cable spark-sim-2 port 1 (enp1s0f1np1/enP2p1s0f1np1) - spark-sim-3 port 0" in text
    assert "Two cables are crossed: swap the ends at spark-sim-4 port 1" in text
    # No sentence is left hanging (the duplicate-cable one has no move to suggest here).
    assert all(p == p.strip() for p in got)


def test_the_discovery_refuses_the_unplugged_ring_naming_both_ends():
    names = names_of(4, "spark-sim")
    cables = ring_cables(names)
    del cables[1]  # simctl unplug 1: spark-sim-2 port 0 - spark-sim-3 port 1, NO-CARRIER at both ends
    (p,) = problems(names, cables)
    assert p.startswith(
        "the ring is missing one cable: connect spark-sim-2 port 0 (enp1s0f0np0/enP2p1s0f0np0) to spark-sim-3 "
        "port 1 (enp1s0f1np1/enP2p1s0f1np1)"
    )


class FakeDocker:
    """The ring's attachments as Docker keeps them, changed by the commands simctl runs."""

    def __init__(self, sim, wiring):
        self.nets = {h: {net: addr for net, (addr, _i) in nets.items()} for h, nets in wiring.items()}
        self.links = {h: dict(nets.values()) for h, nets in wiring.items()}  # address -> netdev in the node
        self.calls = []

    def run(self, cmd, check=True, capture=False, **kw):
        self.calls.append(cmd)
        if cmd[:4] == ["docker", "network", "disconnect", "-f"]:
            self.links[cmd[5]].pop(self.nets[cmd[5]].pop(cmd[4]), None)
        elif cmd[:3] == ["docker", "network", "connect"]:
            self.nets[cmd[6]][cmd[5]] = cmd[4]
            self.links[cmd[6]][cmd[4]] = "eth9"
        elif cmd[:2] == ["docker", "exec"] and "bash" in cmd:  # the rename
            self.links[cmd[2]][cmd[-3]] = cmd[-2]
        return type("Res", (), {"returncode": 0, "stdout": "", "stderr": ""})()


def test_cross_and_replug_are_idempotent(monkeypatch, tmp_path):
    sim = load_simctl(monkeypatch, tmp_path)
    fake = FakeDocker(sim, sim.ring_wiring(4))
    monkeypatch.setattr(sim, "run", fake.run)
    monkeypatch.setattr(sim, "attached", lambda name: dict(fake.nets[name]))
    monkeypatch.setattr(sim, "node_links", lambda name: dict(fake.links[name]))
    monkeypatch.setattr(sim, "node_sh", lambda name, script: "")
    crossed = sim.ring_wiring(4, (0, 2))
    changed = sim.rewire(crossed)
    # spark-sim-2 and spark-sim-4 each leave two networks and join two.
    assert len(changed) == 8 and {c.split()[0] for c in changed} == {"spark-sim-2", "spark-sim-4"}
    assert fake.nets == {h: {net: a for net, (a, _i) in nets.items()} for h, nets in crossed.items()}
    renames = [c for c in fake.calls if c[:2] == ["docker", "exec"] and "bash" in c]
    assert sorted((c[2], c[-2]) for c in renames) == sorted(
        (h, ifname) for h in ("spark-sim-2", "spark-sim-4") for ifname in sim.PORT1
    )
    assert sim.rewire(crossed) == []
    sim.rewire(sim.ring_wiring(4))
    assert fake.nets == {h: {net: a for net, (a, _i) in nets.items()} for h, nets in sim.ring_wiring(4).items()}
    assert sim.rewire(sim.ring_wiring(4)) == []
    # Docker attached but the node without the link (a connect that failed half-way): done again.
    del fake.links["spark-sim-3"]["10.214.2.13"]
    assert sim.rewire(sim.ring_wiring(4)) == [
        "spark-sim-3 off sparkops-sim-ring-c1t0",
        "spark-sim-3 enp1s0f1np1 on sparkops-sim-ring-c1t0 (10.214.2.13)",
    ]
    assert fake.links["spark-sim-3"]["10.214.2.13"] == "enp1s0f1np1"


def test_unplug_takes_both_twins_down_at_both_ends_and_bad_cables_are_refused(monkeypatch, tmp_path):
    sim = load_simctl(monkeypatch, tmp_path)
    fake = FakeDocker(sim, sim.ring_wiring(4))
    monkeypatch.setattr(sim, "run", fake.run)
    monkeypatch.setattr(sim, "ring_size", lambda: 4)
    monkeypatch.setattr(sim, "bridge_ports", lambda net: [f"{net}-a", f"{net}-b"])
    sim.cabling(type("Args", (), {"cmd": "unplug", "cables": [1]})())
    downs = sorted(c[4] for c in fake.calls if c[:3] == ["ip", "link", "set"] and c[-1] == "down")
    assert downs == sorted(f"sparkops-sim-ring-c1t{t}-{end}" for t in range(2) for end in "ab")
    for args in ({"cmd": "unplug", "cables": [4]}, {"cmd": "cross", "cables": [2, 2]}):
        fake.calls.clear()
        with pytest.raises(SystemExit):
            sim.cabling(type("Args", (), args)())
        assert fake.calls == []
