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
  - Also reads the vLLM commit the build contains (the version's C(+g<hash>) label, else the commit setuptools-scm
    wrote into C(vllm/_version.py)) as C(vllm_commit), and the CUTLASS headers FlashInfer ships
    (C(flashinfer/data/cutlass/include)) as C(flashinfer_cutlass), C(<CUTLASS version>+sha256:<digest>).
  - Compares them with I(pins) (a pin matches the same version or one that only adds release numbers or a local
    label, so C(13.2) matches C(13.2.0) and C(0.19.0) matches C(0.19.0+cu132) but not C(0.19.0.dev5)) and with
    I(locked) (exact), and fails naming every component that differs and both versions unless
    I(fail_on_mismatch=false).
  - With C(vllm_commit) pinned, vLLM is judged by commit, not by version string - a build of that commit is
    accepted whatever local, dirty or CUDA label it carries (eugr's build reports e.g.
    C(0.19.1.dev0+g2a69949bd.d20260410.cu132) for tag v0.19.0); a build whose commit cannot be read is accepted
    only when its version is exactly the pinned release (C(0.19.0), C(0.19.0+cu132)).
  - With I(cache_dir), what an image carries is kept in a file named after its image ID, and a later
    run reads that file instead of starting a container. An image ID is the hash of the image's
    configuration, which names every layer, so the same ID always carries the same versions. The pins
    and the lock are compared on every run. A cache file that cannot be read is ignored and rewritten.
  - Read-only on the image and the node's configuration; the cache file is the only thing written.
version_added: "0.2.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  image:
    description: The image (name:tag, name@digest or ID) to look into. It must already be on this host.
    type: str
    required: true
  pins:
    description:
      - Component (vllm, torch, cuda, flashinfer, ray, nccl) to pinned version; null or empty means not pinned.
      - C(vllm_commit) is the vLLM commit (7-40 hex) the build must contain.
      - C(flashinfer_cutlass) is the CUTLASS FlashInfer must ship (C(<version>+sha256:<16 hex>)), compared exactly;
        unset, a FlashInfer release whose own CUTLASS is known (0.6.6) must ship that one, whatever I(locked) says.
    type: dict
    default: {}
  locked:
    description:
      - Component (and C(vllm_commit), C(flashinfer_cutlass)) to the exact value the lock file recorded; compared
        exactly.
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
  cache_dir:
    description:
      - Folder for the versions read from each image ID (created if missing). Unset, the probe container
        runs every time.
    type: path
  serve_help:
    description:
      - Also return what the image's vLLM prints for C(vllm serve --help=all), then O(envs_marker), then the
        C(VLLM_*) variables its C(vllm.envs) reads, one per line (none for a vLLM without
        C(vllm.envs.environment_variables)).
      - With O(cache_dir), a complete answer (the help exited 0) is kept in C(vllm-help-<image ID>.txt) there,
        so a rerun on the same image ID starts no container for it.
      - Fails when the help exits non-zero, with the end of its output.
    type: bool
    default: false
  envs_marker:
    description: The line that separates the help from the variable names in RV(serve_help).
    type: str
    default: "@@sparkops: VLLM_* variables@@"
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

- name: Read what an image carries and what its vLLM accepts (kept per image ID)
  sparkops.cluster.image_versions:
    image: vllm-node:fc08740fba1e
    cache_dir: /var/lib/sparkops/image-probes
    serve_help: true
  register: image_probe

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
  sample: {"vllm": "0.19.1.dev0+g2a69949bd.d20260410.cu132", "vllm_commit": "2a69949bd",
           "torch": "2.12.0.dev20260410+cu130", "cuda": "13.2.0", "flashinfer": "0.6.6",
           "flashinfer_cutlass": "4.2.1+sha256:0123456789abcdef", "ray": "2.52.1", "nccl": "2.28.9"}
record:
  description:
    - What the lock file records from this image (RV(versions) limited to the versions, C(vllm_commit) and
      C(flashinfer_cutlass)), the exact strings.
  returned: always
  type: dict
  sample: {"vllm": "0.19.1.dev0+g2a69949bd.d20260410.cu132", "vllm_commit": "2a69949bd", "flashinfer": "0.6.6"}
problems:
  description: One line per component that differs from its pin or lock, naming both versions.
  returned: always
  type: list
  elements: str
matches:
  description: Whether there are no problems.
  returned: always
  type: bool
image_id:
  description: The image's ID, when I(cache_dir) is set.
  returned: when cache_dir is set
  type: str
cached:
  description: Whether the versions came from the cache file of this image ID (no container started).
  returned: always
  type: bool
serve_help:
  description:
    - C(vllm serve --help=all)'s output, O(envs_marker), then the C(VLLM_*) variable names, one per line.
  returned: when serve_help is true
  type: str
serve_help_cached:
  description: Whether RV(serve_help) came from the cache file of this image ID (no container started).
  returned: when serve_help is true
  type: bool
