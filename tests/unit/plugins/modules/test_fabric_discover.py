"""fabric_discover: one node's read from a built Spark sysfs tree and the tools' recorded formats, and the
lldpd it runs only when none is running (tests/fixtures/discovery/README.md)."""

from __future__ import annotations

import json

import pytest
from ansible_collections.sparkops.cluster.plugins.modules import fabric_discover as mod
from conftest import FIXTURES
from module_runner import run_module
from spark_sysfs import SPARK_FUNCTIONS, build_spark_sysfs

DISC = FIXTURES / "discovery"
IBDEV = (DISC / "nvidia-connect-two-sparks_ibdev2netdev_port1.txt").read_text()
PEER = {
    "enp1s0f1np1": ("fc:4c:ea:f9:43:31", "enp1s0f1np1"),
    "enP2p1s0f1np1": ("fc:4c:ea:f9:43:35", "enP2p1s0f1np1"),
}


def ip_addr():
    links = [{"ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "address": "00:00:00:00:00:00",
              "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
             {"ifname": "enP7s7", "flags": ["BROADCAST", "UP", "LOWER_UP"], "mtu": 1500, "operstate": "UP",
              "address": "4c:bb:47:2c:1a:0e",
              "addr_info": [{"family": "inet", "local": "10.0.0.11", "prefixlen": 24}]}]  # fmt: skip
    for netdev, _pci, _rdma, mac, state, _speed, _ppn in SPARK_FUNCTIONS:
        up = state == "up"
        links.append(
            {
                "ifname": netdev,
                "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP" if up else "NO-CARRIER"],
                "mtu": 1500,
                "operstate": "UP" if up else "DOWN",
                "address": mac,
                "addr_info": [],
            }
        )
    return json.dumps(links)


def lldp_json0():
    ifaces = [
        {"name": n, "via": "LLDP", "chassis": [{"id": [{"type": "mac", "value": "fc:4c:ea:f9:43:30"}],
         "name": [{"value": "spark-2"}]}], "port": [{"id": [{"type": "mac", "value": m}], "descr": [{"value": d}]}]}
        for n, (m, d) in PEER.items()
    ]  # fmt: skip
    return json.dumps({"lldp": [{"interface": ifaces}]})


@pytest.fixture
def spark_sysfs(tmp_path):
    return build_spark_sysfs(tmp_path)


class FakeNode:
    """The commands the module runs, answered as the real tools answer; every argv is recorded."""

    def __init__(self, monkeypatch, *, lldpd_running, lldp_installed=True, ibdev=True, heard=True):
        self.calls = []
        self.heard = heard
        self.running = lldpd_running
        self.started = []
        bins = {"ip": "/usr/sbin/ip", "ping": "/usr/bin/ping"}
        if lldp_installed:
            bins.update(lldpcli="/usr/sbin/lldpcli", lldpd="/usr/sbin/lldpd")
        if ibdev:
            bins["ibdev2netdev"] = "/usr/bin/ibdev2netdev"
        monkeypatch.setattr(mod.AnsibleModule, "get_bin_path", lambda _self, name, *a, **k: bins.get(name))
        monkeypatch.setattr(mod.AnsibleModule, "run_command", self.run_command)
        monkeypatch.setattr(mod, "run_side_by_side", lambda argvs, _deadline: [(0, "", "")] * len(argvs))
        monkeypatch.setattr(mod.fd, "start_daemon", self.popen)
        monkeypatch.setattr(mod, "PRIVSEP_DIR", "/nonexistent-sparkops-test/lldpd")
        monkeypatch.setattr(mod.os, "makedirs", lambda *a, **k: None)
        monkeypatch.setattr(mod.os, "rmdir", lambda *a, **k: None)
        self.clock = [1000.0]
        monkeypatch.setattr(mod.time, "monotonic", lambda: self.clock[0])
        monkeypatch.setattr(mod.time, "sleep", lambda s: self.clock.__setitem__(0, self.clock[0] + s))

    def popen(self, argv):
        node = self

        class Proc:
            stderr = None

            def __init__(self):
                self.alive = True
                node.started.append(argv)
                node.running_own = True

            def poll(self):
                return None if self.alive else 0

            def terminate(self):
                self.alive = False
                node.running_own = False

            def wait(self, timeout=None):
                return 0

            def kill(self):
                self.alive = False

        return Proc()

    def run_command(self, argv, *a, **k):
        self.calls.append(list(argv))
        if argv[0].endswith("ibdev2netdev"):
            return 0, IBDEV, ""
        if argv[:3] == ["ip", "-j", "addr"]:
            return 0, ip_addr(), ""
        if argv[:3] == ["ip", "-j", "-6"]:
            return 0, "[]", ""
        if argv[0].endswith("lldpcli"):
            own = "-u" in argv
            alive = getattr(self, "running_own", False) if own else self.running
            if not alive:
                return 1, "", "cannot connect to lldpd"
            if "neighbors" in argv:
                return 0, lldp_json0() if self.heard else '{"lldp": [{}]}', ""
            return 0, "{}", ""
        return 127, "", f"unexpected {argv}"


