#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
"""Module: read a node's ConnectX-7 ports and who is at the other end of each, for playbooks/discover.yml."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fabric_discover
short_description: Read a node's ConnectX-7 ports, their twins and the neighbour on each cabled port
description:
  - One read per node for C(playbooks/discover.yml); the controller (C(plugins/plugin_utils/discovery.py))
    infers the cables, the topology and the addresses from every node's read.
  - The ConnectX-7 netdevs and their RDMA devices (C(ibdev2netdev) when installed, else
    C(/sys/class/net/<netdev>/device/infiniband/)), each one's link state, speed, MTU, MAC and PCIe function
    (C(ip -j addr show) and sysfs).
  - The neighbour on each port, by LLDP (C(lldpcli -f json0 show neighbors details)). When I(lldp) allows it
    and lldpd is installed but not running, the module runs its own lldpd for the discovery only, on the
    ConnectX-7 netdevs only, on a socket of its own, and stops it before returning (5 s after its ports were
    heard, so that a peer read a little later hears it too); an lldpd found running is
    left running and its configuration is not touched (the module only asks it to send its frames now,
    C(lldpcli update)).
  - On a port without an LLDP neighbour (no lldpd, or none at the far end), the IPv6 link-local neighbours
    (C(ip -j -6 neigh show dev X)) after a ping to C(ff02::1) out through the port.
  - Changes no setting, address or file. In check mode no lldpd is started; the neighbours come from an lldpd
    already running and from IPv6 neighbour discovery.
version_added: "0.9.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  lldp:
    description:
      - C(auto) - LLDP when lldpd is installed (started for the discovery if it is not running), else IPv6
        neighbour discovery.
      - C(required) - fail when lldpd is not installed (C(apt-get install lldpd)).
      - C(off) - IPv6 neighbour discovery only.
    type: str
    choices: [auto, required, "off"]
    default: auto
  wait_s:
    description: Seconds to wait, at most, for an LLDP neighbour on every port that has a link.
    type: int
    default: 30
  simulated:
    description:
      - The test bed (no RDMA device); a port's RDMA device is named as rdma-core names a function's
        (C(rocep1s0f1) for C(enp1s0f1np1)), as C(sim/simctl.py) does in its inventories.
    type: bool
    default: false
  sys_class_net:
    description: Where the kernel lists the network interfaces (tests point it at a built tree).
    type: path
    default: /sys/class/net
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: Reads in check mode too, but starts no lldpd.
  diff_mode:
    support: none
    details: Changes nothing, so there is nothing to show.
"""

EXAMPLES = r"""
- name: Read the ConnectX-7 ports and their neighbours
  sparkops.cluster.fabric_discover:
    lldp: auto
    wait_s: 30
  register: discovered
"""

RETURN = r"""
hostname:
  description: The node's host name (what its lldpd announces as system name).
  returned: always
  type: str
ports:
  description:
    - Per ConnectX-7 netdev, C(netdev), C(rdma_device), C(rdma_state) (C(ibdev2netdev)'s Up/Down), C(mac),
      C(mtu), C(operstate), C(admin_up), C(carrier), C(speed_mbps), C(pci), C(port) (the QSFP port, 0 or 1),
      C(twin_key) and C(domain) (the twins of a port share the key and differ in the PCI domain) and
      C(neighbours) (each with C(via) C(lldp) or C(nd)).
  returned: always
  type: list
  elements: dict
macs:
  description: The MAC of every interface of the node (LLDP chassis IDs are one of them).
  returned: always
  type: list
  elements: str
networks:
  description: The IPv4 networks on the node's other interfaces (the management LAN, docker0), never proposed.
  returned: always
  type: list
  elements: str
method:
  description: How the neighbours were read, C(lldp), C(nd), C(lldp+nd) (LLDP, and IPv6 neighbours on ports
    LLDP left without one).
  returned: always
  type: str
lldpd:
  description: C(installed), C(found_running), C(started) (by this module), C(stopped) (by this module).
  returned: always
  type: dict
"""

import contextlib
import os
import socket
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils import fabric_discovery as fd
from ansible_collections.sparkops.cluster.plugins.module_utils.node_read import run_side_by_side

OWN_SOCKET = "/run/sparkops-discover-lldpd.socket"
PRIVSEP_DIR = "/run/lldpd"  # Debian's lldpd chroots its unprivileged half here
LINGER_S = 5


