# Copyright: sparkops maintainers
# Apache-2.0
"""Parse `ray status` text and `ray list nodes --format json|yaml` output (standard library only).

`ray status` formats seen (fixtures in tests/fixtures/ray/, sources in its README.md):
- Ray 1.x-2.x: "Healthy:" / "Pending:" / "Recent failures:" and "Usage:" or "Total Usage:",
  alive entries as "<count> <node type>" (e.g. " 2 local.cluster.node");
- Ray 2.10+ (autoscaler v2): "Active:" / "Idle:" with one " 1 node_<id>" line per node,
  "Total Usage:", "Pending Demands:", GPU lines like "1.0/2.0 GPU (1.0 used of 2.0 reserved in
  placement groups)"; `-v` adds "Node: <id or ip> (<name>)" sections with their own Usage.
- "No cluster status. ..." while the head is still starting.

Measured on Ray 2.52.1: right after a worker's raylet dies, `ray status` keeps listing it under
"Active:" for a while, but "Total Usage" already shows the smaller GPU total. Judge readiness on
GPUs as well as nodes, and on `ray list nodes` states (ALIVE/DEAD) where available.
"""

from __future__ import annotations

import json
import re

_IP_RE = re.compile(r"\b(\d{1,3}(?:\.\d{1,3}){3})\b")
_RES_RE = re.compile(
    r"^\s*(?P<used>[\d.]+)\s*(?P<uunit>[KMGTPE]?i?B)?/(?P<total>[\d.]+)\s*(?P<tunit>[KMGTPE]?i?B)?"
    r"\s+(?P<name>[^\s(]+)(?:\s+\((?P<note>[^)]*)\))?\s*$"
)
_RESERVED_RE = re.compile(r"([\d.]+) used of ([\d.]+) reserved in placement groups")
_ALIVE_RE = re.compile(r"^\s+(\d+)\s+(\S.*?)\s*$")
_NODE_HDR_RE = re.compile(r"^Node:\s+(\S+)(?:\s+\((.*)\))?\s*$")
_ALIVE_SECTIONS = ("active", "healthy", "idle")

# Node ids, IPs, ALIVE/DEAD states and resources straight from Ray's GCS (ray.nodes()), printed in the
# shape of `ray list nodes --format json`. That command needs the dashboard (state API); this does not.
# Run inside the Ray container (python3 -c GCS_NODES_SCRIPT). The one copy of it: the module builds its
# default nodes_command from it, for readiness (ray_cluster), verify, status and the health report.
GCS_NODES_SCRIPT = (
    "import json, ray; "
    "ray.init(address='auto', logging_level='ERROR', log_to_driver=False); "
    "print(json.dumps([{'node_id': n['NodeID'], 'node_ip': n['NodeManagerAddress'], "
    "'state': 'ALIVE' if n['Alive'] else 'DEAD', 'resources_total': n.get('Resources', {}), "
    "'is_head_node': 'node:__internal_head__' in n.get('Resources', {})} for n in ray.nodes()]))"
)


class RayParseError(ValueError):
    """The text is not output this parser knows."""


def _resource(m: re.Match) -> dict:
    entry = {"used": float(m.group("used")), "total": float(m.group("total"))}
    note = m.group("note") or ""
    r = _RESERVED_RE.search(note)
    if r:
        entry["reserved"] = float(r.group(2))
    if m.group("tunit"):
        entry["unit"] = m.group("tunit")
    return entry


