# Copyright: sparkops maintainers
# Apache-2.0
"""Parse perftest's ``ib_write_bw`` output and judge a Spark cable from it.

Pure functions, Python >= 3.10 standard library only (they also run on the targets).

Units, as perftest prints them:

* ``Gb/sec`` (``--report_gbits``) is 10^9 bit/s;
* ``MB/sec`` (perftest before 2024) and ``MiB/sec`` (newer) are both 2^20 byte/s.

Every bandwidth this module returns is in Gb/s (10^9 bit/s).

A DGX Spark's ConnectX-7 shows each QSFP port as two PCIe functions ("twins",
``rocep1s0f1`` and ``roceP2p1s0f1``). One twin carries about 109 Gb/s each way; a
bidirectional (``-b``) ``ib_write_bw`` of a healthy cable reaches about 213 Gb/s per
twin, a degraded one about 119 (or 26) Gb/s per twin, while a one-way test still
reaches ~109 Gb/s. So the cable verdict compares each twin's *bidirectional* figure
with the threshold (190 Gb/s) and reports the sum of both twins alongside.
"""

from __future__ import annotations

import math
import re

# 2^20 bytes/s in Gb/s.
MIB_PER_S_IN_GBPS = 1048576 * 8 / 1e9

UNITS = ("Gb/sec", "MB/sec", "MiB/sec")

HEALTHY, DEGRADED, FAILED = "healthy", "degraded", "failed"

# Reasons a twin (and so a cable) has no usable figure.
REASONS = (
    "not_installed",
    "server_not_started",
    "peer_unreachable",
    "timed_out",
    "no_result",
    "qp_setup_failed",
    "no_rdma_device",
    "below_floor",
)

DEGRADED_ADVICE = (
    "Reboot the Sparks at both ends of this cable, then measure again.",
    "Restarting the link or the network driver does not clear this state.",
    "If the cable is still degraded after the reboot, reseat it at both ends (and try another cable).",
)

REASON_ADVICE = {
    "not_installed": "Install perftest on both ends: apt-get install perftest.",
    "server_not_started": "The ib_write_bw server did not start or listen on its port; check its output "
    "(port in use, wrong RDMA device) and start it before the client.",
    "peer_unreachable": "The client could not reach the server's test port over TCP or RDMA CM: check the "
    "peer address is on this twin's subnet, the link is up (ibdev2netdev) and no firewall blocks the port.",
    "timed_out": "The test did not finish before its deadline: check both ends run the same options and "
    "that the link is up; the process was killed.",
    "no_result": "ib_write_bw printed no bandwidth result: read its output.",
    "qp_setup_failed": "The queue pairs could not connect (GID/MTU/address mismatch): check RoCE v2 GID "
    "index 3 holds this twin's IPv4 address on both ends (/sys/class/infiniband/<dev>/ports/1/gids/3).",
    "no_rdma_device": "The RDMA device is missing: check ibdev2netdev and the mlx5 driver.",
    "below_floor": "The bandwidth is far below a degraded cable's: reseat or replace the cable, then reboot both ends.",
}

# One result row: #bytes, #iterations, BW peak, BW average, MsgRate (+ optional per-port columns).
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|-?nan|-?inf"
_ROW = re.compile(rf"^\s*(\d+)\s+(\d+)\s+({_NUM})\s+({_NUM})\s+({_NUM})(?:\s+.*)?$", re.IGNORECASE)
# The one group is the average's unit (perftest prints the same unit for the peak).
_HEADER = re.compile(r"#bytes\s+#?iterations\s+BW peak\[[^\]]+\]\s+BW average\[([^\]]+)\]")
_TITLE = re.compile(r"^\s*(RDMA_\w+|Send|Atomic\w*)\s+(?:(Bidirectional)\s+)?(?:Post List\s+)?BW Test\s*$")

