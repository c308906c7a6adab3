# Copyright: sparkops maintainers
# Apache-2.0
"""Parse what one node says about its ConnectX-7 ports and their neighbours (stdlib only, target side).

Inputs, each in the format of the real tool (recorded outputs in tests/fixtures/discovery/README.md):

- ``ibdev2netdev`` (rdma-core/mlnx-ofed script): one line per RDMA device port,
  ``rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)``;
- ``ip -j link show``: a JSON list of links (``ifname``, ``mtu``, ``operstate``, ``flags``, ``address``);
- ``lldpcli -f json0 show neighbors details`` (lldpd): the fixed-shape JSON lldpd's own tests pin
  (lldpd tests/integration/test_lldpcli.py, test_json0_output); ``-f json`` is read too (its shape
  changes with the number of interfaces and neighbours, which is why json0 is asked for);
- ``ip -j -6 neigh show dev X``: the IPv6 neighbour table, the fallback where LLDP is not available;
- sysfs ``/sys/class/net/<netdev>/``: address, mtu, operstate, speed, phys_port_name and the
  ``device`` link to the PCIe function (``0000:01:00.1``), ``device/infiniband/<rdma device>``.

On a DGX Spark each QSFP port is two PCIe functions ("twins") of one ConnectX-7 in socket-direct mode:
port 0 = ``0000:01:00.0`` (enp1s0f0np0, rocep1s0f0) and ``0002:01:00.0`` (enP2p1s0f0np0, roceP2p1s0f0),
port 1 = ``0000:01:00.1`` and ``0002:01:00.1`` (NVIDIA/daqiri PR 108: phys_port_name p0/p1 per function).
The twins of a port share bus, slot and function and differ in the PCI domain.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile

# Tolerant of squeezed blanks: web pages that quote the output lose them ("rocep1s0f0port1==> ...").
IBDEV_RE = re.compile(r"^\s*(?P<dev>\S+?)\s*port\s*(?P<port>\d+)\s*==>\s*(?P<netdev>\S+)\s*\((?P<state>[^)]*)\)")
# Predictable names of a PCIe function (systemd's path naming): en[P<domain>]p<bus>s<slot>f<function>[np<port>].
NETDEV_RE = re.compile(r"^en(?:P(?P<domain>\d+))?p(?P<bus>\d+)s(?P<slot>\d+)f(?P<function>\d+)(?:np(?P<port>\d+))?$")
PCI_RE = re.compile(
    r"^(?P<domain>[0-9a-fA-F]{4,}):(?P<bus>[0-9a-fA-F]{2}):(?P<slot>[0-9a-fA-F]{2})\.(?P<function>[0-7])$"
)
MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
# lldpd keeps a string TLV's octets as sent, up to the 511 a TLV holds (src/daemon/protocols/lldp.c,
# lldp_decode: PEEK_BYTES of the whole TLV, no check of its characters): a neighbour chooses them.
NEIGHBOUR_TEXT_MAX = 255


def neighbour_text(value):
    """A string a neighbour sent (LLDP system name, port description, chassis or port id), safe to show
    and to write into a file: None stays None; every character that is not printable (control characters
    such as a newline or ESC, Unicode format characters such as a right-to-left override) is written as its
    escape (``\\n``, ``\\x1b``, ``\\u202e``), and the text is cut to NEIGHBOUR_TEXT_MAX characters. The
    result is one printable line."""
    if value is None:
        return None
    text = str(value)[:NEIGHBOUR_TEXT_MAX]
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def parse_ibdev2netdev(text: str) -> dict:
    """``ibdev2netdev`` -> {netdev: {rdma_device, rdma_port, state}}; state as printed (Up, Down)."""
    out = {}
    for line in (text or "").splitlines():
        m = IBDEV_RE.match(line)
        if m:
            out[m["netdev"]] = {"rdma_device": m["dev"], "rdma_port": int(m["port"]), "state": m["state"].strip()}
    return out


def parse_ip_link_json(text: str) -> dict:
    """``ip -j link show`` -> {ifname: {mac, mtu, operstate, admin_up, carrier}}."""
    out = {}
    for link in json.loads(text or "[]"):
        name = link.get("ifname")
        if not name:
            continue
        flags = link.get("flags") or []
        out[name] = {
            "mac": (link.get("address") or "").lower() or None,
            "mtu": link.get("mtu"),
            "operstate": (link.get("operstate") or "").lower() or None,
            "admin_up": "UP" in flags,
            "carrier": "LOWER_UP" in flags,
        }
    return out


def parse_ipv4_networks(text: str) -> dict:
    """``ip -j addr show`` -> {ifname: [cidr of each IPv4 network on it]} (the networks in use)."""
    out = {}
    for link in json.loads(text or "[]"):
        name = link.get("ifname")
        nets = []
        for a in link.get("addr_info") or []:
            if a.get("family") == "inet" and "local" in a and "prefixlen" in a:
                nets.append(f"{a['local']}/{a['prefixlen']}")
        if name:
            out[name] = nets
    return out


def _values(node) -> list:
    """json0 wraps every value in [{"value": ...}]; json gives the value itself."""
    if isinstance(node, list):
        return [v.get("value") if isinstance(v, dict) else v for v in node]
    if isinstance(node, dict) and "value" in node:
        return [node["value"]]
    return [node] if node is not None else []


def _first(node):
    vals = _values(node)
    return vals[0] if vals else None


def _id(node) -> tuple:
    """A chassis or port id ({"type": mac, "value": ...}, json0: a list of one) -> (type, value)."""
    if isinstance(node, list):
        node = node[0] if node else {}
    if not isinstance(node, dict):
        return (None, None)
    value = node.get("value")
    kind = node.get("type")
    if isinstance(value, str) and kind == "mac":
        value = value.lower()
    return (kind, value)


def _neighbour(iface: dict) -> dict:
    chassis = iface.get("chassis")
    sysname = None
    if isinstance(chassis, list):  # json0
        chassis = chassis[0] if chassis else {}
        sysname = _first(chassis.get("name"))
    elif isinstance(chassis, dict) and "id" not in chassis and len(chassis) == 1:  # json: {sysname: {...}}
        sysname, chassis = next(iter(chassis.items()))
    chassis = chassis if isinstance(chassis, dict) else {}
    port = iface.get("port")
    port = (port[0] if port else {}) if isinstance(port, list) else (port or {})
    ctype, cid = _id(chassis.get("id"))
    ptype, pid = _id(port.get("id"))
    caps = chassis.get("capability") or []
    bridge = any(isinstance(c, dict) and c.get("type") == "Bridge" and c.get("enabled") is True for c in caps)
    # Every string here is the neighbour's own (a switch, a cable's far end, whatever is plugged in):
    # escaped to one printable line before anything reads it.
    return {
        "via": "lldp",
        "chassis_id": neighbour_text(cid),
        "chassis_id_type": neighbour_text(ctype),
        "sysname": neighbour_text(sysname),
        "port_id": neighbour_text(pid),
        "port_id_type": neighbour_text(ptype),
        "port_descr": neighbour_text(_first(port.get("descr"))),
        "bridge": bridge,
    }


def parse_lldp_neighbours(text: str) -> dict:
    """``lldpcli -f json0|json show neighbors details`` -> {ifname: [neighbour, ...]}, every string a
    neighbour sent escaped (neighbour_text).

    Read with strict=False: lldpcli writes C0 control characters as \\uXXXX, except 0x1f up to lldpd 1.0.18
    (src/client/json_writer.c, json_string_dump: ``c < 0x1f``, fixed by commit 6f55f7af), which it writes
    raw: one such octet in a neighbour's name would otherwise make the whole read fail."""
    data = json.loads(text or "{}", strict=False) or {}
    lldp = data.get("lldp")
    if isinstance(lldp, list):  # json0: [{"interface": [...]}]
        lldp = lldp[0] if lldp else {}
    ifaces = (lldp or {}).get("interface") if isinstance(lldp, dict) else None
    entries = []
    if isinstance(ifaces, list):
        for item in ifaces:
            if isinstance(item, dict) and "name" in item:  # json0
                entries.append((item["name"], item))
            elif isinstance(item, dict):  # json with several neighbours: [{name: {...}}, ...]
                entries.extend(item.items())
    elif isinstance(ifaces, dict):  # json with one neighbour per interface: {name: {...}}
        entries.extend(ifaces.items())
    out: dict = {}
    for name, iface in entries:
        if isinstance(iface, dict):
            out.setdefault(name, []).append(_neighbour(iface))
    return out


