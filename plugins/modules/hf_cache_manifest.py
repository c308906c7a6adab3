#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_cache_manifest
short_description: Describe one model in a Hugging Face hub cache (blobs, snapshot links, free space)
description:
  - Reads C(<cache_dir>/models--<org>--<name>) and returns what one revision of the model holds
    there - the blobs its snapshot links point at with their sizes, the links, the refs, blobs that
    are referenced but absent, and the free space of the filesystem.
  - With I(verify=full) every blob the revision references is hashed (sha256 for LFS blobs, git's
    sha1 for small files) and the ones whose content does not match their name are listed.
  - Read-only; never changes anything (C(changed) is always false), so it runs in check mode.
version_added: "0.1.0"
author:
  - sparkops maintainers
options:
  cache_dir:
    description: The hub cache, for example C(/var/lib/sparkops/huggingface/hub) (C($HF_HOME/hub)).
    type: path
    required: true
  model:
    description: Model id, C(org/name).
    type: str
    required: true
  revision:
    description:
      - Commit sha (40 hex) or a ref name such as C(main) (read from C(refs/)).
      - Omitted, every snapshot and every blob on disk is described.
    type: str
  verify:
    description:
      - C(sizes) reads sizes only (fast). C(full) also hashes every referenced blob.
    type: str
    choices: [sizes, full]
    default: sizes
  require_complete:
    description:
      - Fail when the revision is absent, or a blob it references is missing or (with
        I(verify=full)) corrupt.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Is the model complete on the head node?
  sparkops.cluster.hf_cache_manifest:
    cache_dir: /var/lib/sparkops/huggingface/hub
    model: Qwen/Qwen3-235B-A22B-GPTQ-Int4
    revision: main
  register: weights

- name: Check every blob's hash before serving
  sparkops.cluster.hf_cache_manifest:
    cache_dir: /var/lib/sparkops/huggingface/hub
    model: Qwen/Qwen3-235B-A22B-GPTQ-Int4
    revision: main
    verify: full
    require_complete: true
"""

RETURN = r"""
present:
  description: The model's directory exists in the cache.
  returned: always
  type: bool
revision:
  description: The commit the wanted revision resolves to; null when it cannot be resolved.
  returned: always
  type: str
revision_found:
  description: The snapshot of that commit exists.
  returned: always
  type: bool
complete:
  description: The snapshot exists, no referenced blob is missing and (verify=full) none is corrupt.
  returned: always
  type: bool
total_bytes:
  description: Bytes of the blobs the revision references (plus regular files in the snapshot).
  returned: always
  type: int
free_bytes:
  description: Bytes free on the filesystem that holds (or would hold) the model.
  returned: always
  type: int
hash_failed:
  description: Blobs whose content does not hash to their name (verify=full only).
  returned: always
  type: list
  elements: str
manifest:
  description: The full manifest (blobs name->size, links, files, refs, missing_blobs).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils import hf_cache


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cache_dir": {"type": "path", "required": True},
            "model": {"type": "str", "required": True},
            "revision": {"type": "str"},
            "verify": {"type": "str", "choices": ["sizes", "full"], "default": "sizes"},
            "require_complete": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        repo = hf_cache.repo_dir(p["cache_dir"], p["model"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    manifest = hf_cache.build_manifest(repo, p["revision"])
    hash_failed = []
    if p["verify"] == "full" and manifest["blobs"]:
        hash_failed = hf_cache.failing_blobs(f"{repo}/blobs", list(manifest["blobs"]))
    complete = bool(manifest["revision_found"] and not manifest["missing_blobs"] and not hash_failed)
    result = {
        "changed": False,
        "present": manifest["present"],
        "revision": manifest["revision"],
        "revision_found": manifest["revision_found"],
        "complete": complete,
        "total_bytes": manifest["total_bytes"],
        "free_bytes": hf_cache.free_bytes(repo),
        "hash_failed": hash_failed,
        "repo_path": repo,
        "manifest": manifest,
    }
    if p["require_complete"] and not complete:
        if not manifest["revision_found"]:
            why = (
                f"revision {p['revision']!r} of {p['model']} is not in {p['cache_dir']}"
                if p["revision"]
                else f"{p['model']} has no snapshot in {p['cache_dir']}"
            )
        elif manifest["missing_blobs"]:
            why = f"{len(manifest['missing_blobs'])} blob(s) are missing: {', '.join(manifest['missing_blobs'][:5])}"
        else:
            why = f"{len(hash_failed)} blob(s) do not match their hash: {', '.join(hash_failed[:5])}"
        module.fail_json(
            msg=f"{why}. Download the model again (weight_cache_source: hub) or sync it from a node that has it.",
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
