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
  - The snapshot is C(complete) only when every file of the revision is there with its size, judged by
    the Hub's file list recorded at download time (C(.sparkops/<commit>.json), or huggingface_hub's own
    C(trees/<commit>.json)), else by the shards named in C(model.safetensors.index.json); an
    interrupted download (C(blobs/*.incomplete)) also makes it incomplete. C(expected_from) says which.
  - With I(verify=full) every blob the revision references is hashed (sha256 for LFS blobs, git's
    sha1 for small files) and the ones whose content does not match their name are listed; the blobs
    that match are recorded in C(.sparkops/hashed-blobs.json) (size and mtime), so that a later
    I(verify=sizes) can say which blobs changed since they were hashed.
  - With I(verify=sizes) nothing is read but sizes and mtimes; C(message) says so ("contents not hashed").
  - Changes no model file (C(changed) is always false); with I(verify=full) outside check mode it
    writes the hash record and the progress file.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
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
      - Fail when the revision is absent or incomplete (see the description), or (with
        I(verify=full)) a blob is corrupt.
    type: bool
    default: false
  progress_file:
    description:
      - With I(verify=full), a JSON file rewritten as blobs are hashed (blobs and bytes done, total, rate).
    type: path
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: Reads and hashes as usual; with I(verify=full) it does not write the hash record.
  diff_mode:
    support: none
    details: Changes no model file, so there is nothing to show.
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
  description: Every file the revision lists is there with its size, no download is half done and
    (verify=full) no blob is corrupt.
  returned: always
  type: bool
expected_from:
  description: What decided completeness - C(hub listing), C(hub tree cache), C(model index) or C(links only).
  returned: always
  type: str
missing_files:
  description: Files of the revision that the snapshot lacks.
  returned: always
  type: list
  elements: str
incomplete_downloads:
  description: Blob name -> bytes so far of each interrupted download of this revision.
  returned: always
  type: dict
compared:
  description: C(sizes) (contents not hashed) or C(sha256) (every blob hashed).
  returned: always
  type: str
changed_since_hashed:
  description: Blobs whose size or mtime changed since they were last hashed and matched (verify=sizes).
  returned: always
  type: list
  elements: str
message:
  description: One line saying what was compared and what was found.
  returned: always
  type: str
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
  description: The full manifest (blobs name->size, links, files, refs, missing_blobs, records).
  returned: always
  type: dict
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils import hf_cache


class HashProgress:
    """Blobs and bytes hashed so far, written to a JSON file at most every 2 s."""

    def __init__(self, path, sizes: dict):
        self.path, self.sizes = path, sizes
        self.total = sum(sizes.values())
        self.done = self.blobs = 0
        self.start = self.last = time.monotonic()

    def __call__(self, name: str, ok: bool) -> None:
        self.done += self.sizes.get(name, 0)
        self.blobs += 1
        if time.monotonic() - self.last >= 2.0 or self.blobs == len(self.sizes):
            self.last = time.monotonic()
            self.write()

    def write(self) -> None:
        if not self.path:
            return
        elapsed = max(time.monotonic() - self.start, 1e-6)
        state = {
            "blobs_done": self.blobs,
            "blobs_total": len(self.sizes),
            "bytes_done": self.done,
            "bytes_total": self.total,
            "MB_per_s": round(self.done / 1e6 / elapsed, 1),
        }
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(self.path + ".tmp", "w", encoding="utf-8") as f:
                json.dump(state, f)
            os.replace(self.path + ".tmp", self.path)
        except OSError:
            pass


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cache_dir": {"type": "path", "required": True},
            "model": {"type": "str", "required": True},
            "revision": {"type": "str"},
            "verify": {"type": "str", "choices": ["sizes", "full"], "default": "sizes"},
            "require_complete": {"type": "bool", "default": False},
            "progress_file": {"type": "path"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        repo = hf_cache.repo_dir(p["cache_dir"], p["model"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    manifest = hf_cache.build_manifest(repo, p["revision"])
    if p["revision"] is None:
        # Every snapshot: completeness needs one revision; judge by the links alone.
        manifest["complete"] = bool(manifest["revision_found"] and not manifest["missing_blobs"])
    hash_failed = []
    changed_since = []
    if p["verify"] == "full" and manifest["blobs"]:
        progress = HashProgress(p["progress_file"], manifest["blobs"])
        if module.check_mode:
            hash_failed = hf_cache.failing_blobs(f"{repo}/blobs", list(manifest["blobs"]), progress=progress)
        else:
            hash_failed = hf_cache.verify_and_record(repo, list(manifest["blobs"]), progress=progress)
        compared = "sha256"
    else:
        changed_since = hf_cache.hash_record_status(repo, list(manifest["blobs"]))["changed_since_hashed"]
        compared = "sizes"
    complete = bool(manifest["complete"] and not hash_failed)
    problems = hf_cache.completeness_problems(manifest)
    if hash_failed:
        problems.append(f"{len(hash_failed)} blob(s) do not match their hash: {', '.join(hash_failed[:5])}")
    what = f"{len(manifest['blobs'])} blobs, {manifest['total_bytes']} bytes"
    if compared == "sizes":
        checked = "sizes match; contents not hashed"
        if changed_since:
            checked += (
                f"; {len(changed_since)} blob(s) changed (size or mtime) since they were last hashed: "
                + ", ".join(changed_since[:5])
                + " - run playbooks/verify.yml to hash them"
            )
    else:
        checked = "every blob hashed" + ("" if not hash_failed else " - MISMATCH")
    frm = manifest.get("expected_from") or "links only"
    message = (
        f"{p['model']}@{p['revision']}: complete by the {frm} ({what}): {checked}"
        if complete
        else f"{p['model']}@{p['revision']} is NOT complete ({frm}): " + "; ".join(problems or ["absent"])
    )
    result = {
        "changed": False,
        "present": manifest["present"],
        "revision": manifest["revision"],
        "revision_found": manifest["revision_found"],
        "complete": complete,
        "expected_from": manifest.get("expected_from"),
        "missing_files": manifest.get("missing_files", []),
        "incomplete_downloads": manifest.get("incomplete_downloads", {}),
        "compared": compared,
        "changed_since_hashed": changed_since,
        "message": message,
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
        else:
            why = message
        module.fail_json(
            msg=f"{why}. Download the model again (weight_cache_source: hub resumes it) "
            "or sync it from a node that has it complete.",
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
