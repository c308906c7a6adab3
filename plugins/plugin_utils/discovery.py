"""From what each Spark says about its ConnectX-7 ports to the cables, the topology and an inventory.

``infer(nodes, hosts, settings)`` is pure (no I/O): ``nodes`` is per host what the ``fabric_discover``
module read (its ``ports``: netdev, RDMA device, MAC, state, speed, MTU, PCIe function, QSFP port and the
neighbours seen by LLDP or IPv6 neighbour discovery; ``networks``: the IPv4 networks in use on the
node's other interfaces). It returns the cables (which QSFP port of which Spark meets which), both twins
of every cabled port, the topology (pair, switch, ring) and proposed addresses, or raises
``DiscoveryError`` with every problem, each naming the cable to move or check by both of its ends.

``render_inventory`` writes the result as a ``hosts.yml`` in the shape ``build_cluster``
(plugins/plugin_utils/cluster.py) reads; ``moved_cables`` compares an inventory's links with what was
discovered and names every cable that moved since the inventory was written.

Conventions (spark-facts.md, inventory/examples): a ring runs from port 0 of each Spark to port 1 of
the next; each cable carries both twins of its ports, twin t (the t-th PCIe domain: enp1s0... then
enP2p1s0...) on its own subnet per lane; node i (the head first) gets host number 11 + i on every subnet.
"""

from __future__ import annotations

import ipaddress
import json
import re

import yaml
from ansible_collections.sparkops.cluster.plugins.module_utils.fabric_discovery import neighbour_text

DEFAULT_POOL = "192.168.96.0/19"
DEFAULT_PREFIX = 24
DEFAULT_SPEED_MBPS = 200000
HOST_BASE = 11
_PLAIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$")
# The neighbour's fields: all of them its own words (LLDP TLVs, or the IPv6 neighbour table).
_NEIGHBOUR_TEXT = ("chassis_id", "chassis_id_type", "sysname", "port_id", "port_id_type", "port_descr")
_NEIGHBOUR_TEXT += ("mac", "address")


def printable(text) -> str:
    """One printable line: every character that is not printable (a newline, ESC, a right-to-left override)
    written as its escape. Summary lines, problems and the comments of hosts.yml pass through it."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _shown(text) -> str:
    """A neighbour's words in a sentence (and a comment of hosts.yml): as they are when plain (sw-200g,
    b8:ce:f6:00:00:01), else double-quoted (JSON's escapes, YAML's too), so where they end is never in doubt."""
    text = str(text)
    return text if _PLAIN.match(text) else json.dumps(text)


def _trusted_nodes(nodes: dict) -> dict:
    """The reads with every neighbour string escaped again (neighbour_text): fabric_discover escapes them on
    the node, but a node that is not ours (or not our module) answers what it likes."""
    out = {}
    for h, node in nodes.items():
        if not isinstance(node, dict):
            out[h] = node
            continue
        ports = []
        for port in node.get("ports") or []:
            if not isinstance(port, dict):
                continue  # no port: dropped, as a neighbour that is no mapping is
            nbs = [
                {k: (neighbour_text(v) if k in _NEIGHBOUR_TEXT and v is not None else v) for k, v in nb.items()}
                for nb in port.get("neighbours") or []
                if isinstance(nb, dict)
            ]
            ports.append({**port, "neighbours": nbs})
        out[h] = {**node, "ports": ports}
    return out


class DiscoveryError(ValueError):
    """Every problem of the cabling at once (``problems``: one sentence each, naming the ends)."""

    def __init__(self, problems, partial=None):
        self.problems = [printable(p) for p in problems]
        self.partial = partial or {}
        super().__init__(self.render())

    def render(self) -> str:
        n = len(self.problems)
        head = f"The cabling makes no supported sparkops topology ({n} problem{'s' if n != 1 else ''}):"
        return "\n".join([head] + [f"  {i}. {p}" for i, p in enumerate(self.problems, 1)])


# ------------------------------------------------------------------------------ ports
def _phys_ports(host: str, node: dict) -> dict:
    """QSFP port number -> its twins (fast netdevs) sorted by PCI domain, for one host."""
    ports: dict = {}
    for p in node.get("ports") or []:
        if p.get("port") is None:
            continue
        ports.setdefault(int(p["port"]), []).append(p)
    for twins in ports.values():
        twins.sort(key=lambda t: (t.get("domain") or 0, t["netdev"]))
    return dict(sorted(ports.items()))


def port_label(host: str, port: int, twins: list) -> str:
    names = "/".join(t["netdev"] for t in twins)
    return f"{host} port {port} ({names})" if names else f"{host} port {port}"


def _short(name) -> str:
    return str(name).split(".", maxsplit=1)[0].lower()


class _Index:
    """Who owns a MAC, a chassis ID, a system name: the nodes' fast ports and the nodes themselves."""

    def __init__(self, hosts: list, nodes: dict, ports: dict):
        self.port_mac: dict = {}
        self.host_mac: dict = {}
        self.names: dict = {}
        self.netdev: dict = {}
        for h in hosts:
            node = nodes[h]
            for name in (h, node.get("hostname")):
                if name:
                    self.names[_short(name)] = h
            for mac in node.get("macs") or []:
                self.host_mac[str(mac).lower()] = h
            for pnum, twins in ports[h].items():
                for t in twins:
                    if t.get("mac"):
                        self.port_mac[t["mac"].lower()] = (h, pnum)
                        self.host_mac[t["mac"].lower()] = h
                    self.netdev[(h, t["netdev"])] = (h, pnum)

    def resolve(self, nb: dict):
        """A neighbour -> ("spark", (host, port)) or ("spark", (host, None)) or ("external", key)."""
        if nb.get("via") == "nd":
            hit = self.port_mac.get(str(nb.get("mac") or "").lower())
            return ("spark", hit) if hit else ("external", f"mac {nb.get('mac')}")
        if nb.get("port_id_type") == "mac" and str(nb.get("port_id") or "").lower() in self.port_mac:
            return ("spark", self.port_mac[str(nb["port_id"]).lower()])
        host = None
        if nb.get("chassis_id_type") == "mac":
            host = self.host_mac.get(str(nb.get("chassis_id") or "").lower())
        if host is None and nb.get("sysname"):
            host = self.names.get(_short(nb["sysname"]))
        if host is not None:
            for cand in (nb.get("port_descr"), nb.get("port_id")):
                if (host, cand) in self.netdev:
                    return ("spark", self.netdev[(host, cand)])
            return ("spark", (host, None))
        key = nb.get("chassis_id") or nb.get("sysname") or nb.get("port_id") or "unknown"
        return ("external", f"{_shown(nb.get('sysname') or 'switch')} (chassis {_shown(key)})")


