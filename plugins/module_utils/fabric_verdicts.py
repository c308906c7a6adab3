# Copyright: sparkops maintainers
# Apache-2.0
"""What the roce_network role judges from fabric_facts' read, as ready answers (standard library only).

The role only reads these: a link not as the model says, a ring node's forwarding not live or not in its
file, a ring route missing, lanes that drop jumbo frames, and the list of everything that stops the play.
"""

from __future__ import annotations

import hashlib

# The two kernel settings a ring node's forwarding depends on, read on preconfigured links.
RING_SYSCTLS = ("net.ipv4.ip_forward", "net.ipv4.conf.all.rp_filter")


def link_problems(node: str, links: list, read: dict, mtu: int) -> list:
    """Each link (cluster model: netdev, address, ip) that lacks its address or a jumbo MTU."""
    out = []
    for link in links:
        now = read.get(link["netdev"]) or {"ipv4": [], "mtu": None}
        ip = link.get("ip") or str(link.get("address", "")).split("/", maxsplit=1)[0]
        if ip not in now["ipv4"] or int(now["mtu"] or 0) < int(mtu):
            out.append(
                f"{node}: {link['netdev']} has {', '.join(now['ipv4']) or 'no IPv4 address'} and MTU {now['mtu']}; "
                f"the inventory expects {link.get('address')} and MTU {mtu}."
            )
    return out


def ring_forwarding_problem(node: str, seen: dict) -> str | None:
    """A ring node on preconfigured links that does not forward, or drops replies that come back the other way."""
    forward, rp_filter = (seen.get(k) for k in RING_SYSCTLS)
    if forward == "1" and rp_filter != "1":
        return None
    return (
        f"{node}: net.ipv4.ip_forward={forward}, net.ipv4.conf.all.rp_filter={rp_filter}. A ring node forwards"
        " between its cables (ip_forward=1) and accepts replies that come back the other way round"
        " (rp_filter 0 or 2). Whoever preconfigures the links must set them (the simulated cluster does, with"
        " docker run --sysctl)."
    )


def sysctl_file_text(wanted: dict) -> str:
    """The file ansible.posix.sysctl keeps the settings in: `key=value` lines, in the order given."""
    return "".join(f"{k}={v}\n" for k, v in wanted.items())


def forwarding_stale(wanted: dict, seen: dict, file_sha1: str | None) -> bool:
    """A wanted setting is not live, or the file does not hold exactly the wanted lines."""
    if not wanted:
        return False
    live = any(seen.get(k) != str(v) for k, v in wanted.items())
    text = hashlib.sha1(sysctl_file_text(wanted).encode()).hexdigest()  # noqa: S324 - as hash('sha1') did
    return live or file_sha1 != text


def routes_missing(wanted: list, routes: list) -> list:
    """The wanted routes (to, via, dev) that `ip -j route` does not show with that destination, gateway and device."""
    have = {(r.get("dst"), r.get("gateway"), r.get("dev")) for r in routes if r.get("gateway") is not None}
    return [r for r in wanted if (r["to"], r["via"], r["dev"]) not in have]


def jumbo_problem(node: str, mtu: int, pings: list) -> str:
    """'' when every lane carried jumbo frames; else which lanes failed and why."""
    bad = [r for r in pings if not r["ok"]]
    if not bad:
        return ""
    lanes = ", ".join(
        f"{node} {r['netdev']} -> {r.get('peer', '?')} {r['ip']}{' (routed)' if r.get('routed') else ''}"
        f" ({r['detail'] or 'rc ' + str(r['rc'])})"
        for r in bad
    )
    return (
        f"Jumbo frames ({mtu} bytes, don't fragment) fail on: {lanes}. Check the MTU on both ends (ip link),"
        " with a switch on the switch ports, and on a ring the routes (ip route)."
    )


def problems(node: str, read: dict, *, rdma_required: bool) -> list:
    """Everything that stops the role's play, in this order: links, RDMA, GIDs, jumbo frames."""
    out = list(read["link_problems"])
    if not read["rdma_present"] and rdma_required:
        out.append(
            f"{node}: no RDMA device found ({read['reason']}). A Spark's ConnectX-7 shows up under"
            " /sys/class/infiniband (rocep1s0f0, roceP2p1s0f0, ...): check `ibdev2netdev` and that the mlx5"
            " modules are loaded."
        )
    if read["rdma_present"] and not read["gid_ok"]:
        out.append(f"{node}: " + " | ".join(c["reason"] for c in read["gid_checks"].values() if not c["ok"]))
    if read["jumbo_problem"]:
        out.append(read["jumbo_problem"])
    return out