# (pattern, error text, error kind). The first match in the output wins.
_ERRORS = (
    (
        re.compile(r"Unable to find the Infiniband/RoCE device|No IB devices found|Did not detect devices"),
        "Unable to find the Infiniband/RoCE device",
        "no_rdma_device",
    ),
    (re.compile(r"Couldn't get context for the device"), "Couldn't get context for the device", "no_rdma_device"),
    (
        re.compile(r"Couldn't listen to port|Failed to listen on RDMA CM|rdma_listen failed|Address already in use"),
        "port in use: Couldn't listen to port",
        "port_in_use",
    ),
    (re.compile(r"Couldn't connect to (\S+)"), "Couldn't connect", "connect_failed"),
    (
        re.compile(r"Unable to init the socket connection|Unable to open file descriptor for socket connection"),
        "Couldn't connect",
        "connect_failed",
    ),
    (
        re.compile(
            r"Failed to resolve RDMA CM (?:address|route)|Unable to connect \(retries|Failed to connect RDMA CM"
        ),
        "Couldn't connect over RDMA CM",
        "connect_failed",
    ),
    (re.compile(r"Failed to modify QP(?: \d+)? to (RTR|RTS|INIT)"), "Failed to modify QP to {0}", "qp_setup_failed"),
    (
        re.compile(r"Unable to Connect the HCA's through the link"),
        "Unable to Connect the HCA's through the link",
        "qp_setup_failed",
    ),
    (
        re.compile(r"Unable to create QP|Failed to create QP|Couldn't create IB resources"),
        "Couldn't create IB resources",
        "qp_setup_failed",
    ),
    (
        re.compile(r"Couldn't read remote address|Failed to exchange data between server and clients"),
        "Failed to exchange data between server and client",
        "exchange_failed",
    ),
    (re.compile(r"Completion with error|Failed status (\d+)"), "Completion with error", "completion_error"),
    (re.compile(r"timed out|Timeout", re.IGNORECASE), "timed out", "timed_out"),
)

_SIDE_SERVER = re.compile(r"Waiting for client to connect|Waiting for client rdma_cm QP to connect")


def to_gbps(value: float | None, unit: str | None) -> float | None:
    """Convert a perftest bandwidth figure in ``unit`` (Gb/sec, MB/sec, MiB/sec) to Gb/s."""
    if value is None or unit is None:
        return None
    if unit == "Gb/sec":
        return float(value)
    if unit in ("MB/sec", "MiB/sec"):
        return float(value) * MIB_PER_S_IN_GBPS
    raise ValueError(f"unknown perftest unit {unit!r}; expected one of {', '.join(UNITS)}")


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) or math.isinf(value) else value


def _int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    match = re.match(r"\s*(\d+)", text)
    return int(match.group(1)) if match else None


_FIELD_NAMES = (
    "Device",
    "Number of qps",
    "Transport type",
    "Connection type",
    "Mtu",
    "Link type",
    "GID index",
    "rdma_cm QPs",
    "Data ex. method",
    "TX depth",
)


def _fields(text: str) -> dict[str, str]:
    """``Name : value`` pairs of perftest's header block (two per line in places)."""
    found: dict[str, str] = {}
    for name in _FIELD_NAMES:
        match = re.search(rf"(?:^|\s){re.escape(name)}\s*:\s*(\S+)", text, re.MULTILINE)
        if match:
            found[name] = match.group(1)
    return found


def _find_error(text: str) -> tuple[str | None, str | None]:
    for pattern, message, kind in _ERRORS:
        match = pattern.search(text)
        if not match:
            continue
        if "{0}" in message:
            return message.format(match.group(1)), kind
        if match.re.pattern.startswith("Couldn't connect to"):  # the one pattern that captures the address
            return f"Couldn't connect to {match.group(1)}", kind
        return message, kind
    return None, None


