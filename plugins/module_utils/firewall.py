"""An iptables chain that keeps TCP ports to some interfaces and source networks (target side, stdlib only).

Linux accepts a packet for any of its addresses on any interface (the weak host model), so a service
bound to a fast-link address is still reached from the management LAN by a host with a static route to
the fast subnet. The chain makes the interface (or the client's network) the test, for IPv4 (iptables)
and IPv6 (ip6tables) alike:

    INPUT:  -p tcp -m multiport --dports <ports> -j <CHAIN>            (first rule)
            -d <this node's fast-link address> -j <CHAIN>            (optional: every port and protocol)
    CHAIN:  -i lo -j RETURN; -i <fast link> -j RETURN ...; -s <client network> -j RETURN ...; -j DROP

IPv6: the services bind IPv4 fast-link addresses (the plan has no IPv6 address), but Ray's gRPC servers
and anything on the any address also answer IPv6 (every interface has an fe80:: address). The IPv6 chain
passes loopback, ICMPv6 (neighbour discovery, path MTU), the links given an IPv6 address and IPv6 client
networks, and drops the rest.

RETURN hands the packet back to INPUT and its policy; DROP (not REJECT) answers nothing, as for Ray.
Every value is validated here (interface names by the kernel's rules, networks by ipaddress) and
reaches iptables as argv or through iptables-restore's input, never through a shell.

- chain_rules(chain, ports, interfaces, sources, what, family=, destinations=, interfaces6=) ->
  {"chain": [argv...], "jumps": [argv...], "jump": argv}: one family's rules, ValueError listing every bad value.
- restore_input(chain, rules) -> str: iptables-restore --noflush input that replaces CHAIN's rules in one
  commit (a declared user chain is flushed first; the other chains and tables stay).
- in_place(listing, rules, present) -> bool: whether `iptables -S CHAIN` shows exactly these rules (the
  count, each one found by `iptables -C`, DROP last).
- input_jumps / jumps_input: INPUT's jumps to a chain, and the restore input that replaces them.
- rules_file(chain, family, rules, jumps) -> str: the rules file the boot restore reads.
- parse_save(text), parse_ss_listening(text): what doctor reads of a node.
"""

from __future__ import annotations

import ipaddress
import re

CHAIN_RE = re.compile(r"^[A-Z][A-Z0-9_-]{0,27}$")  # iptables: at most 28 characters; ours are upper case


def valid_ifname(name: str) -> bool:
    """The kernel's dev_valid_name (net/core/dev.c): 1-15 bytes, not . or .., no /, : or white space."""
    return (
        isinstance(name, str)
        and 0 < len(name.encode()) < 16
        and name not in (".", "..")
        and not any(c in name for c in "/:")
        and not any(c.isspace() for c in name)
        and name.isprintable()
    )


def _ports(ports, problems: list[str]) -> list[str]:
    out = []
    for p in ports:
        text = str(p).strip()
        parts = text.split(":")
        ok = 0 < len(parts) <= 2 and all(x.isdigit() and 1 <= int(x) <= 65535 for x in parts)  # noqa: PLR2004
        if ok and len(parts) == 2 and int(parts[0]) >= int(parts[1]):  # noqa: PLR2004
            ok = False
        if not ok or isinstance(p, bool):
            problems.append(f"port {p!r} is not a TCP port (1-65535) or a range low:high")
        else:
            out.append(text)
    if not ports:
        problems.append("ports is empty: name the ports to guard")
    if len(ports) > 15:  # noqa: PLR2004 - iptables' multiport takes at most 15 ports
        problems.append(f"{len(ports)} ports: iptables' multiport match takes at most 15")
    return out


def _networks(sources, problems: list[str], what: str = "client network") -> list:
    """Every network of `sources` (IPv4 and IPv6 alike), as ipaddress networks, in order, once each."""
    out = []
    for s in sources:
        try:
            net = ipaddress.ip_network(str(s).strip(), strict=False)
        except ValueError:
            problems.append(f"{what} {s!r} is not an IPv4 or IPv6 network (a.b.c.d/len, x:y::/len or an address)")
            continue
        if net.prefixlen == 0:
            problems.append(f"{what} {s!r} is every address: leave it out and bind the service there instead")
            continue
        if net not in out:
            out.append(net)
    return out


