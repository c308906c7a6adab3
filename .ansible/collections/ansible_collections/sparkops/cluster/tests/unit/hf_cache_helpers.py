"""Build small Hugging Face hub caches on disk for the weight tests (pure: files only, no daemons)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MODEL = "sparkops-test/tiny"
REVISION = "1" * 40


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 - git object id


def make_model(
    cache: Path, shards: int = 3, shard_bytes: int = 256 * 1024, revision: str = REVISION, index: bool = False
) -> dict:
    """A model as huggingface_hub lays it out: blobs named by hash, relative snapshot links, refs/main."""
    repo = cache / ("models--" + MODEL.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap = repo / "snapshots" / revision
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    names = {}

    def put(rel: str, data: bytes, lfs: bool) -> None:
        name = hashlib.sha256(data).hexdigest() if lfs else git_blob_id(data)
        (repo / "blobs" / name).write_bytes(data)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        os.symlink(os.path.relpath(repo / "blobs" / name, link.parent), link)
        names[rel] = name

    put("config.json", json.dumps({"model_type": "tiny"}).encode(), False)
    for i in range(shards):
        seed = hashlib.sha256(f"{revision}/{i}".encode()).digest()
        put(f"model-{i + 1:05d}-of-{shards:05d}.safetensors", (seed * (shard_bytes // 32 + 1))[:shard_bytes], True)
    if index:
        weight_map = {f"layer.{i}.weight": f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)}
        put("model.safetensors.index.json", json.dumps({"metadata": {}, "weight_map": weight_map}).encode(), False)
    (repo / "refs" / "main").write_text(revision)
    return {"repo": repo, "names": names}


def write_listing(repo: Path, revision: str = REVISION, **overrides) -> dict:
    """The Hub's file list as hub_download.py records it (.sparkops/<commit>.json), from the snapshot."""
    snap = repo / "snapshots" / revision
    files = {}
    for link in sorted(snap.rglob("*")):
        if link.is_symlink():
            blob = os.path.basename(os.readlink(link))
            entry = {"size": link.stat().st_size, "blob_id": blob}
            if len(blob) == 64:
                entry.update(lfs_sha256=blob, lfs_size=entry["size"])
            files[str(link.relative_to(snap))] = entry
    files.update(overrides)
    (repo / ".sparkops").mkdir(exist_ok=True)
    (repo / ".sparkops" / f"{revision}.json").write_text(
        json.dumps({"format": "sparkops-hub-listing/1", "files": files})
    )
    return files
