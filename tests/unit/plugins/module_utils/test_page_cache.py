"""page_cache.evict on real files: residency measured with mincore(2), pages dropped with
fdatasync + POSIX_FADV_DONTNEED (tmpfs keeps its pages by design: skipped there)."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import page_cache
from fs_helpers import on_tmpfs

MIB = 1 << 20


@pytest.fixture
def model(tmp_path):
    """A hub-cache model folder: two blobs, a snapshot linking to them, a ref."""
    if on_tmpfs(tmp_path):
        pytest.skip("tmpfs keeps its pages whatever fadvise says")
    repo = tmp_path / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / "c0ffee").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c0ffee")
    for name, size in (("a" * 64, 8 * MIB), ("b" * 40, 5000)):
        (repo / "blobs" / name).write_bytes(os.urandom(size))
        (repo / "snapshots" / "c0ffee" / f"f-{name[0]}").symlink_to(f"../../blobs/{name}")
    return repo


def cache_all(repo) -> None:
    for path in sorted(repo.rglob("*")):
        if path.is_file() and not path.is_symlink():
            path.read_bytes()


def test_cached_weights_are_dropped_and_measured(model):
    cache_all(model)
    size = 8 * MIB + 5000 + len("c0ffee")
    r = page_cache.evict([str(model)])
    assert r["errors"] == [] and r["missing"] == []
    # Three regular files; the snapshot's links are not followed (the blobs count once).
    assert r["files"] == 3 and r["bytes"] == size
    assert r["resident_before"] >= 8 * MIB, r
    assert r["resident_after"] == 0, r
    again = page_cache.evict([str(model)])
    assert again["resident_before"] == 0


def test_check_only_measures(model):
    cache_all(model)
    r = page_cache.evict([str(model)], check=True)
    assert r["resident_before"] >= 8 * MIB and r["resident_after"] == r["resident_before"]
    assert page_cache.evict([str(model)], check=True)["resident_before"] == r["resident_before"]


def test_dirty_pages_of_a_file_just_written_are_dropped_too(model):
    """A freshly written (downloaded, received through the cache) file is dirty: DONTNEED alone keeps
    dirty pages, so evict writes them back first."""
    fresh = model / "blobs" / ("c" * 64)
    with open(fresh, "wb") as f:
        f.write(os.urandom(16 * MIB))  # no fsync: the pages are dirty
    r = page_cache.evict([str(fresh)])
    assert r["resident_before"] >= 16 * MIB - mmap.PAGESIZE, r
    assert r["resident_after"] == 0, r


def test_pages_a_process_maps_stay_and_are_reported(model):
    blob = model / "blobs" / ("a" * 64)
    with open(blob, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert sum(m[i] for i in range(0, len(m), mmap.PAGESIZE)) >= 0  # touch every page
        r = page_cache.evict([str(blob)])
    assert r["resident_after"] >= 8 * MIB - mmap.PAGESIZE, r


def test_missing_paths_are_listed_not_raised(tmp_path):
    r = page_cache.evict([str(tmp_path / "nope")])
    assert r["missing"] == [str(tmp_path / "nope")] and r["files"] == 0


def test_as_a_script_it_prints_one_json_line(model):
    """The watchdog runs the file as a script with the host's python3 (no Ansible there)."""
    cache_all(model)
    res = subprocess.run(
        [sys.executable, page_cache.__file__, str(model)], capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["files"] == 3 and out["resident_before"] >= 8 * MIB and out["resident_after"] == 0
    bad = subprocess.run([sys.executable, page_cache.__file__], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "usage" in bad.stderr
