# Copyright: sparkops maintainers
# Apache-2.0
"""Tell from NCCL INFO logs (NCCL_DEBUG=INFO) which transport NCCL chose, per host/process (stdlib only).

Lines read (fixtures in tests/fixtures/nccl/, sources in its README.md):
- "<host>:<pid>:<tid> [<dev>] NCCL INFO <message>", or "NCCL INFO <message>" when a log was filtered;
- "NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.100.16<0>"
  (NCCL >= 2.23 merged form "[0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE}" too) -> IB verbs over those HCAs;
- "NET/Socket : Using [0]enP7s7:192.168.0.111<0>" -> TCP sockets; "NET/IB : No device found." precedes it;
- "Using network IB" / "Using network Socket" / "Using network IBext_v8" (a plugin);
- "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0" (the number is the NET device index);
- "Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM" and "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct": ranks on
  ONE host, over GPU peer-to-peer (NVLink or PCIe) or shared memory; no network carried them (recorded with
  NCCL 2.28.9 on two H100s of one host: tests/fixtures/nccl/busbw_probe_h100x2_one_host_*.txt). Such a log
  still says "Using network Socket" (the network NCCL would use between hosts), with no channel over it;
- "NCCL_IB_GID_INDEX set by environment to 3.", "NCCL_IB_HCA set to rocep1s0f1", "NCCL version 2.28.9+cuda13.0";
- plugin lines: "NET/Plugin: Could not find: libnccl-net.so", "Plugin Path : ...", "Initialized NET plugin IB".
"""

from __future__ import annotations

import re

_PREFIX_RE = re.compile(r"^\s*(?:\[\d+\]\s*)?(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<dev>\d+)\]\s+NCCL\s+")
_INFO_RE = re.compile(r"NCCL (?:INFO|WARN) (?P<msg>.*)$")
_USING_RE = re.compile(r"NET/(?P<net>[\w.-]+)\s*:\s*Using\s+(?P<rest>.*)$")
_HCA_RE = re.compile(r"([A-Za-z0-9_.\-]+):(\d+)/(RoCE|IB)\b")
_SOCK_RE = re.compile(r"\[\d+\]([^\s:\[\]]+):([^\s<]+)<\d+>")
_OOB_RE = re.compile(r"OOB\s+([^\s:]+):([^\s<]+)")
_NETWORK_RE = re.compile(r"^Using network (?P<name>.+?)\s*$")
_VIA_RE = re.compile(r"via NET/(?P<net>.+?)/(?P<dev>\d+)(?:/|\s|$)")
_VIA_LOCAL_RE = re.compile(r"via (?P<kind>P2P|SHM)/(?P<rest>\S+)")
_GID_RE = re.compile(r"NCCL_IB_GID_INDEX set (?:by environment )?to (-?\d+)")
_HCA_ENV_RE = re.compile(r"NCCL_IB_HCA set (?:by environment )?to (\S+)")
_VERSION_RE = re.compile(r"NCCL version (\S+)")
_RANK_RE = re.compile(r"\brank (\d+) n[Rr]anks (\d+)")
_PLUGIN_MARKERS = ("NET/Plugin", "Plugin Path", "P2P plugin", "NET plugin", "net plugin")

# Channel transports that stay inside one host (no network): what each is.
LOCAL_TRANSPORTS = {"P2P": "GPU peer-to-peer (NVLink or PCIe)", "SHM": "shared memory"}
LOCAL_HINT = (
    "the ranks ran on one host, so nothing crossed the fabric: run one rank per Spark (the probe's "
    "MASTER_ADDR on the head's fast-link address, RANK per node) to measure the link"
)

SOCKET_HINT = (
    "NCCL fell back to TCP sockets, RDMA is not in use: inside a container it needs the RDMA devices "
    "(--device=/dev/infiniband or privileged) and --ulimit memlock=-1; check NCCL_IB_HCA names and that "
    "NCCL_IB_DISABLE is not 1"
)


def transport_class(net_name: str | None) -> str | None:
    """'IB', 'IBext_v8' -> 'IB'; 'Socket' -> 'Socket'; other plugin names unchanged."""
    if not net_name:
        return None
    name = net_name.strip()
    if name.lower().startswith("ib"):
        return "IB"
    if name.lower().startswith("socket"):
        return "Socket"
    return name


def _endpoint(host: str | None, pid: str | None) -> dict:
    return {
        "host": host,
        "pid": pid,
        "ranks": [],
        "transport": None,
        "network": None,
        "hcas": [],
        "socket_ifs": [],
        "oob": None,
        "gid_index": None,
        "ib_hca_env": None,
        "nccl_version": None,
        "ib_no_device": False,
        "channel_transports": {},
        "channel_net_devs": [],
        "channel_local": [],
    }


