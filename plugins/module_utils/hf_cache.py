# Copyright: sparkops maintainers
# Apache-2.0
"""Read, compare and check a Hugging Face hub cache (one model) on the local filesystem.

Python >= 3.10 standard library only: this file also runs on the nodes. ``hf_cache_sync`` feeds
its own source to ``python3`` over ssh (see :func:`remote_main`), so the manifest a target
reports is built by exactly the code below.

Layout of one model in the cache (``<cache>/models--<org>--<name>``)::

    blobs/<sha256 (LFS files, 64 hex) or git sha1 (small files, 40 hex)>
    snapshots/<revision>/<relative path> -> ../../blobs/<hash>   (relative symlinks)
    refs/<branch>                                                (text: the revision)

A manifest is a plain dict (JSON-safe):

* ``present``: the model's directory exists;
* ``revision``: the commit the wanted revision resolves to (a ref name such as ``main`` is read
  from ``refs/``), or null for "all snapshots"; ``revision_found``: that snapshot exists;
* ``blobs``: name -> size of the blobs the snapshot(s) reference (all blobs with
  ``all_blobs=True``); ``missing_blobs``: referenced names absent from ``blobs/``;
* ``links``: ``snapshots/<rev>/<path>`` -> link target, as stored (relative);
* ``files``: ``snapshots/<rev>/<path>`` -> size, for regular files in a snapshot (not links);
* ``refs``: ref name -> revision (with a revision: only the refs that point at it);
* ``total_bytes``: blobs plus snapshot files.

With a revision, the manifest also says whether the snapshot is COMPLETE, judged by the best list of
what the revision holds that this node has (``expected_from``):

1. ``hub listing``: ``.sparkops/<commit>.json``, the Hub's file list with sizes that
   ``roles/weight_cache/files/hub_download.py`` records before it downloads;
2. ``hub tree cache``: ``trees/<commit>.json``, the same list as huggingface_hub >= 1.x caches it
   (``_tree_cache.py``, format_version 1);
3. ``model index``: the shards named in ``model.safetensors.index.json`` (presence only, no sizes);
4. ``links only``: what the snapshot links point at (nothing else is known).

``missing_files`` (listed but not in the snapshot), ``wrong_size_files`` (path -> [expected, found]),
``incomplete_downloads`` (``blobs/<name>.incomplete`` left by an interrupted download -> bytes so far),
``complete`` and ``records`` (the list files, copied with the model by hf_cache_sync).

Each node also keeps ``.sparkops/hashed-blobs.json``: blob -> size and mtime when it was last hashed and
matched its name (written after a download, a sync copy or a full verify), so a later size check can
tell which blobs changed since they were hashed without reading them again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import ipaddress
import json
import mmap
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

# \Z, not $: "$" also matches before a final newline, and these names become file names and link targets.
SHA256_RE = re.compile(r"^[0-9a-f]{64}\Z")
GIT_SHA1_RE = re.compile(r"^[0-9a-f]{40}\Z")
MODEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9._-]+)?\Z")
REF_RE = re.compile(r"^[A-Za-z0-9._/-]+\Z")
CHUNK = 8 * 1024 * 1024
# Markers on the helper's stdout, so that shell start-up noise on a node is never parsed as a result.
RESULT_MARK = "SPARKOPS-RESULT "
RECORD_DIR = ".sparkops"
HASH_RECORD = "hashed-blobs.json"
INDEX_FILE = "model.safetensors.index.json"


def repo_dir(cache: str, model_id: str) -> str:
    """``<cache>/models--<org>--<name>`` for ``org/name``; ValueError for an unsafe id."""
    if not isinstance(model_id, str) or not MODEL_ID_RE.match(model_id) or ".." in model_id.split("/"):
        raise ValueError(
            f"model {model_id!r} is not a Hugging Face model id: use 'org/name' (letters, digits, '.', '_', '-')"
        )
    return os.path.join(cache, "models--" + model_id.replace("/", "--"))


def _blob_of(link_rel: str, target: str) -> str | None:
    """The blob a snapshot link points at (``link_rel`` is relative to the repo dir), else None."""
    if os.path.isabs(target):
        return None
    resolved = os.path.normpath(os.path.join(os.path.dirname(link_rel), target))
    parts = resolved.split(os.sep)  # normpath leaves no empty, "." or ".." part after "blobs"
    if len(parts) == 2 and parts[0] == "blobs":
        return parts[1]
    return None


def _read_refs(repo_path: str) -> dict:
    refs: dict = {}
    root = os.path.join(repo_path, "refs")
    if not os.path.isdir(root):
        return refs
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            full = os.path.join(dirpath, name)
            try:
                with open(full, encoding="utf-8") as f:
                    value = f.read().strip()
            except (OSError, UnicodeDecodeError):
                continue
            if value:
                refs[os.path.relpath(full, root).replace(os.sep, "/")] = value
    return refs


def _resolve(repo_path: str, refs: dict, revision: str) -> str:
    if revision in refs:
        return refs[revision]
    return revision


def _walk_snapshot(repo_path: str, rev: str, links: dict, files: dict) -> None:
    top = os.path.join(repo_path, "snapshots", rev)
    for dirpath, dirs, names in os.walk(top):
        entries = list(names)
        # os.walk lists symlinks to directories among dirs; a snapshot holds links to files only,
        # but record any link wherever it sits.
        for d in list(dirs):
            if os.path.islink(os.path.join(dirpath, d)):
                dirs.remove(d)
                entries.append(d)
        for name in entries:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, repo_path).replace(os.sep, "/")
            if os.path.islink(full):
                links[rel] = os.readlink(full)
            elif os.path.isfile(full):
                files[rel] = os.path.getsize(full)


def _real_dir(path: str) -> bool:
    """A folder, not a link to one."""
    return os.path.isdir(path) and not os.path.islink(path)


def _completeness_unknown() -> dict:
    """The completeness fields of a manifest before anything is known (a fresh dict each call)."""
    return {
        "expected_from": None,
        "expected_files": 0,
        "missing_files": [],
        "wrong_size_files": {},
        "incomplete_downloads": {},
        "records": {},
        "complete": False,
    }


def build_manifest(repo_path: str, revision: str | None = None, all_blobs: bool = False) -> dict:
    """Manifest of one model directory (see the module docstring). Never writes."""
    manifest = {
        "repo": os.path.basename(os.path.normpath(repo_path)),
        "present": os.path.isdir(repo_path),
        "revision": None,
        "revision_found": False,
        "refs": {},
        "links": {},
        "files": {},
        "blobs": {},
        "missing_blobs": [],
        "total_bytes": 0,
        **_completeness_unknown(),
    }
    if not manifest["present"]:
        if revision is not None:
            manifest["revision"] = revision if GIT_SHA1_RE.match(revision) else None
        return manifest
    refs = _read_refs(repo_path)
    snap_root = os.path.join(repo_path, "snapshots")
    if revision is None:
        revs = sorted(os.listdir(snap_root)) if _real_dir(snap_root) else []
        revs = [r for r in revs if _real_dir(os.path.join(snap_root, r))]
        manifest["refs"] = refs
        manifest["revision_found"] = bool(revs)
    else:
        commit = _resolve(repo_path, refs, revision)
        # A ref is followed only to a commit: huggingface_hub writes 40 hex into refs/<name>; anything else
        # (e.g. "../..") would name a folder outside snapshots/.
        manifest["revision"] = commit if GIT_SHA1_RE.match(commit) else None
        # A snapshot folder that is a link is not a snapshot: walking it would list (and a sync send)
        # whatever it points at, e.g. / on a crafted source.
        found = bool(manifest["revision"]) and _real_dir(snap_root) and _real_dir(os.path.join(snap_root, commit))
        manifest["revision_found"] = found
        revs = [commit] if found else []
        manifest["refs"] = {k: v for k, v in refs.items() if v == commit}
    links: dict = {}
    files: dict = {}
    for rev in revs:
        _walk_snapshot(repo_path, rev, links, files)
    blob_dir = os.path.join(repo_path, "blobs")
    on_disk: dict = {}
    if os.path.isdir(blob_dir):
        with os.scandir(blob_dir) as it:
            for entry in it:
                if entry.name.endswith(".incomplete") or not entry.is_file(follow_symlinks=False):
                    continue
                on_disk[entry.name] = entry.stat().st_size  # a regular file (is_file above did not follow)
    wanted = {b for rel, target in links.items() if (b := _blob_of(rel, target))}
    if revision is None or all_blobs:
        blobs = dict(on_disk)
    else:
        blobs = {name: on_disk[name] for name in wanted if name in on_disk}
    manifest["links"] = dict(sorted(links.items()))
    manifest["files"] = dict(sorted(files.items()))
    manifest["blobs"] = dict(sorted(blobs.items()))
    manifest["missing_blobs"] = sorted(wanted - set(on_disk))
    manifest["total_bytes"] = sum(blobs.values()) + sum(files.values())
    if revision is not None:
        manifest.update(_completeness(repo_path, manifest["revision"], manifest, on_disk, blob_dir))
    return manifest


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def expected_files(repo_path: str, commit: str) -> tuple:
    """(path -> {"size": int|None, "blob": name|None}, where the list came from), best source first."""
    data = _read_json(os.path.join(repo_path, RECORD_DIR, f"{commit}.json"))
    sources = (("hub listing", data),)
    tree = _read_json(os.path.join(repo_path, "trees", f"{commit}.json"))
    if isinstance(tree, dict) and tree.get("format_version") == 1:
        sources += (("hub tree cache", tree),)
    for name, doc in sources:
        if isinstance(doc, dict) and isinstance(doc.get("files"), dict):
            return {
                p: {"size": v.get("size"), "blob": v.get("lfs_sha256") or v.get("blob_id")}
                for p, v in doc["files"].items()
                if isinstance(v, dict)
            }, name
    index = _read_json(os.path.join(repo_path, "snapshots", commit, INDEX_FILE))
    if isinstance(index, dict) and isinstance(index.get("weight_map"), dict):
        shards = {str(v) for v in index["weight_map"].values()}
        return {p: {"size": None, "blob": None} for p in sorted(shards | {INDEX_FILE})}, "model index"
    return {}, "links only"


def _completeness(repo_path: str, commit: str | None, manifest: dict, on_disk: dict, blob_dir: str) -> dict:
    incomplete = {}
    if os.path.isdir(blob_dir):
        with os.scandir(blob_dir) as it:
            for entry in it:
                if entry.name.endswith(".incomplete") and entry.is_file(follow_symlinks=False):
                    incomplete[entry.name.removesuffix(".incomplete")] = entry.stat().st_size
    out = _completeness_unknown()
    if not manifest["revision_found"]:  # found only with a commit (build_manifest)
        out["incomplete_downloads"] = dict(sorted(incomplete.items()))
        return out
    expected, source = expected_files(repo_path, commit)
    out["expected_from"], out["expected_files"] = source, len(expected)
    links, files = manifest["links"], manifest["files"]
    for path, want in sorted(expected.items()):
        rel = f"snapshots/{commit}/{path}"
        if rel in files:
            size = files[rel]
        elif rel in links and (blob := _blob_of(rel, links[rel])) in on_disk:
            size = on_disk[blob]
        else:
            out["missing_files"].append(path)
            continue
        if want["size"] is not None and size != want["size"]:
            out["wrong_size_files"][path] = [want["size"], size]
    listed = {v["blob"] for v in expected.values() if v["blob"]}
    # With a list, only this revision's partial blobs count; without one, any partial blob does.
    relevant = {n: b for n, b in incomplete.items() if n in listed} if listed else incomplete
    out["incomplete_downloads"] = dict(sorted(relevant.items()))
    for rel in (f"{RECORD_DIR}/{commit}.json", f"trees/{commit}.json"):
        full = os.path.join(repo_path, rel)
        if os.path.isfile(full) and not os.path.islink(full):
            out["records"][rel] = os.path.getsize(full)
    out["complete"] = not (
        manifest["missing_blobs"] or out["missing_files"] or out["wrong_size_files"] or out["incomplete_downloads"]
    )
    return out


def completeness_problems(manifest: dict, limit: int = 5) -> list:
    """What keeps a manifest from being complete, as short phrases for a message (empty when complete)."""
    problems = []
    if not manifest.get("revision_found"):
        return ["the revision's snapshot is absent"]
    frm = manifest.get("expected_from")
    if manifest.get("missing_files"):
        miss = manifest["missing_files"]
        problems.append(
            f"{len(miss)} of {manifest.get('expected_files')} files listed by the {frm} are absent: "
            + ", ".join(miss[:limit])
        )
    if manifest.get("missing_blobs"):
        problems.append(
            f"{len(manifest['missing_blobs'])} linked blob(s) are absent: "
            + ", ".join(manifest["missing_blobs"][:limit])
        )
    if manifest.get("wrong_size_files"):
        wrong = manifest["wrong_size_files"]
        problems.append(
            f"{len(wrong)} file(s) have the wrong size: "
            + ", ".join(f"{p} ({g} bytes, the {frm} says {w})" for p, (w, g) in list(wrong.items())[:limit])
        )
    if manifest.get("incomplete_downloads"):
        inc = manifest["incomplete_downloads"]
        problems.append(
            f"{len(inc)} interrupted download(s) (blobs/*.incomplete): "
            + ", ".join(f"{n[:12]}... at {b} bytes" for n, b in list(inc.items())[:limit])
        )
    return problems


def load_hash_record(repo_path: str) -> dict:
    data = _read_json(os.path.join(repo_path, RECORD_DIR, HASH_RECORD))
    return data.get("blobs", {}) if isinstance(data, dict) and isinstance(data.get("blobs"), dict) else {}


def save_hash_record(repo_path: str, names) -> None:
    """Record that ``names`` were hashed just now and matched: their size and mtime, per node."""
    names = list(names)
    if not names:
        return
    record = load_hash_record(repo_path)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for name in names:
        try:
            st = os.lstat(os.path.join(repo_path, "blobs", name))
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue  # a link or folder under a blob's name was never hashed
        record[name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "hashed_at": now}
    data = json.dumps({"format": "sparkops-hashed-blobs/1", "blobs": dict(sorted(record.items()))}, indent=1)
    # Walked and written without following links: .sparkops may have been swapped for one (issue 23).
    with repo_subdir(repo_path, [RECORD_DIR], where=f"{RECORD_DIR}/{HASH_RECORD}") as fd:
        _write_file_at(fd, HASH_RECORD, data.encode())


def hash_record_status(repo_path: str, names) -> dict:
    """Which of ``names`` are unchanged since they were hashed (same size and mtime), changed, or never hashed."""
    record = load_hash_record(repo_path)
    out = {"unchanged": [], "changed_since_hashed": [], "never_hashed": []}
    for name in sorted(names):
        rec = record.get(name)
        try:
            st = os.stat(os.path.join(repo_path, "blobs", name))
        except OSError:
            continue
        if rec is None:
            out["never_hashed"].append(name)
        elif rec.get("size") == st.st_size and rec.get("mtime_ns") == st.st_mtime_ns:
            out["unchanged"].append(name)
        else:
            out["changed_since_hashed"].append(name)
    return out


def verify_and_record(repo_path: str, names, workers: int | None = None, progress=None) -> list:
    """Hash ``names`` (see :func:`failing_blobs`), record the ones that match, return the ones that fail."""
    names = [n for n in names if hash_kind(n)]
    bad = failing_blobs(os.path.join(repo_path, "blobs"), names, workers=workers, progress=progress)
    save_hash_record(repo_path, sorted(set(names) - set(bad)))
    return bad


def referenced_blobs(manifest: dict) -> set:
    """Blob names the manifest's snapshot links point at."""
    return {b for rel, target in manifest.get("links", {}).items() if (b := _blob_of(rel, target))}


