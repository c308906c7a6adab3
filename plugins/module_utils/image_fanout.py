# Copyright: sparkops maintainers
# Apache-2.0
"""The image's streaming fan-out: which hops carry the stream, what each node runs, and the report.

The build host runs `docker save | zstd` once; the compressed stream flows along the cluster model's
fan-out edges (`sparkops_cluster.image.fanout`: a chain each way round a ring, a doubling tree on a
pair or switch). Every node on the way runs the relay (image_relay.py): it pipes its stdin to `zstd -d | docker
load` (only when it lacks the image) and, at the same time, to one ssh per child that runs the same
relay there. So a chain of N nodes takes about one transfer's time, not N-1.

The relay is a real file sent in the ssh command itself (base64, run by `python3 -c`; remote_exec.py),
so nothing is installed on the nodes. Every relay prints a JSON report (its load, and each child's report with the hop's
exit status and stderr), so the build host learns every hop's result from one stdout.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shlex
import subprocess
import sys
import tempfile
import time

from ansible_collections.sparkops.cluster.plugins.module_utils import image_relay
from ansible_collections.sparkops.cluster.plugins.module_utils.remote_exec import ARGV_BOOT as BOOT
from ansible_collections.sparkops.cluster.plugins.module_utils.remote_exec import source_b64


def _code_b64() -> str:
    """The relay's own source (image_relay.py), as the ssh command carries it."""
    return source_b64(image_relay)


def tree_problems(source: str, edges: list) -> list:
    """What makes `edges` not a tree rooted at `source` (each node reached once, from a node already reached)."""
    problems = []
    reached = {source}
    pending = list(edges)
    # Edges may come in any order: take each once its sender is reached (bounded by len(edges) passes).
    for _pass in range(len(edges) + 1):
        rest = []
        for e in pending:
            if not all(k in e for k in ("from", "to", "ip")):
                problems.append(f"edge {e!r} lacks from, to or ip")
            elif e["from"] in reached:
                if e["to"] in reached:
                    problems.append(f"{e['to']} is reached twice (again from {e['from']})")
                reached.add(e["to"])
            else:
                rest.append(e)
        if len(rest) == len(pending):
            break
        pending = rest
    problems += [f"edge {e['from']} -> {e['to']}: {e['from']} is never reached from {source}" for e in pending]
    return problems


def children_of(edges: list) -> dict:
    """node -> its children, in edge order."""
    out = {}
    for e in edges:
        out.setdefault(e["from"], []).append(e["to"])
    return out


def plan(source: str, edges: list, need: list) -> dict:
    """Which hops carry the stream and which nodes load, for the nodes in `need`.

    A node is on the way when it or a node below it needs the image; a subtree that needs nothing
    gets nothing. Returns {hops: [{from, to, ip, wave, load}], loads, relay_only, unreachable}.
    """
    kids = children_of(edges)
    want = set(need) - {source}
    on_way = {}

    def walk(node: str, depth: int) -> bool:
        # The tree is checked (tree_problems) before this; depth bounds a malformed one anyway.
        # Every child is walked (no short cut): each one's on_way is needed.
        below = [walk(c, depth + 1) for c in kids.get(node, [])] if depth <= len(edges) else []
        on_way[node] = node in want or True in below
        return on_way[node]

    walk(source, 0)
    hops = [
        {"from": e["from"], "to": e["to"], "ip": e["ip"], "wave": e.get("wave"), "load": e["to"] in want}
        for e in edges
        if on_way.get(e["from"]) and on_way.get(e["to"])
    ]
    reached = {h["to"] for h in hops}
    return {
        "hops": hops,
        "loads": [h["to"] for h in hops if h["load"]],
        "relay_only": [h["to"] for h in hops if not h["load"]],
        "unreachable": sorted(want - reached),
    }


def relay_spec(the_plan: dict, *, ssh: list, user: str, docker: str, python: str, timeout_s: float) -> dict:
    """What every relay reads: its children, their addresses, who loads, and how to reach them."""
    children = {}
    for h in the_plan["hops"]:
        children.setdefault(h["from"], []).append(h["to"])
    return {
        "children": children,
        "ip": {h["to"]: h["ip"] for h in the_plan["hops"]},
        "load": the_plan["loads"],
        "ssh": list(ssh),
        "user": user,
        "docker": docker,
        "python": python,
        "timeout_s": timeout_s,
    }


def encode_spec(spec: dict) -> str:
    return base64.b64encode(json.dumps(spec, sort_keys=True).encode()).decode()


def relay_argv(python: str, node: str, spec: dict) -> list:
    """The relay as an argv for `node` (the build host runs it locally with this)."""
    return [python, "-c", BOOT, _code_b64(), node, encode_spec(spec)]