# ---------------------------------------------------------------------------- cabling
def _observe(hosts: list, nodes: dict, ports: dict, notes: list, problems: list):
    """Each QSFP port's view: the Spark ports and external devices its twins hear."""
    idx = _Index(hosts, nodes, ports)
    seen: dict = {}
    for h in hosts:
        for pnum, twins in ports[h].items():
            sparks, external, unknown_port = set(), set(), set()
            for t in twins:
                for nb in t.get("neighbours") or []:
                    kind, what = idx.resolve(nb)
                    if kind == "external":
                        external.add(what)
                    elif what[1] is None:
                        unknown_port.add(what[0])
                    elif what == (h, pnum):
                        # The twins of one port share the NIC's embedded switch: a twin may hear its own
                        # twin (NVIDIA/daqiri PR 108: same-port traffic loops on-chip). Not a cable.
                        continue
                    else:
                        sparks.add(what)
            for other in sorted(unknown_port):
                problems.append(
                    f"{port_label(h, pnum, twins)} hears {other} by LLDP but not which of its ports; check that "
                    f"lldpd on {other} sends the port's MAC or interface name (lldpcli configure lldp "
                    "portidsubtype macaddress), then run the discovery again."
                )
            seen[(h, pnum)] = {"sparks": sparks, "external": external}
    return seen


def _twin_states(label: str, twins: list, settings: dict, problems: list, other: str | None = None) -> None:
    both = f" (the cable {label} - {other})" if other else ""
    for t in twins:
        if not t.get("carrier") or t.get("operstate") not in ("up", "unknown"):
            how = "administratively down" if not t.get("admin_up") else "down (no carrier)"
            problems.append(
                f"{t['netdev']} of {label} is {how}{both}. Check that the cable is seated at both ends and is a "
                f"200G QSFP56 DAC/AOC; bring the link up (ip link set {t['netdev']} up) and run the discovery again."
            )
    want = settings.get("speed_mbps")
    if want:
        for t in twins:
            got = t.get("speed_mbps")
            if got and int(got) != int(want):
                problems.append(
                    f"{t['netdev']} of {label} runs at {got} Mb/s, not {want}{both}: check the cable (a 100G or "
                    "lower-rated cable, or a port forced to a lower speed) and replace it with a 200G QSFP56 one."
                )
    if len(twins) == 1:
        problems.append(
            f"{label} shows one PCIe function only ({twins[0]['netdev']}); a Spark's QSFP port is two (twins). "
            "Check `ibdev2netdev` and the firmware (the second function missing halves the bandwidth)."
        )


