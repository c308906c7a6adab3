#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: ib_write_bw
short_description: Measure RDMA write bandwidth of one link with perftest's ib_write_bw
description:
  - Runs perftest's C(ib_write_bw) as the server or the client end of one RDMA link (one
    ConnectX-7 function, a "twin", such as C(rocep1s0f1)), under a hard deadline, and returns
    its parsed output in Gb/s.
  - Start the I(role=server) end first, from the playbook with C(async) (it waits for the
    client), then the I(role=client) end with I(peer) set to the server's address on that twin's
    subnet. Both ends must use the same I(qps), I(size), I(duration_s), I(bidirectional),
    I(rdma_cm) and I(port).
  - The client evaluates the result against I(threshold_gbps), or I(line_rate_gbps) x
    I(min_fraction), and fails naming the link, the figure and the threshold.
  - The process runs in its own process group; at the deadline the whole group is killed, so
    nothing is left running.
  - A measurement; never changes anything (C(changed) is always false).
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  role:
    description: Which end of the test this host runs.
    type: str
    required: true
    choices: [server, client]
  device:
    description:
      - RDMA device of the link, for example C(rocep1s0f1) or C(roceP2p1s0f1) (see C(ibdev2netdev)).
      - Must exist under I(sysfs_root)C(/class/infiniband).
    type: str
    required: true
  peer:
    description: Address of the server on this link's subnet. Required with I(role=client).
    type: str
  port:
    description: TCP port of perftest's out-of-band exchange (C(-p)); both ends must use the same.
    type: int
    default: 18515
  qps:
    description:
      - Number of queue pairs (C(-q)). A single QP at 4096 B caps near 13 Gb/s a channel on a
        Spark, which measures the tool, not the link.
    type: int
    default: 4
  size:
    description: Message size in bytes (C(-s)).
    type: int
    default: 1048576
  duration_s:
    description:
      - Run for this many seconds (C(-D)) instead of a fixed number of iterations. perftest then
        prints C(BW peak) as 0.00 (not measured); I(bw_peak_gbps) is null.
    type: int
  bidirectional:
    description:
      - Write in both directions at once (C(-b)); the figure is the sum of both directions.
      - A degraded Spark cable only shows in a bidirectional test (~119 instead of ~213 Gb/s per twin).
    type: bool
    default: false
  gid_index:
    description:
      - RoCE GID index (C(-x)); 3 is the RoCE v2 entry of the interface's IPv4 address on a Spark.
      - Not passed with I(rdma_cm) (RDMA CM picks the GID from the address). Use -1 to omit it.
    type: int
    default: 3
  rdma_cm:
    description: Connect the queue pairs with RDMA CM (C(-R)).
    type: bool
    default: false
  report_gbits:
    description: Ask perftest for Gb/s (C(--report_gbits)). The results are in Gb/s either way.
    type: bool
    default: true
  extra_args:
    description: Further ib_write_bw arguments, appended before the peer address (e.g. C(["--force-link", "IB"])).
    type: list
    elements: str
    default: []
  timeout_s:
    description:
      - Hard deadline for the ib_write_bw process, in seconds. When it passes, the process group is
        killed and the module fails with I(timed_out=true).
      - For the server, allow for the time until the client starts plus the test itself.
    type: float
    default: 60
  threshold_gbps:
    description:
      - Pass mark in Gb/s for the average bandwidth of the largest message size. Mutually
        exclusive with I(line_rate_gbps).
      - "On a Spark: 190 per twin for a bidirectional test (healthy is ~213)."
    type: float
  line_rate_gbps:
    description: Line rate in Gb/s; the pass mark is I(line_rate_gbps) x I(min_fraction).
    type: float
  min_fraction:
    description: Fraction of I(line_rate_gbps) that passes, in (0, 1].
    type: float
    default: 0.9
  fail_on_threshold:
    description:
      - Fail when the figure is below the pass mark. With false, report C(passed=false) and succeed.
    type: bool
    default: true
  binary:
    description: The ib_write_bw program, a name looked up on C(PATH) or an absolute path.
    type: str
    default: ib_write_bw
  sysfs_root:
    description: Root of sysfs, where C(class/infiniband/<device>) is looked up (tests point it elsewhere).
    type: path
    default: /sys
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: Validates the options, the program and the device, and returns the command it would run.
  diff_mode:
    support: none