def hop_command(spec: dict, parent: str, child: str) -> list:
    """The ssh argv `parent` runs to start the relay on `child` (what the relay builds; for tests and docs)."""
    remote = " ".join(shlex.quote(a) for a in [spec["python"], "-c", BOOT, _code_b64(), child, encode_spec(spec)])
    if child not in spec["children"].get(parent, []):
        raise ValueError(f"{parent} does not send to {child} in this plan")
    return [*spec["ssh"], f"{spec['user']}@{spec['ip'][child]}", remote]


def flatten(report: dict, want_load: list) -> dict:
    """Every hop's result from the build host's nested report: {hops, loaded, failed}."""
    hops, loaded, failed = [], [], []
    stack = list(report.get("children", []))
    for _step in range(10000):  # bounded walk (a tree of at most a few dozen hops)
        if not stack:
            break
        c = stack.pop(0)
        child = c.get("report") or {}
        load = child.get("load")
        problem = None
        if child.get("timeout"):
            problem = "the relay on the node timed out"
        elif c.get("rc") != 0 or not child:
            problem = f"ssh exited {c.get('rc')} without a relay report" + (
                f" ({c['error']})" if c.get("error") else ""
            )
        elif c.get("error"):
            problem = c["error"]
        elif c["to"] in want_load and not (load or {}).get("ok"):
            problem = (
                f"zstd -d | docker load failed there (zstd exit {(load or {}).get('zstd_rc')}, "
                f"docker exit {(load or {}).get('rc')}): {(load or {}).get('stderr') or (load or {}).get('error')}"
            )
        if load and load.get("ok"):
            loaded.append(c["to"])
        hop = {
            "from": c["from"],
            "to": c["to"],
            "ip": c["ip"],
            "ok": problem is None,
            "loaded": bool(load and load.get("ok")),
            "bytes": c.get("bytes", 0),
            "rc": c.get("rc"),
            "error": problem,
            "stderr": c.get("stderr", ""),
        }
        hops.append(hop)
        if problem:
            failed.append(hop)
        stack.extend(child.get("children", []))
    return {"hops": hops, "loaded": loaded, "failed": failed}


def describe_failure(hop: dict) -> str:
    stderr = hop["stderr"].strip().splitlines()[-3:] if hop.get("stderr") else []
    return f"{hop['from']} -> {hop['to']} ({hop['ip']}): {hop['error']}" + (
        f"; stderr: {' | '.join(stderr)}" if stderr else ""
    )


class TransferTimeout(Exception):
    """The relay on the build host did not end within its own bound plus a margin."""


def _tail(f, n=1500) -> str:
    f.seek(0)
    return f.read().decode("utf-8", "replace")[-n:].strip()


def stream_from_source(*, docker: str, image: str, zstd_level: int, source: str, spec: dict) -> dict:
    """`docker save IMAGE | zstd | relay` on the build host; the relay starts the whole tree.

    Returns {report (the nested relay report, or None), save_rc, zstd_rc, relay_rc, save_stderr,
    relay_stderr, seconds}; raises TransferTimeout (after killing the three) past spec's timeout.
    """
    with (
        tempfile.TemporaryFile() as save_err,
        tempfile.TemporaryFile() as relay_out,
        tempfile.TemporaryFile() as relay_err,
    ):
        # Temporary files, not pipes, for what nobody reads until the end (a full pipe would stall the stream).
        started = time.monotonic()
        save = subprocess.Popen([docker, "save", image], stdout=subprocess.PIPE, stderr=save_err)
        zstd = subprocess.Popen(
            ["zstd", "-q", "-T0", f"-{zstd_level}"], stdin=save.stdout, stdout=subprocess.PIPE, stderr=save_err
        )
        save.stdout.close()
        relay = subprocess.Popen(
            relay_argv(sys.executable, source, spec), stdin=zstd.stdout, stdout=relay_out, stderr=relay_err
        )
        zstd.stdout.close()
        procs = (save, zstd, relay)
        try:
            # The relay stops itself at timeout_s; the margin covers its report.
            relay.wait(timeout=float(spec["timeout_s"]) + 30)
            save_rc, zstd_rc = save.wait(timeout=30), zstd.wait(timeout=30)
        except subprocess.TimeoutExpired:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            for proc in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
            raise TransferTimeout from None
        report = None
        for line in reversed(_tail(relay_out, 10**7).splitlines()):
            try:
                report = json.loads(line)
                break
            except ValueError:
                continue
        return {
            "report": report,
            "save_rc": save_rc,
            "zstd_rc": zstd_rc,
            "relay_rc": relay.returncode,
            "save_stderr": _tail(save_err),
            "relay_stderr": _tail(relay_err),
            "seconds": round(time.monotonic() - started, 2),
        }