def _cables(hosts, ports, seen, problems):
    """Direct cables {ends: ((h, p), (h2, p2))} and shared segments (switch) {key: set of (h, p)}."""
    direct: dict = {}
    segments: dict = {}
    for (h, p), view in seen.items():
        sparks = view["sparks"]
        label = port_label(h, p, ports[h][p])
        same_host = sorted(q for q in sparks if q[0] == h)
        for q in same_host:
            problems.append(
                f"{label} is cabled to {port_label(h, q[1], ports[h][q[1]])} of the same Spark: a loop back into "
                f"one machine carries nothing. Move the end at {h} port {q[1]} to another Spark."
            )
        others = {q for q in sparks if q[0] != h}
        if view["external"]:
            for key in view["external"]:
                segments.setdefault(("ext", key), set()).add((h, p))
            continue
        if len({q[0] for q in others}) >= 2:
            # Several Sparks on one port: a segment that forwards LLDP (a bridge, or the test bed's).
            members = frozenset(others | {(h, p)})
            segments.setdefault(("shared", members), set()).update(members)
        elif len(others) == 1:
            q = next(iter(others))
            key = tuple(sorted([(h, p), q], key=lambda e: (hosts.index(e[0]), e[1])))
            direct[key] = True
    # Merge shared segments that overlap (each port's view of the same bridge).
    merged: list = []
    for key, members in segments.items():
        if key[0] == "shared":
            for m in merged:
                if m["members"] & members:
                    m["members"] |= members
                    break
            else:
                merged.append({"key": "a segment that joins several Sparks", "members": set(members)})
        else:
            merged.append({"key": key[1], "members": set(members)})
    # A port named in two direct cables (asymmetric views) is a conflict: name both.
    used: dict = {}
    for ends in direct:
        for e in ends:
            used.setdefault(e, []).append(ends)
    for e, cabs in used.items():
        if len(cabs) > 1:
            problems.append(
                f"{port_label(e[0], e[1], ports[e[0]][e[1]])} is seen at the end of "
                + " and of ".join(_cable_text(c, ports) for c in cabs)
                + ": the two ends disagree, a cable was moved during the discovery or LLDP is stale. Check the "
                "cable at this port and run the discovery again."
            )
    return list(direct), merged


def _cable_text(ends, ports) -> str:
    (a, pa), (b, pb) = ends
    return f"the cable {port_label(a, pa, ports[a][pa])} - {port_label(b, pb, ports[b][pb])}"


def _cycles(hosts: list, cables: list) -> list:
    """Connected components of the cable graph, each as its hosts in inventory order."""
    parent = {h: h for h in hosts}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for (a, _pa), (b, _pb) in cables:
        parent[find(a)] = find(b)
    groups: dict = {}
    for h in hosts:
        groups.setdefault(find(h), []).append(h)
    return list(groups.values())


def _ring_order(hosts: list, cables: list, head: str) -> list:
    """The ring from the head, leaving it by its port-0 cable (or its first cable)."""
    by_host: dict = {h: [] for h in hosts}
    for c in cables:
        (a, pa), (b, pb) = c
        by_host[a].append((pa, b, c))
        by_host[b].append((pb, a, c))
    start = sorted(by_host[head], key=lambda x: x[0])[0]
    order, used = [head], {start[2]}
    cur = start[1]
    while cur != head and len(order) <= len(hosts):
        order.append(cur)
        nxt = [x for x in by_host[cur] if x[2] not in used]
        if not nxt:
            return []  # a path that ends short of the head is no ring (a port seen in two cables)
        used.add(nxt[0][2])
        cur = nxt[0][1]
    return order