def _run(module, argv, what, fail=True):
    rc, out, err = module.run_command(argv)
    if rc != 0 and fail:
        module.fail_json(msg=f"{what} failed (rc {rc}): {err.strip() or out.strip()}")
    return rc, out


def _lldp_neighbours(module, lldpcli, sock):
    argv = [lldpcli] + (["-u", sock] if sock else []) + ["-f", "json0", "show", "neighbors", "details"]
    rc, out, _err = module.run_command(argv)
    if rc != 0:
        return None
    try:
        return fd.parse_lldp_neighbours(out)
    except ValueError:
        return None


class Lldpd:
    """The lldpd of the discovery: one found running (left alone) or one of ours (stopped at the end)."""

    def __init__(self, module, names):
        self.module = module
        self.names = names
        self.lldpcli = module.get_bin_path("lldpcli")
        self.lldpd = module.get_bin_path("lldpd")
        self.state = {"installed": bool(self.lldpcli and self.lldpd), "found_running": False, "started": False,
                      "stopped": False}  # fmt: skip
        self.sock = None
        self.proc = None
        self.made_dir = False

    def running(self) -> bool:
        rc, _out, _err = self.module.run_command([self.lldpcli, "-f", "json0", "show", "chassis"])
        return rc == 0

    def start(self) -> bool:
        if not os.path.isdir(PRIVSEP_DIR):
            os.makedirs(PRIVSEP_DIR, mode=0o755)
            self.made_dir = True
        # Exact names: lldpd(8), -I: "When an exact match is found, it will circumvent some tests" (so the
        # test bed's veth links qualify too); -d: stay in the foreground, our child, stopped below.
        argv = [self.lldpd, "-d", "-u", OWN_SOCKET, "-I", ",".join(self.names)]
        try:
            self.proc = fd.start_daemon(argv)
        except OSError as exc:
            self.module.warn(f"could not start lldpd ({exc}); using IPv6 neighbour discovery")
            return False
        self.sock = OWN_SOCKET
        self.state["started"] = True
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            rc, _out, _err = self.module.run_command([self.lldpcli, "-u", OWN_SOCKET, "-f", "json0", "show", "chassis"])
            if rc == 0:
                return True
            time.sleep(0.3)
        err = fd.daemon_log(self.proc)
        self.stop()
        self.module.warn(f"lldpd did not answer within 10 s ({err}); using IPv6 neighbour discovery")
        return False

    def stop(self) -> None:
        if self.proc is not None:
            fd.stop_daemon(self.proc)
            self.state["stopped"] = True
            self.proc = None
        if self.made_dir:
            with contextlib.suppress(OSError):
                os.rmdir(PRIVSEP_DIR)
            self.made_dir = False
        if self.sock == OWN_SOCKET and os.path.exists(OWN_SOCKET):
            with contextlib.suppress(OSError):
                os.unlink(OWN_SOCKET)

    def neighbours(self, up: list, wait_s: int) -> dict:
        """Ask for frames now (lldpcli update) and read until every port with a link has a neighbour.

        An lldpd of ours then keeps sending for LINGER_S more: a peer whose read started a little later
        hears us before we stop (stopping sends LLDP's shutdown frame, which removes us from its table).
        What is heard meanwhile is added, never dropped: on a segment that forwards LLDP (the test bed's
        bridges) a port hears its first peer before the others, and a peer that stopped is still there.
        """
        base = [self.lldpcli] + (["-u", self.sock] if self.sock else [])
        deadline = time.monotonic() + max(wait_s, 0)
        seen: dict = {}
        done_at = None
        while True:
            self.module.run_command(base + ["update"])
            got = _lldp_neighbours(self.module, self.lldpcli, self.sock)
            for name, nbs in (got or {}).items():
                have = seen.setdefault(name, [])
                have.extend(nb for nb in nbs if nb not in have)
            now = time.monotonic()
            if done_at is None and (all(seen.get(n) for n in up) or now >= deadline):
                done_at = now
            if done_at is not None and (self.proc is None or now >= done_at + LINGER_S):
                return seen
            time.sleep(1)