def _family(family) -> int:
    if family not in (4, 6, "4", "6", "ipv4", "ipv6"):
        raise ValueError(f"family {family!r} must be ipv4 or ipv6")
    return 6 if str(family) in ("6", "ipv6") else 4


def chain_rules(
    chain: str,
    ports,
    interfaces,
    sources,
    what: str,
    *,
    family=4,
    destinations=(),
    interfaces6=(),
) -> dict:
    """One family's chain (argv after `-A CHAIN`) and INPUT's jumps (argv after `-I INPUT 1`).

    family 4 (iptables) or 6 (ip6tables). IPv4 passes loopback, `interfaces` and the IPv4 networks of
    `sources`; IPv6 passes loopback, ICMPv6 (neighbour discovery and path MTU must keep working), the
    `interfaces6` (links the plan gives an IPv6 address: none today) and the IPv6 networks of `sources`.
    INPUT jumps to the chain for the TCP `ports` and, for each of this family's `destinations`, for
    everything addressed there (every protocol and port: ephemeral ones included).
    Returns {"chain": [...], "jumps": [[...], ...], "jump": the ports' jump or None}.
    """
    problems: list[str] = []
    try:
        fam = _family(family)
    except ValueError as exc:
        problems.append(str(exc))
        fam = 4
    if not isinstance(chain, str) or not CHAIN_RE.match(chain):
        problems.append(f"chain {chain!r} must be 1-28 characters of A-Z, 0-9, - and _, starting with a letter")
    port_list = _ports(list(ports or []), problems) if ports or not destinations else []
    devs = []
    allowed_devs = ["lo", *list(interfaces or [] if fam == 4 else interfaces6 or [])]
    for dev in [*allowed_devs, *list(interfaces or []), *list(interfaces6 or [])]:
        if not valid_ifname(dev):
            problems.append(f"interface {dev!r} is not a valid Linux interface name (1-15 characters, no / : or space)")
        elif dev in allowed_devs and dev not in devs:
            devs.append(dev)
    nets = [str(n) for n in _networks(list(sources or []), problems) if n.version == fam]
    dests = []
    for n in _networks(list(destinations or []), problems, "destination"):
        if n.prefixlen != n.max_prefixlen:
            problems.append(f"destination {n} must be one address (this node's fast-link address), not a network")
        elif n.version == fam and str(n) not in dests:
            dests.append(str(n))
    if not isinstance(what, str) or not what or not what.isprintable() or '"' in what or len(what) > 100:  # noqa: PLR2004
        problems.append(f"comment {what!r} must be printable text of 1-100 characters without a double quote")
    if problems:
        raise ValueError("; ".join(problems))

    def tagged(text: str) -> list[str]:
        return ["-m", "comment", "--comment", f"sparkops: {text}"]

    rules = [["-i", dev, *tagged(f"{what} from {dev}"), "-j", "RETURN"] for dev in devs[:1]]
    if fam == 6:  # noqa: PLR2004
        rules.append(["-p", "ipv6-icmp", *tagged("ICMPv6 (neighbour discovery, path MTU)"), "-j", "RETURN"])
    rules += [["-i", dev, *tagged(f"{what} from {dev}"), "-j", "RETURN"] for dev in devs[1:]]
    rules += [["-s", net, *tagged(f"{what} from client network {net}"), "-j", "RETURN"] for net in nets]
    rules.append([*tagged(f"{what}: fast links and client networks only"), "-j", "DROP"])
    jump = None
    if port_list:
        jump = ["-p", "tcp", "-m", "multiport", "--dports", ",".join(port_list), *tagged(f"{what} ports"), "-j", chain]
    jumps = ([jump] if jump else []) + [["-d", d, *tagged(f"{what}: to {d}"), "-j", chain] for d in dests]
    return {"chain": rules, "jumps": jumps, "jump": jump}