def parse_ray_status(text: str) -> dict:
    """`ray status` (optionally -v) -> dict; raise RayParseError on text that is not one."""
    if "No cluster status" in text:
        return {
            "available": False,
            "message": text.strip().splitlines()[0],
            "nodes_alive": 0,
            "node_ids": [],
            "alive_entries": [],
            "pending": [],
            "failures": [],
            "resources": {},
            "per_node": {},
            "demands": [],
            "gpus_total": 0.0,
            "gpus_used": 0.0,
            "gpus_reserved": 0.0,
            "node_ips": [],
        }
    if "Node status" not in text or "Resources" not in text:
        raise RayParseError(
            "not `ray status` output (no 'Node status' and 'Resources' sections): " + " ".join(text.split())[:200]
        )
    out: dict = {
        "available": True,
        "alive_entries": [],
        "node_ids": [],
        "pending": [],
        "failures": [],
        "resources": {},
        "per_node": {},
        "demands": [],
    }
    section = ""
    node = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or set(line.strip()) <= {"-", "="}:
            continue
        hdr = _NODE_HDR_RE.match(line)
        if hdr:
            node = hdr.group(1)
            out["per_node"][node] = {"name": hdr.group(2) or "", "resources": {}}
            section = "node"
            continue
        if not line.startswith(" "):
            # "Active:", "Total Usage:" ... open a section; "Node status", "Resources", the banner close one.
            section = line[:-1].strip().lower() if line.endswith(":") else ""
            node = None
            continue
        if line.startswith(" ") and line.strip().endswith(":") and node is not None:
            section = "node " + line.strip()[:-1].lower()
            continue
        body = line.strip()
        if body.startswith("(") and body.endswith(")"):
            continue  # "(no pending nodes)", "(no failures)", "(none)", ...
        if section in _ALIVE_SECTIONS:
            m = _ALIVE_RE.match(line)
            if m:
                count, name = int(m.group(1)), m.group(2)
                out["alive_entries"].append({"count": count, "name": name, "state": section})
                if name.startswith("node_"):
                    out["node_ids"].append(name[len("node_") :])
        elif section == "pending":
            out["pending"].append(body)
        elif section == "recent failures":
            out["failures"].append(body)
        elif section in ("usage", "total usage") and node is None:
            m = _RES_RE.match(line)
            if m:
                out["resources"][m.group("name")] = _resource(m)
        elif section == "node usage" and node is not None:
            m = _RES_RE.match(line)
            if m:
                out["per_node"][node]["resources"][m.group("name")] = _resource(m)
        elif "demands" in section:
            out["demands"].append(body)
    gpu = out["resources"].get("GPU", {})
    out["nodes_alive"] = sum(e["count"] for e in out["alive_entries"])
    out["gpus_total"] = gpu.get("total", 0.0)
    out["gpus_used"] = gpu.get("used", 0.0)
    out["gpus_reserved"] = gpu.get("reserved", 0.0)
    # IPs only where the format carries them: old `-v` "Node: 10.0.0.1" headers.
    out["node_ips"] = [n for n in out["per_node"] if _IP_RE.fullmatch(n)]
    out["pending_ips"] = [ip for p in out["pending"] for ip in _IP_RE.findall(p)]
    out["failed_ips"] = [ip for f in out["failures"] for ip in _IP_RE.findall(f)]
    return out


def _mini_yaml_nodes(text: str) -> list[dict]:
    """The YAML `ray list nodes --format yaml` prints, without PyYAML: a list of mappings
    whose values are scalars or one level of nested mapping."""
    nodes: list[dict] = []
    cur: dict | None = None
    nested: str | None = None
    base = None
    for source_line in text.splitlines():
        raw = source_line
        if not raw.strip() or raw.strip() in ("---", "..."):
            continue
        stripped = raw.lstrip()
        if stripped.startswith("- "):
            cur, nested = {}, None
            nodes.append(cur)
            base = len(raw) - len(stripped[2:].lstrip())
            raw = " " * base + stripped[2:].lstrip()
        if cur is None:
            raise RayParseError(f"unexpected YAML line: {raw.strip()[:80]}")
        indent = len(raw) - len(raw.lstrip())
        key, _sep, value = raw.strip().partition(":")
        value = value.strip()
        if indent <= (base or 0):
            nested = None
            if value == "":
                nested = key
                cur[key] = {}
            else:
                cur[key] = _scalar(value)
        elif nested is not None:
            cur[nested][key] = _scalar(value)
    return nodes


def _scalar(value: str):
    if value in ("null", "~", ""):
        return None
    if value in ("true", "True"):
        return True
    if value in ("false", "False"):
        return False
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    try:
        return float(value) if "." in value else int(value)
    except ValueError:
        return value


