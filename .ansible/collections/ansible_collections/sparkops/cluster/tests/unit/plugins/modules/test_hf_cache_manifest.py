"""hf_cache_manifest on a real on-disk cache (no daemons): what it compared, completeness, hash records."""

from __future__ import annotations

import json
import os

from ansible_collections.sparkops.cluster.plugins.modules import hf_cache_manifest
from hf_cache_helpers import MODEL, REVISION, make_model, write_listing
from module_runner import run_module


def manifest(cache, check_mode=False, **kw):
    args = {"cache_dir": str(cache), "model": MODEL, "revision": "main", **kw}
    return run_module(hf_cache_manifest, args, check_mode=check_mode)


def flip(path, offset=100):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    st = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_sizes_check_says_contents_were_not_hashed(tmp_path):
    make_model(tmp_path, index=True)
    res = manifest(tmp_path)
    assert res["complete"] and res["compared"] == "sizes" and not res["changed"]
    assert "complete by the model index" in res["message"]
    assert "sizes match; contents not hashed" in res["message"]


def test_full_verify_records_hashes_and_a_later_size_check_sees_a_change(tmp_path):
    model = make_model(tmp_path)
    progress = tmp_path / "progress.json"
    # Check mode hashes but writes nothing.
    res = manifest(tmp_path, check_mode=True, verify="full")
    assert res["complete"] and res["compared"] == "sha256"
    assert not (model["repo"] / ".sparkops").exists()
    res = manifest(tmp_path, verify="full", progress_file=str(progress))
    assert res["complete"] and "every blob hashed" in res["message"]
    state = json.loads(progress.read_text())
    assert state["blobs_done"] == state["blobs_total"] == 4 and state["bytes_done"] == state["bytes_total"]
    record = json.loads((model["repo"] / ".sparkops" / "hashed-blobs.json").read_text())
    assert set(record["blobs"]) == set(model["names"].values())

    shard = model["names"]["model-00002-of-00003.safetensors"]
    flip(model["repo"] / "blobs" / shard)
    res = manifest(tmp_path)
    assert res["complete"], "a same-size change cannot fail a size check"
    assert res["changed_since_hashed"] == [shard]
    assert "1 blob(s) changed (size or mtime) since they were last hashed" in res["message"]
    res = manifest(tmp_path, verify="full", require_complete=True)
    assert res["failed"] and res["hash_failed"] == [shard]
    assert "do not match their hash" in res["msg"] and "Download the model again" in res["msg"]


def test_incomplete_by_the_recorded_listing_fails_when_required(tmp_path):
    model = make_model(tmp_path)
    write_listing(model["repo"], **{"model-00004-of-00003.safetensors": {"size": 5, "blob_id": "b" * 40}})
    res = manifest(tmp_path, require_complete=True)
    assert res["failed"] and not res["complete"]
    assert res["expected_from"] == "hub listing"
    assert res["missing_files"] == ["model-00004-of-00003.safetensors"]
    assert "1 of 5 files listed by the hub listing are absent" in res["msg"]
    assert res["revision"] == REVISION
