"""page_cache_evict: changed only when the model's pages were cached, check mode drops nothing,
a missing model folder fails with what to do."""

from __future__ import annotations

import os

import pytest
from ansible_collections.sparkops.cluster.plugins.modules import page_cache_evict as mod
from fs_helpers import on_tmpfs
from module_runner import run_module

MIB = 1 << 20


@pytest.fixture
def blob(tmp_path):
    path = tmp_path / "models--org--m" / "blobs" / ("a" * 64)
    path.parent.mkdir(parents=True)
    path.write_bytes(os.urandom(4 * MIB))
    if on_tmpfs(tmp_path):
        pytest.skip("tmpfs keeps its pages whatever fadvise says")
    path.read_bytes()
    return path


def test_cached_then_dropped_then_nothing_to_do(blob):
    folder = str(blob.parent.parent)
    checked = run_module(mod, {"paths": [folder]}, check_mode=True)
    assert checked["changed"] is True and checked["resident_after_bytes"] == checked["resident_before_bytes"]
    assert "would drop them" in checked["msg"]
    r = run_module(mod, {"paths": [folder]})
    assert r["changed"] is True and r["files"] == 1 and r["bytes"] == 4 * MIB, r
    assert r["resident_before_bytes"] >= 4 * MIB - 4096 and r["resident_after_bytes"] == 0
    assert r["msg"] == "1 files, 4.0 MiB: 4.0 MiB cached; dropped 4.0 MiB, 0.0 MiB still cached", r["msg"]
    again = run_module(mod, {"paths": [folder]})
    assert again["changed"] is False and again["resident_before_bytes"] == 0


def test_a_missing_model_folder_fails_and_says_what_to_do(tmp_path):
    r = run_module(mod, {"paths": [str(tmp_path / "models--org--absent")]})
    assert r["failed"] is True and "weight_cache role" in r["msg"] and "missing_ok" in r["msg"]
    ok = run_module(mod, {"paths": [str(tmp_path / "models--org--absent")], "missing_ok": True})
    assert ok.get("failed") is not True and ok["changed"] is False and ok["missing"]


def test_an_unreadable_file_fails_with_its_name(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    path = tmp_path / "secret"
    path.write_bytes(b"x")
    path.chmod(0)
    r = run_module(mod, {"paths": [str(path)]})
    assert r["failed"] is True and str(path) in r["msg"]