def diff_manifests(src: dict, dst: dict) -> dict:
    """What ``dst`` lacks of ``src``: blobs, snapshot files, links and refs. Nothing is ever deleted.

    ``copy`` maps repo-relative paths (``blobs/<name>``, ``snapshots/...``) to their source size;
    ``bytes_to_copy`` sums them; ``bytes_needed`` is the extra space the target needs (a partial
    blob already holds part of its size; ``--inplace`` writes over it).
    """
    sblobs, dblobs = src.get("blobs", {}), dst.get("blobs", {})
    missing = sorted(n for n in sblobs if n not in dblobs)
    mismatched = sorted(n for n in sblobs if n in dblobs and dblobs[n] != sblobs[n])
    extra = sorted(n for n in dblobs if n not in sblobs)
    sfiles, dfiles = src.get("files", {}), dst.get("files", {})
    files_missing = sorted(p for p in sfiles if p not in dfiles)
    files_mismatched = sorted(p for p in sfiles if p in dfiles and dfiles[p] != sfiles[p])
    slinks, dlinks = src.get("links", {}), dst.get("links", {})
    links_create = {p: t for p, t in slinks.items() if p not in dlinks and p not in dfiles}
    links_fix = {p: t for p, t in slinks.items() if (p in dlinks and dlinks[p] != t) or p in dfiles}
    refs_update = {k: v for k, v in src.get("refs", {}).items() if dst.get("refs", {}).get(k) != v}
    copy = {f"blobs/{n}": sblobs[n] for n in missing + mismatched}
    copy.update({p: sfiles[p] for p in files_missing + files_mismatched})
    # The Hub's file list travels with the model, so every node can judge completeness by it.
    srec, drec = src.get("records", {}), dst.get("records", {})
    copy.update({p: n for p, n in srec.items() if drec.get(p) != n})
    needed = sum(sblobs[n] for n in missing) + sum(max(0, sblobs[n] - dblobs[n]) for n in mismatched)
    needed += sum(sfiles[p] for p in files_missing) + sum(max(0, sfiles[p] - dfiles[p]) for p in files_mismatched)
    return {
        "missing": missing,
        "mismatched": mismatched,
        "extra": extra,
        "files_missing": files_missing,
        "files_mismatched": files_mismatched,
        "links_create": links_create,
        "links_fix": links_fix,
        "refs_update": refs_update,
        "copy": dict(sorted(copy.items())),
        "bytes_to_copy": sum(copy.values()),
        "bytes_needed": needed,
        "in_sync": not (copy or links_create or links_fix or refs_update),
    }