def _ring_problems(hosts, ports, cables, head, *, settings, problems) -> list | None:
    """A ring of n >= 3 Sparks: every one cabled to two others, one loop, port 0 to the next's port 1."""
    deg = {h: 0 for h in hosts}
    pairs: dict = {}
    for (a, pa), (b, pb) in cables:
        deg[a] += 1
        deg[b] += 1
        pairs.setdefault(frozenset((a, b)), []).append(((a, pa), (b, pb)))
    before = len(problems)
    short = [h for h in hosts if deg[h] < 2]
    for pair, cabs in pairs.items():
        if len(cabs) > 1:
            a, b = sorted(pair, key=hosts.index)
            fix = _swap_hint(hosts, ports, cables, cabs[1]) if short else ""
            problems.append(
                f"two cables join {a} and {b} ("
                + "; ".join(_cable_text(c, ports) for c in cabs)
                + "): a second cable between the same two Sparks adds nothing."
                + (f" {fix}" if fix else "")
            )
    bare = [h for h in hosts if deg[h] == 0]
    for h in bare:
        free = ", ".join(port_label(h, p, t) for p, t in ports[h].items()) or "no QSFP port found"
        problems.append(f"{h} has no cable up ({free}); on a ring every Spark has two cables, one per port.")
    comps = _cycles(hosts, cables)
    ends = [h for h in hosts if deg[h] == 1]
    if not bare and len(comps) == 1 and len(ends) == 2 and all(deg[h] in (1, 2) for h in hosts):
        a, b = sorted(ends, key=hosts.index)
        fa = _free_port(a, ports, cables)
        fb = _free_port(b, ports, cables)
        problems.append(
            f"the ring is missing one cable: connect {port_label(a, fa, ports[a].get(fa, []))} to "
            f"{port_label(b, fb, ports[b].get(fb, []))} (the Sparks cabled once: {a}, {b})."
        )
    elif len(comps) > 1 and not bare and not short:
        loops = "; ".join(" - ".join(c) for c in comps)
        problems.append(
            f"the cables make {len(comps)} separate loops ({loops}), not one ring. " + _merge_hint(comps, cables, ports)
        )
    if len(problems) > before:
        return None
    order = _ring_order(hosts, cables, head)
    if len(order) != len(hosts):
        problems.append("the cables do not make one ring: " + "; ".join(_cable_text(c, ports) for c in cables) + ".")
        return None
    if not settings.get("allow_any_port"):
        _orientation(order, cables, ports, problems)
    return order


def _free_port(h, ports, cables):
    """The port of a Spark cabled once that the ring's missing cable goes to: one of its QSFP ports 0 and 1
    (shown or not: a port whose two functions are both missing is still the one to cable)."""
    used = {p for c in cables for (hh, p) in c if hh == h}
    return min(p for p in {0, 1} | set(ports[h]) if p not in used)


def _swap_hint(hosts, ports, cables, cable) -> str:
    """How to fix a duplicated cable: move its end to a Spark short of a cable."""
    deg = {h: 0 for h in hosts}
    for (a, _pa), (b, _pb) in cables:
        deg[a] += 1
        deg[b] += 1
    (a, pa), (b, pb) = cable
    short = [h for h in hosts if deg[h] < 2]
    if short:
        return f"Move the end at {port_label(b, pb, ports[b][pb])} to {short[0]} (cabled {deg[short[0]]} time(s))."
    return ""


def _merge_hint(comps, cables, ports) -> str:
    """Two loops become one ring by swapping one end of a cable in each: name those ends."""

    def port1_last(c):
        return c if c[1][1] >= c[0][1] else (c[1], c[0])

    first = port1_last([c for c in cables if c[0][0] in comps[0]][0])
    second = port1_last([c for c in cables if c[0][0] in comps[1]][0])
    (a, pa), (b, pb) = first
    (c, pc), (d, pd) = second
    return (
        f"Two cables are crossed: swap the ends at {port_label(b, pb, ports[b][pb])} and "
        f"{port_label(d, pd, ports[d][pd])} (so that {a} port {pa} meets {d} port {pd} and {c} port {pc} "
        f"meets {b} port {pb})."
    )


def _orientation(order, cables, ports, problems) -> None:
    """Ring convention: each cable from port 0 of a Spark to port 1 of the next. A Spark whose two cables
    are the wrong way round (the ends at its ports swapped) is named."""
    n = len(order)
    port_to = {}
    for (a, pa), (b, pb) in cables:
        port_to[(a, b)] = pa
        port_to[(b, a)] = pb
    best = None
    for seq in (order, [order[0]] + order[:0:-1]):
        wrong = [seq[i] for i in range(n) if port_to.get((seq[i], seq[(i + 1) % n])) != 0]
        if best is None or len(wrong) < len(best[1]):
            best = (seq, wrong)
    seq, wrong = best
    for h in wrong:
        i = seq.index(h)
        nxt, prv = seq[(i + 1) % n], seq[(i - 1) % n]
        p_next, p_prev = port_to[(h, nxt)], port_to[(h, prv)]
        problems.append(
            f"{h}'s cables are crossed: its port {p_next} goes to {nxt} and its port {p_prev} to {prv}; on a ring "
            f"each cable runs from port 0 to the next Spark's port 1. Swap the two cables at {h} "
            f"({port_label(h, p_next, ports[h][p_next])} and {port_label(h, p_prev, ports[h][p_prev])}), or set "
            "sparkops_discover_allow_any_port: true to accept this cabling."
        )