def parse_ray_nodes(text: str) -> list[dict]:
    """`ray list nodes --format json|yaml` -> [{node_id, node_ip, state, alive, is_head, gpus, ...}]."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            raw = json.loads(stripped)
        except ValueError as exc:
            raise RayParseError(f"`ray list nodes` JSON does not parse: {exc}") from exc
    elif stripped.startswith(("---", "-")):
        try:
            import yaml  # noqa: PLC0415 - optional on the target; the fallback covers Ray's output

            raw = yaml.safe_load(stripped)
        except ImportError:
            raw = _mini_yaml_nodes(stripped)
    else:
        raise RayParseError(
            "not `ray list nodes --format json|yaml` output (the table format is not "
            "parsed; add --format json): " + " ".join(stripped.split())[:200]
        )
    if not isinstance(raw, list):
        raise RayParseError("`ray list nodes` output is not a list of nodes")
    nodes = []
    for n in raw:
        if not isinstance(n, dict):
            raise RayParseError("`ray list nodes` output has an entry that is not a mapping")
        res = n.get("resources_total") or {}
        state = str(n.get("state") or "").upper()
        nodes.append(
            {
                "node_id": n.get("node_id"),
                "node_ip": n.get("node_ip"),
                "state": state,
                "alive": state == "ALIVE",
                "is_head": bool(n.get("is_head_node")),
                "gpus": float(res.get("GPU") or 0.0),
                "state_message": n.get("state_message"),
            }
        )
    return nodes


def looks_like_node_list(text: str) -> bool:
    return text.lstrip().startswith(("[", "---", "- "))


def membership(status: dict | None, nodes: list[dict] | None) -> dict:
    """The one answer to "which nodes and GPUs are in the cluster", from what was read.

    `status` is parse_ray_status() output (or None), `nodes` parse_ray_nodes() output (or None).
    With a node list, alive nodes are its ALIVE entries and the GPUs are theirs; `ray status` can
    only lower that GPU figure (Ray 2.52.1 keeps a dead worker under "Active:" for minutes while its
    Total Usage already lacks the worker's GPUs, fixtures *_worker_died*). Without a node list, the
    "Active:" count is all there is, and `source` says so.
    """
    status_ok = status is not None and status.get("available", False)
    r = {
        "nodes_alive": 0,
        "gpus_total": 0.0,
        "gpus_used": 0.0,
        "gpus_reserved": 0.0,
        "node_ips": [],
        "node_ids": [],
        "dead_node_ips": [],
        "pending": [],
        "failures": [],
        "demands": [],
        "ips_known": False,
        "available": False,
        "source": "none",
    }
    if status is not None:
        for key in ("gpus_used", "gpus_reserved", "pending", "failures", "demands"):
            r[key] = status.get(key, r[key])
    if status_ok:
        r.update(
            nodes_alive=status["nodes_alive"],
            gpus_total=status["gpus_total"],
            node_ids=list(status["node_ids"]),
            node_ips=list(status["node_ips"]),
            ips_known=bool(status["node_ips"]),
            available=True,
            source="ray status (its Active list can still hold a dead node)",
        )
    if nodes is not None:
        alive = [n for n in nodes if n["alive"]]
        alive_ips = {n["node_ip"] for n in alive if n["node_ip"]}
        gpus_alive = float(sum(n["gpus"] for n in alive))
        r.update(
            nodes_alive=len(alive),
            node_ids=[n["node_id"] for n in alive],
            node_ips=sorted(alive_ips),
            dead_node_ips=sorted({n["node_ip"] for n in nodes if not n["alive"] and n["node_ip"]} - alive_ips),
            gpus_total=min(gpus_alive, r["gpus_total"]) if status_ok else gpus_alive,
            ips_known=True,
            available=True,
            source="ray status and the GCS node list" if status_ok else "the GCS node list",
        )
    return r


def describe_membership(m: dict, expected_nodes: int | None = None, expected_gpus: float | None = None) -> str:
    """One sentence that status, verify and the health report all print, e.g.
    "1/2 nodes alive, 1.0/2.0 GPUs; dead: 10.213.0.12"."""
    nodes = f"{m['nodes_alive']}/{expected_nodes}" if expected_nodes is not None else str(m["nodes_alive"])
    gpus = f"{m['gpus_total']:.1f}"
    if expected_gpus is not None:
        gpus += f"/{float(expected_gpus):.1f}"
    msg = f"{nodes} nodes alive, {gpus} GPUs ({m['gpus_used']:.1f} used)"
    if m.get("missing_node_ips"):
        msg += f"; not joined: {', '.join(m['missing_node_ips'])}"
    if m.get("dead_node_ips"):
        msg += f"; dead: {', '.join(m['dead_node_ips'])}"
    if m.get("failures"):
        msg += f"; recent failures: {'; '.join(m['failures'][:3])}"
    return msg