def hash_kind(name: str) -> str | None:
    """``sha256`` for a 64-hex blob name (LFS), ``git-sha1`` for 40 hex (git blob), else None."""
    if SHA256_RE.match(name):
        return "sha256"
    if GIT_SHA1_RE.match(name):
        return "git-sha1"
    return None


def blob_hasher(name: str, size: int):
    """A hash object that, fed a blob's ``size`` bytes, gives its ``name`` if the content is right.

    64-hex names are sha256 of the content; 40-hex names are git blob ids, sha1 of
    ``b"blob <size>\\0" + content``. ValueError for a name that is neither (nothing to check against).
    """
    kind = hash_kind(name)
    if kind is None:
        raise ValueError(f"blob name {name!r} is neither a sha256 nor a git sha1: it cannot be verified")
    if kind == "sha256":
        return hashlib.sha256()
    h = hashlib.sha1()  # noqa: S324 - git's object id, not a security use
    h.update(b"blob %d\0" % size)
    return h


def file_sha256(path: str) -> str:
    """The sha256 of the file at ``path`` (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def verify_blob(path: str, name: str) -> bool:
    """Whether the file at ``path`` hashes to its blob ``name`` (see :func:`blob_hasher`)."""
    h = blob_hasher(name, os.path.getsize(path))
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest() == name


def failing_blobs(blob_dir: str, names, workers: int | None = None, progress=None) -> list:
    """Names among ``names`` whose file in ``blob_dir`` is absent or does not hash to its name.

    Names that cannot be verified (neither sha256 nor git sha1) are skipped. hashlib releases the
    GIL on large buffers, so a few threads hash a few blobs at once. ``progress(name, ok)`` is called
    as each blob is done.
    """
    names = [n for n in names if hash_kind(n)]
    if not names:
        return []

    def bad(name: str) -> str | None:
        """``name`` when its blob fails, else None."""
        try:
            failed = not verify_blob(os.path.join(blob_dir, name), name)
        except OSError:
            failed = True
        if progress is not None:
            progress(name, not failed)
        return name if failed else None

    workers = workers or min(8, os.cpu_count() or 1, len(names))  # names is not empty: at least 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return sorted(n for n in pool.map(bad, names) if n)


def plan_streams(blobs_with_sizes, streams: int) -> list:
    """Split names into at most ``streams`` lists of about equal bytes (largest first onto the lightest).

    ``blobs_with_sizes`` is a dict name -> size or an iterable of (name, size). Empty lists are
    dropped; the order is deterministic.
    """
    items = list(blobs_with_sizes.items()) if isinstance(blobs_with_sizes, dict) else list(blobs_with_sizes)
    if not items:
        return []
    n = max(1, min(int(streams), len(items)))
    sizes = dict(items)
    bins: list = [[] for _stream in range(n)]
    for name, _size in sorted(items, key=lambda kv: (-kv[1], kv[0])):
        # The lightest bin (min() gives the first of equally light ones); a model has some hundred files.
        min(bins, key=lambda b: sum(sizes[x] for x in b)).append(name)
    return [b for b in bins if b]


def nearest_existing(path: str) -> str:
    """``path`` or its nearest existing parent."""
    path = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def free_bytes(path: str) -> int:
    """Bytes free to an unprivileged user on the filesystem holding ``path`` (or its nearest existing parent)."""
    st = os.statvfs(nearest_existing(path))
    return st.f_bavail * st.f_frsize


# --- node-side actions: run on a target by hf_cache_sync over ssh (``python3 -c BOOT``) -------------


def node_manifest(args: dict) -> dict:
    """Manifest of a model, free space, whether rsync is installed, and (optionally) hash failures.

    ``hash``: name -> expected size of blobs to verify; only those present with that size are
    hashed (absent or wrong-sized ones already fail on their size).
    """
    repo = os.path.abspath(os.path.expanduser(args["repo"]))
    manifest = build_manifest(repo, args.get("revision"), all_blobs=bool(args.get("all_blobs")))
    expected = args.get("hash") or {}
    wanted = [n for n, size in expected.items() if manifest["blobs"].get(n) == size]
    status = hash_record_status(repo, list(manifest["blobs"]))
    if args.get("record", True):
        hash_failed = verify_and_record(repo, wanted)  # nothing to hash: nothing hashed or written
    else:  # check mode: nothing may be written, not even the hash record
        hash_failed = failing_blobs(os.path.join(repo, "blobs"), wanted)
    return {
        "hash_record": {k: len(v) for k, v in status.items()}
        | {"changed_since_hashed_names": status["changed_since_hashed"][:20]},
        "repo_path": repo,
        "manifest": manifest,
        "free_bytes": free_bytes(repo),
        "free_path": nearest_existing(repo),
        "rsync": shutil.which("rsync"),
        "hash_failed": hash_failed,
        "uid": os.getuid(),
        "gid": os.getgid(),
    }


def _safe_rel(rel: str) -> bool:
    norm = os.path.normpath(rel)
    return not os.path.isabs(rel) and norm == rel.replace("/", os.sep) and not norm.startswith("..")


# rsync writes a file as ``.<name>.XXXXXX`` and renames it when complete; a killed rsync leaves it.
RSYNC_TEMP_RE = re.compile(r"^\.[0-9a-f]{40,64}\.[A-Za-z0-9]{6}\Z")


def node_mkdirs(args: dict) -> dict:
    """Create the model's folders and remove temporary files a killed rsync left in ``blobs/``."""
    repo = os.path.abspath(os.path.expanduser(args["repo"]))
    for sub in ("snapshots", "refs"):
        with repo_subdir(repo, [sub]):
            pass  # created, and not a link
    removed = []
    with repo_subdir(repo, ["blobs"]) as fd:
        for name in os.listdir(fd):
            if RSYNC_TEMP_RE.match(name) and stat.S_ISREG(os.lstat(name, dir_fd=fd).st_mode):
                os.unlink(name, dir_fd=fd)
                removed.append(name)
    return {"repo": repo, "stale_temp_removed": sorted(removed)}