def _add(items: list, value) -> None:
    if value is not None and value not in items:
        items.append(value)


def parse_nccl_transport(log_text: str) -> dict:
    """NCCL INFO log text -> {endpoints, hosts, transports, nccl_versions, nccl_version, gid_index, plugin_lines}.

    endpoints are keyed "host:pid" (from the line prefix), or by the OOB/socket address for prefix-less
    lines that carry one, else "unknown".
    """
    endpoints: dict[str, dict] = {}
    plugin_lines: list[str] = []
    versions: list[str] = []
    for raw in (log_text or "").splitlines():
        line = raw.rstrip()
        pm = _PREFIX_RE.match(line)
        im = _INFO_RE.search(line)
        vm = _VERSION_RE.search(line)
        if im is None and vm is None:
            continue
        msg = im.group("msg").strip() if im else line.strip()
        key = f"{pm.group('host')}:{pm.group('pid')}" if pm else None
        using = _USING_RE.search(msg)
        if key is None:
            addr = None
            if using:
                oob = _OOB_RE.search(using.group("rest")) or _SOCK_RE.search(using.group("rest"))
                addr = oob.group(2) if oob else None
            key = addr or "unknown"
        ep = endpoints.get(key)
        if ep is None:
            ep = endpoints[key] = _endpoint(pm.group("host") if pm else None, pm.group("pid") if pm else None)
        if vm:
            ep["nccl_version"] = ep["nccl_version"] or vm.group(1)
            _add(versions, vm.group(1))
        if any(marker in msg for marker in _PLUGIN_MARKERS):
            _add(plugin_lines, msg)
        if using:
            net = transport_class(using.group("net"))
            rest = using.group("rest")
            oob = _OOB_RE.search(rest)
            if net == "IB":
                for hca, _port, _kind in _HCA_RE.findall(rest.split("OOB")[0]):
                    _add(ep["hcas"], hca)
                if oob:
                    ep["oob"] = f"{oob.group(1)}:{oob.group(2)}"
            elif net == "Socket":
                for ifname, addr in _SOCK_RE.findall(rest):
                    _add(ep["socket_ifs"], f"{ifname}:{addr}")
            ep.setdefault("_using", []).append(net)
            continue
        if "NET/IB" in msg and "No device found" in msg:
            ep["ib_no_device"] = True
        nm = _NETWORK_RE.match(msg)
        if nm:
            ep["network"] = nm.group("name")
        local = _VIA_LOCAL_RE.search(msg)
        if local:
            kind = local.group("kind")
            ep["channel_transports"][kind] = ep["channel_transports"].get(kind, 0) + 1
            _add(ep["channel_local"], f"{kind}/{local.group('rest')}")
        via = _VIA_RE.search(msg)
        if via:
            cls = transport_class(via.group("net"))
            ep["channel_transports"][cls] = ep["channel_transports"].get(cls, 0) + 1
            _add(ep["channel_net_devs"], f"NET/{via.group('net')}/{via.group('dev')}")
        gm = _GID_RE.search(msg)
        if gm:
            ep["gid_index"] = int(gm.group(1))
        hm = _HCA_ENV_RE.search(msg)
        if hm:
            ep["ib_hca_env"] = hm.group(1)
        rm = _RANK_RE.search(msg)
        if rm:
            _add(ep["ranks"], int(rm.group(1)))
    for ep in endpoints.values():
        using = ep.pop("_using", [])
        counts = ep["channel_transports"]
        net_channels = {k: v for k, v in counts.items() if k not in LOCAL_TRANSPORTS}
        if counts and not net_channels:
            # Every channel inside one host: "Using network ..." names a network no channel used.
            ep["transport"] = max(sorted(counts), key=lambda t: counts[t])
        elif ep["network"]:
            ep["transport"] = transport_class(ep["network"])
        elif net_channels:
            ep["transport"] = max(sorted(net_channels), key=lambda t: net_channels[t])
        elif "Socket" in using and not ep["hcas"]:
            ep["transport"] = "Socket"
        elif using:
            ep["transport"] = using[-1]
        ep["channel_net_devs"].sort()
        ep["channel_local"].sort()
        ep["ranks"].sort()
    # Drop endpoints that carry nothing about the transport (e.g. a host seen only in unrelated lines).
    # (HCAs and socket interfaces come with a "Using" line, which always sets a transport.)
    endpoints = {
        k: v for k, v in endpoints.items() if v["transport"] or v["gid_index"] is not None or v["ib_no_device"]
    }
    hosts: dict[str, dict] = {}
    for ep in endpoints.values():
        host = ep["host"] or (ep["oob"] or "unknown")
        agg = hosts.setdefault(host, {"transports": [], "hcas": [], "socket_ifs": [], "gid_index": None})
        _add(agg["transports"], ep["transport"])
        for h in ep["hcas"]:
            _add(agg["hcas"], h)
        for s in ep["socket_ifs"]:
            _add(agg["socket_ifs"], s)
        if ep["gid_index"] is not None:
            agg["gid_index"] = ep["gid_index"]
    gids = sorted({ep["gid_index"] for ep in endpoints.values() if ep["gid_index"] is not None})
    return {
        "endpoints": endpoints,
        "hosts": hosts,
        "transports": sorted({ep["transport"] for ep in endpoints.values() if ep["transport"]}),
        "nccl_versions": versions,
        "nccl_version": versions[0] if versions else None,
        "gid_index": gids[0] if len(gids) == 1 else (gids or None),
        "plugin_lines": plugin_lines,
    }