notes:
  - Target side needs only the Python standard library and the C(perftest) package (C(apt-get install perftest)).
  - Units - perftest's C(Gb/sec) is 10^9 bit/s; C(MB/sec) (older perftest) and C(MiB/sec) (newer) are
    2^20 byte/s. All returned figures are Gb/s.
  - Judge a whole Spark cable (both twins) with C(cable_verdict) in the collection's
    C(module_utils/perftest.py), from the results of both twins.
"""

EXAMPLES = r"""
- name: Start the server end of twin rocep1s0f1 (waits for the client)
  sparkops.cluster.ib_write_bw:
    role: server
    device: rocep1s0f1
    bidirectional: true
    duration_s: 5
    port: 18620
    timeout_s: 60
  async: 90
  poll: 0
  register: bw_server
  delegate_to: spark2

- name: Measure the link from the client end
  sparkops.cluster.ib_write_bw:
    role: client
    device: rocep1s0f1
    peer: 192.168.177.12
    bidirectional: true
    duration_s: 5
    port: 18620
    timeout_s: 30
    threshold_gbps: 190
  register: bw_client
  delegate_to: spark1

- name: One-way check against 95% of a 100G function
  sparkops.cluster.ib_write_bw:
    role: client
    device: roceP2p1s0f1
    peer: 192.168.178.12
    line_rate_gbps: 100
    min_fraction: 0.9
"""

RETURN = r"""
cmd:
  description: The ib_write_bw command line (argv).
  returned: always
  type: list
  elements: str
rc:
  description: Exit status of ib_write_bw; null in check mode or when it was killed.
  returned: always
  type: int
ran:
  description: Whether ib_write_bw was started (false in check mode).
  returned: always
  type: bool
timed_out:
  description: Whether the deadline passed and the process group was killed.
  returned: always
  type: bool
passed:
  description: Whether the figure met the pass mark; null without a pass mark or a figure.
  returned: always
  type: bool
threshold_gbps:
  description: The pass mark in Gb/s (I(threshold_gbps) or I(line_rate_gbps) x I(min_fraction)); null without one.
  returned: always
  type: float
bw_avg_gbps:
  description: Average bandwidth of the largest message size, Gb/s (both directions summed with I(bidirectional)).
  returned: always
  type: float
bw_peak_gbps:
  description: Peak bandwidth of that row, Gb/s; null when perftest did not measure it (duration runs).
  returned: always
  type: float
bw_peak_measured:
  description: False when perftest says "BW peak won't be measured" or prints 0.00.
  returned: always
  type: bool
msg_rate_mpps:
  description: Message rate of that row, millions of messages per second.
  returned: always
  type: float
msg_size_bytes:
  description: Largest message size measured.
  returned: always
  type: int
iterations:
  description: Iterations of that row.
  returned: always
  type: int
rows:
  description: >-
    Every result row, each with msg_size_bytes, iterations, bw_peak, bw_avg, unit, bw_peak_gbps,
    bw_avg_gbps, msg_rate_mpps.
  returned: always
  type: list
  elements: dict
units_seen:
  description: Bandwidth units in perftest's result headers (Gb/sec, MB/sec, MiB/sec).
  returned: always
  type: list
  elements: str
qps:
  description: Number of QPs perftest reports.
  returned: always
  type: int
mtu:
  description: MTU perftest used, bytes.
  returned: always
  type: int
link_type:
  description: Ethernet (RoCE) or IB, as perftest reports it.
  returned: always
  type: str
gid_index:
  description: GID index perftest reports (absent with RDMA CM).
  returned: always
  type: int
transport:
  description: Transport type perftest reports (IB for RoCE too).
  returned: always
  type: str
rdma_cm:
  description: Whether perftest connected the QPs with RDMA CM.
  returned: always
  type: bool
device:
  description: RDMA device, as perftest reports it (else the I(device) option).
  returned: always
  type: str
side:
  description: server or client, as recognised in the output; null when it cannot be told.
  returned: always
  type: str
bidirectional:
  description: Whether perftest ran a bidirectional test (from its title).
  returned: always
  type: bool
duration_s:
  description: I(duration_s) as run; null for an iterations run.
  returned: always
  type: int
error:
  description: >-
    Short text of the error perftest reports (e.g. "Couldn't connect to 10.0.0.2:18515"), or
    "timed out after N s"; else null.
  returned: always
  type: str
error_kind:
  description: >-
    no_rdma_device, port_in_use, connect_failed, qp_setup_failed, exchange_failed, completion_error,
    timed_out or not_installed; null without an error.
  returned: always
  type: str
reason:
  description: >-
    For a cable verdict, why this end has no figure - not_installed, server_not_started,
    peer_unreachable, timed_out, no_result, qp_setup_failed, no_rdma_device; null with a figure.
  returned: always
  type: str