def parse_ib_write_bw(text: str | None) -> dict:
    """Parse the standard output (and error) of one ``ib_write_bw`` run, client or server side.

    Works for perftest's older (``MB/sec``) and newer (``MiB/sec``) byte units and for
    ``--report_gbits``; single size, ``-a`` (all sizes), ``-q N``, ``-b``, ``-D``,
    ``--run_infinitely`` and rdma_cm (``-R``) runs; outputs cut short. A field the output
    lacks is None. The figures of the *result row* are those of the largest message size
    measured (the last row of that size for ``--run_infinitely``).
    """
    text = text or ""
    lines = text.splitlines()
    fields = _fields(text)

    unit = None
    header_at = None
    for index, line in enumerate(lines):
        match = _HEADER.search(line)
        if match:
            unit = match.group(1).strip()
            header_at = index
    units_seen: list[str] = []
    for match in filter(None, map(_HEADER.search, lines)):
        if match.group(1).strip() not in units_seen:
            units_seen.append(match.group(1).strip())

    rows = []
    if header_at is not None:
        # Rows follow their header; with several headers (repeated runs) each applies to the rows below it.
        row_unit = None
        for line in lines:
            header = _HEADER.search(line)
            if header:
                row_unit = header.group(1).strip()
                continue
            match = _ROW.match(line)
            if not match or row_unit is None:
                continue
            peak, avg, rate = (_number(match.group(i)) for i in (3, 4, 5))
            rows.append(
                {
                    "msg_size_bytes": int(match.group(1)),
                    "iterations": int(match.group(2)),
                    "bw_peak": peak,
                    "bw_avg": avg,
                    "unit": row_unit,
                    "bw_peak_gbps": to_gbps(peak, row_unit) if row_unit in UNITS else None,
                    "bw_avg_gbps": to_gbps(avg, row_unit) if row_unit in UNITS else None,
                    "msg_rate_mpps": rate,
                }
            )

    title = next((m for m in map(_TITLE.match, lines) if m), None)
    warning_no_peak = "BW peak won't be measured" in text
    error, error_kind = _find_error(text)

    result_row = None
    if rows:
        largest = max(row["msg_size_bytes"] for row in rows)
        result_row = [row for row in rows if row["msg_size_bytes"] == largest][-1]

    peak_measured = None
    if result_row is not None:
        # perftest prints a peak of 0.00 when it did not measure one (duration runs); a 0 peak is a
        # measured zero only next to a 0 average (a NaN average, None here, says nothing either).
        avg = result_row["bw_avg"]
        peak_measured = not (warning_no_peak or (result_row["bw_peak"] == 0 and (avg is None or avg > 0)))
    elif warning_no_peak:
        peak_measured = False

    if _SIDE_SERVER.search(text) or error_kind == "port_in_use":
        side = "server"
    elif error_kind == "connect_failed" or title is not None:
        side = "client"
    else:
        side = None

    rdma_cm = fields.get("rdma_cm QPs")
    gid = fields.get("GID index")
    return {
        "test": " ".join(title.group(0).split()) if title else None,
        "bidirectional": (title.group(2) is not None) if title else None,
        "device": fields.get("Device"),
        "side": side,
        "qps": _int_or_none(fields.get("Number of qps")),
        "transport": fields.get("Transport type"),
        "connection_type": fields.get("Connection type"),
        "mtu": _int_or_none(fields.get("Mtu")),
        "link_type": fields.get("Link type"),
        "gid_index": _int_or_none(gid),
        "rdma_cm": None if rdma_cm is None else rdma_cm.upper() == "ON",
        "data_exchange": fields.get("Data ex. method"),
        "tx_depth": _int_or_none(fields.get("TX depth")),
        "unit": unit,
        "units_seen": units_seen,
        "rows": rows,
        "msg_size_bytes": result_row["msg_size_bytes"] if result_row else None,
        "iterations": result_row["iterations"] if result_row else None,
        "bw_peak_gbps": result_row["bw_peak_gbps"] if peak_measured else None,  # measured: there is a row
        "bw_avg_gbps": result_row["bw_avg_gbps"] if result_row else None,
        "msg_rate_mpps": result_row["msg_rate_mpps"] if result_row else None,
        "bw_peak_measured": peak_measured,
        "duration_s": None,
        "error": error,
        "error_kind": error_kind,
    }


def line_rate_threshold(line_rate_gbps: float, fraction: float) -> float:
    """The pass mark ``line_rate_gbps * fraction`` (e.g. 200 Gb/s x 0.95), checked."""
    if line_rate_gbps is None or line_rate_gbps <= 0:
        raise ValueError(f"line_rate_gbps must be a positive number of Gb/s, got {line_rate_gbps!r}")
    if fraction is None or not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    return float(line_rate_gbps) * float(fraction)


def failure_reason(result: dict) -> str | None:
    """Map one twin's result (parse_ib_write_bw output, or the ib_write_bw module's result) to a reason.

    None when the result carries a bandwidth figure. Honours an explicit ``reason`` key,
    ``not_installed`` / ``timed_out`` flags, and a ``server`` sub-result whose side failed.
    """
    if result.get("reason") in REASONS:
        return result["reason"]
    if result.get("not_installed"):
        return "not_installed"
    kind = result.get("error_kind")
    server = result.get("server") or {}
    if kind == "no_rdma_device" or server.get("error_kind") == "no_rdma_device":
        return "no_rdma_device"
    if server.get("error_kind") in ("port_in_use", "not_installed") or server.get("started") is False:
        return "not_installed" if server.get("error_kind") == "not_installed" else "server_not_started"
    if kind == "port_in_use":
        return "server_not_started"
    if result.get("timed_out") or kind == "timed_out":
        return "timed_out"
    if kind == "connect_failed":
        return "peer_unreachable"
    if kind == "qp_setup_failed":
        return "qp_setup_failed"
    if result.get("bw_avg_gbps") is None:
        return "no_result"
    return None