"""

import json
import os
import re
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.files import write_text_atomic
from ansible_collections.sparkops.cluster.plugins.module_utils.image_versions import (
    LOCK_KEYS,
    PIN_KEYS,
    PROBE,
    compare_versions,
    lock_record,
    parse_probe_output,
)

_ID_RE = re.compile(r"^sha256:([0-9a-f]{64})$")


def _docker(module, argv: list, timeout: float) -> subprocess.CompletedProcess:
    p = module.params
    try:
        return subprocess.run([p["docker"], *argv], capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        module.fail_json(msg=f"{p['docker']} is not installed on this host: install Docker (the image role needs it)")
    except subprocess.TimeoutExpired:
        module.fail_json(msg=f"`docker {argv[0]}` on {p['image']} did not finish in {timeout} s; is dockerd up?")
    raise AssertionError  # fail_json exits


def image_id(module) -> str:
    p = module.params
    res = _docker(module, ["image", "inspect", "--format", "{{.Id}}", p["image"]], 60)
    found = _ID_RE.match(res.stdout.strip())
    if res.returncode != 0 or not found:
        module.fail_json(
            msg=f"{p['image']} is not on this host ({res.stderr.strip()[-300:] or res.stdout.strip()[-300:]}): "
            "build or transfer it first (playbooks/image.yml)",
        )
    return found.group(1)


def read_cache(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            versions = json.load(f)
    except (OSError, ValueError):
        return None
    # Every key the probe writes, so a file from an older probe (without vllm_commit) is read again.
    if not isinstance(versions, dict) or not set(LOCK_KEYS) <= set(versions):
        return None
    return versions


def write_cache(path: str, versions: dict) -> None:
    write_text_atomic(path, json.dumps(versions, sort_keys=True))


def probe(module) -> dict:
    p = module.params
    res = _docker(
        module, ["run", "--rm", "--network", "none", "--entrypoint", "python3", p["image"], "-c", PROBE], p["timeout_s"]
    )
    if res.returncode != 0:
        module.fail_json(
            msg=f"could not run python3 in {p['image']} (exit {res.returncode}): {res.stderr.strip()[-500:]}. "
            "Is the image on this host, and does it have python3?",
            rc=res.returncode,
        )
    try:
        return parse_probe_output(res.stdout)
    except ValueError as exc:
        module.fail_json(msg=f"{p['image']}: {exc}", stdout=res.stdout[-2000:])
    raise AssertionError  # fail_json exits


def serve_help(module, image_id_hex: str | None) -> tuple[str, bool]:
    """`vllm serve --help=all`, the marker and the VLLM_* names: from the cache when kept, else one container run."""
    p = module.params
    cache = os.path.join(p["cache_dir"], f"vllm-help-{image_id_hex}.txt") if p["cache_dir"] and image_id_hex else None
    if cache:
        try:
            with open(cache, encoding="utf-8") as f:
                text = f.read()
            if text:
                return text, True
        except OSError:
            pass
    # The help's exit status is the container's; a vLLM without vllm.envs.environment_variables
    # (older releases) prints no variables, and the caller's env check is then skipped.
    script = (
        "vllm serve --help=all; rc=$?; printf '%s\\n' \"$SPARKOPS_ENVS_MARKER\"; "
        "python3 -c 'import vllm.envs as e; print(chr(10).join(sorted(e.environment_variables)))' 2>/dev/null; "
        "exit $rc"
    )
    res = _docker(
        module,
        [
            "run",
            "--rm",
            "--network",
            "none",
            "-e",
            f"SPARKOPS_ENVS_MARKER={p['envs_marker']}",
            "--entrypoint",
            "sh",
            p["image"],
            "-c",
            script,
        ],
        p["timeout_s"],
    )
    if res.returncode != 0:
        module.fail_json(
            msg=f"`vllm serve --help=all` in {p['image']} exited {res.returncode}: "
            f"{(res.stderr.strip() or res.stdout.strip())[-500:]}. The image's vLLM cannot say which options it has; "
            "check that the image is the one the build made (playbooks/image.yml).",
            rc=res.returncode,
        )
    if cache and not module.check_mode:
        try:
            write_text_atomic(cache, res.stdout)
        except OSError as exc:
            module.warn(f"could not keep vLLM's options in {cache} ({exc}); the next run asks the image again")
    return res.stdout, False


def main():
    module = AnsibleModule(
        argument_spec=dict(
            image=dict(type="str", required=True),
            pins=dict(type="dict", default={}),
            locked=dict(type="dict", default={}),
            fail_on_mismatch=dict(type="bool", default=True),
            docker=dict(type="str", default="docker"),
            timeout_s=dict(type="float", default=180),
            cache_dir=dict(type="path"),
            serve_help=dict(type="bool", default=False),
            envs_marker=dict(type="str", default="@@sparkops: VLLM_* variables@@"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    unknown = sorted(set(p["pins"]) - set(PIN_KEYS)) + sorted(set(p["locked"]) - set(LOCK_KEYS))
    if unknown:
        module.fail_json(
            msg=f"unknown components {', '.join(unknown)} in pins/locked; pins may name {', '.join(PIN_KEYS)}, "
            f"the lock {', '.join(LOCK_KEYS)}",
        )
    result = dict(changed=False, cached=False)
    versions = None
    cache = None
    if p["cache_dir"]:
        result["image_id"] = "sha256:" + image_id(module)
        cache = os.path.join(p["cache_dir"], f"image-versions-{result['image_id'][7:]}.json")
        versions = read_cache(cache)
        result["cached"] = versions is not None
    if versions is None:
        versions = probe(module)
        if cache and not module.check_mode:
            try:
                write_cache(cache, versions)
            except OSError as exc:
                module.warn(f"could not keep the versions in {cache} ({exc}); the next run probes the image again")
    if p["serve_help"]:
        result["serve_help"], result["serve_help_cached"] = serve_help(module, result.get("image_id", "")[7:] or None)
    problems = compare_versions(versions, p["pins"], p["locked"])
    result.update(versions=versions, record=lock_record(versions), problems=problems, matches=not problems)
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