# --- writing on a target without following links (issue 23) ---------------------------------------
#
# What a target writes into its cache is named by the source (snapshot paths, link targets). Checking a
# path as text is not enough: a folder on the way may already be a link (planted by an earlier sync of a
# crafted snapshot, or by anyone who can write into the cache), and the kernel follows it. So every
# write below walks from the model's folder one component at a time with O_NOFOLLOW, creates what is
# missing with mkdir(dir_fd=...), and writes, links and renames relative to the last folder's fd: a link
# anywhere on the way makes the walk fail instead of leading out of the cache.

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_component(name: str, dir_fd: int, create: bool, where: str) -> int:
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"refusing {where!r}: {name!r} is not a plain folder name")
    for _attempt in range(2):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=dir_fd)
        except OSError as exc:  # ELOOP (a link) or ENOTDIR (a file)
            raise ValueError(
                f"refusing {where!r}: {name!r} on the way is a link or not a folder on this node "
                "(nothing is written through links; remove it and run again)"
            ) from exc
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def open_repo(repo: str, create: bool = True) -> int:
    """An fd of the model's folder ``repo`` (``<cache>/models--org--name``), itself not a link.

    The cache folder above it is the node's own (configured, may sit behind a link); the model's
    folder and everything in it is what a sync writes, so it is never followed."""
    parent, name = os.path.split(os.path.abspath(repo))
    if create:
        os.makedirs(parent, exist_ok=True)
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _open_component(name, pfd, create, repo)
    finally:
        os.close(pfd)


def open_subdir(repo_fd: int, parts, create: bool = True, where: str = "") -> int:
    """An fd of ``repo/parts...``, walked without following any link (see above); the caller closes it."""
    fd = os.dup(repo_fd)
    try:
        for part in parts:
            nfd = _open_component(part, fd, create, where or "/".join(parts))
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def repo_subdir(repo: str, parts, create: bool = True, where: str = ""):
    """``open_repo`` then ``open_subdir`` as a context: yields the folder's fd."""
    rfd = open_repo(repo, create)
    try:
        fd = open_subdir(rfd, list(parts), create, where)
    finally:
        os.close(rfd)
    try:
        yield fd
    finally:
        os.close(fd)


def _write_file_at(dir_fd: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """``data`` into ``name`` in ``dir_fd`` by a new temporary file renamed over it (never through a link)."""
    # Unique per process and thread (two writers of the hash record never share a temporary file).
    tmp = f".{name}.{os.getpid()}.{threading.get_ident()}.sparkops-tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)  # unlink never follows: a link there is removed, not its target
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    _replace_at(dir_fd, tmp, name)


def _replace_at(dir_fd: int, tmp: str, name: str) -> None:
    """Rename ``tmp`` over ``name`` (both in ``dir_fd``); a folder there is refused, not filled."""
    try:
        if stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode):
            os.unlink(tmp, dir_fd=dir_fd)
            raise ValueError(f"refusing to replace the folder {name!r} with a file or link")
    except FileNotFoundError:
        pass
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def canonical_link_target(rel: str) -> str | None:
    """The only target accepted for the snapshot link ``rel`` (``snapshots/<rev>/<path>``): the one
    huggingface_hub writes (os.path.relpath to the blob), ``../`` up to the model's folder then
    ``blobs/<hash>``. None when ``rel`` is not such a path."""
    parts = rel.split("/")  # _safe_rel refuses empty, "." and ".." components (normpath would change them)
    if len(parts) < 3 or parts[0] != "snapshots" or not _safe_rel(rel):
        return None
    return "../" * (len(parts) - 1) + "blobs/"


def link_target_ok(rel: str, target: str) -> bool:
    """Whether ``rel -> target`` is a snapshot link to a blob of the same model, in canonical form."""
    prefix = canonical_link_target(rel)
    return prefix is not None and target.startswith(prefix) and bool(hash_kind(target[len(prefix) :]))


