# Copyright: sparkops maintainers
# Apache-2.0
"""The fabric's NCCL gate: read an all_gather bus-bandwidth table and judge it against a threshold.

Two producers write the same table: NVIDIA's nccl-tests (``all_gather_perf``: out-of-place and in-place
columns) and sparkops' own probe (``roles/fastpath/files/nccl_busbw_probe.py``: torch.distributed over
NCCL inside the serving image, out-of-place columns only). Both compute bus bandwidth as nccl-tests'
PERFORMANCE.md defines it for all_gather: ``algbw = S / t`` with S the gathered bytes (every rank's part),
``busbw = algbw * (n - 1) / n``. Standard library only: it runs on the controller and on the nodes.
"""

from __future__ import annotations

import math
import re

# NVIDIA's two-Spark setup expects at least 175 Gb/s on the bus: 21.875 GB/s.
DEFAULT_THRESHOLD_GBS = 21.875
# Only sizes from here up count for the verdict: small messages measure latency, not the link.
DEFAULT_MIN_BYTES = 64 << 20

_NUM = r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|inf|N/A)"
# size count type redop root time algbw busbw #wrong [time algbw busbw #wrong]
ROW_RE = re.compile(
    r"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>\w+)\s+(?P<redop>\S+)\s+(?P<root>-?\d+)\s+"
    rf"(?P<time>{_NUM})\s+(?P<algbw>{_NUM})\s+(?P<busbw>{_NUM})\s+(?P<wrong>\S+)"
    rf"(?:\s+(?P<ip_time>{_NUM})\s+(?P<ip_algbw>{_NUM})\s+(?P<ip_busbw>{_NUM})\s+(?P<ip_wrong>\S+))?\s*$"
)
AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<avg>\S+)")
RANKS_RE = re.compile(r"^#\s+Rank\s+(\d+)\s")
PROBE_RE = re.compile(r"^#\s*sparkops nccl_busbw_probe:\s*(?P<kv>.*)$")


def _num(text: str | None) -> float | None:
    if text is None or text == "N/A":
        return None
    value = float(text)
    return None if math.isnan(value) or math.isinf(value) else value


def parse_busbw(text: str) -> dict:
    """Rows (size, time_us, algbw_gbs, busbw_gbs, wrong) and what the header says, from either producer."""
    rows, ranks, info, avg = [], set(), {}, None
    for line in text.splitlines():
        if m := ROW_RE.match(line):
            busbw = [b for b in (_num(m["busbw"]), _num(m["ip_busbw"])) if b is not None]
            wrong = [w for w in (m["wrong"], m["ip_wrong"]) if w is not None]
            rows.append(
                {
                    "size": int(m["size"]),
                    "time_us": _num(m["time"]),
                    "algbw_gbs": _num(m["algbw"]),
                    "busbw_gbs": max(busbw) if busbw else None,
                    "wrong": sum(int(w) for w in wrong if w.isdigit()) if wrong else 0,
                    "unchecked": any(w == "N/A" for w in wrong),
                }
            )
        elif m := AVG_RE.match(line):
            avg = _num(m["avg"]) if m["avg"] != "N/A" else None
        elif m := RANKS_RE.match(line):
            ranks.add(int(m[1]))
        elif m := PROBE_RE.match(line):
            info.update(kv.split("=", 1) for kv in m["kv"].split() if "=" in kv)
    world = int(info["world_size"]) if "world_size" in info else (len(ranks) or None)
    return {"rows": rows, "avg_busbw_gbs": avg, "world_size": world, "probe": info}


def _fail(message: str, peak: float | None = None) -> dict:
    return {"verdict": "FAIL", "peak_busbw_gbs": peak, "message": message}


# Channel transports that stay inside one host (nccl_log.LOCAL_TRANSPORTS' keys; this file stays stdlib-only).
_LOCAL = {"P2P": "GPU peer-to-peer (NVLink or PCIe)", "SHM": "shared memory"}


def busbw_verdict(
    parsed: dict,
    threshold_gbs: float = DEFAULT_THRESHOLD_GBS,
    min_bytes: int = DEFAULT_MIN_BYTES,
    transports: list | None = None,
):
    """PASS when the best bus bandwidth at ``min_bytes`` and up reaches the threshold; FAIL otherwise, saying why.

    The best, not the average: nccl-tests' "Avg bus bandwidth" averages every size, small ones included, and
    says more about the size range than about the link. ``transports``: what the output's own NCCL INFO lines
    say the channels used (nccl_log.parse_nccl_transport); when every one stayed inside one host (P2P, SHM) the
    table measured that host, not the fabric, and is refused whatever its speed (two H100s of one host: 241 GB/s
    over P2P, 24.9 GB/s over SHM, tests/fixtures/nccl/busbw_probe_h100x2_one_host_*.txt)."""
    rows = parsed.get("rows") or []
    if not rows:
        return _fail("no bandwidth rows in the output: the probe did not run")
    if transports and set(transports) <= set(_LOCAL):
        used = " and ".join(f"{_LOCAL[t]} ({t})" for t in sorted(set(transports)))
        peak = max((r["busbw_gbs"] for r in rows if r["busbw_gbs"] is not None), default=None)
        return _fail(
            f"every NCCL channel ran over {used} inside one host: the table measured that host, not the fabric; "
            "run one rank per Spark",
            peak,
        )
    if parsed.get("world_size") == 1:
        return _fail(
            "world size 1: nothing crossed a link (bus bandwidth is 0 by definition); run it across nodes", 0.0
        )
    wrong = sum(r["wrong"] for r in rows)
    if wrong:
        return _fail(f"{wrong} wrong value(s) in the gathered data: the fabric corrupts data; check cables, firmware")
    large = [r for r in rows if r["size"] >= min_bytes and r["busbw_gbs"] is not None]
    if not large:
        return _fail(f"no size of at least {min_bytes} bytes was measured: run the probe up to a larger size")
    best = max(large, key=lambda r: r["busbw_gbs"])
    peak = best["busbw_gbs"]
    said = f"best all_gather bus bandwidth {peak:.2f} GB/s at {best['size']} bytes (threshold {threshold_gbs:g} GB/s)"
    if peak >= threshold_gbs:
        return {"verdict": "PASS", "peak_busbw_gbs": peak, "message": said}
    return _fail(
        said + ": below it. NCCL may have fallen back to TCP sockets (read its INFO log: "
        "`NET/Socket` instead of `NET/IB`), or uses one twin only (NCCL_IB_HCA must name both)",
        peak,
    )
