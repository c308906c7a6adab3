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
  - A log file another local user could have written is not read but listed in RV(files_refused) - one
    that is not owned by root (or by the user the module runs as), is writable by others, or is reached
    through a folder such a user could write to, before a folder only its owner may enter. Ray makes its
    session folders world-writable; sparkops keeps them under a folder only root may enter.
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
      - /var/lib/sparkops/private/ray/session_latest/logs/worker-*.err
      - /var/lib/sparkops/private/ray/session_latest/logs/worker-*.out
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
files_refused:
  description: Log files matched but not read, each with why another local user could have written it.
  returned: always
  type: list
  elements: str
"""

import glob
import os
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.nccl_log import parse_nccl_transport, transport_verdict


def forgeable(path: str, stat_fn=os.stat) -> str | None:
    """Why a local user other than root (or the one running this) could have written path, or None.

    The file must belong to a trusted user and not be writable by others; and on the way down from
    ``/`` every folder must belong to a trusted user and be closed to others' writes (a sticky folder
    such as /tmp is fine: others cannot rename what is not theirs), until a folder only its owner may
    enter, below which nobody else can reach at all.
    """
    trusted = {0, os.geteuid()}
    real = os.path.realpath(path)

    def loose(st) -> bool:
        world = st.st_mode & stat.S_IWOTH
        group = st.st_mode & stat.S_IWGRP and st.st_gid not in {0, os.getegid()}
        return bool(world or group)

    st = stat_fn(real)
    if st.st_uid not in trusted:
        return f"{real} belongs to uid {st.st_uid}"
    if loose(st):
        return f"{real} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    parts = real.split("/")[1:-1]
    for depth in range(len(parts) + 1):
        folder = "/" + "/".join(parts[:depth])
        st = stat_fn(folder)
        if st.st_uid not in trusted:
            return f"{folder} belongs to uid {st.st_uid}"
        if stat.S_IMODE(st.st_mode) & 0o077 == 0:
            return None  # only its owner may enter: nobody else reaches what lies below
        if loose(st) and not st.st_mode & stat.S_ISVTX:
            return f"{folder} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}, no sticky bit)"
    return None


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
    chunks, files, refused = [], [], []
    for pattern in p["paths"]:
        for path in sorted(glob.glob(pattern)):
            try:
                why = forgeable(path)
                if why:
                    # The proof must be the root containers' own log, not one a local user planted.
                    refused.append(f"{path}: {why}")
                    module.warn(f"not reading {path}: {why}; another local user could have written it")
                    continue
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
        "files_refused": refused,
    }
    if not verdict["ok"] and p["fail_on_mismatch"]:
        where = f" (read {len(files)} file(s): {', '.join(files[:5])})" if p["paths"] else ""
        module.fail_json(msg=f"NCCL transport check failed: {verdict['message']}{where}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
