"""Download one model revision into a Hugging Face hub cache, resumably, and record the Hub's file list.

Runs INSIDE the serving image, with the image's own huggingface_hub (0.36 and 1.x are tested against a
Hub-speaking server in tests/system/test_hub_client.py):

    python3 hub_download.py --model ORG/NAME --revision REV --cache-dir /hub

1. Resolves the revision (``model_info``) and lists every file of that commit with its size and hash
   (``list_repo_tree``), and writes that list to ``<repo>/.sparkops/<commit>.json`` BEFORE downloading,
   so a download cut short still leaves the list that says what is missing (sparkops' hf_cache reads it).
2. ``snapshot_download`` into the cache; files already complete are not fetched again. Within one run
   both client lines resume a cut transfer with an HTTP Range request (``http_get`` retries). Across
   runs, 0.36 resumes the ``blobs/<etag>.incomplete`` an interrupted run left (file_download.py
   ``_download_to_tmp_and_move`` opens it "ab") - unless hf_transfer is on, which deletes it and starts
   the file over; 1.33 writes a process-unique ``<etag>.<uuid8>.incomplete`` and deletes it when the run
   fails, so a new run starts that one file over. So hf_transfer is only switched on when it is
   importable, the client still uses it (1.x ignores it) and no ``.incomplete`` file is waiting to be
   resumed. ``HF_HUB_ENABLE_HF_TRANSFER=1`` without the package makes 0.36 fail with a ValueError,
   which is why the role never sets it. 0.36.2 reads the variable ONCE, when ``huggingface_hub`` is
   imported (constants.py:219), and every download asks that constant (file_download.py:390,
   _snapshot_download.py:326), so the script decides before the import (the client's version comes
   from its installed metadata, not from importing it) and reports what the imported client holds.

Xet-backed repositories: 0.36.2 downloads a file with ``xet_get`` (hf_xet) instead of ``http_get`` when the
Hub's HEAD answer carries ``X-Xet-Hash`` and a refresh route and hf_xet is importable (file_download.py
1725-1743, utils/_xet.py ``parse_xet_file_data_from_response``, utils/_runtime.py ``is_xet_available``).
``xet_get`` ignores what ``.incomplete`` holds (it passes no resume offset to ``hf_xet.download_files``), and
hf_xet's chunk cache, the only thing a second run could reuse, is off by default since hf_xet 1.2 and
ignored since 1.3 (xet-core PRs 535/559, issue 715; huggingface_hub PR 4883): an interrupted Xet download
starts over. So this script sets ``HF_HUB_DISABLE_XET=1`` unless the caller set it (the role passes
``weight_cache_use_xet``): the client then takes ``http_get`` for Xet-backed files too, through the
resolve URL's redirect, and resumes ``.incomplete`` with a Range request - the path the tests cut and
resume. ``HF_XET_CACHE`` still goes to a persistent folder (``weight_cache_xet_dir``) for whoever turns
Xet on. The result line says which path this client takes (``xet``).

Prints one line ``SPARKOPS-HUB {json}``; exit 0 done, 2 revision or repo not found, 3 no access (401/403,
gated), 1 anything else. The token comes from the file named by HF_TOKEN_PATH (the role's 0600 tmpfs file,
mounted read-only), never from the command line or the container's environment, and is never printed.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import importlib.util
import json
import os
import sys
import time

MARK = "SPARKOPS-HUB "


def emit(result: dict, code: int) -> int:
    sys.stdout.write(MARK + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
    return code


def client_major() -> int | None:
    """The installed huggingface_hub's major version, from its metadata (importing it would fix its settings)."""
    try:
        return int(importlib.metadata.version("huggingface_hub").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--revision", default="main")
    ap.add_argument("--cache-dir", required=True)
    ap.add_argument("--max-workers", type=int, default=8)
    args = ap.parse_args()

    repo_dir = os.path.join(args.cache_dir, "models--" + args.model.replace("/", "--"))
    waiting = glob.glob(os.path.join(repo_dir, "blobs", "*.incomplete"))
    has_transfer = importlib.util.find_spec("hf_transfer") is not None
    # Decided BEFORE the import: 0.36.2 reads HF_HUB_ENABLE_HF_TRANSFER once at import (constants.py:219);
    # 1.x has no hf_transfer path. The version from the installed metadata (no import).
    want_transfer = has_transfer and not waiting and client_major() == 0
    if want_transfer:
        os.environ["HF_HUB_ENABLE_HF_TRANSFER"] = "1"
    else:
        os.environ.pop("HF_HUB_ENABLE_HF_TRANSFER", None)

    # Xet off unless the caller asked for it (weight_cache_use_xet): xet_get cannot resume (see above),
    # http_get resumes blobs/*.incomplete with a Range request, and the Hub serves Xet-backed files over
    # HTTP too (the resolve URL's redirect), which is what every client without hf_xet does.
    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")

    import huggingface_hub  # noqa: PLC0415 - after the environment is settled (read at import)
    from huggingface_hub import HfApi, snapshot_download  # noqa: PLC0415

    try:
        from huggingface_hub import errors as hub_errors  # noqa: PLC0415
    except ImportError:  # older clients
        from huggingface_hub import utils as hub_errors  # noqa: PLC0415

    try:
        from huggingface_hub import constants as hub_constants  # noqa: PLC0415
    except ImportError:
        hub_constants = None
    # What the imported client will really do: its own constant, read at its import (0.36.2
    # constants.py:219; absent in 1.x, which never uses hf_transfer).
    use_transfer = bool(getattr(hub_constants, "HF_HUB_ENABLE_HF_TRANSFER", False)) and want_transfer
    try:
        from huggingface_hub.utils._runtime import is_xet_available  # noqa: PLC0415

        xet = {"hf_xet": bool(is_xet_available()), "cache": getattr(hub_constants, "HF_XET_CACHE", None)}
    except ImportError:  # a client without Xet support downloads over HTTP only
        xet = {"hf_xet": False, "cache": None}
    base = {
        "xet": xet,
        "model": args.model,
        "revision": args.revision,
        "client": f"huggingface_hub {huggingface_hub.__version__}",
        "hf_transfer": use_transfer,
        "resumed_files": len(waiting),
    }
    api = HfApi()
    try:
        info = api.model_info(args.model, revision=args.revision)
        commit = info.sha
        listing = {}
        for entry in api.list_repo_tree(args.model, revision=commit, recursive=True):
            if not hasattr(entry, "blob_id"):
                continue  # a folder
            item = {"size": entry.size, "blob_id": entry.blob_id}
            if entry.lfs is not None:
                item["lfs_sha256"] = entry.lfs.sha256
                item["lfs_size"] = entry.lfs.size
            listing[entry.path] = item
        record_dir = os.path.join(repo_dir, ".sparkops")
        os.makedirs(record_dir, exist_ok=True)
        tmp = os.path.join(record_dir, f".{commit}.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "format": "sparkops-hub-listing/1",
                    "model": args.model,
                    "revision": args.revision,
                    "commit": commit,
                    "recorded_by": base["client"],
                    "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "files": dict(sorted(listing.items())),
                },
                f,
                indent=1,
            )
        os.replace(tmp, os.path.join(record_dir, f"{commit}.json"))
        t0 = time.monotonic()
        path = snapshot_download(
            args.model, revision=args.revision, cache_dir=args.cache_dir, max_workers=args.max_workers
        )
    except (hub_errors.RevisionNotFoundError, hub_errors.RepositoryNotFoundError) as exc:
        if isinstance(exc, hub_errors.GatedRepoError):
            return emit({**base, "error": "gated", "status": 401, "message": str(exc).splitlines()[0]}, 3)
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403) and not isinstance(exc, hub_errors.RevisionNotFoundError):
            return emit({**base, "error": "no access", "status": status, "message": str(exc).splitlines()[0]}, 3)
        kind = "revision not found" if isinstance(exc, hub_errors.RevisionNotFoundError) else "repo not found"
        return emit({**base, "error": kind, "status": status, "message": str(exc).splitlines()[0]}, 2)
    except Exception as exc:  # noqa: BLE001 - reported as text; the caller decides
        msg = str(exc).splitlines()[0] if str(exc) else ""
        return emit({**base, "error": type(exc).__name__, "message": msg}, 1)
    got = os.path.basename(os.path.normpath(path))
    return emit(
        {
            **base,
            "commit": commit,
            "snapshot_commit": got,
            "files": len(listing),
            "bytes": sum(v["size"] for v in listing.values()),
            "seconds": round(time.monotonic() - t0, 2),
        },
        0 if got == commit else 1,
    )


if __name__ == "__main__":
    sys.exit(main())