# --------------------------------------------------------------------------- addresses
def _subnets(settings: dict, used: list, count: int, hosts: int, problems: list) -> list:
    pool_text = str(settings.get("pool") or DEFAULT_POOL)
    prefix = int(settings.get("prefix") or DEFAULT_PREFIX)
    try:
        pool = ipaddress.IPv4Network(pool_text, strict=True)
    except ValueError as exc:
        problems.append(
            f"sparkops_discover_pool {pool_text!r} is no IPv4 network ({exc}); give one such as {DEFAULT_POOL}."
        )
        return []
    if not pool.prefixlen <= prefix <= 30:
        problems.append(f"sparkops_discover_prefix /{prefix} must lie between the pool's /{pool.prefixlen} and /30.")
        return []
    if HOST_BASE + hosts >= 2 ** (32 - prefix) - 1:
        problems.append(
            f"sparkops_discover_prefix /{prefix} is too small: node i gets host number {HOST_BASE} + i, so "
            f"{hosts} nodes need a /{32 - (HOST_BASE + hosts + 1).bit_length()} or larger (e.g. /24)."
        )
        return []
    busy = []
    for cidr in used:
        try:
            busy.append(ipaddress.IPv4Network(cidr, strict=False))
        except ValueError:
            continue
    out = []
    for net in pool.subnets(new_prefix=prefix):
        if any(net.overlaps(b) for b in busy):
            continue
        out.append(net)
        if len(out) == count:
            return out
    taken = ", ".join(sorted({str(b) for b in busy if b.overlaps(pool)})) or "none"
    problems.append(
        f"the pool {pool} holds {len(out)} free /{prefix} subnet(s), {count} are needed (in use on the nodes' "
        f"other interfaces: {taken}). Set sparkops_discover_pool to a larger range that the management LAN "
        "does not use."
    )
    return []


def _link(twin: dict, address: str) -> dict:
    return {"netdev": twin["netdev"], "rdma_device": twin.get("rdma_device"), "address": address}


