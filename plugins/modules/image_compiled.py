#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_compiled
short_description: Load a serving image's compiled vLLM and FlashInfer code against the torch the image carries
description:
  - Runs the image's own C(python3) in a throw-away container (C(docker run --rm --network none --entrypoint python3),
    with C(--gpus all) when I(gpus)) with a short probe that imports torch, then vLLM's extension modules as vLLM
    imports them at start-up (C(vllm._C), C(vllm._C_stable_libtorch), and C(vllm._moe_C) when the build has it),
    then FlashInfer, and loads every compiled module in FlashInfer's AOT folder (the flashinfer-jit-cache package's)
    with C(tvm_ffi.load_module), as FlashInfer does.
  - Fails naming each module that does not load and why (an C(undefined symbol) is a torch ABI skew between the
    torch the code was compiled against and the torch the image runs), unless I(fail_on_problem=false).
  - Meant to run right after a build, so a skew is a build-time refusal, not an engine crash at the first start.
  - Read-only; writes nothing.
version_added: "0.3.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  image:
    description: The image (name:tag or ID) to look into. It must already be on this host.
    type: str
    required: true
  gpus:
    description:
      - Give the container the host's GPUs (C(--gpus all)). FlashInfer's compiled modules link the driver's
        C(libcuda), which only the NVIDIA container runtime brings into the container; without it they cannot load.
      - False on a host without an NVIDIA GPU (the simulated cluster), where the image carries no CUDA code.
    type: bool
    default: true
  fail_on_problem:
    description: Fail when something does not load (otherwise only report RV(problems)).
    type: bool
    default: true
  docker:
    description: The docker executable.
    type: str
    default: docker
  timeout_s:
    description: Timeout of the probe container, in seconds (loading hundreds of FlashInfer modules takes a while).
    type: float
    default: 900
extends_documentation_fragment:
  - sparkops.cluster.attributes
  - sparkops.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Refuse a build whose compiled code does not load against its torch
  sparkops.cluster.image_compiled:
    image: vllm-node:fc08740fba1e-0123abcd

- name: Only report (a host without a GPU)
  sparkops.cluster.image_compiled:
    image: vllm-node:fc08740fba1e-0123abcd
    gpus: false
    fail_on_problem: false
  register: compiled
"""

RETURN = r"""
found:
  description: What the probe saw (torch's version, each vLLM extension, FlashInfer's AOT folder and counts, errors).
  returned: always
  type: dict
  sample: {"torch": "2.12.0.dev20260410+cu130", "vllm": {"vllm._C": "loaded"}, "flashinfer_loaded": 212,
           "flashinfer_failed": [], "errors": {}}
problems:
  description: One line per thing that does not load, with the error.
  returned: always
  type: list
  elements: str
summary:
  description: One line saying what was loaded.
  returned: always
  type: str
"""

import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.image_compiled import (
    PROBE,
    parse_output,
    problems,
    summary,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            image=dict(type="str", required=True),
            gpus=dict(type="bool", default=True),
            fail_on_problem=dict(type="bool", default=True),
            docker=dict(type="str", default="docker"),
            timeout_s=dict(type="float", default=900),
        ),
        supports_check_mode=True,
    )
    p = module.params
    argv = [p["docker"], "run", "--rm", "--network", "none"]
    if p["gpus"]:
        argv += ["--gpus", "all"]
    argv += ["--entrypoint", "python3", p["image"], "-c", PROBE]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=p["timeout_s"], check=False)
    except FileNotFoundError:
        module.fail_json(msg=f"{p['docker']} is not installed on this host: install Docker (the image role needs it)")
    except subprocess.TimeoutExpired:
        module.fail_json(
            msg=f"loading the compiled code of {p['image']} did not finish in {p['timeout_s']} s; raise timeout_s "
            "or look at the image by hand (docker run --rm --gpus all --entrypoint python3 <image> -c 'import vllm._C')"
        )
    if res.returncode != 0:
        module.fail_json(
            msg=f"could not run python3 in {p['image']} (exit {res.returncode}): {res.stderr.strip()[-500:]}. "
            + ("Is the NVIDIA container runtime installed (--gpus all)? " if p["gpus"] else "")
            + "Is the image on this host, and does it have python3?",
            rc=res.returncode,
        )
    try:
        found = parse_output(res.stdout)
    except ValueError as exc:
        module.fail_json(msg=f"{p['image']}: {exc}", stdout=res.stdout[-2000:], stderr=res.stderr[-2000:])
    issues = problems(found)
    result = dict(changed=False, found=found, problems=issues, summary=summary(found))
    if issues and p["fail_on_problem"]:
        module.fail_json(
            msg=f"{p['image']}: its compiled code does not load against the torch it carries: "
            + "; ".join(issues)
            + ". eugr's build installs the newest PyTorch nightly twice, in the builder that compiles this code and in "
            "the image that runs it (Dockerfile@fc08740:53, :314): build again, so that both take the same nightly.",
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
