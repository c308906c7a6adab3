#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_doctor_facts
short_description: Read what the day-2 doctor judges on one node
description:
  - Reads the running kernel, the memory the host has left (MemAvailable, bounded by the host's own cgroup
    limit where it has one), free disk where the weights live, every RDMA device's firmware and the PCIe link
    of its function (sysfs), the GPU clocks and their event reasons (C(nvidia-smi -q -d CLOCK,PERFORMANCE)),
    the state of the serving containers (with Docker's restart count and their last log lines), the memory
    floor marker and, on the head, the watchdog's state and its recent events.
  - The firewall (C(iptables-save) and C(ip6tables-save), filter table) against the SPARKOPS rules files in
    I(firewall_rules_dir) (which chains the node must have, per family), and the listening TCP sockets
    (C(ss -Hltnp)).
  - Anything that is not there (no GPU, no RDMA device, no watchdog) is reported empty, not as a failure;
    the verdicts are made on the controller (plugins/plugin_utils/day2_checks.py).
  - Read-only.
version_added: "0.2.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  containers:
    description: Names of the containers to inspect.
    type: list
    elements: str
    default: []
  weights_path:
    description: Where the weights live (the nearest existing parent is measured).
    type: path
    required: true
  floor_marker:
    description: The memory floor's marker file (JSON), present when the floor stopped vLLM.
    type: path
    required: true
  watchdog_state_file:
    description: The watchdog's state file (JSON); only the head has one.
    type: path
  watchdog_events_file:
    description: The watchdog's JSON-lines events file.
    type: path
  events_tail:
    description: How many of the last events to return.
    type: int
    default: 50
  log_lines:
    description: How many last log lines of each container to return.
    type: int
    default: 5
  infiniband_sysfs:
    description: Where RDMA devices are listed.
    type: path
    default: /sys/class/infiniband
  nvidia_smi_path:
    description: nvidia-smi to run for the clocks.
    type: str
    default: nvidia-smi
  firewall_rules_dir:
    description: Where M(sparkops.cluster.iptables_chain) writes the rules files (C(<chain>.v4), C(<chain>.v6)).
    type: path
    default: /etc/sparkops/firewall
"""

EXAMPLES = r"""
- name: Read what the doctor judges
  sparkops.cluster.node_doctor_facts:
    containers: [sparkops-ray, sparkops-vllm, sparkops-watchdog]
    weights_path: /var/lib/sparkops/huggingface
    floor_marker: /var/lib/sparkops/memory-floor.json
    watchdog_state_file: /var/lib/sparkops/watchdog-state.json
    watchdog_events_file: /var/lib/sparkops/watchdog.jsonl
  register: doctor_node
"""

RETURN = r"""
kernel:
  description: The running kernel release (C(uname -r)).
  returned: always
  type: str
available_bytes:
  description: Memory the host has left, bytes; null when unreadable.
  returned: always
  type: int
disk_free_bytes:
  description: Free bytes where the weights live; null when unreadable.
  returned: always
  type: int
nic_functions:
  description:
    - Per RDMA device its firmware, PCI address and PCIe link
      (C(sta_width), C(cap_width), C(sta_speed_gts), C(cap_speed_gts)).
  returned: always
  type: list
  elements: dict
gpu_clocks:
  description:
    - Per GPU its performance state, active clock event reasons, clocks and max clocks (MHz).
    - Empty without nvidia-smi.
  returned: always
  type: list
  elements: dict
containers:
  description:
    - Per container C(name), C(status), C(restarting), C(exit_code), C(restart_count), C(oom_killed),
      C(started_at), C(log_tail).
  returned: always
  type: list
  elements: dict
floor_marker:
  description: The memory floor marker's content; null when the floor has not acted.
  returned: always
  type: dict
watchdog_state:
  description: The watchdog's state; null when there is none on this node.
  returned: always
  type: dict
watchdog_events:
  description: The last I(events_tail) watchdog events.
  returned: always
  type: list
  elements: dict
firewall:
  description:
    - C(expected), the chains the rules files name (C(chain), C(family) C(ipv4) or C(ipv6)); C(ipv4) and C(ipv6),
      each the filter table read (C(chains), C(hooks), C(drops), C(ports)) or C(error).
  returned: always
  type: dict
listening:
  description:
    - The listening TCP sockets (C(address), C(interface), C(port), C(wildcard), C(v6only), C(process)), or C(null)
      when C(ss) could not be run (C(listening_error) says why).
  returned: always
  type: list
  elements: dict
listening_error:
  description: Why the listening sockets could not be read; empty when they were.
  returned: always
  type: str
"""

import json
import os
import platform
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.firewall import (
    FAMILY_SUFFIX,
    parse_save,
    parse_ss_listening,
)
from ansible_collections.sparkops.cluster.plugins.module_utils.hw_links import (
    parse_nvidia_smi_clocks,
    parse_sysfs_link,
)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def _json(path: str | None):
    text = _read(path) if path else None
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def available_bytes() -> int | None:
    # Same rule as the watchdog's floor (roles/watchdog/files/sparkops_watchdog.py, which runs
    # without this collection): MemAvailable, bounded by PID 1's cgroup where it has a limit.
    meminfo = _read("/proc/meminfo") or ""
    vals = {}
    for line in meminfo.splitlines():
        key, _sep, rest = line.partition(":")
        if key in ("MemAvailable", "MemTotal"):
            vals[key] = int(rest.split()[0]) * 1024
    if "MemAvailable" not in vals:
        return None
    avail = vals["MemAvailable"]
    for line in (_read("/proc/1/cgroup") or "").splitlines():
        _hier, ctrls, path = line.split(":", 2)
        if "memory" in ctrls.split(","):
            base = f"/sys/fs/cgroup/memory{path}"
            limit, used = _read(f"{base}/memory.limit_in_bytes"), _read(f"{base}/memory.usage_in_bytes")
            if limit and used and int(limit) < vals.get("MemTotal", 1 << 62):
                inactive = 0
                for stat in (_read(f"{base}/memory.stat") or "").splitlines():
                    k, _sep, v = stat.partition(" ")
                    if k == "total_inactive_file":
                        inactive = int(v)
                avail = min(avail, max(0, int(limit) - (int(used) - inactive)))
        elif ctrls == "":
            limit = (_read(f"/sys/fs/cgroup{path}/memory.max") or "max").strip()
            used = _read(f"/sys/fs/cgroup{path}/memory.current")
            if limit != "max" and used:
                avail = min(avail, max(0, int(limit) - int(used)))
    return avail


def disk_free(path: str) -> int | None:
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path or "/").free
    except OSError:
        return None


def nic_functions(sysfs: str) -> list[dict]:
    out = []
    if not os.path.isdir(sysfs):
        return out
    for dev in sorted(os.listdir(sysfs)):
        base = os.path.join(sysfs, dev, "device")
        attrs = {
            a: _read(os.path.join(base, a))
            for a in ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")
        }
        entry = {
            "device": dev,
            "bdf": os.path.basename(os.path.realpath(base)),
            "firmware": (_read(os.path.join(sysfs, dev, "fw_ver")) or "").strip() or None,
        }
        entry.update(parse_sysfs_link(attrs))
        out.append(entry)
    return out


def gpu_clocks(module: AnsibleModule, smi: str) -> list[dict]:
    exe = module.get_bin_path(smi)
    if not exe:
        return []
    rc, out, _err = module.run_command([exe, "-q", "-d", "CLOCK,PERFORMANCE"])
    return parse_nvidia_smi_clocks(out) if rc == 0 else []


def containers(module: AnsibleModule, names: list[str], lines: int) -> list[dict]:
    docker = module.get_bin_path("docker")
    out = []
    for name in names:
        entry = {"name": name, "status": "missing"}
        if docker:
            rc, text, _err = module.run_command([docker, "inspect", "--format", "{{json .}}", name])
            if rc == 0:
                info = json.loads(text)
                st = info.get("State", {})
                entry.update(
                    status=st.get("Status"),
                    restarting=bool(st.get("Restarting")),
                    exit_code=st.get("ExitCode"),
                    oom_killed=bool(st.get("OOMKilled")),
                    started_at=st.get("StartedAt"),
                    finished_at=st.get("FinishedAt"),
                    restart_count=int(info.get("RestartCount", 0)),
                    error=st.get("Error") or None,
                )
                rc, logs, err = module.run_command([docker, "logs", "--tail", str(lines), name])
                entry["log_tail"] = [ln for ln in (logs + err).splitlines() if ln.strip()][-lines:]
        out.append(entry)
    return out


def events(path: str | None, tail: int) -> list[dict]:
    text = _read(path) if path else None
    out = []
    for line in (text or "").splitlines()[-tail:]:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def firewall(module: AnsibleModule, rules_dir: str) -> dict:
    suffixes = {v: ("ipv4" if k == 4 else "ipv6") for k, v in FAMILY_SUFFIX.items()}  # noqa: PLR2004
    expected = []
    if os.path.isdir(rules_dir):
        for name in sorted(os.listdir(rules_dir)):
            chain, _dot, suffix = name.rpartition(".")
            if chain.startswith("SPARKOPS-") and suffix in suffixes:
                expected.append({"chain": chain, "family": suffixes[suffix]})
    out = {"expected": expected}
    for family, tool in (("ipv4", "iptables-save"), ("ipv6", "ip6tables-save")):
        exe = module.get_bin_path(tool)
        if not exe:
            out[family] = {"error": f"{tool} is not installed"}
            continue
        rc, text, err = module.run_command([exe, "-t", "filter"])
        out[family] = parse_save(text) if rc == 0 else {"error": f"{tool} -t filter: {err.strip()[:200] or rc}"}
    return out


def listening(module: AnsibleModule) -> tuple[list[dict] | None, str]:
    exe = module.get_bin_path("ss")
    if not exe:
        return None, "ss (iproute2) is not installed"
    rc, text, err = module.run_command([exe, "-Hltnp"])
    return (parse_ss_listening(text), "") if rc == 0 else (None, f"ss -Hltnp: {err.strip()[:200] or rc}")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "containers": {"type": "list", "elements": "str", "default": []},
            "weights_path": {"type": "path", "required": True},
            "floor_marker": {"type": "path", "required": True},
            "watchdog_state_file": {"type": "path"},
            "watchdog_events_file": {"type": "path"},
            "events_tail": {"type": "int", "default": 50},
            "log_lines": {"type": "int", "default": 5},
            "infiniband_sysfs": {"type": "path", "default": "/sys/class/infiniband"},
            "nvidia_smi_path": {"type": "str", "default": "nvidia-smi"},
            "firewall_rules_dir": {"type": "path", "default": "/etc/sparkops/firewall"},
        },
        supports_check_mode=True,
    )
    p = module.params
    if p["events_tail"] < 0 or p["log_lines"] < 0:
        module.fail_json(msg="events_tail and log_lines must be 0 or more")
    sockets, sockets_error = listening(module)
    module.exit_json(
        changed=False,
        firewall=firewall(module, p["firewall_rules_dir"]),
        listening=sockets,
        listening_error=sockets_error,
        kernel=platform.release(),
        available_bytes=available_bytes(),
        disk_free_bytes=disk_free(p["weights_path"]),
        nic_functions=nic_functions(p["infiniband_sysfs"]),
        gpu_clocks=gpu_clocks(module, p["nvidia_smi_path"]),
        containers=containers(module, p["containers"], p["log_lines"]),
        floor_marker=_json(p["floor_marker"]),
        watchdog_state=_json(p["watchdog_state_file"]),
        watchdog_events=events(p["watchdog_events_file"], p["events_tail"]),
    )


if __name__ == "__main__":
    main()