stdout_tail:
  description: The last lines of ib_write_bw's output (stdout and stderr together).
  returned: always
  type: str
elapsed_s:
  description: Seconds ib_write_bw ran.
  returned: always
  type: float
"""

import os
import shutil
import time
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.perftest import (
    failure_reason,
    line_rate_threshold,
    parse_ib_write_bw,
)

TAIL_LINES = 40
KILL_GRACE_S = 2.0


def build_command(p: dict, binary: str) -> list[str]:
    cmd = [binary, "-d", p["device"], "-p", str(p["port"]), "-q", str(p["qps"]), "-s", str(p["size"]), "-F"]
    if p["report_gbits"]:
        cmd.append("--report_gbits")
    if p["bidirectional"]:
        cmd.append("-b")
    if p["duration_s"] is not None:
        cmd += ["-D", str(p["duration_s"])]
    if p["rdma_cm"]:
        cmd.append("-R")
    elif p["gid_index"] >= 0:
        cmd += ["-x", str(p["gid_index"])]
    cmd += list(p["extra_args"])
    if p["role"] == "client":
        cmd.append(p["peer"])
    return cmd


def find_binary(binary: str) -> str | None:
    if "/" in binary:
        return binary if os.path.isfile(binary) and os.access(binary, os.X_OK) else None
    return shutil.which(binary)


def rdma_devices(sysfs_root: str) -> list[str]:
    root = Path(sysfs_root) / "class" / "infiniband"
    try:
        return sorted(entry.name for entry in root.iterdir())
    except OSError:
        return []


# coreutils timeout exits 124 when it stopped the command with TERM, 137 (128+9) when KILL was needed.
TIMEOUT_RCS = (124, 137)


def run_with_deadline(module, cmd: list[str], timeout_s: float) -> tuple[int | None, str, bool, float]:
    """Run ``cmd`` under coreutils ``timeout``, which makes itself a process group and, at the deadline,
    signals the whole group (TERM, then KILL after KILL_GRACE_S): no child outlives it.

    Returns (rc, output, timed_out, elapsed_s). rc is None when the process was killed.
    """
    start = time.monotonic()
    # coreutils; /usr/bin and /bin too when PATH is narrow (sudo secure_path, a test PATH).
    timeout_bin = module.get_bin_path("timeout", required=True, opt_dirs=["/usr/bin", "/bin"])
    rc, out, err = module.run_command(
        [timeout_bin, f"--kill-after={KILL_GRACE_S:g}", f"{timeout_s:g}", *cmd], check_rc=False
    )
    timed_out = rc in TIMEOUT_RCS
    output = (out or "") + (err or "")
    return (None if timed_out else rc), output, timed_out, time.monotonic() - start


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "role": {"type": "str", "required": True, "choices": ["server", "client"]},
            "device": {"type": "str", "required": True},
            "peer": {"type": "str"},
            "port": {"type": "int", "default": 18515},
            "qps": {"type": "int", "default": 4},
            "size": {"type": "int", "default": 1048576},
            "duration_s": {"type": "int"},
            "bidirectional": {"type": "bool", "default": False},
            "gid_index": {"type": "int", "default": 3},
            "rdma_cm": {"type": "bool", "default": False},
            "report_gbits": {"type": "bool", "default": True},
            "extra_args": {"type": "list", "elements": "str", "default": []},
            "timeout_s": {"type": "float", "default": 60},
            "threshold_gbps": {"type": "float"},
            "line_rate_gbps": {"type": "float"},
            "min_fraction": {"type": "float", "default": 0.9},
            "fail_on_threshold": {"type": "bool", "default": True},
            "binary": {"type": "str", "default": "ib_write_bw"},
            "sysfs_root": {"type": "path", "default": "/sys"},
        },
        required_if=[("role", "client", ("peer",))],
        mutually_exclusive=[("threshold_gbps", "line_rate_gbps")],
        supports_check_mode=True,
    )
    p = module.params
    base = {"changed": False, "ran": False, "rc": None, "timed_out": False, "passed": None, "role": p["role"]}

    problems = []
    if not 1 <= p["port"] <= 65535:
        problems.append(f"port must be 1-65535, got {p['port']}")
    if p["qps"] < 1:
        problems.append(f"qps must be at least 1, got {p['qps']}")
    if p["size"] < 1:
        problems.append(f"size must be at least 1 byte, got {p['size']}")
    if p["duration_s"] is not None and p["duration_s"] < 1:
        problems.append(f"duration_s must be at least 1 second, got {p['duration_s']}")
    if p["timeout_s"] <= 0:
        problems.append(f"timeout_s must be positive, got {p['timeout_s']}")
    if p["duration_s"] is not None and p["timeout_s"] <= p["duration_s"]:
        problems.append(
            f"timeout_s ({p['timeout_s']:g}) must exceed duration_s ({p['duration_s']}), or every run would be killed"
        )
    if p["threshold_gbps"] is not None and p["threshold_gbps"] <= 0:
        problems.append(f"threshold_gbps must be positive, got {p['threshold_gbps']}")
    if p["role"] == "server" and p["peer"]:
        problems.append("peer is only for role=client; the server listens on all addresses")
    threshold = p["threshold_gbps"]
    if p["line_rate_gbps"] is not None:
        try:
            threshold = line_rate_threshold(p["line_rate_gbps"], p["min_fraction"])
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        module.fail_json(msg="Invalid ib_write_bw options: " + "; ".join(problems) + ".", **base)
    base["threshold_gbps"] = threshold

    binary = find_binary(p["binary"])
    cmd = build_command(p, binary or p["binary"])
    base["cmd"] = cmd
    if binary is None:
        module.fail_json(
            msg=f"perftest is not installed: {p['binary']} was not found on PATH. "
            "Install it with: apt-get install perftest",
            not_installed=True,
            error="perftest is not installed",
            error_kind="not_installed",
            reason="not_installed",
            **base,
        )

    devices = rdma_devices(p["sysfs_root"])
    if p["device"] not in devices:
        where = os.path.join(p["sysfs_root"], "class", "infiniband")
        have = ", ".join(devices) if devices else "none"
        module.fail_json(
            msg=f"RDMA device {p['device']} does not exist under {where}; devices present: {have}. "
            "Check the device name with ibdev2netdev and that the mlx5 driver is loaded.",
            devices=devices,
            error=f"no RDMA device {p['device']}",
            error_kind="no_rdma_device",
            reason="no_rdma_device",
            **base,
        )

    if module.check_mode:
        module.exit_json(msg="check mode: ib_write_bw not run", devices=devices, **base)

    rc, output, timed_out, elapsed = run_with_deadline(module, cmd, p["timeout_s"])
    parsed = parse_ib_write_bw(output)
    parsed["duration_s"] = p["duration_s"]
    parsed["device"] = parsed["device"] or p["device"]
    if timed_out:
        parsed["error"] = f"timed out after {p['timeout_s']:g} s" + (f" ({parsed['error']})" if parsed["error"] else "")
        parsed["error_kind"] = "timed_out"
    result = base | parsed
    result.update(
        ran=True,
        rc=rc,
        timed_out=timed_out,
        elapsed_s=round(elapsed, 3),
        stdout_tail="\n".join(output.splitlines()[-TAIL_LINES:]),
    )
    result["reason"] = failure_reason(result)

    end = f"ib_write_bw {p['role']} on {p['device']}" + (f" to {p['peer']}:{p['port']}" if p["peer"] else "")
    if timed_out:
        hint = (
            "no client connected, or the test ran longer than the deadline"
            if p["role"] == "server"
            else "is the server running on the peer with the same options and port?"
        )
        module.fail_json(msg=f"{end} did not finish within {p['timeout_s']:g} s and was killed; {hint}", **result)
    if rc != 0 or parsed["error_kind"]:
        what = parsed["error"] or "failed"
        module.fail_json(msg=f"{end} failed (rc {rc}): {what}. Output tail: {result['stdout_tail'][-500:]}", **result)
    avg = parsed["bw_avg_gbps"]
    if avg is None and p["role"] == "server":
        result["reason"] = None
        module.exit_json(**result)
    if avg is None:
        module.fail_json(
            msg=f"{end} printed no bandwidth result (rc {rc}). Output tail: {result['stdout_tail'][-500:]}", **result
        )
    if threshold is not None:
        result["passed"] = avg >= threshold
        if not result["passed"] and p["fail_on_threshold"]:
            direction = "both directions" if p["bidirectional"] else "one way"
            module.fail_json(
                msg=f"RDMA link {p['device']}"
                + (f" -> {p['peer']}" if p["peer"] else "")
                + f": {avg:.2f} Gb/s is below the threshold {threshold:.2f} Gb/s ({direction}, "
                f"{parsed['qps'] or p['qps']} QPs, {parsed['msg_size_bytes']} B messages)",
                **result,
            )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