def transport_verdict(parsed: dict, expected_hcas=None) -> dict:
    """Whether every endpoint in parsed used IB verbs (and, given expected_hcas, all of them).

    Returns {ok, message, problems}. Fails on sockets (also when only some channels ran over them), on a
    transport other than IB verbs (a plugin such as Libfabric), on an endpoint whose NET/IB lines chose
    nothing ("NET/IB : No device found." alone), on an endpoint that lists only some of expected_hcas (one
    twin only), on channels that ran over fewer NET devices than expected_hcas, and on a log with no
    transport lines.
    """
    expected = [h for h in (expected_hcas or []) if h]
    endpoints = parsed.get("endpoints")
    problems = []
    if not endpoints:
        return {
            "ok": False,
            "message": "no NCCL transport lines found: run with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET)",
            "problems": ["no transport lines"],
        }
    for key, ep in sorted(endpoints.items()):
        where = key
        # (A NET/Socket "Using" line always sets the transport, so socket_ifs imply "Socket" here.)
        if ep["transport"] == "Socket":
            ifs = ", ".join(ep["socket_ifs"]) or "a TCP interface"
            problems.append(f"{where}: NET/Socket over {ifs}; {SOCKET_HINT}")
            continue
        if ep["transport"] in LOCAL_TRANSPORTS:
            kinds = ", ".join(
                f"{LOCAL_TRANSPORTS[k]} (via {', '.join(x for x in ep['channel_local'] if x.startswith(k + '/'))})"
                for k in sorted(LOCAL_TRANSPORTS)
                if ep["channel_transports"].get(k)
            )
            problems.append(f"{where}: every channel ran over {kinds}, none over a network; {LOCAL_HINT}")
            continue
        if ep["transport"] not in ("IB", None):
            problems.append(f"{where}: transport {ep['transport']}, not IB verbs")
            continue
        if ep["transport"] is None:
            # Only NET/IB lines that chose nothing (e.g. "NET/IB : No device found."), or a GID index:
            # no proof that RDMA carried anything. (HCAs come with a "Using" line, which sets a transport.)
            problems.append(f"{where}: no transport chosen in the log (NET/IB No device found: {ep['ib_no_device']})")
            continue
        socket_channels = ep["channel_transports"].get("Socket", 0)
        if socket_channels:
            # Judged IB by its majority of channels, but some ran over TCP: not all traffic is RDMA.
            total = sum(ep["channel_transports"].values())
            problems.append(f"{where}: {socket_channels} of {total} channels over NET/Socket; {SOCKET_HINT}")
            continue
        if expected:
            if ep["hcas"]:
                missing = [h for h in expected if h not in ep["hcas"]]
                if missing:
                    problems.append(
                        f"{where}: NCCL uses only {', '.join(ep['hcas'])}; expected {', '.join(expected)} "
                        f"(missing {', '.join(missing)}): set NCCL_IB_HCA={','.join(expected)} and check that "
                        "every twin is up with its address"
                    )
                    continue
            devs = {d for d in ep["channel_net_devs"] if transport_class(d.split("/")[1]) == "IB"}
            if devs and len(devs) < len(expected):
                problems.append(
                    f"{where}: channels ran over only {', '.join(sorted(devs))} of {len(expected)} expected HCAs"
                )
    if problems:
        return {"ok": False, "message": "; ".join(problems), "problems": problems}
    hcas = sorted({h for ep in endpoints.values() for h in ep["hcas"]})
    via = f" over {', '.join(hcas)}" if hcas else ""
    return {
        "ok": True,
        "message": f"NCCL used IB verbs (RDMA){via} on all {len(endpoints)} endpoint(s)",
        "problems": [],
    }