def node_links(args: dict) -> dict:
    """Create or fix snapshot links and write refs, never through a link already on disk.

    A link is accepted only at ``snapshots/<rev>/<path>`` and only pointing at ``blobs/<hash>`` of the
    same model in the form huggingface_hub writes (:func:`link_target_ok`); its folders are walked
    without following links (:func:`open_subdir`). Refs are written the same way under ``refs/``.
    Everything is checked before anything is written.
    """
    repo = os.path.abspath(os.path.expanduser(args["repo"]))
    done = {"links_created": 0, "links_fixed": 0, "refs_written": 0}
    links = sorted((args.get("links") or {}).items())
    refs = sorted((args.get("refs") or {}).items())
    for rel, target in links:
        if canonical_link_target(rel) is None:
            raise ValueError(f"refusing snapshot path {rel!r}: not a relative path under snapshots/<revision>/")
        if not isinstance(target, str) or not link_target_ok(rel, target):
            raise ValueError(
                f"refusing link {rel} -> {target}: a snapshot link must point at blobs/<hash> of the same model "
                f"({canonical_link_target(rel)}<hash>); the target leaves the model's blobs"
            )
    for name, value in refs:
        if (
            not isinstance(name, str)
            or not REF_RE.match(name)
            or not _safe_rel(name)
            or not GIT_SHA1_RE.match(str(value))
        ):
            raise ValueError(f"refusing ref {name!r} = {value!r}")
    for rel, target in links:
        parts = rel.split("/")
        with repo_subdir(repo, parts[:-1], where=rel) as fd:
            name = parts[-1]
            try:
                st = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode) and os.readlink(name, dir_fd=fd) == target:
                continue
            tmp = f".{name}.sparkops-tmp"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=fd)
            os.symlink(target, tmp, dir_fd=fd)
            _replace_at(fd, tmp, name)
            done["links_fixed" if st is not None else "links_created"] += 1
    for name, value in refs:
        parts = ["refs", *name.split("/")]
        with repo_subdir(repo, parts[:-1], where=f"refs/{name}") as fd:
            _write_file_at(fd, parts[-1], str(value).encode())
        done["refs_written"] += 1
    return done


def _wait_port(address: str, port: int, proc, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.02)  # the daemon starts in ~30 ms (measured); a 0.1 s poll cost 0.1 s a sync
    return False


def _stop_group(proc, grace_s: float = 5.0) -> None:
    """SIGTERM (when ``grace_s`` > 0), then SIGKILL the process group; wait for the leader."""
    if proc.poll() is None and grace_s > 0:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # connection children share the daemon's group
    proc.wait(timeout=10)


class TemporaryRsyncd:
    """A temporary rsync daemon on this node, started by :func:`remote_main` and stopped by it.

    Bound to ``address``:``port`` only, one module ``hf`` with path = the model's folder (``path``),
    write-only, ``hosts allow`` = the source, password auth with a one-time secret, no chroot but
    symlinks munged, running as the ssh user. It lives until the source sends ``rsyncd_stop`` or
    closes the channel (the copy is done, failed, or the source was killed): :meth:`stop` kills the
    daemon's process group and removes its temporary files.
    """

    def __init__(self, args: dict):
        self.tmp = tempfile.mkdtemp(prefix="sparkops-rsyncd-")
        self.proc = None
        try:
            self._start(args)
        except BaseException:
            self.stop()
            raise

    def _start(self, args: dict) -> None:
        tmp = self.tmp
        secrets = os.path.join(tmp, "secrets")
        fd = os.open(secrets, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{args['user']}:{args['secret']}\n")
        conf = os.path.join(tmp, "rsyncd.conf")
        log = os.path.join(tmp, "rsyncd.log")
        with open(conf, "w", encoding="utf-8") as f:
            f.write(
                f"address = {args['address']}\nport = {int(args['port'])}\n"
                f"lock file = {os.path.join(tmp, 'rsyncd.lock')}\nlog file = {log}\n"
                f"[hf]\n  path = {args['path']}\n  comment = sparkops hf_cache_sync (temporary)\n"
                # Write-only, one model's folder, links munged (stored as /rsyncd-munged/...: never
                # followed) - without a chroot a stored link would lead the daemon out (issue 23).
                f"  read only = no\n  write only = yes\n  list = no\n  use chroot = no\n  munge symlinks = yes\n"
                # uid/gid only matter to a daemon started as root: keep the ssh user's identity.
                + (f"  uid = {os.getuid()}\n  gid = {os.getgid()}\n" if os.getuid() == 0 else "")
                + f"  hosts allow = {args['allow']}\n  hosts deny = *\n"
                f"  auth users = {args['user']}\n  secrets file = {secrets}\n  strict modes = yes\n"
                # A copy only adds files: no deletion on the target, whatever the client asks (rsyncd.conf(5),
                # refuse options: every delete option implies --delete, and implied options are refused
                # like explicit ones; the daemon prints an error and exits before the transfer).
                "  refuse options = delete* del remove-source-files\n"
                f"  timeout = {int(args.get('io_timeout', 300))}\n"
            )
        os.makedirs(args["path"], exist_ok=True)
        cmd = [
            args.get("rsync") or "rsync",
            "--daemon",
            "--no-detach",
            f"--config={conf}",
            f"--address={args['address']}",
            f"--port={int(args['port'])}",
        ]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        if not _wait_port(args["address"], int(args["port"]), self.proc, float(args.get("start_timeout", 15))):
            err = b""
            if self.proc.poll() is not None and self.proc.stderr:
                err = self.proc.stderr.read() or b""
            log_text = ""
            if os.path.exists(log):
                with open(log, encoding="utf-8", errors="replace") as f:
                    log_text = f.read()[-2000:]
            raise RuntimeError(
                f"rsync daemon did not start on {args['address']}:{args['port']}: "
                f"{err.decode(errors='replace').strip()} {log_text.strip()}".strip()
            )

    def stop(self) -> dict:
        pid = self.proc.pid if self.proc is not None else None
        if self.proc is not None:
            # No grace period: by the time the source stops the daemon every stream has ended (or the
            # source is gone), and rsync took ~0.4 s to exit on SIGTERM here, measured - a third of a
            # GiB's copy. A transfer cut short leaves a temp file that node_mkdirs removes next time.
            _stop_group(self.proc, grace_s=0.0)
            self.proc = None
        shutil.rmtree(self.tmp, ignore_errors=True)
        return {"stopped": True, "pid": pid}


# --- transport=tcp: sparkops' own receiver (issue 17, "weights at disk speed") ------------------
#
# Where the time of a node-to-node copy went (benchmarks/weight_sync.py, 2 cores, 2 GiB): not the
# network (a plain TCP socket into /dev/null moved it 3-5 times faster than a local copy) but the page
# cache on the receiver. rsync, tar and nc write through it; dirtying 2 GiB of pages and writing them
# back cost more than everything else (`cp` pays the same, and sets the bar). Writes with O_DIRECT
# skip both, and rsync has no such option. So: source file -> socket by sendfile(2) (no copy in user
# space); socket -> one page-aligned buffer -> disk by O_DIRECT (the disk's DMA does the write).
# `dd oflag=direct` was as fast (1.45 s vs 1.39 s, same run) but cannot hash the bytes on their way,
# and hashing afterwards re-reads the whole model from disk (5.4 s vs 1.75 s for the module's run): the
# receiver checks each blob against its name before giving it that name. On a Spark the second reason
# matters as much: memory is unified, and page cache filled by 57.6 GiB of received weights is counted
# against vLLM's KV cache at its start (docs/cold-start.md); O_DIRECT leaves none behind.

AUTH_NONCE_BYTES = 32
AUTH_ANSWER_BYTES = hashlib.sha256().digest_size  # tcp_auth's HMAC-SHA256
TCP_HEADER = struct.Struct("!I")
TCP_MAX_HEADER = 4096
TCP_CHUNK = 4 << 20  # a multiple of every disk's logical block size, for O_DIRECT
DIRECT_ALIGN = 4096


def _recv_exact(conn, n: int) -> bytes:
    """Exactly ``n`` bytes from ``conn`` (never more: what follows a header is the blob's, read into
    the aligned buffer); EOFError when the peer closed first."""
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _send_msg(conn, obj: dict) -> None:
    data = json.dumps(obj).encode()
    conn.sendall(TCP_HEADER.pack(len(data)) + data)


def _recv_msg(conn) -> dict | None:
    """One length-prefixed JSON message; None at a clean end of the stream (EOF before a header)."""
    first = conn.recv(TCP_HEADER.size)
    if not first:
        return None
    (n,) = TCP_HEADER.unpack(first + _recv_exact(conn, TCP_HEADER.size - len(first)))
    if n > TCP_MAX_HEADER:
        raise ValueError(f"a header of {n} bytes: not a sparkops sender")
    return json.loads(_recv_exact(conn, n))


def tcp_auth(secret: str, nonce: bytes) -> bytes:
    """The sender's answer to the receiver's challenge (the secret itself never crosses the link)."""
    return hmac.new(secret.encode(), nonce, hashlib.sha256).digest()


def direct_io_ok(directory: str) -> bool:
    """Whether files in ``directory`` can be written with O_DIRECT (not on tmpfs, for one)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    probe = os.path.join(directory, f".sparkops-direct-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
    except OSError:
        return False
    try:
        with mmap.mmap(-1, DIRECT_ALIGN) as page:  # page-aligned, as O_DIRECT wants
            return os.write(fd, page) == DIRECT_ALIGN
    except OSError:
        return False
    finally:
        os.close(fd)
        os.unlink(probe)


def _temp_name_at(dir_fd: int, name: str) -> str:
    """A new empty ``.<name>.XXXXXX`` in ``dir_fd`` (rsync's pattern: node_mkdirs removes a cut
    transfer's leftover in blobs/), created with O_EXCL|O_NOFOLLOW: never an existing file or link."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    for _attempt in range(100):
        suffix = "".join(secrets.choice(alphabet) for _position in range(6))
        tmp = f".{name}.{suffix}"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd))
            return tmp
        except FileExistsError:
            continue
    raise RuntimeError(f"no free temporary name for {name}")


