"""Sparks and cables for the discovery tests: what each node's tools print, run through the real parsers.

For a cabling (which QSFP port of which Spark meets which, or which ports hang off a switch) this writes,
per node, the outputs the fabric_discover module reads - `ibdev2netdev` in the format of the NVIDIA
guide's recorded output, `ip -j link`, `lldpcli -f json0 show neighbors details` in lldpd's pinned
json0 shape (tests/fixtures/discovery/README.md) or `ip -j -6 neigh` - and turns them into the node
reads with plugins/module_utils/fabric_discovery.py, as the module does.
"""

from __future__ import annotations

import json

from ansible_collections.sparkops.cluster.plugins.module_utils import fabric_discovery as fd

# Port -> twins (netdev, rdma device, PCIe function, last MAC byte): daqiri PR 108 and sbc-reviews 92.
TWINS = {
    0: [("enp1s0f0np0", "rocep1s0f0", "0000:01:00.0", 0x30), ("enP2p1s0f0np0", "roceP2p1s0f0", "0002:01:00.0", 0x34)],
    1: [("enp1s0f1np1", "rocep1s0f1", "0000:01:00.1", 0x31), ("enP2p1s0f1np1", "roceP2p1s0f1", "0002:01:00.1", 0x35)],
}


def mac(i: int, last: int) -> str:
    return f"fc:4c:ea:f9:{0x40 + i:02x}:{last:02x}"


def _json0(entries: list) -> str:
    """lldpcli -f json0 show neighbors details, one entry per (interface, neighbour)."""
    ifaces = []
    for name, nb in entries:
        ifaces.append(
            {
                "name": name,
                "via": "LLDP",
                "rid": "1",
                "age": "0 day, 00:00:03",
                "chassis": [
                    {
                        "id": [{"type": "mac", "value": nb["chassis"]}],
                        "name": [{"value": nb["sysname"]}],
                        "descr": [{"value": "Ubuntu 24.04.3 LTS Linux 6.11.0-1016-nvidia #16-Ubuntu SMP aarch64"}],
                        "capability": [
                            {"type": "Bridge", "enabled": nb.get("bridge", False)},
                            {"type": "Router", "enabled": False},
                            {"type": "Wlan", "enabled": False},
                            {"type": "Station", "enabled": not nb.get("bridge", False)},
                        ],
                    }
                ],
                "port": [
                    {
                        "id": [{"type": nb.get("port_type", "mac"), "value": nb["port"]}],
                        "descr": [{"value": nb["descr"]}],
                        "ttl": [{"value": "120"}],
                    }
                ],
            }
        )
    return json.dumps({"lldp": [{"interface": ifaces}]})


class World:
    """names: the Sparks in inventory order; cables: [((host, port), (host, port))]; switch: {(host, port)}
    cabled to one switch that runs LLDP; bridge: {(host, port)} on a segment that forwards LLDP (the test
    bed's Docker bridges with group_fwd_mask)."""

    def __init__(self, names, cables=(), switch=(), bridge=(), via="lldp"):
        self.names = list(names)
        self.cables = list(cables)
        self.switch = set(switch)
        self.bridge = set(bridge)
        self.via = via
        self.down = set()  # (host, netdev): no carrier
        self.admin_down = set()
        self.speed: dict = {}  # (host, netdev) -> Mb/s
        self.hear_own_twin = False
        self.networks: dict = {h: [f"10.0.0.{11 + i}/24"] for i, h in enumerate(names)}
        self.missing_twin = set()  # (host, netdev) absent
        self.switch_name = "sw-200g"  # the switch's LLDP system name (its own words)

    def _i(self, h):
        return self.names.index(h)

    def peers(self, h, p):
        out = []
        for a, b in self.cables:
            if a == (h, p):
                out.append(b)
            elif b == (h, p):
                out.append(a)
        if (h, p) in self.bridge:
            out += [e for e in sorted(self.bridge) if e != (h, p)]
        return out

    def _cabled(self, h, p):
        return bool(self.peers(h, p)) or (h, p) in self.switch

    def tool_outputs(self, h):
        i = self._i(h)
        ib, links, lldp, nd = [], [], [], {}
        for p, twins in TWINS.items():
            for t, (netdev, rdma, _pci, last) in enumerate(twins):
                if (h, netdev) in self.missing_twin:
                    continue
                up = self._cabled(h, p) and (h, netdev) not in self.down and (h, netdev) not in self.admin_down
                ib.append(f"{rdma} port 1 ==> {netdev} ({'Up' if up else 'Down'})")
                flags = ["BROADCAST", "MULTICAST"] + ([] if (h, netdev) in self.admin_down else ["UP"])
                flags += ["LOWER_UP"] if up else ["NO-CARRIER"]
                links.append(
                    {
                        "ifname": netdev,
                        "flags": flags,
                        "mtu": 1500,
                        "operstate": "UP" if up else "DOWN",
                        "address": mac(i, last),
                    }
                )
                if (h, netdev) in self.down or (h, netdev) in self.admin_down:
                    continue
                heard = []
                for q, qp in self.peers(h, p):
                    qi = self._i(q)
                    qnet, _r, _pci, qlast = TWINS[qp][t]
                    if (q, qnet) in self.down or (q, qnet) in self.admin_down or (q, qnet) in self.missing_twin:
                        continue
                    heard.append(
                        {
                            "chassis": mac(qi, 0x30),
                            "sysname": q,
                            "port": mac(qi, qlast),
                            "descr": qnet,
                            "mac": mac(qi, qlast),
                        }
                    )
                if self.hear_own_twin:
                    onet, _r, _pci, olast = twins[1 - t]
                    heard.append(
                        {
                            "chassis": mac(i, 0x30),
                            "sysname": h,
                            "port": mac(i, olast),
                            "descr": onet,
                            "mac": mac(i, olast),
                        }
                    )
                if (h, p) in self.switch:
                    heard.append(
                        {
                            "chassis": "b8:ce:f6:00:00:01",
                            "sysname": self.switch_name,
                            "port": f"swp{i + 1}s{t}",
                            "port_type": "ifname",
                            "descr": f"swp{i + 1}s{t}",
                            "bridge": True,
                            "mac": f"b8:ce:f6:00:01:{i:02x}",
                        }
                    )
                for nb in heard:
                    lldp.append((netdev, nb))
                nd[netdev] = [
                    {
                        "dst": "fe80::" + nb["mac"].replace(":", "")[-4:],
                        "dev": netdev,
                        "lladdr": nb["mac"],
                        "state": ["STALE"],
                    }
                    for nb in heard
                ]
        return "\n".join(ib) + "\n", json.dumps(links), _json0(lldp), nd

    def node(self, h):
        ib_text, link_text, lldp_text, nd = self.tool_outputs(h)
        ibdev = fd.parse_ibdev2netdev(ib_text)
        links = fd.parse_ip_link_json(link_text)
        neighbours = fd.parse_lldp_neighbours(lldp_text)
        ports = []
        for name, link in links.items():
            if not fd.is_fast_candidate(name, {}, ibdev):
                continue
            pci = next(pc for tw in TWINS.values() for (n, _r, pc, _m) in tw if n == name)
            sysfs = {"pci": pci, "phys_port_name": f"p{fd.function_identity(name)['port']}"}
            sysfs["speed_mbps"] = self.speed.get((h, name), 200000 if link["carrier"] else None)
            if self.via == "nd":
                nbs = fd.parse_ipv6_neighbours(json.dumps(nd.get(name, [])))
            else:
                nbs = neighbours.get(name, [])
            ports.append(fd.build_port(name, sysfs, link, ibdev, neighbours=nbs, simulated=False))
        i = self._i(h)
        return {
            "hostname": h,
            "ports": ports,
            "macs": [mac(i, 0x30), mac(i, 0x0E)],
            "networks": list(self.networks[h]),
        }

    def nodes(self):
        return {h: self.node(h) for h in self.names}


