"""The SPARKOPS chains against real packets: three network namespaces joined by veth pairs (nothing leaves
this machine, and its own firewall is never touched).

    mgmt ns (10.77.0.2, fd77::2)  --mgmt0--  node ns  --fast0--  fast ns (192.168.77.2)
    the mgmt ns routes the fast subnet through the node (the weak-host walk-around)

In the node ns a dual-stack listener on the any address stands for Ray's GCS (gRPC binds `0.0.0.0`, which
gRPC opens as `[::]` without IPV6_V6ONLY, as `ss` shows `*:6379`), and one on the fast-link address at a port
no chain names stands for an mp rank's ephemeral ZMQ/gloo/NCCL port. The module writes SPARKOPS-RAY and
SPARKOPS-MP as the roles do; then the mgmt ns must reach neither (IPv4, IPv6, link-local), the fast ns both.
Skipped where this cannot run (not root, no `ip netns`, iptables or ip6tables).
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

PY_LISTEN = textwrap.dedent(
    """
    import socket, sys, time
    host, port = sys.argv[1], int(sys.argv[2])
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam)
    if fam == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen()
    print("listening", flush=True)
    s.settimeout(60)
    while True:
        try:
            c, _ = s.accept(); c.sendall(b"ok"); c.close()
        except socket.timeout:
            break
    """
)
PY_CONNECT = textwrap.dedent(
    """
    import socket, sys
    host, port = sys.argv[1], int(sys.argv[2])
    try:
        c = socket.create_connection((host, port), timeout=1.5)
        print(c.recv(2).decode() or "closed")
    except OSError as exc:
        print(type(exc).__name__)
    """
)
MODULE = textwrap.dedent(
    """
    import json, sys
    sys.path[:0] = sys.argv[1:3]
    from ansible_collections.sparkops.cluster.plugins.modules import iptables_chain
    from module_runner import run_module
    r = run_module(iptables_chain, json.loads(sys.argv[3]))
    assert not r.get("failed"), r
    """
)


def _run(*argv, check=True, **kw):
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=check, **kw)


@pytest.fixture
def namespaces(tmp_path):
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "iptables", "ip6tables")):
        pytest.skip("needs root, ip, iptables and ip6tables")
    tag = str(os.getpid())[-5:]
    names = {k: f"spfw-{k}-{tag}" for k in ("node", "mgmt", "fast")}
    if _run("ip", "netns", "add", names["node"], check=False).returncode:
        pytest.skip("ip netns add is not allowed here")
    procs = []
    try:
        for k in ("mgmt", "fast"):
            _run("ip", "netns", "add", names[k])
        node = ["ip", "netns", "exec", names["node"]]
        mgmt = ["ip", "netns", "exec", names["mgmt"]]
        fast = ["ip", "netns", "exec", names["fast"]]
        _run("ip", "link", "add", f"m{tag}", "netns", names["node"], "type", "veth", "peer", "name", f"mp{tag}",
             "netns", names["mgmt"])  # fmt: skip
        _run("ip", "link", "add", f"f{tag}", "netns", names["node"], "type", "veth", "peer", "name", f"fp{tag}",
             "netns", names["fast"])  # fmt: skip
        for ns, cmds in (
            (node, [["link", "set", "lo", "up"], ["link", "set", f"m{tag}", "up"], ["link", "set", f"f{tag}", "up"],
                    ["addr", "add", "10.77.0.1/24", "dev", f"m{tag}"],
                    ["-6", "addr", "add", "fd77::1/64", "dev", f"m{tag}", "nodad"],
                    ["addr", "add", "192.168.77.1/24", "dev", f"f{tag}"]]),
            (mgmt, [["link", "set", "lo", "up"], ["link", "set", f"mp{tag}", "up"],
                    ["addr", "add", "10.77.0.2/24", "dev", f"mp{tag}"],
                    ["-6", "addr", "add", "fd77::2/64", "dev", f"mp{tag}", "nodad"],
                    ["route", "add", "192.168.77.0/24", "via", "10.77.0.1"]]),
            (fast, [["link", "set", "lo", "up"], ["link", "set", f"fp{tag}", "up"],
                    ["addr", "add", "192.168.77.2/24", "dev", f"fp{tag}"]]),
        ):  # fmt: skip
            for c in cmds:
                _run(*ns, "ip", *c)
        for host, port in (("::", "6379"), ("192.168.77.1", "45555")):
            procs.append(subprocess.Popen([*node, sys.executable, "-c", PY_LISTEN, host, port], stdout=subprocess.PIPE))
        # Each listener says when it listens: the first connection must not race its start (seconds on a loaded
        # machine). Bounded: a listener that does not say so within 30 s fails the fixture.
        for p in procs:
            ready, _, _ = select.select([p.stdout], [], [], 30)
            assert ready and p.stdout.readline().strip() == b"listening", "a listener in the node ns did not start"
        # the node's own link-local address on the management link (every DGX OS interface has one)
        out = _run(*node, "ip", "-6", "-o", "addr", "show", "dev", f"m{tag}", "scope", "link").stdout
        link_local = out.split("inet6 ")[1].split("/")[0] if "inet6 " in out else None
        yield {"node": node, "mgmt": mgmt, "fast": fast, "tag": tag, "link_local": link_local, "tmp": tmp_path}
    finally:
        for p in procs:
            p.kill()
        for name in names.values():
            _run("ip", "netns", "del", name, check=False)


def connect(ns, host, port="6379"):
    return _run(*ns, sys.executable, "-c", PY_CONNECT, host, port).stdout.strip()


def chain(env, **args):
    import json  # noqa: PLC0415

    from conftest import ROOT as root  # noqa: PLC0415

    args.setdefault("rules_dir", str(env["tmp"] / "rules"))
    _run(*env["node"], sys.executable, "-c", MODULE, str(root / "collections"), str(root / "tests" / "unit"),
         json.dumps(args), env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})  # fmt: skip


def test_the_management_lan_reaches_no_guarded_port_over_ipv4_or_ipv6_and_the_fast_link_does(namespaces):
    env = namespaces
    tag = env["tag"]
    # Before any chain: everything answers everyone (the finding).
    assert connect(env["mgmt"], "10.77.0.1") == "ok"
    assert connect(env["mgmt"], "fd77::1") == "ok"
    assert connect(env["mgmt"], "192.168.77.1", "45555") == "ok"
    # Ray's chain for IPv4 alone (what the roles did before): IPv6 still walks around it.
    ray = {"chain": "SPARKOPS-RAY", "ports": ["6379"], "interfaces": [f"f{tag}"], "comment": "Ray"}
    chain(env, **ray, families=["ipv4"])
    assert connect(env["mgmt"], "10.77.0.1") == "TimeoutError"
    assert connect(env["mgmt"], "fd77::1") == "ok"
    # Both families (the module's default), and the mp ranks' chain with the fast-link address.
    chain(env, **ray)
    chain(env, chain="SPARKOPS-MP", ports=["29501"], destinations=["192.168.77.1"], interfaces=[f"f{tag}"],
          comment="vLLM ranks")  # fmt: skip
    assert connect(env["mgmt"], "10.77.0.1") == "TimeoutError"
    assert connect(env["mgmt"], "fd77::1") == "TimeoutError"
    if env["link_local"]:
        assert connect(env["mgmt"], f"{env['link_local']}%mp{tag}") == "TimeoutError"
    # an ephemeral port no chain names, at the fast-link address, through the management link
    assert connect(env["mgmt"], "192.168.77.1", "45555") == "TimeoutError"
    # the fast link reaches both; the node itself (loopback) too
    assert connect(env["fast"], "192.168.77.1") == "ok"
    assert connect(env["fast"], "192.168.77.1", "45555") == "ok"
    assert connect(env["node"], "::1") == "ok"
    # neighbour discovery still works on the management link: with the neighbour cache flushed, a port no
    # chain guards answers (a refusal needs the node's address resolved first)
    _run(*env["mgmt"], "ip", "-6", "neigh", "flush", "all")
    assert connect(env["mgmt"], "fd77::1", "2222") == "ConnectionRefusedError"
    assert "fd77::1 " in _run(*env["mgmt"], "ip", "-6", "neigh", "show").stdout
    assert sorted(os.listdir(env["tmp"] / "rules")) == [
        "SPARKOPS-MP.v4", "SPARKOPS-MP.v6", "SPARKOPS-RAY.v4", "SPARKOPS-RAY.v6"]  # fmt: skip
    # a reboot: the chains gone, the boot restore puts them back from the files
    for tool in ("iptables", "ip6tables"):
        _run(*env["node"], tool, "-w", "-F")
        _run(*env["node"], tool, "-w", "-X")
    assert connect(env["mgmt"], "fd77::1") == "ok"
    script = ROOT / "roles" / "firewall_boot" / "files" / "sparkops-firewall-restore"
    _run(*env["node"], "sh", str(script), str(env["tmp"] / "rules"))
    assert connect(env["mgmt"], "fd77::1") == "TimeoutError"
    assert connect(env["mgmt"], "192.168.77.1", "45555") == "TimeoutError"
    assert connect(env["fast"], "192.168.77.1", "45555") == "ok"
