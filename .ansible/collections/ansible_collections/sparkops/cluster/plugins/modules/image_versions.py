#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_versions
short_description: Read vLLM, torch, CUDA, FlashInfer, Ray and NCCL inside a serving image and compare with pins
description:
  - Runs the image's own C(python3) in a throw-away container (C(docker run --rm --network none --entrypoint python3))
    with a short probe that reads the installed wheels through C(importlib.metadata), the CUDA toolkit from
    C(CUDA_VERSION) (set by NVIDIA's CUDA base images) or C(/usr/local/cuda/version.json), and NCCL from
    C(torch.cuda.nccl.version()).
  - Compares them with I(pins) (a pin matches the same version or one that only adds release numbers or a local
    label, so C(13.2) matches C(13.2.0) and C(0.19.0) matches C(0.19.0+cu132) but not C(0.19.0.dev5)) and with
    I(locked) (exact), and fails naming the component and both versions unless I(fail_on_mismatch=false).
  - Read-only; changes nothing.
version_added: "0.2.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  image:
    description: The image (name:tag, name@digest or ID) to look into. It must already be on this host.
    type: str
    required: true
  pins:
    description: Component (vllm, torch, cuda, flashinfer, ray, nccl) to pinned version; null or empty means not pinned.
    type: dict
    default: {}
  locked:
    description: Component to the exact version the lock file recorded; compared exactly.
    type: dict
    default: {}
  fail_on_mismatch:
    description: Fail when a version differs from its pin or lock (otherwise only report I(problems)).
    type: bool
    default: true
  docker:
    description: The docker executable.
    type: str
    default: docker
  timeout_s:
    description: Timeout of the probe container, in seconds.
    type: float
    default: 180
extends_documentation_fragment:
  - sparkops.cluster.attributes
  - sparkops.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Check the image against the pins and the lock file
  sparkops.cluster.image_versions:
    image: vllm-node:fc08740fba1e
    pins: "{{ sparkops_image_pins }}"
    locked: "{{ sparkops_lock.versions | default({}) }}"
  register: image_versions

- name: Only read what an image carries
  sparkops.cluster.image_versions:
    image: nvcr.io/nvidia/vllm@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
    fail_on_mismatch: false
"""

RETURN = r"""
versions:
  description: What the image carries; a component it lacks is null.
  returned: always
  type: dict
  sample: {"vllm": "0.19.0", "torch": "2.12.0.dev20260410+cu130", "cuda": "13.2.0", "flashinfer": "0.6.6",
           "ray": "2.52.1", "nccl": "2.28.9"}
problems:
  description: One line per component that differs from its pin or lock, naming both versions.
  returned: always
  type: list
  elements: str
matches:
  description: Whether there are no problems.
  returned: always
  type: bool
"""

import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.image_versions import (
    COMPONENTS,
    PROBE,
    compare_versions,
    parse_probe_output,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            image=dict(type="str", required=True),
            pins=dict(type="dict", default={}),
            locked=dict(type="dict", default={}),
            fail_on_mismatch=dict(type="bool", default=True),
            docker=dict(type="str", default="docker"),
            timeout_s=dict(type="float", default=180),
        ),
        supports_check_mode=True,
    )
    p = module.params
    unknown = sorted(set(p["pins"]) - set(COMPONENTS)) + sorted(set(p["locked"]) - set(COMPONENTS))
    if unknown:
        module.fail_json(
            msg=f"unknown components {', '.join(unknown)} in pins/locked; use only {', '.join(COMPONENTS)}",
        )
    argv = [p["docker"], "run", "--rm", "--network", "none", "--entrypoint", "python3", p["image"], "-c", PROBE]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=p["timeout_s"], check=False)
    except FileNotFoundError:
        module.fail_json(msg=f"{p['docker']} is not installed on this host: install Docker (the image role needs it)")
    except subprocess.TimeoutExpired:
        module.fail_json(msg=f"the version probe in {p['image']} did not finish in {p['timeout_s']} s; is dockerd up?")
    if res.returncode != 0:
        module.fail_json(
            msg=f"could not run python3 in {p['image']} (exit {res.returncode}): {res.stderr.strip()[-500:]}. "
            "Is the image on this host, and does it have python3?",
            rc=res.returncode,
        )
    try:
        versions = parse_probe_output(res.stdout)
    except ValueError as exc:
        module.fail_json(msg=f"{p['image']}: {exc}", stdout=res.stdout[-2000:])
    problems = compare_versions(versions, p["pins"], p["locked"])
    result = dict(changed=False, versions=versions, problems=problems, matches=not problems)
    if problems and p["fail_on_mismatch"]:
        module.fail_json(
            msg=f"{p['image']} is not the image that was pinned: "
            + "; ".join(problems)
            + ". Build with the pinned build arguments (spark_vllm_image_build_args), or move the pins or the lock "
            "on purpose with playbooks/upgrade.yml.",
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