def receivable_path(rel) -> bool:
    """Whether transport=tcp may write ``rel`` at all: a blob by its hash name, the Hub's file list
    (``.sparkops/<commit>.json``, huggingface_hub 1.x's ``trees/<commit>.json``) or a plain file in a
    snapshot. Only what the source also announced for this copy (the plan) is received."""
    if not isinstance(rel, str) or not _safe_rel(rel):
        return False
    parts = rel.split("/")  # _safe_rel refused empty, "." and ".." components already
    if len(parts) == 2 and parts[0] == "blobs":
        return bool(hash_kind(parts[1]))
    if len(parts) == 2 and parts[0] in (RECORD_DIR, "trees"):
        return bool(GIT_SHA1_RE.match(parts[1].removesuffix(".json"))) and parts[1].endswith(".json")
    return canonical_link_target(rel) is not None


# Blobs are content-addressed and never written again: read-only for everyone, whatever the sender's
# file had (the sent mode bits once made a blob -rwsrwsrwx on the target). Other files: 0644.
BLOB_MODE = 0o444
FILE_MODE = 0o644
MAX_REFUSALS_KEPT = 20


class TemporaryReceiver:
    """The target's end of transport=tcp, started by :func:`remote_main` and stopped by it.

    Listens on ``address``:``port`` only, accepts connections from ``allow`` only, and asks each for the
    HMAC of a random challenge under the one-time ``secret`` within ``handshake_timeout`` seconds. A
    connection takes one of the ``max_conns`` stream slots (the source's streams plus one; one more is
    refused) only once it has answered: connections still owing their answer are held apart, at most
    ``max_pending`` (default 4 x max_conns, at least 16), and a new one drops the oldest of them, so idle
    connections (anyone on the source's address can open them) never keep the real sender out.
    A connection then carries files one after another: a header (path, size, mtime), the bytes, and
    the receiver's answer after each (an error answer for anything malformed, then the connection ends).
    Only paths in the plan (``plan`` at the start, more by :meth:`allow`: path -> size) are written,
    with exactly that size, and only paths :func:`receivable_path` accepts; each goes to a new
    temporary file in its folder, walked without following links (:func:`open_subdir`), must have its
    full size and (``verify``, blobs) hash to its name, is flushed, gets a fixed mode (0444 for a
    blob) and is then renamed; the blobs verified are added to the node's hash record at the stop.
    It lives until ``tcp_stop`` or the end of the session.
    """

    def __init__(self, args: dict):
        self.repo = os.path.abspath(os.path.expanduser(args["repo"]))
        with repo_subdir(self.repo, ["blobs"]):
            pass  # created, and not a link
        self.blob_dir = os.path.join(self.repo, "blobs")
        self.secret = args["secret"]
        self.allow_addr = ipaddress_normal(args["allow"])
        self.io_timeout = float(args.get("io_timeout", 300))
        self.handshake_timeout = float(args.get("handshake_timeout", 10))
        self.max_conns = max(1, int(args.get("max_conns", 8)))
        self.max_pending = max(1, int(args.get("max_pending", max(16, 4 * self.max_conns))))
        self.pending: dict = {}  # connections before their answer, oldest first -> accepted at
        self.verify = bool(args.get("verify", True))
        # Without O_DIRECT (tmpfs, for one) it writes through the cache and drops what it wrote.
        self.direct = direct_io_ok(self.blob_dir)
        self.lock = threading.Lock()
        self.plan: dict = {}
        self.hashes: dict = {}  # path -> sha256 of a file not named by its hash (the lists, snapshot files)
        self.allow(args.get("plan") or {}, args.get("hashes"))
        self.stats = {"files": 0, "bytes": 0, "refused": [], "errors": []}
        self.verified: list = []
        self.workers: list = []
        self.conns: set = set()
        self.stopping = False
        self.stopped: dict | None = None
        fam = socket.AF_INET6 if ":" in args["address"] else socket.AF_INET
        self.sock = socket.socket(fam, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((args["address"], int(args["port"])))
            self.sock.listen(64)
        except OSError as exc:
            self.sock.close()
            raise RuntimeError(f"cannot listen on {args['address']}:{args['port']}: {exc}") from exc
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def allow(self, files: dict, hashes: dict | None = None) -> dict:
        """Add ``files`` (path -> size) to what may be received, and ``hashes`` (path -> sha256) of the files
        among them that their name does not check (the Hub's file lists, snapshot files): each must arrive
        with exactly that hash. ValueError (nothing added) for a bad one."""
        if not isinstance(files, dict):
            raise ValueError("the plan must map paths to sizes")
        hashes = {} if hashes is None else hashes
        if not isinstance(hashes, dict):
            raise ValueError("the plan's hashes must map paths to sha256 digests")
        for rel, size in files.items():
            if not receivable_path(rel) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ValueError(f"refusing to plan {rel!r} ({size!r} bytes): not a file a model's cache holds")
        for rel, digest in hashes.items():
            if (
                rel not in files
                or rel.startswith("blobs/")
                or not isinstance(digest, str)
                or not SHA256_RE.match(digest)
            ):
                raise ValueError(
                    f"refusing the hash {str(digest)[:80]!r} of {str(rel)[:200]!r}: not a planned file's sha256"
                )
        with self.lock:
            self.plan.update(files)
            self.hashes.update(hashes)
            return {"planned": len(self.plan), "hashed": len(self.hashes)}

    def _refuse(self, why: str) -> None:
        with self.lock:
            if len(self.stats["refused"]) < MAX_REFUSALS_KEPT:
                self.stats["refused"].append(why)

    def _accept(self) -> None:
        while not self.stopping:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return  # the socket was closed: stop() was called
            try:
                if ipaddress_normal(peer[0]) != self.allow_addr:
                    self._refuse(peer[0])
                    conn.close()
                    continue
                with self.lock:
                    # No stream slot before the answer: the oldest connection still owing one makes room.
                    self.pending[conn] = time.monotonic()
                    oldest = next(iter(self.pending)) if len(self.pending) > self.max_pending else None
                    if oldest is not None:
                        del self.pending[oldest]
                if oldest is not None:
                    self._refuse(f"{peer[0]}: more than {self.max_pending} connections without an answer yet")
                    with contextlib.suppress(OSError):
                        oldest.shutdown(socket.SHUT_RDWR)  # its thread's read ends; the thread closes it
                t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
                with self.lock:
                    self.workers = [w for w in self.workers if w.is_alive()]
                    self.workers.append(t)
                t.start()
            except Exception as exc:  # noqa: BLE001 - e.g. no thread could start: drop this one, keep accepting
                self._refuse(f"{peer[0]}: {type(exc).__name__}: {exc}")
                with self.lock:
                    self.pending.pop(conn, None)
                    self.conns.discard(conn)
                with contextlib.suppress(OSError):
                    conn.close()

    def _serve(self, conn) -> None:
        try:
            conn.settimeout(self.handshake_timeout)  # an idle connection is dropped in seconds
            nonce = secrets.token_bytes(AUTH_NONCE_BYTES)
            conn.sendall(nonce)
            if not hmac.compare_digest(_recv_exact(conn, AUTH_ANSWER_BYTES), tcp_auth(self.secret, nonce)):
                self._refuse("wrong secret")
                return
            with self.lock:  # answered: now, and only now, a stream slot
                if self.pending.pop(conn, None) is None:
                    return  # dropped as the oldest waiting one meanwhile
                full = len(self.conns) >= self.max_conns
                if not full:
                    self.conns.add(conn)
            if full:
                self._refuse(f"{self.allow_addr}: more than {self.max_conns} connections")
                return
            conn.settimeout(self.io_timeout)  # a stalled stream fails after io_timeout
            while True:
                try:
                    meta = _recv_msg(conn)
                    if meta is None:
                        return
                    rel, size = self._check(meta)
                    self._receive(conn, rel, size, meta)
                except Exception as exc:  # noqa: BLE001 - every failure is answered, never a traceback
                    if self.stopping:
                        return  # stop() woke this read: nothing to answer
                    msg = str(exc) if isinstance(exc, (ValueError, RuntimeError)) else f"{type(exc).__name__}: {exc}"
                    with self.lock:
                        self.stats["errors"].append(msg)
                    with contextlib.suppress(OSError):
                        _send_msg(conn, {"error": msg})
                    return  # the stream's position is lost: the sender fails this stream
                with self.lock:
                    self.stats["files"] += 1
                    self.stats["bytes"] += size
                    if self.verify and rel.startswith("blobs/"):
                        self.verified.append(rel.removeprefix("blobs/"))
                _send_msg(conn, {"ok": rel})
        except Exception as exc:  # noqa: BLE001 - the connection ends; the sender sees it closed
            if not self.stopping:
                with self.lock:
                    self.stats["errors"].append(f"connection from {self.allow_addr}: {type(exc).__name__}: {exc}")
        finally:
            with self.lock:
                self.pending.pop(conn, None)
                self.conns.discard(conn)
            with contextlib.suppress(OSError):
                conn.close()

    def _check(self, meta) -> tuple:
        """(path, size) of a header that names a planned file with its planned size; ValueError else."""
        if not isinstance(meta, dict):
            raise ValueError(f"malformed header {str(meta)[:80]!r}: not a sparkops sender")
        rel, size = meta.get("name"), meta.get("size")
        if not receivable_path(rel) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(
                f"refusing {str(rel)[:200]!r} ({size!r} bytes): only blobs/<hash name>, the Hub's file list "
                "and snapshot files are received"
            )
        with self.lock:
            planned = self.plan.get(rel)
        if planned is None:
            raise ValueError(f"refusing {rel!r}: not in this copy's plan")
        if planned != size:
            raise ValueError(f"refusing {rel!r}: {size} bytes announced, the plan says {planned}")
        mtime = meta.get("mtime", time.time())
        if not isinstance(mtime, (int, float)) or isinstance(mtime, bool) or not 0 <= mtime < 2**33:
            raise ValueError(f"refusing {rel!r}: mtime {mtime!r} is not a time")
        return rel, size

    def _receive(self, conn, rel: str, size: int, meta: dict) -> int:
        parts = rel.split("/")
        name = parts[-1]
        is_blob = parts[0] == "blobs"
        with self.lock:
            want = None if is_blob else self.hashes.get(rel)
        # A blob is checked against its name (verify); a list or a snapshot file against the hash the source
        # planned for it over its ssh channel, whatever this connection carried.
        h = blob_hasher(name, size) if self.verify and is_blob else (hashlib.sha256() if want else None)
        direct = self.direct and is_blob
        with repo_subdir(self.repo, parts[:-1], where=rel) as dfd:
            tmp = _temp_name_at(dfd, name)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW | (os.O_DIRECT if direct else 0), dir_fd=dfd)
                try:
                    self._write_from(conn, fd, size, h, direct)
                    if h is not None and h.hexdigest() != (want or name):
                        expected = "the hash the source planned" if want else "the blob's name"
                        raise RuntimeError(f"{rel}: the received bytes hash to {h.hexdigest()}, not to {expected}")
                    os.fchmod(fd, BLOB_MODE if is_blob else FILE_MODE)
                    mtime = float(meta.get("mtime", time.time()))
                    os.utime(fd, (mtime, mtime))
                finally:
                    os.close(fd)
                _replace_at(dfd, tmp, name)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                raise
            os.fsync(dfd)  # the rename survives a power cut too
        return size

    def _write_from(self, conn, fd: int, size: int, h, direct: bool) -> None:
        """``size`` bytes from ``conn`` into ``fd`` through one page-aligned buffer (O_DIRECT wants
        aligned memory and lengths), hashing them on the way; then on disk (fsync)."""
        with mmap.mmap(-1, TCP_CHUNK) as buf:
            view = memoryview(buf)
            try:
                left = size
                while left:
                    want = min(left, TCP_CHUNK)
                    got = 0
                    while got < want:
                        n = conn.recv_into(view[got:want], want - got)
                        if not n:
                            raise EOFError(f"the sender closed the connection with {left - got} bytes to go")
                        got += n
                    if h is not None:
                        h.update(view[:want])
                    if direct and want % DIRECT_ALIGN:
                        # The file's unaligned end: O_DIRECT would refuse it, so this write is buffered.
                        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                    done = 0
                    while done < want:
                        done += os.write(fd, view[done:want])
                    left -= want
            finally:
                view.release()
        os.fsync(fd)
        if not direct:  # written through the cache: do not leave the weights in it
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def stop(self) -> dict:
        """Stop listening, end every connection, record what was verified; never raises (a second
        call returns the first call's answer)."""
        if self.stopped is not None:
            return self.stopped
        self.stopping = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()
        with self.lock:
            workers, conns = list(self.workers), list(self.conns) + list(self.pending)
        for conn in conns:  # the source is done (its streams ended) or gone: wake any blocked read
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for t in workers:
            with contextlib.suppress(RuntimeError):
                t.join(timeout=30)
        with contextlib.suppress(RuntimeError):
            self.acceptor.join(timeout=5)
        with self.lock:
            verified = sorted(set(self.verified))
        try:
            save_hash_record(self.repo, verified)  # what a later sizes check on this node relies on
        except (OSError, ValueError) as exc:
            with self.lock:
                self.stats["errors"].append(f"the hash record was not written: {exc}")
        with self.lock:
            stats = {k: (list(v) if isinstance(v, list) else v) for k, v in self.stats.items()}
        self.stopped = {"stopped": True, "write": self.write_mode(), "verified": verified, **stats}
        return self.stopped

    def write_mode(self) -> str:
        return "O_DIRECT" if self.direct else "buffered, then dropped from the page cache"