def cable_verdict(per_twin_results, threshold_gbps: float = 190.0, degraded_floor_gbps: float | None = None) -> dict:
    """Classify one cable from the bidirectional ``ib_write_bw`` result of each of its twins.

    ``per_twin_results``: a list of twin results, or a dict ``{device: result}``. Each result is
    what ``parse_ib_write_bw`` or the ``ib_write_bw`` module returns (``bw_avg_gbps``,
    ``error_kind``, ``device``, optionally ``timed_out``, ``not_installed``, ``reason`` and a
    ``server`` sub-result). A Spark cable has two twins; both must be given.

    Each twin's figure is compared with ``threshold_gbps`` (healthy at or above it; on a
    Spark ~213 Gb/s is healthy, ~119 degraded). The cable is ``failed`` when any twin has no
    figure (with that twin's ``reason``) or, with ``degraded_floor_gbps`` set, a figure below
    that floor (``below_floor``); else ``degraded`` when any twin is below the threshold (with
    the repair ``advice``); else ``healthy``. ``total_gbps`` is the sum of both twins.
    """
    if threshold_gbps is None or threshold_gbps <= 0:
        raise ValueError(f"threshold_gbps must be a positive number of Gb/s, got {threshold_gbps!r}")
    if degraded_floor_gbps is not None and not 0 <= degraded_floor_gbps < threshold_gbps:
        raise ValueError(
            f"degraded_floor_gbps must be between 0 and threshold_gbps ({threshold_gbps}), got {degraded_floor_gbps!r}"
        )
    if isinstance(per_twin_results, dict):
        items = [
            dict(result or {}) | {"device": (result or {}).get("device") or name}
            for name, result in per_twin_results.items()
        ]
    else:
        items = [dict(result or {}) for result in per_twin_results or []]

    twins = []
    notes = []
    for item in items:
        gbps = item.get("bw_avg_gbps", item.get("gbps"))
        reason = failure_reason(item) if gbps is None else None
        if reason is None and gbps is None:
            reason = "no_result"
        if reason is not None:
            verdict = FAILED
        elif degraded_floor_gbps is not None and gbps < degraded_floor_gbps:
            verdict, reason = FAILED, "below_floor"
        elif gbps >= threshold_gbps:
            verdict = HEALTHY
        else:
            verdict = DEGRADED
        if item.get("bidirectional") is False:
            notes.append(
                f"{item.get('device') or 'a twin'} was measured one way; a one-way test does not "
                "show a degraded cable (run ib_write_bw with -b)."
            )
        twins.append(
            {
                "device": item.get("device"),
                "gbps": gbps,
                "verdict": verdict,
                "reason": reason,
                "error": item.get("error"),
            }
        )

    if not twins:
        twins_verdict, reason = FAILED, "no_result"
    elif any(t["verdict"] == FAILED for t in twins):
        twins_verdict = FAILED
        reason = next(t["reason"] for t in twins if t["verdict"] == FAILED)
    elif any(t["verdict"] == DEGRADED for t in twins):
        twins_verdict, reason = DEGRADED, None
    else:
        twins_verdict, reason = HEALTHY, None
    if len(twins) == 1:
        notes.append("Only one twin was measured; a Spark port has two (both carry the cable's traffic).")

    figures = [t["gbps"] for t in twins]
    total = sum(figures) if figures and all(f is not None for f in figures) else None
    known = [f for f in figures if f is not None]
    if twins_verdict == DEGRADED:
        advice = list(DEGRADED_ADVICE)
    elif twins_verdict == FAILED:
        advice = [REASON_ADVICE[reason]]
    else:
        advice = []
    described = (
        ", ".join(
            f"{t['device'] or '?'} {t['gbps']:.2f} Gb/s {t['verdict']}"
            if t["gbps"] is not None
            else f"{t['device'] or '?'} failed ({t['reason']})"
            for t in twins
        )
        or "no twin results"
    )
    message = (
        f"cable {twins_verdict}: {described} (healthy at {threshold_gbps:g} Gb/s or more per twin, both directions)"
    )
    return {
        "verdict": twins_verdict,
        "reason": reason,
        "total_gbps": total,
        "min_gbps": min(known) if known else None,
        "threshold_gbps": float(threshold_gbps),
        "degraded_floor_gbps": degraded_floor_gbps,
        "twins": twins,
        "advice": advice,
        "notes": notes,
        "message": message,
    }