def nd_neighbours(module, names: list) -> dict:
    """IPv6 link-local neighbours per netdev, after one bounded ping to all-nodes out through each."""
    if not names:
        return {}
    ping = module.get_bin_path("ping")
    if ping:
        run_side_by_side([[ping, "-6", "-c", "2", "-i", "0.2", "-W", "1", "-I", n, "ff02::1"] for n in names], 8)
    out = {}
    for n in names:
        rc, text, _err = module.run_command(["ip", "-j", "-6", "neigh", "show", "dev", n])
        try:
            out[n] = fd.parse_ipv6_neighbours(text) if rc == 0 else []
        except ValueError:
            out[n] = []
    return out


def main():  # noqa: C901, PLR0912, PLR0915 - one read in a fixed order
    module = AnsibleModule(
        argument_spec={
            "lldp": {"type": "str", "choices": ["auto", "required", "off"], "default": "auto"},
            "wait_s": {"type": "int", "default": 30},
            "simulated": {"type": "bool", "default": False},
            "sys_class_net": {"type": "path", "default": "/sys/class/net"},
        },
        supports_check_mode=True,
    )
    p = module.params
    if not 0 <= p["wait_s"] <= 600:
        module.fail_json(msg=f"wait_s must be between 0 and 600 seconds, got {p['wait_s']}")
    ibdev = {}
    ibdev2netdev = module.get_bin_path("ibdev2netdev")
    if ibdev2netdev:
        rc, out, _err = module.run_command([ibdev2netdev])
        ibdev = fd.parse_ibdev2netdev(out) if rc == 0 else {}
    _rc, addr_text = _run(module, ["ip", "-j", "addr", "show"], "ip -j addr show (is iproute2 installed?)")
    try:
        links = fd.parse_ip_link_json(addr_text)
        nets = fd.parse_ipv4_networks(addr_text)
    except ValueError as exc:
        module.fail_json(msg=f"could not read `ip -j addr show`: {exc}")
    try:
        names = sorted(n for n in os.listdir(p["sys_class_net"]) if not n.startswith("."))
    except OSError as exc:
        module.fail_json(msg=f"cannot list {p['sys_class_net']} ({exc}); is sysfs mounted?")
    sysfs = {n: fd.read_sysfs_netdev(n, p["sys_class_net"]) for n in names}
    fast = [n for n in names if fd.is_fast_candidate(n, sysfs[n], ibdev)]
    up = [n for n in fast if (links.get(n) or {}).get("carrier")]

    lldpd = Lldpd(module, fast)
    lldp = {}
    method = "nd"
    if p["lldp"] == "required" and not lldpd.state["installed"]:
        module.fail_json(
            msg="lldp=required but lldpd is not installed on this node: install it (apt-get install lldpd) or "
            "run with lldp=auto to fall back to IPv6 neighbour discovery."
        )
    if p["lldp"] != "off" and lldpd.state["installed"] and fast:
        try:
            if lldpd.running():
                lldpd.state["found_running"] = True
                lldp = lldpd.neighbours(up, p["wait_s"])
                method = "lldp"
            elif not module.check_mode and lldpd.start():
                lldp = lldpd.neighbours(up, p["wait_s"])
                method = "lldp"
        finally:
            lldpd.stop()
        if p["lldp"] == "required" and method != "lldp":
            module.fail_json(
                msg="lldp=required but no lldpd answered (in check mode none is started): start lldpd "
                "(systemctl start lldpd) or run with lldp=auto.",
                lldpd=lldpd.state,
            )
    quiet = [n for n in up if not lldp.get(n)]
    nd = nd_neighbours(module, quiet) if p["lldp"] != "required" else {}
    if any(nd.values()):
        method = "lldp+nd" if method == "lldp" else "nd"
    ports = [
        fd.build_port(
            n,
            sysfs[n],
            links.get(n) or {},
            ibdev,
            neighbours=(lldp.get(n) or []) + (nd.get(n) or []),
            simulated=p["simulated"],
        )
        for n in fast
    ]
    macs = sorted({v["mac"] for v in links.values() if v.get("mac") and v["mac"] != "00:00:00:00:00:00"})
    networks = sorted({c for n, cs in nets.items() if n not in fast and n != "lo" for c in cs})
    module.exit_json(
        changed=False,
        hostname=socket.gethostname(),
        ports=ports,
        macs=macs,
        networks=networks,
        method=method,
        lldpd=lldpd.state,
    )


if __name__ == "__main__":
    main()