def _quote(arg: str) -> str:
    # iptables-restore splits on white space and honours double quotes (our values hold none but comments)
    return f'"{arg}"' if any(c.isspace() for c in arg) else arg


def restore_input(chain: str, rules: list[list[str]]) -> str:
    lines = ["*filter", f":{chain} - [0:0]"]
    lines += [" ".join(["-A", chain, *(_quote(a) for a in rule)]) for rule in rules]
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def in_place(listing: str, rules: list[list[str]], present: list[bool]) -> bool:
    """listing: `iptables -S CHAIN`; present[i]: `iptables -C CHAIN rules[i]` succeeded."""
    appended = [line for line in listing.splitlines() if line.startswith("-A ")]
    return len(appended) == len(rules) and all(present) and bool(appended) and appended[-1].endswith("-j DROP")


def input_jumps(listing: str, chain: str) -> list[str]:
    """The lines of `iptables -S INPUT` (iptables-save's format) that jump to `chain`."""
    return [ln for ln in listing.splitlines() if ln.startswith("-A INPUT ") and ln.split()[-2:] == ["-j", chain]]


def jumps_input(chain: str, have: list[str], jumps: list[list[str]]) -> str:
    """iptables-restore --noflush input that replaces INPUT's jumps to `chain` (lines of `-S INPUT`) with
    `jumps`, first in INPUT and in order, in one commit (iptables-restore reads the quotes -S writes)."""
    lines = ["*filter"]
    lines += ["-D" + ln[2:] for ln in have]
    lines += [" ".join(["-I", "INPUT", "1", *(_quote(a) for a in j)]) for j in reversed(jumps)]
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


RULES_DIR = "/etc/sparkops/firewall"
FAMILY_SUFFIX = {4: "v4", 6: "v6"}


def _header(chain: str, family: int, writer: str) -> str:
    tool = "iptables" if family == 4 else "ip6tables"  # noqa: PLR2004
    return (
        f"# {chain} ({'IPv4' if family == 4 else 'IPv6'}): written by {writer}, restored at boot by "  # noqa: PLR2004
        f"sparkops-firewall ({tool}-restore --noflush). Edits are overwritten by the next run."
    )


