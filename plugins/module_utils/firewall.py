"""An iptables chain that keeps TCP ports to some interfaces and source networks (target side, stdlib only).

Linux accepts a packet for any of its addresses on any interface (the weak host model), so a service
bound to a fast-link address is still reached from the management LAN by a host with a static route to
the fast subnet. The chain makes the interface (or the client's network) the test, like Ray's
SPARKOPS-RAY chain (roles/ray_cluster/tasks/firewall.yml):

    INPUT:  -p tcp -m multiport --dports <ports> -j <CHAIN>            (first rule)
    CHAIN:  -i lo -j RETURN; -i <fast link> -j RETURN ...; -s <client network> -j RETURN ...; -j DROP

RETURN hands the packet back to INPUT and its policy; DROP (not REJECT) answers nothing, as for Ray.
Every value is validated here (interface names by the kernel's rules, networks by ipaddress) and
reaches iptables as argv or through iptables-restore's input, never through a shell.

- chain_rules(chain, ports, interfaces, sources, what) -> {"chain": [argv...], "jump": argv}: the rules,
  ValueError listing every bad value.
- restore_input(chain, rules) -> str: iptables-restore --noflush input that replaces CHAIN's rules in one
  commit (a declared user chain is flushed first; the other chains and tables stay).
- in_place(listing, rules, present) -> bool: whether `iptables -S CHAIN` shows exactly these rules (the
  count, each one found by `iptables -C`, DROP last).
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


def _networks(sources, problems: list[str]) -> list[str]:
    out = []
    for s in sources:
        try:
            net = ipaddress.ip_network(str(s).strip(), strict=False)
        except ValueError:
            problems.append(f"client network {s!r} is not an IPv4 network (a.b.c.d/len or an address)")
            continue
        if net.version != 4:  # noqa: PLR2004
            problems.append(f"client network {s!r} is IPv6: this chain is iptables (IPv4); the services listen on IPv4")
            continue
        if net.prefixlen == 0:
            problems.append(f"client network {s!r} is every address: leave it out and bind the service there instead")
            continue
        if str(net) not in out:
            out.append(str(net))
    return out


def chain_rules(chain: str, ports, interfaces, sources, what: str) -> dict:
    """The chain's rules (argv after `-A CHAIN`) and INPUT's jump (argv after `-I INPUT 1`)."""
    problems: list[str] = []
    if not isinstance(chain, str) or not CHAIN_RE.match(chain):
        problems.append(f"chain {chain!r} must be 1-28 characters of A-Z, 0-9, - and _, starting with a letter")
    port_list = _ports(list(ports or []), problems)
    devs = []
    for dev in ["lo", *list(interfaces or [])]:
        if not valid_ifname(dev):
            problems.append(f"interface {dev!r} is not a valid Linux interface name (1-15 characters, no / : or space)")
        elif dev not in devs:
            devs.append(dev)
    nets = _networks(list(sources or []), problems)
    if not isinstance(what, str) or not what or not what.isprintable() or '"' in what or len(what) > 100:  # noqa: PLR2004
        problems.append(f"comment {what!r} must be printable text of 1-100 characters without a double quote")
    if problems:
        raise ValueError("; ".join(problems))

    def tagged(text: str) -> list[str]:
        return ["-m", "comment", "--comment", f"sparkops: {text}"]

    rules = [["-i", dev, *tagged(f"{what} from {dev}"), "-j", "RETURN"] for dev in devs]
    rules += [["-s", net, *tagged(f"{what} from client network {net}"), "-j", "RETURN"] for net in nets]
    rules.append([*tagged(f"{what}: fast links and client networks only"), "-j", "DROP"])
    jump = ["-p", "tcp", "-m", "multiport", "--dports", ",".join(port_list), *tagged(f"{what} ports"), "-j", chain]
    return {"chain": rules, "jump": jump}


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