def ipaddress_normal(address: str) -> str:
    """An address in one spelling (``::ffff:10.0.0.1`` is ``10.0.0.1``), to compare peers."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    return str(ip.ipv4_mapped or ip) if ip.version == 6 else str(ip)


def send_stream(channel: dict, files: list, repo: str, progress) -> tuple:
    """The source's end of transport=tcp: send ``files`` (relative to ``repo``) over one connection.

    ``channel``: address, port, source_address, secret, io_timeout. Each file goes by sendfile(2) and
    counts once the receiver has it on disk under its name. Returns (rc, message) like :func:`run_stream`.
    """
    where = f"{channel['address']}:{channel['port']}"
    try:
        with socket.create_connection(
            (channel["address"], channel["port"]),
            timeout=channel["io_timeout"],
            source_address=(channel["source_address"], 0),
        ) as conn:
            conn.sendall(tcp_auth(channel["secret"], _recv_exact(conn, AUTH_NONCE_BYTES)))
            for rel in files:
                path = os.path.join(repo, rel)
                st = os.stat(path)
                meta = {"name": rel, "size": st.st_size, "mtime": st.st_mtime}  # the receiver sets the mode
                _send_msg(conn, meta)
                with open(path, "rb") as f:
                    sent = conn.sendfile(f, 0, st.st_size) if st.st_size else 0
                if sent != st.st_size:
                    return 1, f"{rel}: sent {sent} of {st.st_size} bytes (the file shrank while it was sent)"
                answer = _recv_msg(conn)
                if answer is None:
                    return 1, f"{where} closed the connection after {rel}"
                if "error" in answer:
                    return 1, f"{where}: {answer['error']}"
                progress.add(st.st_size)
        return 0, ""
    except (OSError, EOFError, ValueError) as exc:
        return 1, f"{where}: {type(exc).__name__}: {exc}"


def node_free(args: dict) -> dict:
    """Free bytes where the model's folder is (follow mode asks before each forward)."""
    repo = os.path.abspath(os.path.expanduser(args["repo"]))
    return {"free_bytes": free_bytes(repo), "free_path": nearest_existing(repo)}


