"""The sparkops cluster model: one pure function from the inventory to everything the roles need.

``build_cluster(inputs)`` takes plain data (groups, per-host variables, settings) and returns the
model as JSON-able dicts and lists, or raises ``ClusterError`` carrying EVERY problem found, each
naming the host, link or address and saying how to fix it. It does no I/O: the same inputs always
give the same model, so it is unit-tested without Ansible and ``playbooks/plan.yml`` can show it on
an inventory whose hosts are unreachable.

The shape follows the design in docs (architecture.md): validate everything first and count all
errors (arista.avd's eos_designs_facts does the same for a fabric), compute each value once
(kubespray's network_facts / kubespray_defaults), and let roles only read the result.

Topologies (``sparkops_topology``), checked against the addresses, since links on one subnet share
a cable or a switch segment:

* ``pair``: two nodes, one cable, both twins of the cabled port, each twin on its own subnet;
* ``switch``: two or more nodes, every fast subnet holds every node;
* ``ring``: three or more nodes, every fast subnet holds exactly two nodes (one cable), and the
  nodes form one cycle; non-neighbours are reached through routes the short way round (a tie goes
  clockwise, to the next node in ring order). A 3-node ring is also the full mesh (``mesh`` is
  accepted as its name). Ring nodes forward only from one fast link to another (``forward_rules``).

Every name the model hands to a shell, an env file or netplan is checked first: interface and RDMA
device names by the kernel's grammar (see IFNAMSIZ below), no control characters in any setting,
the management interface never a fast link, host names that exist, an API address of the head.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import unicodedata
from collections import OrderedDict
from collections.abc import Mapping

TOPOLOGIES = ("pair", "switch", "ring", "mesh")
HARDWARE = ("dgx_spark", "simulated")
MIN_MTU = 9000
MAX_NODES = 64
_ADDRESS_RE = re.compile(r"^(\d{1,3}\.){3}\d{1,3}/\d{1,2}$")
_EXAMPLE_LINK = "{netdev: enp1s0f1np1, rdma_device: rocep1s0f1, address: 192.168.100.11/24}"
# Interface names as the kernel takes them (net/core/dev.c dev_valid_name): not empty, shorter than
# IFNAMSIZ (16, include/uapi/linux/if.h) bytes, not "." or "..", no '/', ':' or whitespace (the
# kernel's isspace, lib/ctype.c, includes 0xA0). RDMA device names are sysfs directory names under
# /sys/class/infiniband held in IB_DEVICE_NAME_MAX (64, include/rdma/ib_verbs.h) bytes with the NUL,
# and `rdma dev set ... name` (drivers/infiniband/core/nldev.c nldev_set_doit) refuses an empty one.
IFNAMSIZ = 16
IB_DEVICE_NAME_MAX = 64
# The kernel accepts more than this (';', '$', quotes, non-ASCII): sparkops also writes the names into
# netplan YAML, env files and iptables rules, so it takes only what real interfaces are called
# (udev's predictable names, VLAN and renamed devices): letters, digits, '_', '-' and '.'.
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_KERNEL_SPACE = frozenset(" \t\n\v\f\r\xa0")
# Environment variable names (POSIX: letters, digits, underscore, not starting with a digit). \Z, not $:
# "$" also matches before a final newline, which would end the env file's line after the name.
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
WILDCARDS = ("0.0.0.0", "::")  # noqa: S104 - values compared, not bound


class ClusterError(ValueError):
    """Every problem of an inventory at once (``problems``: one sentence each)."""

    HEADLINE = "The inventory describes no valid sparkops cluster"

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__(self.render())

    def count(self) -> str:
        n = len(self.problems)
        return f"{n} problem{'s' if n != 1 else ''}"

    def render(self) -> str:
        head = f"{self.HEADLINE} ({self.count()}):"
        return "\n".join([head] + [f"  {i}. {p}" for i, p in enumerate(self.problems, 1)])


# ----------------------------------------------------------------------------- helpers
def controller_state_dir(inventory_dir: str, given=None) -> str:
    """The controller's state folder (plan, credentials, keys, lock, reports, wheelhouse): `given`
    (sparkops_controller_state_dir) when set, else `<inventory>-state` beside the inventory folder, never
    inside it: Ansible reads every file of an inventory folder as an inventory source (an API key would
    become a host)."""
    if given:
        return str(given)
    folder = posixpath.normpath(str(inventory_dir or "."))
    if folder in (".", "/"):
        return posixpath.join(folder, "sparkops-state")
    return folder + "-state"


def _setting(settings: dict, name: str, default=None):
    value = settings.get(name, default)
    return default if value is None else value


def _as_int(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _control_chars(text: str) -> list:
    """The control and line-separator characters in text (each one would end a line of an env file)."""
    return sorted({c for c in text if unicodedata.category(c) in ("Cc", "Zl", "Zp")})


def _name_problem(what: str, name, max_bytes: int) -> str | None:
    """Why name is no valid netdev/RDMA device name (every reason, the kernel's first), or None."""
    if not isinstance(name, str) or not name:
        return f"{what} is missing"
    shown = repr(name)
    why = []
    size = len(name.encode("utf-8", "surrogatepass"))
    if size >= max_bytes:
        why.append(f"is {size} bytes; the kernel takes at most {max_bytes - 1}")
    if name in (".", ".."):
        why.append("is not a name the kernel accepts")
    bad = sorted({c for c in name if c in "/:" or c in _KERNEL_SPACE or unicodedata.category(c) in ("Cc", "Zl", "Zp")})
    if bad:
        why.append(f"contains {', '.join(repr(c) for c in bad)}, which the kernel refuses in a device name")
    others = sorted({c for c in name if not _NAME_RE.match(c) and c not in bad})
    if others:
        why.append(
            f"contains {', '.join(repr(c) for c in others)}; sparkops takes letters, digits, '_', '-' and '.' "
            "only (the name goes into netplan, env files and firewall rules)"
        )
    return f"{what} {shown} {'; '.join(why)}" if why else None


def _parse_links(host: str, raw, problems: list, mgmt_interface: str = "enP7s7", rejected: set | None = None) -> list:
    """The host's fast links as dicts with ip/prefix/cidr; a problem for each malformed entry. The subnet of
    each link refused for another reason than its address goes into `rejected` ("?" when it has none): the
    topology checks then say nothing of what that link's absence causes (it was reported)."""
    rejected = set() if rejected is None else rejected
    if raw is None or raw in ([], ""):
        problems.append(
            f"{host} has no usable 'sparkops_fast_links' (a list). List its QSFP interfaces with their "
            f"addresses, e.g. sparkops_fast_links: [{_EXAMPLE_LINK}]. NCCL, Ray and the weight sync use "
            "these links only."
        )
        return []
    if not isinstance(raw, (list, tuple)):
        problems.append(
            f"{host}: 'sparkops_fast_links' is a {type(raw).__name__}, not a list; write it as a list of "
            f"links, e.g. [{_EXAMPLE_LINK}]."
        )
        return []
    links = []
    for index, entry in enumerate(raw):
        where = f"{host}: fast link #{index} ({entry})"
        if not isinstance(entry, dict):
            problems.append(
                f"{where} is malformed. Each entry needs 'netdev' (e.g. enp1s0f1np1) and 'address' as IPv4 "
                "host address with prefix (e.g. 192.168.100.11/24)."
            )
            continue
        netdev = entry.get("netdev")
        address = entry.get("address")
        rdma = entry.get("rdma_device")
        bad = []
        if not isinstance(netdev, str) or not netdev.strip():
            bad.append("'netdev' (e.g. enp1s0f1np1) is missing")
        else:
            why = _name_problem("'netdev'", netdev.strip(), IFNAMSIZ)
            if why:
                bad.append(why)
            elif netdev.strip() == mgmt_interface:
                bad.append(
                    f"'netdev' {netdev.strip()} is the management interface (sparkops_mgmt_interface); netplan would "
                    "take its address away and cut the node off. List the QSFP interfaces (ibdev2netdev shows them)"
                )
        iface = None
        if not isinstance(address, str) or not _ADDRESS_RE.match(address.strip()):
            bad.append("'address' is not an IPv4 host address with prefix (e.g. 192.168.100.11/24)")
        else:
            try:
                iface = ipaddress.IPv4Interface(address.strip())
            except ValueError:
                bad.append(f"'address' {address} is not a valid IPv4 address with prefix")
            else:
                net = iface.network
                if net.prefixlen < 8 or net.prefixlen > 30:
                    bad.append(f"prefix /{net.prefixlen} is outside /8../30 (a cable subnet is e.g. a /24)")
                    iface = None
                elif iface.ip in (net.network_address, net.broadcast_address):
                    bad.append(f"{iface.ip} is the network or broadcast address of {net}; pick a host address")
                    iface = None
        if rdma is not None and (not isinstance(rdma, str) or not rdma.strip()):
            bad.append("'rdma_device' must be a name such as rocep1s0f1 (or left out)")
        elif rdma is not None:
            why = _name_problem("'rdma_device'", rdma.strip(), IB_DEVICE_NAME_MAX)
            if why:
                bad.append(why)
        if bad:
            problems.append(f"{where} is malformed: {'; '.join(bad)}. Example: {_EXAMPLE_LINK}.")
            rejected.add(str(iface.network) if iface is not None else "?")
            continue
        links.append(
            {
                "index": index,
                "netdev": netdev.strip(),
                "rdma_device": rdma.strip() if isinstance(rdma, str) else None,
                "address": str(iface),
                "ip": str(iface.ip),
                "prefix": iface.network.prefixlen,
                "cidr": str(iface.network),
            }
        )
    return links


def _check_settings(settings: dict, problems: list) -> None:
    hardware = _setting(settings, "sparkops_hardware", "dgx_spark")
    if hardware not in HARDWARE:
        problems.append(f"sparkops_hardware is '{hardware}'; valid values: {', '.join(HARDWARE)}.")
    mtu = _as_int(_setting(settings, "sparkops_fast_mtu", MIN_MTU))
    if mtu is None or mtu < MIN_MTU:
        problems.append(
            f"sparkops_fast_mtu is {settings.get('sparkops_fast_mtu')}; the QSFP links need MTU 9000 (RoCE and "
            "NCCL lose much of their bandwidth with smaller frames). Set sparkops_fast_mtu: 9000."
        )
    branch = str(_setting(settings, "sparkops_nvidia_driver_branch", "580"))
    if branch != "580":
        problems.append(
            f"sparkops_nvidia_driver_branch is '{branch}'. GB10 (SM121) must stay on the 580 driver branch: "
            '590.x has a regression on GB10. Set sparkops_nvidia_driver_branch: "580".'
        )
    version = str(_setting(settings, "nvidia_driver_version", ""))
    if version and not version.startswith(branch + "."):
        problems.append(
            f"nvidia_driver_version is '{version}', outside the {branch} branch. Pick a {branch}.x version "
            "(apt-cache policy nvidia-driver-580-open lists them) or leave it empty."
        )
    for name, default in (("ray_cluster_gcs_port", 6379), ("vllm_serve_port", 8000)):
        port = _as_int(_setting(settings, name, default))
        if port is None or not 1 <= port <= 65535:
            problems.append(f"{name} is '{settings.get(name)}'; give a TCP port number (1-65535).")
    why = _name_problem("sparkops_mgmt_interface", _setting(settings, "sparkops_mgmt_interface", "enP7s7"), IFNAMSIZ)
    if why:
        problems.append(f"{why}. Set it to the management interface's name (ip -br link shows it, enP7s7 on a Spark).")
    # Values end up in files read line by line (the containers' env file, netplan, the lock file):
    # a newline in one would add a line of the writer's choosing (e.g. LD_PRELOAD=...).
    for name in sorted(settings):
        value = settings[name]
        if isinstance(value, str) and _control_chars(value):
            problems.append(
                f"{name} contains control characters ({', '.join(repr(c) for c in _control_chars(value))}); "
                "remove them (a newline would add a line to the files sparkops writes)."
            )
    extra = settings.get("roce_network_env_extra")
    if extra is not None and not isinstance(extra, Mapping):
        problems.append(f"roce_network_env_extra is a {type(extra).__name__}; give a mapping NAME: value.")
    for key, value in extra.items() if isinstance(extra, Mapping) else ():
        if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
            problems.append(
                f"roce_network_env_extra: {key!r} is no environment variable name (letters, digits and '_', "
                "not starting with a digit)."
            )
        if _control_chars(str(value)):
            problems.append(
                f"roce_network_env_extra: the value of {key!r} contains control characters; an env file holds "
                "one variable per line, so a newline would add a variable of its own."
            )


def _check_roles(settings: dict, hosts: list, nodes: dict, mgmt: dict, problems: list, *, head) -> None:
    """The hosts named by settings exist, and the API binds to an address of the head."""
    for name in ("sparkops_weights_source_host", "sparkops_image_build_host"):
        value = _setting(settings, name, "")
        if value and str(value) not in hosts:
            problems.append(
                f"{name} is '{value}', which is not a host of group 'spark_cluster' ({', '.join(hosts) or 'none'}). "
                "Name one of them, or leave it empty for the head."
            )
    bind = _setting(settings, "vllm_serve_host", "")
    if not bind or head is None:
        return
    if not nodes[head]["links"]:
        return  # the head's links are malformed (reported): its addresses are unknown
    mine = [link["ip"] for link in nodes[head]["links"]] + [mgmt[head]]
    why = bind_problem(
        "vllm_serve_host", bind, mine, owner=f"the head {head}", what="The API", empty="the head's fast-link address"
    )
    if why:
        problems.append(why)


def bind_problem(
    variable: str,
    value,
    addresses: list,
    *,
    owner: str,
    what: str,
    allowed=("0.0.0.0",),  # noqa: S104 - values compared, not bound
    empty: str = "",
) -> str:
    """Why `value` cannot be the listen address of `variable` ("" when it can): it must be one of `addresses`
    (the owner's own) or of `allowed` (0.0.0.0: every IPv4 address), written as such. An IPv6 address
    (``::`` included) is refused: the SPARKOPS-* chains are iptables (IPv4) rules, and a service bound to
    IPv6 would answer every network, over the fe80:: address every interface has."""
    text = str(value)
    extra = [a for a in allowed if a not in addresses]
    valid_text = ", ".join(addresses) + (f" or {', '.join(extra)}" if extra else "")
    if "0.0.0.0" in extra:  # noqa: S104 - a value compared
        valid_text += " (0.0.0.0: every IPv4 address)"
    tail = f", or leave it empty for {empty}" if empty else ""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        address = None
    if address is not None and address.version == 6:
        return (
            f"{variable} is '{text}', an IPv6 address. sparkops' firewall chains (SPARKOPS-*) filter IPv4 only for "
            "now, so a port bound to IPv6 would be open to every network (every interface has an fe80:: address): "
            f"IPv6 binds are refused until the chains cover IPv6. Give {valid_text}{tail}."
        )
    if text not in addresses and text not in extra:
        return (
            f"{variable} is '{text}', which is none of {owner}'s addresses ({', '.join(addresses)}). {what} can "
            f"listen only on an IPv4 address of {owner}: give {valid_text}{tail}."
        )
    return ""


# --------------------------------------------------------------------------- topology
def _segments(nodes: dict, hosts: list) -> OrderedDict:
    """cidr -> [(host, link)] in inventory order, subnets ordered by first appearance."""
    segs: OrderedDict = OrderedDict()
    for h in hosts:
        for link in nodes[h]["links"]:
            segs.setdefault(link["cidr"], []).append((h, link))
    return segs


def _check_addresses(nodes: dict, hosts: list, mgmt: dict, problems: list, doubled: set | None = None) -> None:
    """Unique addresses, one link per subnet on each node (the subnets that break this go into `doubled`)."""
    doubled = set() if doubled is None else doubled
    owners: dict = {}
    for h in hosts:
        for link in nodes[h]["links"]:
            owners.setdefault(link["ip"], []).append(f"{h} {link['netdev']}")
    dups = {ip: who for ip, who in owners.items() if len(who) > 1}
    if dups:
        problems.append(
            "Fast-link addresses must be unique across the cluster; duplicated: "
            + ", ".join(f"{ip} (on {' and '.join(who)})" for ip, who in dups.items())
            + ". Give every interface of every node its own address."
        )
    for h in hosts:
        links = nodes[h]["links"]
        by_net: dict = {}
        for link in links:
            by_net.setdefault(link["cidr"], []).append(link)
        for cidr, same in by_net.items():
            if len(same) > 1:
                doubled.add(cidr)
                problems.append(
                    f"{h}: two fast links are on the same subnet {cidr} "
                    f"({', '.join(link['netdev'] + ' ' + link['address'] for link in same)}). The two PCIe "
                    "functions (twins) of a ConnectX-7 port need different subnets, or routing and NCCL "
                    "discovery get confused: move one twin to a subnet of its own."
                )
        netdevs = [link["netdev"] for link in links]
        for nd in sorted({n for n in netdevs if netdevs.count(n) > 1}):
            problems.append(f"{h}: netdev {nd} is listed twice in sparkops_fast_links; list each interface once.")
        ansible_host = mgmt.get(h)
        if ansible_host and ansible_host in owners:
            problems.append(
                f"{h}: ansible_host {ansible_host} is a fast-link address. Connect Ansible over the management "
                "interface (enP7s7); the fast links carry NCCL, Ray and weights only."
            )


def _cables(segs, hosts: list, ranks: dict) -> list:
    """Point-to-point subnets grouped by the two nodes they join: one cable, its subnets the lanes."""
    by_pair: OrderedDict = OrderedDict()
    for cidr, members in segs.items():
        if len(members) != 2:
            continue
        (ha, la), (hb, lb) = sorted(members, key=lambda m: ranks[m[0]])
        if ha == hb:
            continue
        by_pair.setdefault((ha, hb), []).append((cidr, la, lb))
    cables = []
    for (a, b), lanes in sorted(by_pair.items(), key=lambda kv: (ranks[kv[0][0]], ranks[kv[0][1]])):
        cables.append({"a": a, "b": b, "lanes": [_lane(cidr, a, la, b, lb) for cidr, la, lb in lanes]})
    return cables


def _end(host: str, link: dict) -> dict:
    return {"host": host, "netdev": link["netdev"], "rdma_device": link["rdma_device"], "ip": link["ip"]}


def _lane(cidr: str, a: str, la: dict, b: str, lb: dict) -> dict:
    return {"cidr": cidr, "a": _end(a, la), "b": _end(b, lb)}


def _cycle(hosts: list, neighbours: dict) -> list | None:
    """The nodes in ring order starting at the head, or None when they do not form one cycle."""
    if any(len(neighbours[h]) != 2 for h in hosts):
        return None
    start = hosts[0]
    order = [start]
    prev, cur = None, start
    while True:
        nxt = [n for n in sorted(neighbours[cur], key=hosts.index) if n != prev]
        step = nxt[0] if prev is not None else sorted(neighbours[cur], key=hosts.index)[0]
        if step == start:
            break
        if step in order:
            return None
        order.append(step)
        prev, cur = cur, step
    return order if len(order) == len(hosts) else None


def _check_topology(
    topology: str, hosts: list, segs, cables: list, problems: list, *, reported=frozenset()
) -> list | None:
    """Checks the declared topology against the subnets; returns the ring order for rings.

    `reported`: subnets whose links were already found wrong (a malformed link, "?" for one without a usable
    address, two links of one node on one subnet). What follows from them (a lane that reaches nobody, a
    cable short of a lane, a subnet with too many ends) is not said again: fixing the first problem fixes it.
    """
    n = len(hosts)
    incomplete = bool(reported)
    if topology == "pair":
        if n != 2:
            problems.append(
                f"sparkops_topology is pair but the cluster has {n} node(s) ({', '.join(hosts)}); a pair is "
                "exactly two Sparks joined by one cable. For more nodes declare switch or ring."
            )
    elif topology == "switch":
        if n < 2:
            problems.append(f"sparkops_topology is switch but the cluster has {n} node; a switch joins two or more.")
    elif topology in ("ring", "mesh"):
        if n < 3:
            problems.append(
                f"sparkops_topology is {topology} but the cluster has {n} node(s); a ring needs three or more "
                "(two Sparks on one cable are a pair)."
            )
        if topology == "mesh" and n != 3:
            problems.append(
                f"sparkops_topology is mesh but the cluster has {n} nodes; a full mesh of Sparks (two QSFP ports "
                "each) is three nodes. For more declare ring."
            )
    for cidr, members in segs.items():
        names = [h for h, _link in members]
        ends = ", ".join(f"{h} {link['netdev']} {link['ip']}" for h, link in members)
        if cidr in reported or (len(members) == 1 and "?" in reported):
            continue
        if len(members) == 1:
            h, link = members[0]
            problems.append(
                f"{h} {link['netdev']} {link['address']}: no other node has an address in {cidr}, so this link "
                "reaches nobody. Give the node at the cable's (or switch's) other end an address in that subnet, "
                "or remove the link."
            )
        elif topology == "switch" and len(set(names)) != n and "?" not in reported:
            missing = [h for h in hosts if h not in names]
            problems.append(
                f"switch subnet {cidr} holds {ends} but not {', '.join(missing)}; on a switch every fast subnet "
                f"holds every node: give {', '.join(missing)} an address in {cidr}."
            )
        elif topology in ("pair", "ring", "mesh") and len(members) > 2 and len(set(names)) > 2:
            problems.append(
                f"subnet {cidr} holds {len(set(names))} nodes ({ends}); on a {topology} each subnet is one cable "
                "lane with exactly two ends. Give each cable its own subnets (or declare sparkops_topology: "
                "switch if the nodes hang off a switch)."
            )
    if topology == "pair" and n == 2 and not incomplete:
        if len(cables) != 1:
            problems.append(
                f"the pair {hosts[0]} and {hosts[1]} share no fast subnet; both ends of a cable must be on one "
                "subnet per twin (e.g. 192.168.100.11/24 and 192.168.100.12/24)."
            )
        elif len(cables[0]["lanes"]) < 2:
            lane = cables[0]["lanes"][0]
            problems.append(
                f"the pair's cable carries one lane only ({lane['cidr']}: {lane['a']['netdev']} - "
                f"{lane['b']['netdev']}); full bandwidth needs both twins of the cabled port (e.g. enp1s0f1np1 "
                "and enP2p1s0f1np1), each on its own subnet: add the second twin to both nodes."
            )
    if topology in ("ring", "mesh") and n >= 3 and not incomplete:
        neighbours = {h: set() for h in hosts}
        for c in cables:
            neighbours[c["a"]].add(c["b"])
            neighbours[c["b"]].add(c["a"])
        short = [h for h in hosts if len(neighbours[h]) < 2]
        for h in hosts:
            nb = sorted(neighbours[h], key=hosts.index)
            if len(nb) < 2:
                others = [o for o in short if o != h and o not in nb]
                hint = f" (also short of a cable: {', '.join(others)})" if others else ""
                problems.append(
                    f"{h} is cabled to {len(nb)} node(s) ({', '.join(nb) or 'none'}); on a ring every node has "
                    f"one cable to each of two neighbours. A cable is missing{hint}: give both of its ends "
                    "addresses in one new subnet per twin."
                )
            elif len(nb) > 2:
                problems.append(
                    f"{h} is cabled to {len(nb)} nodes ({', '.join(nb)}); on a ring every node has exactly two "
                    "neighbours (a Spark has two QSFP ports)."
                )
        if not short and all(len(neighbours[h]) == 2 for h in hosts):
            order = _cycle(hosts, neighbours)
            if order is None:
                problems.append(
                    "the cables form several separate loops, not one ring: "
                    + "; ".join(f"{c['a']}-{c['b']}" for c in cables)
                    + ". Re-cable (or re-address) so that the nodes form one cycle."
                )
            return order
    return None


# ----------------------------------------------------------------------------- compute
def _ring_routes(order: list, nodes: dict, cables_by_pair: dict, segs) -> dict:
    """For each node, routes to every subnet it is not on, via the neighbour on the short way round.

    Ties (the subnet opposite on an odd ring, every far subnet of the 3-node mesh) go clockwise: through
    the next node in ``ring_order`` (order[i + 1]), so every node breaks them the same way round.
    """
    n = len(order)
    routes = {h: [] for h in order}
    for i, h in enumerate(order):
        mine = {link["cidr"] for link in nodes[h]["links"]}
        right, left = order[(i + 1) % n], order[(i - 1) % n]
        for cidr, members in segs.items():
            if cidr in mine:
                continue
            dists_r = [(order.index(m) - i) % n for m, _link in members]
            dists_l = [(i - order.index(m)) % n for m, _link in members]
            via = right if min(dists_r) <= min(dists_l) else left
            hops = min(*dists_r, *dists_l)
            lane = cables_by_pair[frozenset((h, via))]["lanes"][0]
            me, other = (lane["a"], lane["b"]) if lane["a"]["host"] == h else (lane["b"], lane["a"])
            routes[h].append({"to": cidr, "via": other["ip"], "dev": me["netdev"], "through": via, "hops": hops})
    return routes


FORWARD_CHAIN = "SPARKOPS-FWD"


def _forward_rules(netdevs: list) -> list:
    """iptables rules that let a ring node forward between its fast links and nothing else.

    Each rule is {"where": [...], "rule": [...]} for ``iptables <where> <rule>`` (``-C <chain> <rule>``
    checks it): FORWARD sends every packet that comes in or goes out on a fast link to FORWARD_CHAIN,
    which accepts one fast link to another and drops the rest (the management interface, Docker's
    bridges). Packets on no fast link (Docker's own NAT through the management interface) are left to
    the rest of FORWARD. The routes send traffic on, never back out of the link it came in on.
    """
    rules = []
    for inner in netdevs:
        for outer in netdevs:
            if inner != outer:
                rules.append(
                    {
                        "where": ["-I", FORWARD_CHAIN, "1"],
                        "rule": ["-i", inner, "-o", outer, "-m", "comment", "--comment",
                                 f"sparkops: ring forwarding {inner} to {outer}", "-j", "ACCEPT"],
                    }
                )  # fmt: skip
    rules.append(
        {
            "where": ["-A", FORWARD_CHAIN],
            "rule": ["-m", "comment", "--comment", "sparkops: no other forwarding to or from the fast links",
                     "-j", "DROP"],
        }
    )  # fmt: skip
    for dev in netdevs:
        for flag, way in (("-i", "from"), ("-o", "to")):
            rules.append(
                {
                    "where": ["-I", "FORWARD", "1"],
                    "rule": [flag, dev, "-m", "comment", "--comment", f"sparkops: forwarding {way} {dev}",
                             "-j", FORWARD_CHAIN],
                }
            )  # fmt: skip
    return rules


def _fanout(source: str, hosts: list, order: list | None, lane_ip) -> list:
    """Copy plan for the weights and the image: edges {from, to, ip, wave}.

    On a ring two chains leave the source, one each way, and every copy runs along a cable (each
    node forwards to the next); on a switch or pair a doubling tree (wave k: every node that holds
    the data sends to one that does not), so N nodes take ~log2(N) copy times, not N-1.
    """
    edges = []
    if order is not None:
        n = len(order)
        s = order.index(source)
        cw = [order[(s + k) % n] for k in range(1, n // 2 + 1)]
        ccw = [order[(s - k) % n] for k in range(1, (n - 1) // 2 + 1)]
        for chain in (cw, ccw):
            prev = source
            for wave, h in enumerate(chain, 1):
                edges.append({"from": prev, "to": h, "ip": lane_ip(prev, h), "wave": wave})
                prev = h
        return sorted(edges, key=lambda e: (e["wave"], hosts.index(e["to"])))
    have = [source]
    todo = [h for h in hosts if h != source]
    wave = 0
    while todo:
        wave += 1
        senders = list(have)
        for sender in senders:
            if not todo:
                break
            h = todo.pop(0)
            edges.append({"from": sender, "to": h, "ip": lane_ip(sender, h), "wave": wave})
            have.append(h)
    return edges


def _fabric_env(topology: str, n: int, node: dict) -> dict:
    primary = node["primary"]
    env = OrderedDict()
    env["VLLM_HOST_IP"] = primary["ip"]
    env["NCCL_SOCKET_IFNAME"] = primary["netdev"]
    env["NCCL_IB_HCA"] = ",".join(node["hcas"])
    env["NCCL_IB_DISABLE"] = "0"
    env["GLOO_SOCKET_IFNAME"] = primary["netdev"]
    env["TP_SOCKET_IFNAME"] = primary["netdev"]
    env["UCX_NET_DEVICES"] = primary["netdev"]
    env["OMPI_MCA_btl_tcp_if_include"] = primary["netdev"]
    if topology in ("ring", "mesh"):
        # What people running Spark meshes and rings set (spark-facts.md): keep the twins as
        # separate NICs, no external net plugin, and let NCCL pick the NIC on the peer's subnet.
        env["NCCL_IB_MERGE_NICS"] = "0"
        env["NCCL_NET_PLUGIN"] = "none"
        env["NCCL_IB_SUBNET_AWARE_ROUTING"] = "1"
        if n >= 4:
            env["NCCL_ALGO"] = "Ring"
    return dict(env)


def build_cluster(inputs: dict) -> dict:
    """The whole cluster model from the inventory, or ClusterError with every problem.

    inputs: {"groups": {group: [hosts]}, "hostvars": {host: {sparkops_fast_links, ansible_host}},
    "settings": {variable: value}} (settings: sparkops_topology, sparkops_hardware, sparkops_fast_mtu,
    image/endpoint/paths variables, inventory_dir; see roles/cluster_facts/meta/argument_specs.yml).
    """
    groups = inputs.get("groups") or {}
    hostvars = inputs.get("hostvars") or {}
    settings = inputs.get("settings") or {}
    problems: list = []

    hosts = list(dict.fromkeys(groups.get("spark_cluster") or []))
    heads = list(dict.fromkeys(groups.get("spark_head") or []))
    if not hosts:
        problems.append(
            "The inventory has no hosts in group 'spark_cluster'. Put every Spark in it, with one of them also "
            "in 'spark_head' (see inventory/two-sparks/hosts.yml)."
        )
    if len(heads) != 1:
        problems.append(
            f"Group 'spark_head' must hold exactly one host; it holds {len(heads)} "
            f"({', '.join(heads) if heads else 'none'}). The head runs the Ray head and the vLLM API server: "
            "pick one Spark and put only it in 'spark_head'."
        )
    elif hosts and heads[0] not in hosts:
        problems.append(
            f"The head '{heads[0]}' is not in group 'spark_cluster'. Make 'spark_head' a child of 'spark_cluster' "
            "(as in inventory/two-sparks/hosts.yml)."
        )
    if len(hosts) > MAX_NODES:
        problems.append(f"The cluster has {len(hosts)} nodes; sparkops models at most {MAX_NODES}.")
    topology = str(_setting(settings, "sparkops_topology", "pair"))
    if topology not in TOPOLOGIES:
        problems.append(f"sparkops_topology is '{topology}'; valid values: pair, switch, ring (mesh = 3-node ring).")
    _check_settings(settings, problems)

    head = heads[0] if len(heads) == 1 and heads[0] in hosts else None
    ordered = ([head] if head else []) + [h for h in hosts if h != head]
    ranks = {h: i for i, h in enumerate(ordered)}
    nodes: dict = {}
    mgmt: dict = {}
    mgmt_interface = str(_setting(settings, "sparkops_mgmt_interface", "enP7s7"))
    rejected: set = set()  # subnets of links refused as malformed: their absence was reported
    doubled: set = set()  # subnets that hold two links of one node: reported
    for h in ordered:
        hv = hostvars.get(h) or {}
        links = _parse_links(h, hv.get("sparkops_fast_links"), problems, mgmt_interface, rejected)
        mgmt[h] = str(hv.get("ansible_host") or h)
        if _control_chars(mgmt[h]):
            problems.append(f"{h}: ansible_host {mgmt[h]!r} contains control characters; give an address or name.")
        nodes[h] = {"links": links}
    _check_addresses(nodes, ordered, mgmt, problems, doubled)
    _check_roles(settings, ordered, nodes, mgmt, problems, head=head)
    segs = _segments(nodes, ordered)
    cables = _cables(segs, ordered, ranks)
    order = None
    if topology in TOPOLOGIES and ordered:
        order = _check_topology(topology, ordered, segs, cables, problems, reported=rejected | doubled)
    if problems:
        raise ClusterError(problems)
    return _assemble(topology, head, ordered, ranks, nodes, mgmt, segs, cables, order, settings)


def _assemble(topology, head, hosts, ranks, nodes, mgmt, segs, cables, order, settings) -> dict:  # noqa: PLR0913, PLR0917
    n = len(hosts)
    workers = hosts[1:]
    cables_by_pair = {frozenset((c["a"], c["b"])): c for c in cables}
    if topology == "switch":
        # A switch has no cables between nodes; for per-cable tests each worker's path to the
        # head counts as one, its lanes the shared subnets.
        cables = []
        for w in workers:
            lanes = []
            for cidr, members in segs.items():
                la = next(link for h, link in members if h == head)
                lb = next(link for h, link in members if h == w)
                lanes.append(_lane(cidr, head, la, w, lb))
            cables.append({"a": head, "b": w, "lanes": lanes})
    for h in hosts:
        node = nodes[h]
        node["rank"] = ranks[h]
        node["is_head"] = h == head
        node["mgmt_address"] = mgmt[h]
        node["primary"] = node["links"][0]
        node["ips"] = [link["ip"] for link in node["links"]]
        node["hcas"] = [link["rdma_device"] for link in node["links"] if link["rdma_device"]]
        node["netdevs"] = [link["netdev"] for link in node["links"]]
        pings, peers = [], []
        for cidr, members in segs.items():
            mine = [link for m, link in members if m == h]
            if not mine:
                continue
            for peer, plink in members:
                if peer == h:
                    continue
                if peer not in peers:
                    peers.append(peer)
                pings.append({"netdev": mine[0]["netdev"], "peer": peer, "ip": plink["ip"], "cidr": cidr})
        node["peers"] = sorted(peers, key=ranks.get)
        node["neighbours"] = list(node["peers"])
        node["pings"] = pings
        node["routes"] = []
        node["ssh_from"] = list(segs.keys())
    if order is not None:
        for h, rts in _ring_routes(order, nodes, cables_by_pair, segs).items():
            nodes[h]["routes"] = rts
            # A jumbo ping to each non-neighbour's address on a far subnet proves the route.
            for r in rts:
                for owner, link in segs[r["to"]]:
                    if owner != h and owner not in nodes[h]["neighbours"]:
                        nodes[h]["pings"].append(
                            {"netdev": r["dev"], "peer": owner, "ip": link["ip"], "cidr": r["to"], "routed": True}
                        )
    for h in hosts:
        nodes[h]["reachable"] = [p for p in hosts if p != h]
        # Only a node that routes forwards (roce_network turns ip_forward on where there are routes).
        nodes[h]["forward_rules"] = _forward_rules(nodes[h]["netdevs"]) if nodes[h]["routes"] else []
    for h in hosts:
        nodes[h]["env"] = _fabric_env(topology, n, nodes[h])

    def lane_ip(src: str, dst: str) -> str:
        cable = cables_by_pair.get(frozenset((src, dst)))
        if cable is not None:
            lane = cable["lanes"][0]
            return lane["a"]["ip"] if lane["a"]["host"] == dst else lane["b"]["ip"]
        src_nets = {link["cidr"] for link in nodes[src]["links"]}
        return next(
            (link["ip"] for link in nodes[dst]["links"] if link["cidr"] in src_nets), nodes[dst]["primary"]["ip"]
        )

    head_ip = nodes[head]["primary"]["ip"]
    gcs_port = _as_int(_setting(settings, "ray_cluster_gcs_port", 6379))
    port = _as_int(_setting(settings, "vllm_serve_port", 8000))
    bind = str(_setting(settings, "vllm_serve_host", "") or head_ip)
    url_host = head_ip if bind in ("0.0.0.0", "::") else bind  # noqa: S104 - a value compared, not bound

    ref = str(_setting(settings, "spark_vllm_image_ref", ""))
    # The image's exact name (commit and build arguments, or the lock's commit) is the serving plan's
    # (plugins/plugin_utils/serving.py plan_image): here only where it is built and how it spreads.
    build_host = str(_setting(settings, "sparkops_image_build_host", "") or head)
    weights_source = str(_setting(settings, "sparkops_weights_source_host", "") or head)
    image_source = build_host  # an unknown name was refused (_check_roles)

    inventory_dir = str(_setting(settings, "inventory_dir", "") or ".")
    state_dir = controller_state_dir(inventory_dir, _setting(settings, "sparkops_controller_state_dir", ""))
    credentials_dir = str(
        _setting(settings, "sparkops_credentials_dir", "") or posixpath.join(state_dir, "credentials")
    )
    reports_dir = str(_setting(settings, "sparkops_reports_dir", "") or posixpath.join(state_dir, "reports"))
    lock_file = str(_setting(settings, "sparkops_lock_file", "") or posixpath.join(state_dir, "sparkops.lock.json"))
    plan_file = str(_setting(settings, "sparkops_plan_file", "") or posixpath.join(state_dir, "sparkops-plan.json"))

    segments = [{"cidr": cidr, "hosts": [h for h, _link in members]} for cidr, members in segs.items()]
    return {
        "name": str(_setting(settings, "sparkops_cluster_name", "sparks")),
        "hardware": str(_setting(settings, "sparkops_hardware", "dgx_spark")),
        "topology": "ring" if topology == "mesh" else topology,
        "mesh": topology == "mesh" or (topology == "ring" and n == 3),
        "mtu": _as_int(_setting(settings, "sparkops_fast_mtu", MIN_MTU)),
        "mgmt_interface": str(_setting(settings, "sparkops_mgmt_interface", "enP7s7")),
        "size": n,
        "head": head,
        "workers": workers,
        "hosts": hosts,
        "ranks": dict(ranks),
        "ring_order": order or [],
        "nodes": nodes,
        "segments": segments,
        "cables": cables,
        "ray": {"head": head, "head_ip": head_ip, "port": gcs_port, "address": f"{head_ip}:{gcs_port}"},
        "endpoint": {"host": head, "bind": bind, "port": port, "url": f"http://{url_host}:{port}"},
        "image": {
            "repo": str(_setting(settings, "spark_vllm_image_repo", "")),
            "ref": ref,
            "build_host": image_source,
            "fanout": _fanout(image_source, hosts, order, lane_ip),
        },
        "weights": {
            "source": weights_source,
            "source_ip": nodes[weights_source]["primary"]["ip"],
            "targets": [h for h in hosts if h != weights_source],
            "fanout": _fanout(weights_source, hosts, order, lane_ip),
        },
        "paths": {
            "inventory_dir": inventory_dir,
            "state_dir": state_dir,
            "credentials_dir": credentials_dir,
            "api_key_file": posixpath.join(credentials_dir, "api_key"),
            "reports_dir": reports_dir,
            "lock_file": lock_file,
            "plan_file": plan_file,
        },
    }


def summary(model: dict) -> list:
    """A readable plan: nodes, cables, segments, peers, routes and what each stage would use."""
    mesh = " (3-node full mesh)" if model["mesh"] else ""
    out = [
        f"cluster {model['name']}: {model['topology']}{mesh} of {model['size']} node(s), MTU {model['mtu']}, "
        f"hardware {model['hardware']}",
        f"head {model['head']}; workers {', '.join(model['workers']) or 'none'}",
    ]
    for h in model["hosts"]:
        node = model["nodes"][h]
        links = ", ".join(
            f"{lk['netdev']}={lk['address']}" + (f"[{lk['rdma_device']}]" if lk["rdma_device"] else "")
            for lk in node["links"]
        )
        out.append(f"node {h} (rank {node['rank']}, mgmt {node['mgmt_address']}): {links}")
        out.append(f"  peers (cabled/switched): {', '.join(node['peers'])}")
        out.extend(
            f"  route {r['to']} via {r['via']} dev {r['dev']} ({r['through']}, {r['hops']} hops)"
            for r in node["routes"]
        )
    out.extend(f"segment {seg['cidr']}: {', '.join(seg['hosts'])}" for seg in model["segments"])
    for c in model["cables"]:
        lanes = "; ".join(
            f"{ln['a']['netdev']} {ln['a']['ip']} <-> {ln['b']['netdev']} {ln['b']['ip']}" for ln in c["lanes"]
        )
        out.append(f"cable {c['a']} - {c['b']}: {lanes}")
    ep, img, paths = model["endpoint"], model["image"], model["paths"]
    serving = model.get("serving") or {}
    if serving.get("ray_used", True):
        out.append(f"ray head {model['ray']['address']}")
    out.append(f"vLLM API on the head {ep['url']} (bind {ep['bind']}; clients: see Clients below)")
    # The image's exact tag (with its build arguments' hash) is the serving plan's: serving.summary prints it.
    out.append(f"image from {img['repo']} @ {img['ref']}, built on {img['build_host']}")
    waves = model["weights"]["fanout"]
    out.append(
        f"weights from {model['weights']['source']} in {max([e['wave'] for e in waves], default=0)} wave(s): "
        + ", ".join(f"{e['from']}->{e['to']}@{e['ip']} (w{e['wave']})" for e in waves)
    )
    if paths.get("state_dir"):
        out.append(f"controller: state folder {paths['state_dir']} (beside the inventory, never in it)")
    out.append(f"controller: API key file {paths['api_key_file']}, reports {paths['reports_dir']}")
    out.append(f"controller: lock file {paths['lock_file']}, plan {paths['plan_file']}")
    return out
