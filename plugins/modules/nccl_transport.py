#!/usr/bin/python
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nccl_transport
short_description: Prove which transport NCCL chose (RDMA over RoCE or TCP sockets) from its INFO log
description:
  - Reads NCCL INFO log lines (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET) from log files on the node, or
    from I(text), and reports per process what NCCL used - C(NET/IB) with the HCAs, or C(NET/Socket).
  - "Fails when NCCL fell back to sockets (also when only some of a process's channels ran over them), used a
    network plugin other than IB verbs, chose no transport (only C(NET/IB : No device found.)), used only one of
    the expected twins, or left no transport lines, unless I(fail_on_mismatch) is false."
  - Several published two-Spark recipes silently run NCCL over TCP; this is the check that catches it.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  paths:
    description:
      - Glob patterns of log files to read (Ray worker logs, vLLM container logs saved to a file).
    type: list
    elements: str
    default: []
  text:
    description: Log text to parse instead of (or as well as) the files.
    type: str
  expected_hcas:
    description: RDMA devices NCCL must use, both twins of the cabled port (e.g. rocep1s0f1, roceP2p1s0f1).
    type: list
    elements: str
    default: []
  max_bytes_per_file:
    description: Read at most this many bytes from the start of each file (NCCL prints its choice at init).
    type: int
    default: 4194304
  fail_on_mismatch:
    description: Fail when the verdict is not RDMA over every expected HCA.
    type: bool
    default: true
extends_documentation_fragment:
  - sparkops.cluster.attributes
  - sparkops.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Prove NCCL used RDMA over both twins
  sparkops.cluster.nccl_transport:
    paths:
      - /var/lib/sparkops/ray/session_latest/logs/worker-*.err
      - /var/lib/sparkops/ray/session_latest/logs/worker-*.out
    expected_hcas: [rocep1s0f1, roceP2p1s0f1]
"""

RETURN = r"""
ok:
  description: True when every NCCL endpoint used IB verbs over every expected HCA.
  returned: always
  type: bool
message:
  description: The verdict in words, naming sockets or the missing twin when not ok.
  returned: always
  type: str
endpoints:
  description: Per process (host:pid) the transport, HCAs, socket interfaces and channel devices NCCL logged.
  returned: always
  type: dict
transports:
  description: The distinct transports seen (IB, Socket).
  returned: always
  type: list
  elements: str
gid_index:
  description: NCCL_IB_GID_INDEX when the log prints it.
  returned: always
  type: raw
nccl_version:
  description: NCCL version from the log.
  returned: always
  type: str
files_read:
  description: The log files read.
  returned: always
  type: list
  elements: str
"""

import glob

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.nccl_log import parse_nccl_transport, transport_verdict


def main():
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "str", "default": []},
            "text": {"type": "str"},
            "expected_hcas": {"type": "list", "elements": "str", "default": []},
            "max_bytes_per_file": {"type": "int", "default": 4194304},
            "fail_on_mismatch": {"type": "bool", "default": True},
        },
        required_one_of=[("paths", "text")],
        supports_check_mode=True,
    )
    p = module.params
    if p["max_bytes_per_file"] <= 0:
        module.fail_json(msg=f"max_bytes_per_file must be positive, got {p['max_bytes_per_file']}")
    chunks, files = [], []
    for pattern in p["paths"]:
        for path in sorted(glob.glob(pattern)):
            try:
                with open(path, "rb") as fh:
                    chunks.append(fh.read(p["max_bytes_per_file"]).decode("utf-8", "replace"))
                files.append(path)
            except OSError as exc:
                module.warn(f"could not read {path}: {exc}")
    if p["text"]:
        chunks.append(p["text"])
    parsed = parse_nccl_transport("\n".join(chunks))
    verdict = transport_verdict(parsed, p["expected_hcas"])
    endpoints = parsed.get("endpoints") or {}
    result = {
        "changed": False,
        "ok": verdict["ok"],
        "message": verdict["message"],
        "problems": verdict.get("problems", []),
        "endpoints": endpoints,
        "transports": sorted({ep.get("transport") for ep in endpoints.values() if ep.get("transport")}),
        "gid_index": parsed.get("gid_index"),
        "nccl_version": parsed.get("nccl_version"),
        "files_read": files,
    }
    if not verdict["ok"] and p["fail_on_mismatch"]:
        where = f" (read {len(files)} file(s): {', '.join(files[:5])})" if p["paths"] else ""
        module.fail_json(msg=f"NCCL transport check failed: {verdict['message']}{where}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