def parse_ipv6_neighbours(text: str) -> list:
    """``ip -j -6 neigh show dev X`` -> [{via: nd, mac, address}] for link-local neighbours with a MAC."""
    out = []
    for entry in json.loads(text or "[]"):
        mac = (entry.get("lladdr") or "").lower()
        dst = entry.get("dst") or ""
        if MAC_RE.match(mac) and dst.lower().startswith("fe80:") and "FAILED" not in (entry.get("state") or []):
            out.append({"via": "nd", "mac": mac, "address": neighbour_text(dst)})
    return out


def function_identity(netdev: str, pci: str | None = None, phys_port_name: str | None = None) -> dict | None:
    """Which QSFP port and which PCIe function a netdev is, from sysfs when known, else from its name.

    -> {port, twin_key, domain, pci}: the twins of a port share twin_key (bus:slot.function) and
    differ in domain; None when the name is no PCIe function's (a bridge, docker0, a VLAN).
    """
    m = PCI_RE.match(pci or "")
    n = NETDEV_RE.match(netdev or "")
    if m:
        domain, bus, slot, function = int(m["domain"], 16), int(m["bus"], 16), int(m["slot"], 16), int(m["function"])
    elif n:
        domain, bus, slot, function = int(n["domain"] or 0), int(n["bus"]), int(n["slot"]), int(n["function"])
    else:
        return None
    port = None
    pm = re.match(r"^p(\d+)$", phys_port_name or "")
    if pm:
        port = int(pm[1])
    elif n and n["port"] is not None:
        port = int(n["port"])
    else:
        port = function
    return {
        "port": port,
        "twin_key": f"{bus:02x}:{slot:02x}.{function}",
        "domain": domain,
        "pci": pci or f"{domain:04x}:{bus:02x}:{slot:02x}.{function}",
    }


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def read_sysfs_netdev(name: str, sys_class_net: str = "/sys/class/net") -> dict:
    """One netdev's sysfs attributes: mac, mtu, operstate, speed (Mb/s; None when unknown), PCIe function,
    driver, phys_port_name and the RDMA devices of its function (device/infiniband/)."""
    base = os.path.join(sys_class_net, name)
    dev = os.path.join(base, "device")
    speed = _read(os.path.join(base, "speed"))
    mtu = _read(os.path.join(base, "mtu"))
    pci = os.path.basename(os.path.realpath(dev)) if os.path.exists(dev) else None
    driver_link = os.path.join(dev, "driver")
    driver = os.path.basename(os.path.realpath(driver_link)) if os.path.exists(driver_link) else None
    try:
        rdma = sorted(n for n in os.listdir(os.path.join(dev, "infiniband")) if not n.startswith("."))
    except OSError:
        rdma = []
    try:
        speed_mbps = int(speed) if speed is not None else None
    except ValueError:
        speed_mbps = None
    return {
        "mac": (_read(os.path.join(base, "address")) or "").lower() or None,
        "mtu": int(mtu) if mtu and mtu.isdigit() else None,
        "operstate": _read(os.path.join(base, "operstate")),
        # The kernel answers -1 (or EINVAL) for a link without carrier: unknown, not a speed.
        "speed_mbps": speed_mbps if speed_mbps and speed_mbps > 0 else None,
        "pci": pci if pci and PCI_RE.match(pci) else None,
        "driver": driver,
        "phys_port_name": _read(os.path.join(base, "phys_port_name")),
        "rdma_devices": rdma,
    }


