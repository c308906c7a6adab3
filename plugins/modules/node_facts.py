#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_facts
short_description: Read a node's architecture, OS, kernel, interfaces and disk space in one call
description:
  - What preflight judges on a node, read in one module run instead of fact gathering and two commands.
  - C(architecture) (C(platform.machine()), as Ansible's fact), C(distribution) and C(distribution_version) (read by
    Ansible's own distribution fact code, so the values are those of C(ansible_facts)), C(kernel) (C(uname -r)),
    and every network interface with its MTU and state (from C(/sys/class/net), like Ansible's interfaces fact).
  - I(free_space_path) - the free space (C(df -P)'s Available) of the nearest existing folder of a path, which
    need not exist yet.
  - I(usage_paths) - the apparent size of what is under each path (as C(du -sb) counts it, hard links once);
    null for a path that does not exist.
  - Read-only.
version_added: "0.7.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  free_space_path:
    description: A path whose nearest existing folder's free space to measure.
    type: path
  usage_paths:
    description: Paths whose apparent size in bytes to add up.
    type: list
    elements: path
    default: []
extends_documentation_fragment:
  - sparkops.cluster.attributes
  - sparkops.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Read what preflight checks on a node
  sparkops.cluster.node_facts:
    free_space_path: /var/lib/sparkops/huggingface
    usage_paths: [/var/lib/sparkops/huggingface/hub/models--Qwen--Qwen3-235B-A22B-GPTQ-Int4]
  register: node
"""

RETURN = r"""
architecture:
  description: The machine, for example C(aarch64).
  returned: always
  type: str
distribution:
  description: The OS as Ansible names it, for example C(Ubuntu) or C(Debian).
  returned: always
  type: str
distribution_version:
  description: Its version as Ansible gives it, for example C(24.04).
  returned: always
  type: str
kernel:
  description: The running kernel release.
  returned: always
  type: str
interfaces:
  description: Per interface, C(mtu) (null when unreadable) and C(operstate).
  returned: always
  type: dict
  sample: {"enp1s0f1np1": {"mtu": 9000, "operstate": "up"}}
free_space:
  description:
    - C(path) (the folder measured), C(mount) (its mount point) and C(free_bytes); empty without I(free_space_path).
  returned: always
  type: dict
usage:
  description: Per path of I(usage_paths), its size in bytes, or null when it does not exist.
  returned: always
  type: dict
"""

import os
import platform

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.facts.system.distribution import Distribution
from ansible_collections.sparkops.cluster.plugins.module_utils.node_read import interfaces


def free_space(path: str) -> dict:
    """df -P's Available for the nearest existing folder of path (a blocks count as an unprivileged user sees it)."""
    here = os.path.abspath(path)
    while not os.path.exists(here):
        here = os.path.dirname(here)
    st = os.statvfs(here)
    mount = os.path.realpath(here)
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    return {"path": here, "mount": mount, "free_bytes": st.f_bavail * st.f_frsize}


def usage(path: str) -> int | None:
    """Apparent size of everything under path, each inode once, links not followed (du -sb)."""
    try:
        top = os.lstat(path)
    except OSError:
        return None
    seen = {(top.st_dev, top.st_ino)}
    total = top.st_size
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def main():
    module = AnsibleModule(
        argument_spec={
            "free_space_path": {"type": "path"},
            "usage_paths": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    dist = Distribution(module).get_distribution_facts()
    module.exit_json(
        changed=False,
        architecture=platform.machine(),
        distribution=dist.get("distribution"),
        distribution_version=dist.get("distribution_version"),
        kernel=platform.release(),
        interfaces=interfaces(),
        free_space=free_space(p["free_space_path"]) if p["free_space_path"] else {},
        usage={path: usage(path) for path in p["usage_paths"]},
    )


if __name__ == "__main__":
    main()
