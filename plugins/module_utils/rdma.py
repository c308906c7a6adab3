# Copyright: sparkops maintainers
# Apache-2.0
"""Read RDMA devices and their RoCE GID tables from sysfs, and check the fabric address's GID (stdlib only).

Linux sysfs layout read here (per device under <root>/class/infiniband/<dev>/):
- device/net/<netdev>/            the Ethernet interface(s) of the PCI function;
- ports/<n>/state                 "4: ACTIVE" (or "1: DOWN"); phys_state "5: LinkUp"; link_layer "Ethernet";
  rate "200 Gb/sec (2X NDR)";
- ports/<n>/gids/<i>              one GID per index, as 8 groups of 4 hex digits:
  "fe80:0000:0000:0000:4ebb:47ff:fe82:0e6a" (from the MAC), "0000:0000:0000:0000:0000:ffff:0a64:b801"
  (IPv4-mapped: 10.100.184.1), all zeros for an unused entry;
- ports/<n>/gid_attrs/types/<i>   "IB/RoCE v1" or "RoCE v2"; gid_attrs/ndevs/<i> the netdev. The kernel refuses
  to read these two (EINVAL) for an unused entry, so unreadable means "no entry".

The kernel adds two GIDs per address (RoCE v1 and v2); on a DGX Spark with one IPv4 address per interface
the RoCE v2 entry of that address is index 3, which is what NCCL_IB_GID_INDEX=3 relies on. sparkring's
records show the entry moving to another index when a neighbour reboots.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
MOVE_HINT = "it moves when a neighbour reboots; re-add the address or restart the interface"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def ipv4_from_gid(gid: str | None) -> str | None:
    """'0000:...:ffff:0a00:0001' or '::ffff:10.0.0.1' -> '10.0.0.1'; None when not IPv4-mapped."""
    if not gid:
        return None
    try:
        mapped = ipaddress.IPv6Address(gid.strip()).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped is not None else None


def _is_empty(gid: str | None) -> bool:
    if not gid:
        return True
    try:
        return int(ipaddress.IPv6Address(gid.strip())) == 0
    except ValueError:
        return True


def _sorted_numeric(names) -> list[str]:
    return sorted((n for n in names if n.isdigit()), key=int)


def read_port(port_dir: Path) -> dict:
    """One ports/<n> directory -> state, phys_state, link_layer, rate and its non-empty GID entries."""
    gids = []
    gid_dir = port_dir / "gids"
    names = _sorted_numeric(os.listdir(gid_dir)) if gid_dir.is_dir() else []
    for name in names:
        gid = _read(gid_dir / name)
        if _is_empty(gid):
            continue
        gids.append(
            {
                "index": int(name),
                "gid": gid,
                "type": _read(port_dir / "gid_attrs" / "types" / name),
                "ndev": _read(port_dir / "gid_attrs" / "ndevs" / name),
                "ipv4": ipv4_from_gid(gid),
            }
        )
    state = _read(port_dir / "state")
    return {
        "state": state,
        "active": bool(state) and state.split(":")[-1].strip().upper() == "ACTIVE",
        "phys_state": _read(port_dir / "phys_state"),
        "link_layer": _read(port_dir / "link_layer"),
        "rate": _read(port_dir / "rate"),
        "gid_table_size": len(names),
        "gids": gids,
    }


def read_device(dev_dir: Path) -> dict:
    """One <root>/class/infiniband/<dev> directory -> {name, netdevs, ports}."""
    netdevs = set()
    net_dir = dev_dir / "device" / "net"
    if net_dir.is_dir():
        netdevs.update(n for n in os.listdir(net_dir) if not n.startswith("."))
    ports = {}
    ports_dir = dev_dir / "ports"
    for num in _sorted_numeric(os.listdir(ports_dir)) if ports_dir.is_dir() else []:
        port = read_port(ports_dir / num)
        ports[num] = port
        netdevs.update(g["ndev"] for g in port["gids"] if g["ndev"])
    return {"name": dev_dir.name, "netdevs": sorted(netdevs), "ports": ports}


def read_rdma_sysfs(sysfs_root: str = "/sys") -> dict:
    """All RDMA devices under <sysfs_root>/class/infiniband -> {present, reason, devices: {name: device}}."""
    base = Path(sysfs_root) / "class" / "infiniband"
    if not base.is_dir():
        return {
            "present": False,
            "reason": f"{base} does not exist: no RDMA driver loaded (mlx5_ib) or no RDMA-capable NIC",
            "devices": {},
        }
    names = sorted(n for n in os.listdir(base) if not n.startswith("."))
    if not names:
        return {"present": False, "reason": f"{base} is empty: no RDMA devices", "devices": {}}
    return {"present": True, "reason": None, "devices": {n: read_device(base / n) for n in names}}


def device_for_netdev(devices: dict, netdev: str) -> str | None:
    """Name of the RDMA device whose netdevs include netdev (what ibdev2netdev prints)."""
    for name, dev in sorted(devices.items()):
        if netdev in dev["netdevs"]:
            return name
    return None


def check_roce_gid(device_info: dict, expected_ipv4: str, gid_index: int = 3, port: str = "1") -> dict:
    """Whether GID <gid_index> of the device's port is the RoCE v2 entry of expected_ipv4.

    Returns {ok, status, reason, found, at_index}: status is one of "ok", "missing" (the entry is empty or
    absent), "other_address" (it holds another address), "roce_v1" (the address is there as RoCE v1), "moved"
    (the address's RoCE v2 entry sits at another index, at_index), "no_port". found is the entry at
    gid_index (or None).
    """
    name = device_info.get("name", "?")
    info = (device_info.get("ports") or {}).get(str(port))
    result = {"ok": False, "status": "no_port", "reason": None, "found": None, "at_index": None}
    if info is None:
        result["reason"] = f"{name} has no port {port}"
        return result
    entries = {g["index"]: g for g in info["gids"]}
    found = entries.get(gid_index)
    result["found"] = found
    v2_at = sorted(i for i, g in entries.items() if g["ipv4"] == expected_ipv4 and g["type"] == "RoCE v2")
    if found and found["ipv4"] == expected_ipv4 and found["type"] == "RoCE v2":
        result.update(
            ok=True, status="ok", at_index=gid_index, reason=f"{name} GID {gid_index} is RoCE v2 {expected_ipv4}"
        )
        return result
    elsewhere = [i for i in v2_at if i != gid_index]
    if found and found["ipv4"] == expected_ipv4:
        extra = f"; the RoCE v2 entry sits at index {elsewhere[0]}" if elsewhere else ""
        result.update(
            status="roce_v1",
            at_index=elsewhere[0] if elsewhere else None,
            reason=f"{name} GID {gid_index} holds {expected_ipv4} as {found['type'] or 'an untyped entry'}, "
            f"not RoCE v2{extra}; NCCL needs the RoCE v2 entry at index {gid_index}",
        )
        return result
    if elsewhere:
        now = f"holds {found['ipv4'] or found['gid']}" if found else "is empty"
        result.update(
            status="moved",
            at_index=elsewhere[0],
            reason=f"{name}: {expected_ipv4} is the RoCE v2 GID at index {elsewhere[0]}, not {gid_index} "
            f"(GID {gid_index} {now}); {MOVE_HINT}",
        )
        return result
    if found:
        held = found["ipv4"] or found["gid"]
        result.update(
            status="other_address",
            reason=f"{name} GID {gid_index} holds {held}, not {expected_ipv4}: the address is not on this "
            "interface (check the netplan addresses of this twin)",
        )
        return result
    result.update(
        status="missing",
        reason=f"{name} GID {gid_index} is empty and {expected_ipv4} is in no RoCE v2 entry: the address is not on "
        "this interface (assign it, then check again)",
    )
    return result


def gid_report(sysfs_root: str, expect: dict, gid_index: int = 3) -> dict:
    """rdma_facts' result: the devices, netdev to device, and per expected netdev its GID check.

    expect maps netdev to the IPv4 address (no prefix) it must carry as RoCE v2 GID gid_index.
    """
    state = read_rdma_sysfs(sysfs_root)
    devices = state["devices"]
    netdev_map = {nd: name for name, dev in devices.items() for nd in dev["netdevs"]}
    checks = {}
    for netdev, ipv4 in sorted(expect.items()):
        name = device_for_netdev(devices, netdev)
        if name is None:
            where = "" if state["present"] else f" ({state['reason']})"
            checks[netdev] = {
                "device": None,
                "expected_ipv4": ipv4,
                "ok": False,
                "status": "no_device",
                "reason": f"no RDMA device has netdev {netdev}{where}; check the interface name (ibdev2netdev)",
                "found": None,
                "at_index": None,
            }
            continue
        check = check_roce_gid(devices[name], ipv4, gid_index=gid_index)
        checks[netdev] = {"device": name, "expected_ipv4": ipv4, **check}
    return {
        "rdma_present": state["present"],
        "reason": state["reason"],
        "devices": devices,
        "netdev_to_device": netdev_map,
        "gid_checks": checks,
        "gid_ok": all(c["ok"] for c in checks.values()),
    }