def simulated_rdma_name(netdev: str) -> str:
    """The RDMA device name rdma-core gives a function's netdev (rocep1s0f1 for enp1s0f1np1); the test bed
    has no RDMA device, and sim/simctl.py names its links' RDMA devices the same way."""
    return "roce" + netdev.replace("en", "", 1).rsplit("np", 1)[0]


def is_fast_candidate(name: str, sysfs: dict, ibdev: dict) -> bool:
    """A ConnectX-7 function: ibdev2netdev maps it, or mlx5_core drives it, or (the test bed, no PCIe)
    its name is a PCIe function's with a physical port number (enp1s0f1np1)."""
    if name in ibdev or sysfs.get("driver") == "mlx5_core":
        return True
    m = NETDEV_RE.match(name)
    return bool(m and m["port"] is not None)


def build_port(name: str, sysfs: dict, link: dict, ibdev: dict, *, neighbours: list, simulated: bool) -> dict:
    """One fast netdev as the controller's inference reads it (plugins/plugin_utils/discovery.py)."""
    ident = function_identity(name, sysfs.get("pci"), sysfs.get("phys_port_name")) or {}
    rdma = (ibdev.get(name) or {}).get("rdma_device") or (sysfs.get("rdma_devices") or [None])[0]
    if rdma is None and simulated:
        rdma = simulated_rdma_name(name)
    operstate = (link.get("operstate") or sysfs.get("operstate") or "unknown").lower()
    return {
        "netdev": name,
        "rdma_device": rdma,
        "rdma_state": (ibdev.get(name) or {}).get("state"),
        "mac": link.get("mac") or sysfs.get("mac"),
        "mtu": link.get("mtu") or sysfs.get("mtu"),
        "operstate": operstate,
        "admin_up": link.get("admin_up", operstate == "up"),
        "carrier": link.get("carrier", operstate == "up"),
        "speed_mbps": sysfs.get("speed_mbps"),
        "pci": ident.get("pci"),
        "port": ident.get("port"),
        "twin_key": ident.get("twin_key"),
        "domain": ident.get("domain"),
        "neighbours": list(neighbours),
    }


def start_daemon(argv: list):
    """Start a foreground daemon (lldpd -d) as our child. Its log goes to a temporary file, not a pipe that
    nobody reads while it runs (a full pipe would stop it); daemon_log() reads it for a failure message."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop_daemon
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)  # noqa: S603 - fixed argv
    proc.sparkops_log = log
    return proc


def daemon_log(proc, limit: int = 400) -> str:
    log = getattr(proc, "sparkops_log", None)
    if log is None:
        return ""
    log.seek(0)
    return log.read().decode(errors="replace")[-limit:].strip()


def stop_daemon(proc, timeout_s: float = 5) -> None:
    """Stop a child started by start_daemon: SIGTERM, then SIGKILL after timeout_s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)
    log = getattr(proc, "sparkops_log", None)
    if log is not None:
        log.close()
