# Copyright: sparkops maintainers
# Apache-2.0
"""Which reference a `registry` image is pulled by, and the digest a first pull by tag resolved to.

Controller-only (plugin_utils), stdlib only. A stack names its registry image by tag (`registry_image`)
and, once known, by digest (`registry_digest`; spark_vllm_image_registry_ref is then `<repo>@sha256:..`).
Every pull on every node is by digest: docker checks the content against it, and a tag may move.

    pull_plan(image, lock_image, upgrade) -> {"ref", "tag", "by_tag", "problems"}
        ref     the digest reference to pull ("" when by_tag)
        tag     the tag to pull ONCE on the build host to learn its digest (by_tag true)
    digest_ref(repo_digests, tag) -> "<repo>@sha256:<64 hex>", the entry of `docker image inspect`'s
        RepoDigests for the tag's repository (the digest docker verified when it pulled the tag);
        ValueError saying what is wrong otherwise.

The lock (plugins/plugin_utils/lockfile.py) records the reference pulled as `image.registry_ref` and the
tag as `image.registry_image`; from then on the lock's digest is pulled, by every run (an upgrade too,
while it asks for the same tag): a tag is followed once, at the first pull, never again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

DIGEST_REF_RE = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
# name[:port]/path:tag (the tag after the last '/'), without a digest
_TAG_RE = re.compile(
    r"^([a-z0-9][a-z0-9._-]*(?::[0-9]+)?(?:/[a-z0-9][a-z0-9._-]*)*)"  # the repository, a registry host:port first
    r":([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})$"  # the tag
)
# Docker Hub's names as `docker image inspect` writes them in RepoDigests: a repository without a
# registry host is docker.io's, a one-part name is under library/ (distribution/reference normalize.go).
_HUB_PREFIXES = ("docker.io/", "index.docker.io/", "registry-1.docker.io/")


def _text(value) -> str:
    return "" if value is None else str(value).strip()


def _repository(name: str) -> str:
    """A repository name in one form: docker.io's without its host, library/ dropped."""
    for prefix in _HUB_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return name[len("library/") :] if name.startswith("library/") else name


def pull_plan(image: Mapping, lock_image: Mapping | None, upgrade: bool) -> dict:
    """Which reference to pull. `image`: {registry_ref, registry_image} as the inventory gives them (the
    stack's, or an override); `lock_image`: the lock's `image` section; `upgrade`: this run may move the lock.

    A digest given (registry_ref) is pulled; outside an upgrade the lock's digest wins (the plan refuses an
    inventory that asks for another one). A tag (registry_image, no registry_ref) is held to the digest the
    lock recorded for that very tag, whatever the run; only a tag the lock does not hold is pulled, once."""
    lock_image = lock_image if isinstance(lock_image, Mapping) else {}
    given = _text(image.get("registry_ref"))
    tag = _text(image.get("registry_image"))
    locked = _text(lock_image.get("registry_ref"))
    out = {"ref": "", "tag": "", "by_tag": False, "problems": []}
    if given:
        ref = locked if locked and not upgrade else given
        if not DIGEST_REF_RE.match(ref):
            out["problems"].append(
                f"spark_vllm_image_registry_ref is '{ref}'; with spark_vllm_image_source: registry it must name the "
                "image by digest, e.g. nvcr.io/nvidia/vllm@sha256:<64 hex> (a tag moves; a digest does not). "
                "`docker buildx imagetools inspect <image:tag>` shows the digest of a tag you have verified, or "
                "leave it empty and name the tag in the stack's registry_image: the first pull records its digest"
            )
        out["ref"] = ref
        return out
    if not tag:
        out["problems"].append(
            "spark_vllm_image_source is registry but the stack names no image: set its registry_image "
            "(e.g. vllm/vllm-openai:v0.33.0-aarch64) or spark_vllm_image_registry_ref (<image>@sha256:<64 hex>)"
        )
        return out
    if not _TAG_RE.match(tag):
        out["problems"].append(
            f"the stack's registry_image is '{tag}', which is no image by tag (<registry>/<path>:<tag>, lower-case "
            "path, no digest): name the digest in registry_digest instead of the image"
        )
        return out
    held = locked and (_text(lock_image.get("registry_image")) == tag or not upgrade)
    if held:
        if not DIGEST_REF_RE.match(locked):
            out["problems"].append(
                f"the lock file's image.registry_ref is '{locked}', no digest reference: restore the lock file "
                "from version control"
            )
        out["ref"] = locked
        return out
    out.update(tag=tag, by_tag=True)
    return out


def digest_ref(repo_digests, tag: str) -> str:
    """The digest reference docker recorded for `tag`'s repository when it pulled it.

    `repo_digests`: `docker image inspect --format '{{json .RepoDigests}}' <tag>` (JSON text, or the
    list). Each entry is `<repository>@sha256:<64 hex>` (what the registry's manifest hashed to, checked by
    docker on the pull). Text from the node is checked, not trusted."""
    match = _TAG_RE.match(_text(tag))
    if not match:
        raise ValueError(f"'{tag}' is no image by tag")
    if isinstance(repo_digests, str):
        try:
            repo_digests = json.loads(repo_digests or "null")
        except ValueError:
            raise ValueError(
                f"docker image inspect of {tag} did not answer its RepoDigests as JSON: {repo_digests[:200]!r}"
            ) from None
    if not isinstance(repo_digests, list):
        repo_digests = []
    want = _repository(match.group(1))
    found = sorted(
        {
            str(entry)
            for entry in repo_digests
            if isinstance(entry, str) and DIGEST_REF_RE.match(entry) and _repository(entry.split("@", 1)[0]) == want
        }
    )
    if len(found) != 1:
        raise ValueError(
            f"the pull of {tag} left {'no' if not found else len(found)} digest(s) of {want} in the image's "
            f"RepoDigests ({', '.join(map(str, repo_digests)) or 'none'}): the image was not pulled from that "
            "registry (a local build or load carries no digest). Pull it from the registry, or give its digest as "
            "the stack's registry_digest"
        )
    repo, _at, digest = found[0].partition("@")
    # Pulled by the name the stack gives (its registry host kept), as docker verified it.
    return f"{match.group(1)}@{digest}" if _repository(repo) == want else found[0]