def names_of(n, prefix="spark"):
    return [f"{prefix}-{i + 1}" for i in range(n)]


def ring_cables(names):
    """Port 0 of each Spark to port 1 of the next (inventory/examples/ring-4, sim/simctl.py)."""
    n = len(names)
    return [((names[i], 0), (names[(i + 1) % n], 1)) for i in range(n)]


def write_host(world: World, h: str, root) -> dict:
    """A node on this machine for playbooks/discover.yml: its sysfs tree and the tools, as files.

    -> the host's inventory variables: a Python wrapper that puts the node's tools first on PATH, and
    its /sys/class/net. The tools print what World.tool_outputs says (an lldpd is running).
    """
    import os
    import sys
    from pathlib import Path

    root = Path(root)
    ib_text, link_text, lldp_text, _nd = world.tool_outputs(h)
    links = {x["ifname"]: x for x in json.loads(link_text)}
    drivers = root / "sys" / "bus" / "pci" / "drivers" / "mlx5_core"
    drivers.mkdir(parents=True)
    for twins in TWINS.values():
        for netdev, rdma, pci, _last in twins:
            if netdev not in links:
                continue
            up = "LOWER_UP" in links[netdev]["flags"]
            dev = root / "sys" / "devices" / f"pci{pci[:4]}:00" / pci
            (dev / "infiniband" / rdma).mkdir(parents=True)
            os.symlink(os.path.relpath(drivers, dev), dev / "driver")
            net = root / "sys" / "class" / "net" / netdev
            net.mkdir(parents=True)
            speed = world.speed.get((h, netdev), 200000) if up else -1
            attrs = {"address": links[netdev]["address"], "mtu": "1500", "operstate": "up" if up else "down",
                     "speed": str(speed), "phys_port_name": f"p{fd.function_identity(netdev)['port']}"}  # fmt: skip
            for name, value in attrs.items():
                (net / name).write_text(f"{value}\n")
            os.symlink(os.path.relpath(dev, net), net / "device")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (root / "ibdev2netdev.txt").write_text(ib_text)
    i = world.names.index(h)
    mgmt = {"ifname": "enP7s7", "flags": ["UP", "LOWER_UP"], "address": mac(i, 0x0E),
            "addr_info": [{"family": "inet", "local": f"10.0.0.{11 + i}", "prefixlen": 24}]}  # fmt: skip
    (root / "addr.json").write_text(json.dumps([*links.values(), mgmt]))
    (root / "lldp.json").write_text(lldp_text)
    scripts = {
        "ibdev2netdev": f'cat "{root}/ibdev2netdev.txt"\n',
        "ip": f'case "$*" in "-j addr show") cat "{root}/addr.json";; *neigh*) echo "[]";; *) exit 1;; esac\n',
        "lldpcli": f'case "$*" in *neighbors*) cat "{root}/lldp.json";; *) echo "{{}}";; esac\n',
        "lldpd": "exit 1\n",
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    python = root / "python"
    python.write_text(f'#!/bin/sh\nPATH="{bin_dir}:$PATH" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(python),
        "sparkops_discover_sys_class_net": str(root / "sys" / "class" / "net"),
    }