def infer(nodes: dict, hosts: list, settings: dict | None = None) -> dict:  # noqa: C901, PLR0912, PLR0915
    """The cables, twins, topology and proposed addresses, or DiscoveryError with every problem.

    settings: pool (CIDR), prefix (int), speed_mbps (expected link speed; None: 200000; 0: not checked),
    topology (auto, pair, switch, ring, mesh: the shape expected), allow_any_port (bool), head (host).
    """
    settings = dict(settings or {})
    nodes = _trusted_nodes(nodes)
    if settings.get("speed_mbps") is None:
        settings["speed_mbps"] = DEFAULT_SPEED_MBPS
    problems: list = []
    notes: list = []
    hosts = list(dict.fromkeys(hosts))
    missing = [h for h in hosts if h not in nodes]
    if missing:
        raise DiscoveryError([f"no discovery read from {', '.join(missing)}; check that they are reachable."])
    head = settings.get("head") if settings.get("head") in hosts else hosts[0]
    hosts = [head] + [h for h in hosts if h != head]
    ports = {h: _phys_ports(h, nodes[h]) for h in hosts}
    for h in hosts:
        if not ports[h]:
            problems.append(
                f"{h} shows no ConnectX-7 netdev (ibdev2netdev and /sys/class/net list none): check the mlx5_core "
                "driver (lsmod | grep mlx5) and `ibdev2netdev`."
            )
    seen = _observe(hosts, nodes, ports, notes, problems)
    direct, segments = _cables(hosts, ports, seen, problems)
    # A cabled port whose link is down at one end: the peer heard it, or it heard the peer.
    cabled = {e for c in direct for e in c} | {m for s in segments for m in s["members"]}
    for c in direct:
        (a, pa), (b, pb) = c
        la, lb = port_label(a, pa, ports[a][pa]), port_label(b, pb, ports[b][pb])
        _twin_states(la, ports[a][pa], settings, problems, lb)
        _twin_states(lb, ports[b][pb], settings, problems, la)
    for s in segments:
        for h, p in sorted(s["members"], key=lambda e: (hosts.index(e[0]), e[1])):
            _twin_states(port_label(h, p, ports[h][p]), ports[h][p], settings, problems, s["key"])
    for h in hosts:
        for p, twins in ports[h].items():
            if (h, p) in cabled:
                continue
            up = [t["netdev"] for t in twins if t.get("carrier")]
            if up:
                problems.append(
                    f"{port_label(h, p, twins)} has a link ({', '.join(up)} up) but no neighbour answered on it "
                    "(neither LLDP nor IPv6 neighbour discovery): check what the cable's other end is plugged "
                    "into, and that lldpd runs there (or that the far end is a Spark of this inventory)."
                )
    wanted = str(settings.get("topology") or "auto")
    n = len(hosts)
    topology = None
    order = None
    if direct and segments:
        problems.append(
            "some Sparks are cabled to each other ("
            + "; ".join(_cable_text(c, ports) for c in direct)
            + ") and some to a switch ("
            + "; ".join(f"{s['key']}: {', '.join(f'{h} port {p}' for h, p in sorted(s['members']))}" for s in segments)
            + "): use one or the other (a switch for any number of Sparks, cables for a pair or a ring)."
        )
    elif segments:
        topology = "switch"
        if len(segments) > 1:
            problems.append(
                "the Sparks hang off "
                + f"{len(segments)} switches or segments ("
                + "; ".join(
                    f"{s['key']}: {', '.join(f'{h} port {p}' for h, p in sorted(s['members']))}" for s in segments
                )
                + "): cable every Spark to the same switch."
            )
        else:
            members = segments[0]["members"]
            for h in hosts:
                on = sorted(p for hh, p in members if hh == h)
                if not on:
                    free = ", ".join(port_label(h, p, t) for p, t in ports[h].items())
                    problems.append(f"{h} is not on the switch ({segments[0]['key']}): cable one of {free} to it.")
                elif len(on) > 1:
                    problems.append(
                        f"{h} has both ports on the switch ({', '.join(port_label(h, p, ports[h][p]) for p in on)}); "
                        f"sparkops uses one: unplug {port_label(h, on[-1], ports[h][on[-1]])}."
                    )
    elif direct:
        if n == 2:
            topology = "pair"
            if len(direct) > 1:
                problems.append(
                    f"two cables join {hosts[0]} and {hosts[1]} ("
                    + "; ".join(_cable_text(c, ports) for c in direct)
                    + "): a second cable adds nothing (the two twins of one port carry the full 200G). Remove "
                    + _cable_text(direct[1], ports)
                    + "."
                )
        else:
            topology = "ring"
            order = _ring_problems(hosts, ports, direct, head, settings=settings, problems=problems)
    elif n >= 2 and not problems:
        problems.append(
            "no cable found between the Sparks (no port has a neighbour): check that the QSFP cables are plugged "
            "in and the links are up (`ibdev2netdev` shows Up), and that lldpd can run on the nodes."
        )
    if n < 2:
        problems.append(f"the inventory names {n} host; a cluster is two or more Sparks.")
    if (
        wanted != "auto"
        and topology
        and wanted != topology
        and not (wanted == "mesh" and topology == "ring" and n == 3)
    ):
        problems.append(f"sparkops_discover_topology is {wanted}, but the cabling makes a {topology}.")
    partial = {"hosts": hosts, "ports": _ports_out(hosts, ports)}  # what the refusal's summary shows
    if problems:
        raise DiscoveryError(problems, partial)

    used = sorted({c for h in hosts for c in nodes[h].get("networks") or []})
    rank = {h: i for i, h in enumerate(hosts)}
    lanes_plan = []  # (a_end (h, p) or None for a switch, b_end, twin index)
    cables_out = []
    if topology == "switch":
        members = segments[0]["members"]
        port_of = dict(members)
        twins = max(len(ports[h][port_of[h]]) for h in hosts)
        subnets = _subnets(settings, used, twins, n, problems)
        if problems:
            raise DiscoveryError(problems, partial)
        links = {h: [] for h in hosts}
        for t, net in enumerate(subnets):
            for h in hosts:
                tw = ports[h][port_of[h]]
                if t < len(tw):
                    links[h].append(_link(tw[t], f"{net[HOST_BASE + rank[h]]}/{net.prefixlen}"))
        segments_out = [
            {"switch": segments[0]["key"], "ports": [port_label(h, port_of[h], ports[h][port_of[h]]) for h in hosts]}
        ]
    else:
        if topology == "ring":
            seq = order
            ordered = []
            for i, h in enumerate(seq):
                nxt = seq[(i + 1) % len(seq)]
                c = next(c for c in direct if {c[0][0], c[1][0]} == {h, nxt})
                a_end = c[0] if c[0][0] == h else c[1]
                b_end = c[1] if a_end is c[0] else c[0]
                ordered.append((a_end, b_end))
        else:
            ordered = direct  # a pair's one cable (a second one is refused above)
        lane_count = sum(min(len(ports[a][pa]), len(ports[b][pb])) for (a, pa), (b, pb) in ordered)
        subnets = _subnets(settings, used, lane_count, n, problems)
        if problems:
            raise DiscoveryError(problems, partial)
        links = {h: [] for h in hosts}
        k = 0
        for (a, pa), (b, pb) in ordered:
            lanes = []
            for t in range(min(len(ports[a][pa]), len(ports[b][pb]))):
                net = subnets[k]
                k += 1
                ta, tb = ports[a][pa][t], ports[b][pb][t]
                la = _link(ta, f"{net[HOST_BASE + rank[a]]}/{net.prefixlen}")
                lb = _link(tb, f"{net[HOST_BASE + rank[b]]}/{net.prefixlen}")
                links[a].append(la)
                links[b].append(lb)
                lanes.append({"cidr": str(net), "a": dict(la, host=a), "b": dict(lb, host=b)})
            lanes_plan.append(lanes)
            cables_out.append(
                {
                    "a": {"host": a, "port": pa, "label": port_label(a, pa, ports[a][pa])},
                    "b": {"host": b, "port": pb, "label": port_label(b, pb, ports[b][pb])},
                    "lanes": lanes,
                }
            )
        segments_out = []
    # Each cable's (or the switch port's) twins are in _phys_ports' order already: the stable sort by port
    # puts port 0's before port 1's and keeps the twins in that order.
    port_no = {(h, t["netdev"]): p for h in hosts for p, tw in ports[h].items() for t in tw}
    for h in hosts:
        links[h].sort(key=lambda lk, h=h: port_no[(h, lk["netdev"])])
    return {
        "topology": topology,
        "mesh": topology == "ring" and n == 3,
        "head": head,
        "hosts": hosts,
        "ring_order": order or [],
        "cables": cables_out,
        "segments": segments_out,
        "links": links,
        "ports": partial["ports"],
        "notes": notes,
        "pool": str(settings.get("pool") or DEFAULT_POOL),
    }


