"""The default weight path end to end on loopback (issue 22): the role's hub_download.py with the REAL
huggingface_hub client (each version in HUB_CLIENT_VERSIONS, 0.36.2 as in the image) downloads from the
project's Hub-speaking server into one cache, then hf_cache_sync copies it over transport=tcp (the
default) to a second cache through a real sshd; the target must hold the Hub's file list (and, with
1.x, its tree cache), be complete by it, and a rerun must change nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from ansible_collections.sparkops.cluster.plugins.modules import hf_cache_manifest, hf_cache_sync
from conftest import ROOT
from hub_server import HubServer
from module_runner import run_module
from sshd_helpers import free_port

MODEL = "sparkops-test/hub-tcp"
SCRIPT = ROOT / "roles" / "weight_cache" / "files" / "hub_download.py"


def model_files() -> dict:
    shard = hashlib.shake_256(b"hub-tcp").digest(3 * 1024 * 1024 + 5)
    return {
        "config.json": json.dumps({"model_type": "tiny"}).encode(),
        "model.safetensors": shard,
        # gpt-oss ships original/: files in a snapshot subfolder travel and count like the others.
        "original/params.json": b'{"dim": 8}',
    }


@pytest.fixture
def hub():
    with HubServer() as server:
        server.add_repo(MODEL, model_files())
        yield server


def download(hub, client, tmp_path, cache) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(
        HF_ENDPOINT=hub.endpoint,
        HF_HOME=str(tmp_path / "hf-home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        PYTHONPATH=str(client[1]),
        NO_PROXY="127.0.0.1,127.0.0.2",
    )
    argv = [sys.executable, str(SCRIPT), "--model", MODEL, "--revision", "main", "--cache-dir", str(cache)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("SPARKOPS-HUB ")]
    assert proc.returncode == 0 and lines, (proc.stdout[-800:], proc.stderr[-2000:])
    return json.loads(lines[-1][len("SPARKOPS-HUB ") :])


def test_a_hub_download_syncs_over_tcp_with_its_file_list_and_a_rerun_changes_nothing(hub, hub_client, sshd, tmp_path):
    src, dst = tmp_path / "src-hub", tmp_path / "dst-hub"
    dst.mkdir()
    res = download(hub, hub_client, tmp_path, src)
    commit = res["commit"]
    assert commit == hub.repos[MODEL].refs["main"] and res["files"] == 3
    repo = "models--" + MODEL.replace("/", "--")
    listing = f".sparkops/{commit}.json"
    assert (src / repo / listing).is_file()
    # huggingface_hub 1.x caches the tree listing too (trees/<commit>.json): a plain file, not a blob.
    records = [listing] + ([f"trees/{commit}.json"] if (src / repo / "trees" / f"{commit}.json").is_file() else [])
    if hub_client[0].startswith("1."):
        assert len(records) == 2, "1.x was expected to cache the tree"

    args = {
        "cache_dir": str(src),
        "target_cache_dir": str(dst),
        "model": MODEL,
        "revision": "main",
        "transport": "tcp",
        "streams": 2,
        "receiver_port": free_port(),
        **sshd.module_args(),
    }
    first = run_module(hf_cache_sync, args)
    assert not first.get("failed"), first.get("msg")
    assert first["changed"] and first["targets"][0]["verified_on_receipt"] == 3  # the three blobs
    for rel in records:
        assert (dst / repo / rel).read_bytes() == (src / repo / rel).read_bytes(), rel
        assert (dst / repo / rel).stat().st_mode & 0o7777 == 0o644
    m = run_module(hf_cache_manifest, {"cache_dir": str(dst), "model": MODEL, "revision": "main", "verify": "full"})
    assert m["complete"] and m["expected_from"] == "hub listing" and m["hash_failed"] == [], m["message"]
    assert m["revision"] == commit
    assert f"snapshots/{commit}/original/params.json" in m["manifest"]["links"]
    for blob in m["manifest"]["blobs"]:
        assert (dst / repo / "blobs" / blob).stat().st_mode & 0o7777 == 0o444

    again = run_module(hf_cache_sync, args | {"receiver_port": free_port()})
    assert not again.get("failed"), again.get("msg")
    assert not again["changed"] and again["totals"]["files_copied"] == 0