def test_lldpd_running_is_used_and_left_alone(monkeypatch, spark_sysfs):
    node = FakeNode(monkeypatch, lldpd_running=True)
    r = run_module(mod, {"sys_class_net": str(spark_sysfs), "wait_s": 5})
    assert r.get("failed") is not True, r
    assert r["changed"] is False and r["method"] == "lldp"
    assert r["lldpd"] == {"installed": True, "found_running": True, "started": False, "stopped": False}
    assert node.started == []
    assert not any("-u" in c for c in node.calls)  # the running daemon's own socket, its config untouched
    assert node.calls.count(["/usr/sbin/lldpcli", "update"]) == 1  # a running lldpd stays: no lingering
    ports = {p["netdev"]: p for p in r["ports"]}
    assert sorted(ports) == ["enP2p1s0f0np0", "enP2p1s0f1np1", "enp1s0f0np0", "enp1s0f1np1"]
    one = ports["enP2p1s0f1np1"]
    assert (one["rdma_device"], one["port"], one["domain"], one["pci"], one["speed_mbps"]) == (
        "roceP2p1s0f1",
        1,
        2,
        "0002:01:00.1",
        200000,
    )
    assert one["neighbours"][0]["port_id"] == "fc:4c:ea:f9:43:35"
    assert ports["enp1s0f0np0"]["neighbours"] == [] and ports["enp1s0f0np0"]["carrier"] is False
    assert r["networks"] == ["10.0.0.11/24"]  # the management LAN; never the fast ports' or lo's
    assert "4c:bb:47:2c:1a:0e" in r["macs"] and "00:00:00:00:00:00" not in r["macs"]


def test_lldpd_not_running_is_started_for_the_discovery_and_stopped(monkeypatch, spark_sysfs):
    node = FakeNode(monkeypatch, lldpd_running=False)
    r = run_module(mod, {"sys_class_net": str(spark_sysfs), "wait_s": 5})
    assert r.get("failed") is not True, r
    assert r["lldpd"] == {"installed": True, "found_running": False, "started": True, "stopped": True}
    (argv,) = node.started
    assert argv[:4] == ["/usr/sbin/lldpd", "-d", "-u", mod.OWN_SOCKET]
    assert argv[4:] == ["-I", "enP2p1s0f0np0,enP2p1s0f1np1,enp1s0f0np0,enp1s0f1np1"]
    assert node.running_own is False  # stopped before the module returned
    assert r["method"] == "lldp"
    # Heard at once, then kept sending for LINGER_S so that a peer read a little later hears this node.
    updates = [c for c in node.calls if c[-1] == "update"]
    assert len(updates) == mod.LINGER_S + 1