def rules_file(chain: str, family: int, rules: list[list[str]], jumps: list[list[str]]) -> str:
    """The chain and its INPUT jumps as a rules file (iptables-save's format, one table, one commit), which
    the boot restore (sparkops-firewall) feeds to iptables-restore / ip6tables-restore --noflush after
    deleting the jumps to the chain already in INPUT and FORWARD: the other chains and rules stay."""
    lines = [_header(chain, family, "sparkops.cluster.iptables_chain"), "*filter", f":{chain} - [0:0]"]
    lines += [" ".join(["-A", chain, *(_quote(a) for a in rule)]) for rule in rules]
    lines += [" ".join(["-I", "INPUT", "1", *(_quote(a) for a in j)]) for j in reversed(jumps)]
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def rules_file_from(chain: str, family: int, entries: list[dict], writer: str) -> str:
    """A rules file from rules given as {"where": ["-I"|"-A", CHAIN, (position)], "rule": [...]} (the cluster
    model's forward_rules), in their order: replaying them after `:CHAIN` (which flushes it) rebuilds what the
    same `iptables <where> <rule>` calls built. Only `chain` and the built-in INPUT/FORWARD may be named."""
    lines = [_header(chain, family, writer), "*filter", f":{chain} - [0:0]"]
    for e in entries:
        where, rule = [str(w) for w in e["where"]], [str(a) for a in e["rule"]]
        ok = (
            len(where) in (2, 3)
            and where[0] in ("-I", "-A")
            and where[1] in (chain, "INPUT", "FORWARD")
            # A position only after -I, from 1 (iptables(8): `-I chain [rulenum]`, rule numbers start at 1;
            # `-A chain` takes none): anything else would be written here and refused only at the boot restore.
            and (len(where) == 2 or (where[0] == "-I" and where[2].isdigit() and int(where[2]) >= 1))  # noqa: PLR2004
            and all(a.isprintable() and '"' not in a for a in rule)
        )
        if not ok:
            raise ValueError(f"rule {where} {rule} is not one this file may hold")
        lines.append(" ".join([*where, *(_quote(a) for a in rule)]))
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- reading a node (doctor)
def parse_save(text: str) -> dict:
    """The filter table of `iptables-save` / `ip6tables-save` output: {"chains": [user chains],
    "hooks": {chain: jumps to it from INPUT or FORWARD}, "drops": {chain: whether its last rule is -j DROP},
    "ports": {chain: the TCP port specs INPUT sends to it (`6379`, `6381:6385`)}}.

    The format (iptables-save(8); iptables/iptables-save.c of netfilter's iptables 1.8): `*table`, a
    `:CHAIN POLICY [packets:bytes]` line per chain (`-` for a user chain), `-A CHAIN <rule>` per rule,
    `COMMIT`; `#` starts a comment line. A multiport match is `-m multiport --dports a,b:c`, a single port
    `-m tcp --dport a`.
    """
    chains: list[str] = []
    hooks: dict[str, int] = {}
    ports: dict[str, list[str]] = {}
    last: dict[str, str] = {}
    table = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("*"):
            table = line[1:]
            continue
        if table != "filter" or not line or line.startswith("#"):
            continue
        words = line.split()
        if line.startswith(":"):
            name = line[1:].split()[0] if line[1:].split() else ""
            if name and name not in ("INPUT", "FORWARD", "OUTPUT"):
                chains.append(name)
        elif words[0] == "-A" and len(words) > 1:
            last[words[1]] = line
            if words[1] in ("INPUT", "FORWARD") and words[-2:-1] == ["-j"]:
                target = words[-1]
                hooks[target] = hooks.get(target, 0) + 1
                for flag in ("--dports", "--dport"):
                    if (
                        words[1] == "INPUT"
                        and "-p" in words
                        and words[words.index("-p") + 1] == "tcp"
                        and flag in words
                    ):
                        ports.setdefault(target, []).extend(words[words.index(flag) + 1].split(","))
    drops = {c: last.get(c, "").split()[-2:] == ["-j", "DROP"] for c in chains}
    return {"chains": chains, "hooks": hooks, "drops": drops, "ports": ports}


_SS_ADDR = re.compile(r"^(?P<addr>\*|\[[0-9A-Fa-f:.]+\]|[0-9.]+)(?:%(?P<dev>[^:\s]+))?:(?P<port>\d+|\*)$")
WILDCARDS = ("*", "0.0.0.0", "[::]")  # noqa: S104 - what ss prints for the any addresses


def parse_ss_listening(text: str) -> list[dict]:
    """`ss -Hltnp` (listening TCP sockets, numeric, with processes, no header), one dict a socket:
    {address, interface, port, wildcard, v6only, process}.

    ss (iproute2 6.1.0 misc/ss.c:1705-1734 inet_addr_print, :1477-1487 sock_addr_print) writes the local
    address as `a.b.c.d:port`, `[v6]:port`, or `*:port` for an IPv6 socket on the any address that also
    takes IPv4 (not IPV6_V6ONLY); `[::]:port` is an IPv6-only any socket; `addr%dev:port` one bound to a
    device (SO_BINDTODEVICE). Columns: State, Recv-Q, Send-Q, Local Address:Port, Peer Address:Port, then
    the process (`users:(("name",pid=N,fd=M))`).
    Names are the processes' own (comm): text from the node, kept printable and short.
    """
    out = []
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 5 or cols[0] != "LISTEN":  # noqa: PLR2004
            continue
        m = _SS_ADDR.match(cols[3])
        if not m or m["port"] == "*":
            continue
        procs = re.findall(r'\("([^"]{0,64})",pid=(\d+)', " ".join(cols[5:]))
        name = ",".join(sorted({"".join(c for c in n if c.isprintable()) for n, _pid in procs}))
        out.append(
            {
                "address": m["addr"],
                "interface": m["dev"],
                "port": int(m["port"]),
                "wildcard": m["addr"] in WILDCARDS and not m["dev"],
                "v6only": m["addr"] == "[::]",
                "process": name[:120],
            }
        )
    return out
