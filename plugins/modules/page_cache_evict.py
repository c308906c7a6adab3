#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: page_cache_evict
short_description: Drop a model's files from the page cache before vLLM starts (unified memory)
description:
  - On a DGX Spark the GPU and the CPU share one memory. Pages the kernel keeps cached for the weight
    files (left by the download, a weight sync written through the cache, or the previous vLLM's load)
    count as used when vLLM measures free memory at its start, so they cost KV cache or fail
    C(--gpu-memory-utilization)'s check.
  - Drops the cached pages of every regular file under I(paths), and only those, with
    C(posix_fadvise(POSIX_FADV_DONTNEED)) after C(fdatasync) (dirty pages cannot be dropped). The node's
    other caches stay; C(/proc/sys/vm/drop_caches) would empty them all and needs root on the host.
  - Residency is measured before and after with C(mincore(2)), which reads nothing from disk.
  - C(changed) is true when some of those pages were cached. In check mode it only measures.
  - The same code runs as a script in the watchdog before it restarts vLLM (C(module_utils/page_cache.py)).
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  paths:
    description:
      - Files or folders, for example the model's folder in the hub cache
        (C(<hf_home>/hub/models--<org>--<name>)). Folders are walked; symbolic links are not followed
        (a snapshot's links point at the blobs, which are walked once).
    type: list
    elements: path
    required: true
  missing_ok:
    description:
      - When false, a path that does not exist fails the task (the weights should be there before vLLM
        starts). When true, it is listed in C(missing) and skipped.
    type: bool
    default: false
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: Measures what is cached and drops nothing.
  diff_mode:
    support: none
    details: Page-cache residency is not a file's content; C(resident_before_bytes) and C(resident_after_bytes) say it.
notes:
  - Pages that a running process keeps mapped stay cached; they are counted in C(resident_after_bytes).
seealso:
  - module: sparkops.cluster.hf_cache_sync
"""

EXAMPLES = r"""
- name: Drop the model's files from the page cache on every node before vLLM starts
  sparkops.cluster.page_cache_evict:
    paths: ["/var/lib/sparkops/huggingface/hub/models--Qwen--Qwen3-235B-A22B-GPTQ-Int4"]
  delegate_to: "{{ item }}"
  loop: "{{ groups['spark_cluster'] }}"
  run_once: true
"""

RETURN = r"""
files:
  description: Regular files measured.
  returned: always
  type: int
bytes:
  description: Their total size.
  returned: always
  type: int
resident_before_bytes:
  description: Bytes of those files in the page cache before.
  returned: always
  type: int
resident_after_bytes:
  description: Bytes still cached after (a page another process maps stays); equal to before in check mode.
  returned: always
  type: int
missing:
  description: Paths that do not exist (only with I(missing_ok)).
  returned: always
  type: list
  elements: str
seconds:
  description: Time the measurement and the eviction took.
  returned: always
  type: float
msg:
  description: One line saying what was cached and what was dropped.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.page_cache import evict


def human(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "path", "required": True},
            "missing_ok": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    paths = module.params["paths"]
    if not paths:
        module.fail_json(msg="paths is empty: give the model's folder in the hub cache (or its files)")
    r = evict(paths, check=module.check_mode)
    result = {
        "files": r["files"],
        "bytes": r["bytes"],
        "resident_before_bytes": r["resident_before"],
        "resident_after_bytes": r["resident_after"],
        "missing": r["missing"],
        "seconds": r["seconds"],
    }
    if r["missing"] and not module.params["missing_ok"]:
        module.fail_json(
            msg=f"{', '.join(r['missing'])}: no such file or folder. The weights should be on this node before "
            "vLLM starts (the weight_cache role puts them there); check the path, or set missing_ok",
            changed=False,
            **result,
        )
    if r["errors"]:
        module.fail_json(
            msg=f"cannot read {len(r['errors'])} file(s) to measure or drop their cached pages: "
            f"{'; '.join(r['errors'][:5])}. Run as a user that can read them (become)",
            changed=False,
            **result,
        )
    cached = f"{r['files']} files, {human(r['bytes'])}: {human(r['resident_before'])} cached"
    if module.check_mode:
        result["msg"] = cached + ("; would drop them" if r["resident_before"] else "")
    else:
        dropped = r["resident_before"] - r["resident_after"]
        result["msg"] = f"{cached}; dropped {human(dropped)}, {human(r['resident_after'])} still cached"
    module.exit_json(changed=r["resident_before"] > 0, **result)


if __name__ == "__main__":
    main()