NODE_ACTIONS = {"manifest": node_manifest, "mkdirs": node_mkdirs, "links": node_links, "free": node_free}


def remote_main(control=None, out=None) -> int:
    """Entry point on a node: a session over one ssh channel.

    Reads one JSON line of arguments per action from ``control`` and answers each with one RESULT
    line, until EOF, so that the source pays for one ssh connection and one python start per target
    (each cost ~0.3-0.6 s on a loaded 2-core machine, more than copying a GiB: the benchmark shows
    it). ``rsyncd_start`` starts a :class:`TemporaryRsyncd` and ``tcp_start`` a :class:`TemporaryReceiver`;
    each is stopped by its ``*_stop`` or, at the latest, when the channel closes. Returns 3 if any action failed.
    """
    control = control if control is not None else sys.stdin.buffer
    out = out if out is not None else sys.stdout
    daemon = receiver = None
    rc = 0
    try:
        while line := control.readline():  # bounded by the channel: b"" at EOF
            try:
                args = json.loads(line)
                action = args.pop("action")
                if action == "rsyncd_start":
                    if daemon is not None:
                        raise RuntimeError("a temporary rsync daemon already runs in this session")
                    daemon = TemporaryRsyncd(args)
                    result = {"pid": daemon.proc.pid}
                elif action == "rsyncd_stop":
                    result = daemon.stop() if daemon is not None else {"stopped": False}
                    daemon = None
                elif action == "tcp_start":
                    if receiver is not None:
                        raise RuntimeError("a receiver already runs in this session")
                    receiver = TemporaryReceiver(args)
                    result = {"write": receiver.write_mode()}
                elif action == "tcp_plan":
                    if receiver is None:
                        raise RuntimeError("no receiver runs in this session (tcp_start first)")
                    result = receiver.allow(args.get("files"), args.get("hashes"))
                elif action == "tcp_stop":
                    result = receiver.stop() if receiver is not None else {"stopped": False}
                    receiver = None
                else:
                    result = NODE_ACTIONS[action](args)
            except Exception as exc:  # noqa: BLE001 - reported to the source as text
                result = {"error": f"{type(exc).__name__}: {exc}"}
                rc = 3
            out.write(RESULT_MARK + json.dumps(result) + "\n")
            out.flush()
    finally:
        if daemon is not None:
            daemon.stop()
        if receiver is not None:
            receiver.stop()
    return rc


def open_pipes(argv: list):
    """A process with stdin, stdout and stderr pipes: a channel (ssh to a node's :func:`remote_main`
    session) that stays open across several actions and the copy, which run_command cannot do."""
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def run_stream(argv: list, env: dict | None, files: list, repo: str, progress, *, timeout: float) -> tuple:
    """One rsync process copying ``files`` (relative to ``repo``); returns (rc, stderr tail).

    ``progress.add(n)`` is called with each finished file's size as rsync reports it (so it runs
    as a process we read while it works, not through run_command, which returns only at exit).
    """
    with tempfile.NamedTemporaryFile("wb", prefix="sparkops-files-", delete=False) as lst:
        lst.write(b"\0".join(f.encode() for f in files) + b"\0")
    try:
        cmd = [*argv[:1], f"--files-from={lst.name}", "--from0", *argv[1:]]
        proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        errors: list = []

        def drain_err() -> None:
            errors.append(proc.stderr.read())

        t = threading.Thread(target=drain_err, daemon=True)
        t.start()
        deadline = time.monotonic() + timeout
        for raw in proc.stdout:  # "<name> <size>" per finished file (--out-format)
            parts = raw.decode(errors="replace").rsplit(" ", 1)
            # Implied parent directories are listed too ("blobs/ 4096"): count files only.
            if len(parts) == 2 and parts[1].strip().isdigit() and not parts[0].endswith("/"):
                progress.add(int(parts[1]))
            if time.monotonic() > deadline:
                proc.kill()
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        t.join(timeout=10)
        return proc.returncode, b"".join(e for e in errors if e).decode(errors="replace")[-800:]
    finally:
        os.unlink(lst.name)