def _ports_out(hosts, ports) -> dict:
    return {
        h: [
            {k: t.get(k) for k in ("netdev", "rdma_device", "port", "pci", "mac", "operstate", "speed_mbps", "mtu")}
            for p in ports[h]
            for t in ports[h][p]
        ]
        for h in hosts
    }


# ---------------------------------------------------------------------------- output
def _scalar(value) -> str:
    """A YAML scalar that reads back as str(value): plain where YAML reads the same string (enp1s0f1np1,
    10.0.0.11/24), else double-quoted (JSON's escapes are YAML's): never text YAML would read as more."""
    text = str(value)
    if _PLAIN.match(text):
        try:
            if yaml.safe_load(text) == text:
                return text
        except yaml.YAMLError:
            pass
    return json.dumps(text)


def render_inventory(result: dict, connection: dict | None = None, source: str = "") -> str:
    """hosts.yml in the shape of inventory/two-sparks and inventory/examples (build_cluster reads it).

    connection: {host: {ansible_host: ..., ...}}, the connection variables from the inventory given.
    """
    connection = connection or {}
    head = result["head"]

    def host_block(h: str, indent: str) -> list:
        lines = [f"{indent}{_scalar(h)}:"]
        for key, value in sorted((connection.get(h) or {}).items()):
            lines.append(f"{indent}  {_scalar(key)}: {_scalar(value)}")
        lines.append(f"{indent}  sparkops_fast_links:")
        for lk in result["links"][h]:
            parts = [f"netdev: {_scalar(lk['netdev'])}"]
            if lk.get("rdma_device"):
                parts.append(f"rdma_device: {_scalar(lk['rdma_device'])}")
            parts.append(f"address: {_scalar(lk['address'])}")
            lines.append(f"{indent}    - {{ {', '.join(parts)} }}")
        return lines

    # The comments hold what the neighbours and the nodes said (a switch's system name, netdev names):
    # each one printable line (printable), so none ends its comment and writes YAML of its own. Every
    # value below is a _scalar.
    out = [
        "---",
        printable(
            f"# Written by playbooks/discover.yml{(' from ' + str(source)) if source else ''}: the "
            f"{result['topology']} the cables make,"
        ),
        "# both twins of every cabled port, one subnet per cable lane and twin. Check it with",
        "#   ansible-playbook playbooks/plan.yml -i <this directory>",
    ]
    out += ["# " + printable(line) for line in summary(result, brief=True)]
    out += [
        "all:",
        "  children:",
        "    spark_cluster:",
        "      vars:",
        f"        sparkops_topology: {_scalar(result['topology'])}",
        "      children:",
        "        spark_head:",
        "          hosts:",
    ]
    out += host_block(head, "            ")
    workers = [h for h in result["hosts"] if h != head]
    out += ["        spark_workers:", "          hosts:" + ("" if workers else " {}")]
    for h in workers:
        out += host_block(h, "            ")
    return "\n".join(out) + "\n"