def test_check_mode_starts_no_lldpd_and_falls_back_to_ipv6_neighbours(monkeypatch, spark_sysfs):
    node = FakeNode(monkeypatch, lldpd_running=False)
    r = run_module(mod, {"sys_class_net": str(spark_sysfs), "wait_s": 5}, check_mode=True)
    assert r.get("failed") is not True, r
    assert node.started == []
    assert r["lldpd"]["started"] is False
    neigh = [c for c in node.calls if c[:3] == ["ip", "-j", "-6"]]
    assert sorted(c[-1] for c in neigh) == ["enP2p1s0f1np1", "enp1s0f1np1"]  # the ports with a link


def test_lldp_required_without_lldpd_says_how_to_install_it(monkeypatch, spark_sysfs):
    FakeNode(monkeypatch, lldpd_running=False, lldp_installed=False)
    r = run_module(mod, {"sys_class_net": str(spark_sysfs), "lldp": "required"})
    assert r["failed"] is True
    assert "apt-get install lldpd" in r["msg"]


def test_without_ibdev2netdev_sysfs_names_the_rdma_devices(monkeypatch, spark_sysfs):
    FakeNode(monkeypatch, lldpd_running=True, ibdev=False)
    r = run_module(mod, {"sys_class_net": str(spark_sysfs), "wait_s": 0})
    assert {p["netdev"]: p["rdma_device"] for p in r["ports"]}["enp1s0f1np1"] == "rocep1s0f1"


@pytest.mark.parametrize("wait_s", [-1, 601])
def test_bad_wait_is_refused(monkeypatch, spark_sysfs, wait_s):
    FakeNode(monkeypatch, lldpd_running=True)
    r = run_module(mod, {"sys_class_net": str(spark_sysfs), "wait_s": wait_s})
    assert r["failed"] is True and "wait_s must be between 0 and 600" in r["msg"]


def test_a_silent_port_waits_wait_s_then_asks_ipv6_neighbours(monkeypatch, spark_sysfs):
    node = FakeNode(monkeypatch, lldpd_running=True, heard=False)
    t0 = node.clock[0]
    r = run_module(mod, {"sys_class_net": str(spark_sysfs), "wait_s": 7})
    assert r.get("failed") is not True, r
    assert node.clock[0] - t0 == 7  # polled once a second up to wait_s
    assert sorted(c[-1] for c in node.calls if c[:3] == ["ip", "-j", "-6"]) == ["enP2p1s0f1np1", "enp1s0f1np1"]


def test_peers_heard_while_lingering_are_added_never_dropped(monkeypatch, spark_sysfs):
    # A segment that forwards LLDP (the test bed's switch bridges): the first read hears one peer, a later
    # one (still within LINGER_S) a second; the first may be gone from the table by then (its shutdown
    # frame). Both are neighbours of the port.
    node = FakeNode(monkeypatch, lldpd_running=False)
    second = json.loads(lldp_json0())
    for iface in second["lldp"][0]["interface"]:
        iface["chassis"][0]["id"][0]["value"] = "fc:4c:ea:f9:44:30"
        iface["chassis"][0]["name"][0]["value"] = "spark-3"
    reads = iter([lldp_json0(), json.dumps(second)])
    plain = node.run_command

    def run_command(_module, argv, *a, **k):
        if argv[0].endswith("lldpcli") and "neighbors" in argv:
            node.calls.append(list(argv))
            return 0, next(reads, json.dumps(second)), ""
        return plain(argv, *a, **k)

    monkeypatch.setattr(mod.AnsibleModule, "run_command", run_command)
    r = run_module(mod, {"sys_class_net": str(spark_sysfs), "wait_s": 5})
    assert r.get("failed") is not True, r
    ports = {p["netdev"]: p for p in r["ports"]}
    heard = [nb["sysname"] for nb in ports["enP2p1s0f1np1"]["neighbours"]]
    assert heard == ["spark-2", "spark-3"]
