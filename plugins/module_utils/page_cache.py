# Copyright: sparkops maintainers
# Apache-2.0
"""Drop one model's files from the page cache before vLLM starts.

On a DGX Spark the GPU and the CPU share one memory: pages the kernel keeps cached for the weight
files (left by the download, a weight sync that wrote through the cache, or the previous vLLM's
load) count as used when vLLM measures free memory at its start, so they cost KV cache or fail
``--gpu-memory-utilization``'s check (docs/cold-start.md cites the reports). Only the model's files
are dropped (``posix_fadvise(POSIX_FADV_DONTNEED)`` after ``fdatasync``), not the node's whole cache
(``drop_caches`` needs root on the host and empties every other cache too).

Standard library only: imported by the ``page_cache_evict`` module, and run as a script by the
watchdog (``python3 page_cache.py [--check] PATH...``, one JSON line out) before it restarts vLLM.
"""

from __future__ import annotations

import ctypes
import functools
import json
import mmap
import os
import stat
import sys
import time


@functools.lru_cache(maxsize=1)
def _mincore():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    libc.mincore.restype = ctypes.c_int
    return libc.mincore


def resident_bytes(fd: int, size: int) -> int:
    """Bytes of the open file ``fd`` in the page cache: mincore(2) on a private mapping, which reads nothing."""
    if size == 0:
        return 0
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = ctypes.create_string_buffer(pages)
    # MAP_PRIVATE: copy-on-write, so a file opened read-only can be mapped writable, which ctypes
    # needs to take the mapping's address; nothing is ever written to it.
    with mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE) as m:
        anchor = ctypes.c_char.from_buffer(m)
        try:
            rc = _mincore()(ctypes.addressof(anchor), size, vec)
            err = ctypes.get_errno()
        finally:
            del anchor
    if rc != 0:
        raise OSError(err, f"mincore: {os.strerror(err)}")
    return min(size, sum(b & 1 for b in vec.raw) * mmap.PAGESIZE)


def files_under(paths: list[str]) -> tuple[list[str], list[str]]:
    """Regular files under ``paths`` (a hub cache's model folder: its blobs; snapshot links are not
    followed, they point at the same blobs), and the paths that do not exist."""
    found, missing = [], []
    for top in paths:
        try:
            st = os.lstat(top)
        except FileNotFoundError:
            missing.append(top)
            continue
        if stat.S_ISREG(st.st_mode):
            found.append(top)
            continue
        for root, dirs, names in os.walk(top):
            dirs.sort()
            for name in sorted(names):
                path = os.path.join(root, name)
                if stat.S_ISREG(os.lstat(path).st_mode):
                    found.append(path)
    return found, missing


def evict(paths: list[str], check: bool = False) -> dict:
    """Drop the page-cache pages of every regular file under ``paths``; with ``check``, only measure.

    Returns files, bytes, resident_before (bytes cached before), resident_after (bytes still cached:
    a page a running process has mapped, or one dirtied again meanwhile), missing paths, errors
    (one line per file that could not be read) and seconds.
    """
    start = time.monotonic()
    files, missing = files_under(paths)
    result = {"files": 0, "bytes": 0, "resident_before": 0, "resident_after": 0, "missing": missing, "errors": []}
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            result["errors"].append(f"{path}: {exc.strerror}")
            continue
        try:
            size = os.fstat(fd).st_size
            before = resident_bytes(fd, size)
            after = before
            if before and not check:
                # DONTNEED skips dirty pages: write them back first (a file just downloaded or received).
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                after = resident_bytes(fd, size)
        except OSError as exc:
            result["errors"].append(f"{path}: {exc.strerror or exc}")
            continue
        finally:
            os.close(fd)
        result["files"] += 1
        result["bytes"] += size
        result["resident_before"] += before
        result["resident_after"] += after
    result["seconds"] = round(time.monotonic() - start, 3)
    return result


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"]
    if not paths:
        sys.stderr.write("usage: page_cache.py [--check] PATH...\n")
        return 2
    result = evict(paths, check=check)
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
