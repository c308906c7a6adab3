"""A DGX Spark's /sys/class/net and PCIe functions, built in a directory (sources: tests/fixtures/discovery/README.md).

PCIe functions and phys_port_name from NVIDIA/daqiri PR 108, MACs from the node GUIDs of `ibstat` on a GB10
(geerlingguy/sbc-reviews issue 92); the Spark is cabled on port 1 (both twins up at 200000 Mb/s).
"""

from __future__ import annotations

import os
from pathlib import Path

SPARK_FUNCTIONS = [
    ("enp1s0f0np0", "0000:01:00.0", "rocep1s0f0", "fc:4c:ea:f9:42:30", "down", "-1", "p0"),
    ("enp1s0f1np1", "0000:01:00.1", "rocep1s0f1", "fc:4c:ea:f9:42:31", "up", "200000", "p1"),
    ("enP2p1s0f0np0", "0002:01:00.0", "roceP2p1s0f0", "fc:4c:ea:f9:42:34", "down", "-1", "p0"),
    ("enP2p1s0f1np1", "0002:01:00.1", "roceP2p1s0f1", "fc:4c:ea:f9:42:35", "up", "200000", "p1"),
]


def build_spark_sysfs(root: Path) -> Path:
    """class/net links into devices/, each function's driver and RDMA device; returns <root>/class/net."""
    drivers = root / "bus" / "pci" / "drivers" / "mlx5_core"
    drivers.mkdir(parents=True)
    for netdev, pci, rdma, mac, state, speed, ppn in SPARK_FUNCTIONS:
        dev = root / "devices" / f"pci{pci[:4]}:00" / f"{pci[:4]}:00:00.0" / pci
        (dev / "infiniband" / rdma).mkdir(parents=True)
        os.symlink(os.path.relpath(drivers, dev), dev / "driver")
        net = root / "class" / "net" / netdev
        net.mkdir(parents=True)
        for name, value in (("address", mac), ("mtu", "1500"), ("operstate", state), ("speed", speed)):
            (net / name).write_text(value + "\n")
        (net / "phys_port_name").write_text(ppn + "\n")
        os.symlink(os.path.relpath(dev, net), net / "device")
    mgmt = root / "class" / "net" / "enP7s7"
    mgmt.mkdir(parents=True)
    (mgmt / "address").write_text("4c:bb:47:2c:1a:0e\n")
    return root / "class" / "net"