def summary(result: dict, brief: bool = False) -> list:
    """Readable lines: nodes, cables (with both twins), topology, proposed addresses."""
    shape = result["topology"] + (" (3-node full mesh)" if result.get("mesh") else "")
    lines = [f"topology: {shape} of {len(result['hosts'])} Sparks, head {result['head']}"]
    if result.get("ring_order"):
        lines.append("ring order: " + " -> ".join(result["ring_order"] + [result["ring_order"][0]]))
    if not brief:
        for h in result["hosts"]:
            ports = ", ".join(
                f"{p['netdev']}[{p['rdma_device'] or '-'}] {p['operstate']}"
                + (f" {p['speed_mbps'] // 1000}G" if p.get("speed_mbps") else "")
                + (f" mtu {p['mtu']}" if p.get("mtu") else "")
                for p in result["ports"][h]
            )
            lines.append(f"node {h}: {ports}")
    for c in result["cables"]:
        lines.append(f"cable {c['a']['label']} <-> {c['b']['label']}")
        for ln in c["lanes"]:
            lines.append(
                f"  twin lane {ln['cidr']}: {ln['a']['host']} {ln['a']['netdev']} {ln['a']['address']} <-> "
                f"{ln['b']['host']} {ln['b']['netdev']} {ln['b']['address']}"
            )
    for s in result["segments"]:
        lines.append(f"switch {s['switch']}: {', '.join(s['ports'])}")
        for h in result["hosts"]:
            lines.append("  " + h + ": " + ", ".join(f"{lk['netdev']} {lk['address']}" for lk in result["links"][h]))
    return [printable(line) for line in lines]


# ----------------------------------------------------------------------- moved cables
def _port_of_netdev(netdev: str, ports_of_host: list):
    for p in ports_of_host:
        if p["netdev"] == netdev:
            return p["port"]
    m = re.match(r"^en(?:P\d+)?p\d+s\d+f(\d+)(?:np(\d+))?$", netdev or "")
    if m:
        return int(m[2] if m[2] is not None else m[1])
    return None


def moved_cables(inventory_links: dict, result: dict) -> list:
    """Cables of the inventory (subnets with two ends, by QSFP port) that the discovery no longer finds.

    inventory_links: {host: sparkops_fast_links}; result: infer()'s. One sentence per moved cable.
    """
    seg: dict = {}
    for h, links in inventory_links.items():
        for lk in links or []:
            try:
                cidr = str(ipaddress.IPv4Interface(str(lk.get("address"))).network)
            except ValueError:
                continue
            seg.setdefault(cidr, []).append((h, lk.get("netdev")))
    expected = set()
    for ends in seg.values():
        if len(ends) != 2:
            continue
        (a, na), (b, nb) = ends
        pa = _port_of_netdev(na, result["ports"].get(a, []))
        pb = _port_of_netdev(nb, result["ports"].get(b, []))
        expected.add(frozenset(((a, pa), (b, pb))))
    found = {frozenset(((c["a"]["host"], c["a"]["port"]), (c["b"]["host"], c["b"]["port"]))) for c in result["cables"]}
    where = {}
    for c in result["cables"]:
        where[(c["a"]["host"], c["a"]["port"])] = (c["b"]["host"], c["b"]["port"])
        where[(c["b"]["host"], c["b"]["port"])] = (c["a"]["host"], c["a"]["port"])
    out = []
    for cable in sorted(expected - found, key=lambda c: sorted(map(str, c))):
        (a, pa), (b, pb) = sorted(cable, key=str)
        now_a = where.get((a, pa))
        now_b = where.get((b, pb))
        now = []
        now.append(f"{a} port {pa} now meets {now_a[0]} port {now_a[1]}" if now_a else f"{a} port {pa} meets nothing")
        now.append(f"{b} port {pb} now meets {now_b[0]} port {now_b[1]}" if now_b else f"{b} port {pb} meets nothing")
        out.append(
            f"the cable {a} port {pa} - {b} port {pb} of the inventory is not there: {'; '.join(now)}. Put the cable "
            "back, or run playbooks/discover.yml to write an inventory for the new cabling."
        )
    for cable in sorted(found - expected, key=lambda c: sorted(map(str, c))):
        (a, pa), (b, pb) = sorted(cable, key=str)
        if not any(cable & e for e in expected):
            out.append(f"a cable {a} port {pa} - {b} port {pb} is not in the inventory.")
    return out
