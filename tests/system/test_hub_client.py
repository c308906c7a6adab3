"""The real huggingface_hub client (``hf download`` and ``snapshot_download`` through the role's
hub_download.py) against the Hub-speaking server on loopback, for each version in HUB_CLIENT_VERSIONS.

What the server must say is taken from the client's source at those versions (tests/system/README.md)
and checked here by what the client does with it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import time

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import hf_cache
from ansible_collections.sparkops.cluster.plugins.modules import hf_cache_manifest
from conftest import ROOT
from hub_server import HubServer
from module_runner import run_module

MODEL = "sparkops-test/tiny-hub"
GATED = "sparkops-test/gated"
XET_MODEL = "sparkops-test/xet-backed"
TOKEN = "hf_sparkopsTestToken0123456789"
SCRIPT = ROOT / "roles" / "weight_cache" / "files" / "hub_download.py"
# Larger than the clients' download chunk (10 MiB, constants.DOWNLOAD_CHUNK_SIZE): a cut keeps only whole
# chunks written before it, so a partial blob needs more than one.
SHARD_BYTES = 24 * 1024 * 1024
SHARDS = [f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)]


@functools.cache
def model_files() -> dict:
    files = {
        "config.json": json.dumps({"model_type": "tiny"}).encode(),
        "model.safetensors.index.json": json.dumps(
            {"metadata": {}, "weight_map": {f"w{i}": name for i, name in enumerate(SHARDS)}}
        ).encode(),
    }
    for i, name in enumerate(SHARDS):
        seed = hashlib.sha256(name.encode()).digest()
        files[name] = bytes(b ^ (i * 7 + j) % 256 for j, b in enumerate(seed)) * (SHARD_BYTES // 32)
    return files


@pytest.fixture
def hub():
    with HubServer() as server:
        server.add_repo(MODEL, model_files())
        server.add_repo(GATED, model_files(), gated=True, tokens=(TOKEN,))
        server.add_repo(XET_MODEL, model_files(), xet=True)
        yield server


def client_env(hub, client, tmp_path, token=None, token_file=None, **extra) -> dict:
    _version, path = client
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(
        HF_ENDPOINT=hub.endpoint,
        HF_HOME=str(tmp_path / "hf-home"),  # no stored token, no stray config
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        PYTHONPATH=str(path),
        NO_PROXY="127.0.0.1,127.0.0.2",
        **extra,
    )
    if token:
        env["HF_TOKEN"] = token
    if token_file:  # as the role passes it: a 0600 file named by HF_TOKEN_PATH, never the token itself
        env["HF_TOKEN_PATH"] = str(token_file)
    return env


def hf_download(hub, client, tmp_path, cache, *, model=MODEL, revision="main", **kw):
    """The real CLI: ``hf download <id> --revision <rev> --cache-dir DIR``."""
    argv = [sys.executable, str(client[1] / "bin" / "hf"), "download", model, "--revision", revision,
            "--cache-dir", str(cache)]  # fmt: skip
    return subprocess.run(
        argv, env=client_env(hub, client, tmp_path, **kw), capture_output=True, text=True, timeout=180, check=False
    )


def script(hub, client, tmp_path, cache, *, model=MODEL, revision="main", **kw):
    """The role's download (snapshot_download inside), as the image runs it."""
    argv = [sys.executable, str(SCRIPT), "--model", model, "--revision", revision, "--cache-dir", str(cache)]
    proc = subprocess.run(
        argv, env=client_env(hub, client, tmp_path, **kw), capture_output=True, text=True, timeout=180, check=False
    )
    return _result(proc)


def _result(proc):
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("SPARKOPS-HUB ")]
    assert lines, f"no result line (rc {proc.returncode}): {proc.stdout[-800:]} {proc.stderr[-2000:]}"
    return proc.returncode, json.loads(lines[-1][len("SPARKOPS-HUB ") :]), proc


def manifest(cache, revision="main", verify="sizes") -> dict:
    return run_module(hf_cache_manifest, {"cache_dir": str(cache), "model": MODEL, "revision": revision,
                                          "verify": verify})  # fmt: skip


def repo_dir(cache, model=MODEL):
    return cache / ("models--" + model.replace("/", "--"))


def shard_sha(name: str) -> str:
    return hashlib.sha256(model_files()[name]).hexdigest()


def test_hf_download_gets_a_complete_snapshot(hub, hub_client, tmp_path):
    cache = tmp_path / "hub"
    proc = hf_download(hub, hub_client, tmp_path, cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = manifest(cache, verify="full")
    assert m["complete"] and m["hash_failed"] == [], m["message"]
    assert m["expected_from"] in ("hub tree cache", "model index")  # 1.x caches the tree; 0.36 does not
    assert m["revision"] == hub.repos[MODEL].refs["main"]
    # What the client asked: metadata by HEAD on resolve/<commit>, LFS bytes from the CDN host.
    heads = hub.requests("HEAD", f"/{MODEL}/resolve/")
    assert {r["path"].rsplit("/", 1)[1] for r in heads} >= set(SHARDS)
    assert len(hub.requests("GET", "/cdn-lfs/")) == 3


def test_script_records_the_hub_listing_and_the_snapshot_is_complete_by_it(hub, hub_client, tmp_path):
    cache = tmp_path / "hub"
    rc, res, proc = script(hub, hub_client, tmp_path, cache)
    assert rc == 0, (res, proc.stderr[-2000:])
    assert res["client"] == f"huggingface_hub {hub_client[0]}" and res["files"] == 5
    assert res["hf_transfer"] is False
    m = manifest(cache)
    assert m["complete"] and m["expected_from"] == "hub listing", m["message"]
    assert "sizes match; contents not hashed" in m["message"]
    listing = json.loads((repo_dir(cache) / ".sparkops" / f"{m['revision']}.json").read_text())
    assert listing["files"][SHARDS[1]] == {
        "size": SHARD_BYTES, "blob_id": listing["files"][SHARDS[1]]["blob_id"],
        "lfs_sha256": shard_sha(SHARDS[1]), "lfs_size": SHARD_BYTES,
    }  # fmt: skip


def keeps_partial_blobs(client) -> bool:
    """0.x resumes ``blobs/<etag>.incomplete`` on the next run (file_download.py, 0.36.2
    ``_download_to_tmp_and_move``: opens it with "ab" and sends ``Range: bytes=<size>-``). 1.33.0 writes
    to a process-unique ``<etag>.<uuid8>.incomplete`` and deletes it when the run fails (same function,
    huggingface_hub PR 4228): it resumes only within one run (``http_get`` retries with a Range)."""
    return client[0].startswith("0.")


def test_download_cut_mid_shard_is_incomplete_then_completes_on_the_next_run(hub, hub_client, tmp_path):
    cache = tmp_path / "hub"
    sha = shard_sha(SHARDS[1])
    # The link dies at 15 MiB into this shard, for the client's own retries too.
    hub.cut[sha] = 15 << 20
    rc, res, proc = script(hub, hub_client, tmp_path, cache)
    assert rc != 0 and "error" in res, res
    first = hub.requests("GET", f"/cdn-lfs/{sha}")
    partial = repo_dir(cache) / "blobs" / f"{sha}.incomplete"
    if keeps_partial_blobs(hub_client):
        done = partial.stat().st_size
        assert 0 < done < SHARD_BYTES
        incomplete = {sha: done}
    else:
        # Within the run the client resumed after the first whole chunk (10 MiB) with a Range request.
        assert f"bytes={10 << 20}-" in [g["range"] for g in first], first
        assert not list((repo_dir(cache) / "blobs").glob("*.incomplete")), "1.x keeps no partial file"
        incomplete = {}
    m = manifest(cache)
    # The folder exists and the snapshot has the other files: only the recorded list can call it incomplete.
    assert not m["complete"] and m["expected_from"] == "hub listing"
    assert m["missing_files"] == [SHARDS[1]] and m["incomplete_downloads"] == incomplete
    assert "NOT complete" in m["message"] and SHARDS[1] in m["message"]

    del hub.cut[sha]
    hub.log.clear()
    rc, res, proc = script(hub, hub_client, tmp_path, cache)
    assert rc == 0, (res, proc.stderr[-2000:])
    gets = hub.requests("GET", f"/cdn-lfs/{sha}")
    if keeps_partial_blobs(hub_client):
        assert res["resumed_files"] == 1
        assert [(g["range"], g["status"]) for g in gets] == [(f"bytes={done}-", 206)], gets  # resumed
    else:
        assert [(g["range"], g["status"]) for g in gets] == [(None, 200)], gets  # started over
    # Only the missing shard travelled again.
    assert {g["path"] for g in hub.requests("GET", "/cdn-lfs/")} == {f"/cdn-lfs/{sha}"}
    assert not partial.exists()
    m = manifest(cache, verify="full")
    assert m["complete"] and m["hash_failed"] == [], m["message"]


def test_hf_cli_after_a_cut_download(hub, hub_client, tmp_path):
    cache = tmp_path / "hub"
    sha = shard_sha(SHARDS[2])
    hub.cut[sha] = 13 << 20
    proc = hf_download(hub, hub_client, tmp_path, cache)
    assert proc.returncode != 0
    partial = repo_dir(cache) / "blobs" / f"{sha}.incomplete"
    m = manifest(cache)
    assert not m["complete"], m["message"]
    if keeps_partial_blobs(hub_client):
        done = partial.stat().st_size
        assert 0 < done < SHARD_BYTES and m["incomplete_downloads"] == {sha: done}
    else:
        assert m["expected_from"] == "hub tree cache" and m["missing_files"] == [SHARDS[2]]
    del hub.cut[sha]
    hub.log.clear()
    proc = hf_download(hub, hub_client, tmp_path, cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = [f"bytes={done}-"] if keeps_partial_blobs(hub_client) else [None]
    assert [g["range"] for g in hub.requests("GET", f"/cdn-lfs/{sha}")] == want
    assert manifest(cache, verify="full")["complete"]


def test_wrong_revision_is_a_clear_error_and_writes_no_snapshot(hub, hub_client, tmp_path):
    cache = tmp_path / "hub"
    bad = "0123456789abcdef0123456789abcdef01234567"
    proc = hf_download(hub, hub_client, tmp_path, cache, revision=bad)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    # 0.36.2 prints the RevisionNotFoundError with the server's message; 1.33.0 its own sentence.
    assert "Invalid rev id" in out or "Revision not found" in out, out[-1500:]
    rc, res, _proc = script(hub, hub_client, tmp_path, cache, revision="no-such-branch")
    assert rc == 2 and res["error"] == "revision not found" and res["status"] == 404, res
    assert not (repo_dir(cache) / "snapshots").exists() or not any((repo_dir(cache) / "snapshots").iterdir())
    assert all(r["status"] == 404 for r in hub.requests() if "no-such-branch" in r["path"])


def test_gated_model_without_token_is_401_and_with_token_downloads(hub, hub_client, tmp_path):
    cache = tmp_path / "hub"
    proc = hf_download(hub, hub_client, tmp_path, cache, model=GATED)
    assert proc.returncode != 0
    assert any(r["status"] == 401 for r in hub.requests(prefix=f"/{GATED}/resolve/"))
    out = proc.stdout + proc.stderr
    # 0.36.2: GatedRepoError with the server's message; 1.33.0: "Access denied. This repository requires approval."
    assert "is restricted" in out or "requires approval" in out, out[-1500:]
    rc, res, _proc = script(hub, hub_client, tmp_path, cache, model=GATED)
    assert rc == 3 and res["error"] == "gated" and res["status"] == 401, res
    assert TOKEN not in json.dumps(res)
    hub.log.clear()
    rc, res, proc = script(hub, hub_client, tmp_path, cache, model=GATED, token=TOKEN)
    assert rc == 0, (res, proc.stderr[-1500:])
    assert TOKEN not in proc.stdout + proc.stderr
    # The token goes to the Hub, never to the CDN host (the client drops it off-host).
    assert all(r["authorization"] for r in hub.requests("HEAD", f"/{GATED}/resolve/"))
    assert not any(r["authorization"] for r in hub.requests(prefix="/cdn-lfs/"))


def test_checksum_mismatch_passes_the_client_and_is_found_by_the_hash_check(hub, hub_client, tmp_path):
    cache = tmp_path / "hub"
    sha = shard_sha(SHARDS[0])
    hub.corrupt.add(sha)  # same size, one byte flipped
    rc, res, proc = script(hub, hub_client, tmp_path, cache)
    # Seen with both pinned clients: a cache_dir download checks the size, not the sha256.
    assert rc == 0, (res, proc.stderr[-1500:])
    sizes = manifest(cache)
    assert sizes["complete"] and "contents not hashed" in sizes["message"]
    full = manifest(cache, verify="full")
    assert not full["complete"] and full["hash_failed"] == [sha]
    assert "do not match their hash" in full["message"]
    assert hf_cache.failing_blobs(str(repo_dir(cache) / "blobs"), [sha]) == [sha]


def test_hf_transfer_is_never_forced_on_a_client_without_it(hub, hub_client, tmp_path):
    cache = tmp_path / "hub"
    # What the role used to do: the env var with a client that lacks hf_transfer.
    proc = hf_download(hub, hub_client, tmp_path, cache, HF_HUB_ENABLE_HF_TRANSFER="1")
    if hub_client[0].startswith("0."):
        assert proc.returncode != 0 and "hf_transfer" in proc.stdout + proc.stderr  # issue 12's ValueError
    rc, res, proc = script(hub, hub_client, tmp_path, tmp_path / "hub2", HF_HUB_ENABLE_HF_TRANSFER="1")
    assert rc == 0 and res["hf_transfer"] is False, (res, proc.stderr[-1500:])


# A stand-in for the hf_transfer package: 0.36.2 imports it inside http_get only when its constant
# HF_HUB_ENABLE_HF_TRANSFER is true (file_download.py:390-405); that constant is read once, when
# huggingface_hub is imported (constants.py:219). The stand-in records its import (the client took the
# hf_transfer branch) and keeps hf_transfer's call signature (file_download.py:470-478); the shards here
# (24 MiB) are under the 5-chunk threshold (:467), so the client streams them itself either way.
HF_TRANSFER_STANDIN = """
import os
with open(os.environ["SPARKOPS_TEST_HF_TRANSFER_LOG"], "a") as _log:
    _log.write("imported\\n")

def download(url, filename, max_files, chunk_size, headers=None, parallel_failures=0, max_retries=0, callback=None):
    raise NotImplementedError("the test's hf_transfer stand-in does not download")
"""


def test_hf_transfer_reported_on_is_the_one_the_client_uses(hub, hub_client, tmp_path):
    stub = tmp_path / "stub"
    (stub / "hf_transfer").mkdir(parents=True)
    (stub / "hf_transfer" / "__init__.py").write_text(HF_TRANSFER_STANDIN)
    log = tmp_path / "hf-transfer.log"
    env = client_env(hub, hub_client, tmp_path, SPARKOPS_TEST_HF_TRANSFER_LOG=str(log))
    env["PYTHONPATH"] = f"{hub_client[1]}{os.pathsep}{stub}"
    argv = [sys.executable, str(SCRIPT), "--model", MODEL, "--revision", "main", "--cache-dir", str(tmp_path / "hub")]
    rc, res, proc = _result(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, check=False))
    assert rc == 0, (res, proc.stderr[-1500:])
    used = log.exists() and "imported" in log.read_text()
    # The result says what really ran: 0.36 takes the hf_transfer branch, 1.x has none.
    assert res["hf_transfer"] is used, (res, used)
    assert used is hub_client[0].startswith("0."), (hub_client[0], res)


def test_the_token_reaches_the_client_by_file_and_never_a_process_listing(hub, hub_client, tmp_path):
    # issue 23: the role put the token in the remote shell's environment (command line, ps, -vvv) and in
    # `docker run -e HF_TOKEN`. Now: a 0600 file, HF_TOKEN_PATH names it. Sampled while the download runs.
    secrets_dir = tmp_path / "run-sparkops"
    secrets_dir.mkdir(mode=0o700)
    token_file = secrets_dir / "hf-token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    cache = tmp_path / "hub"
    argv = [sys.executable, str(SCRIPT), "--model", GATED, "--revision", "main", "--cache-dir", str(cache)]
    env = client_env(hub, hub_client, tmp_path, token_file=token_file)
    hub.delay_s = 0.2  # each response waits: the download lasts long enough to be sampled many times
    samples, seen_running = [], 0
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            # Arguments and environment of every process (`ps e`), as any user (args) or root (env) sees them.
            listing = subprocess.run(
                ["ps", "axwwe", "-o", "pid=,args="], capture_output=True, text=True, timeout=10, check=False
            ).stdout
            if str(SCRIPT) in listing and proc.poll() is None:
                seen_running += 1
            samples.append(listing)
            time.sleep(0.05)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out[-800:], err[-1500:])
    assert seen_running >= 3, f"the download was sampled only {seen_running} times while it ran"
    assert not any(TOKEN in s for s in samples), "the token appeared in a process listing"
    assert any("HF_TOKEN_PATH=" in s for s in samples), "the sample cannot see environments: it proves nothing"
    assert TOKEN not in out + err
    # The client read the file: the Hub got the token (a gated repo answers 401 without it).
    heads = hub.requests("HEAD", f"/{GATED}/resolve/")
    assert heads and all(r["authorization"] and r["status"] != 401 for r in heads)


def test_the_xet_chunk_cache_goes_where_the_role_mounts_it(hub, hub_client, tmp_path):
    # What this file's download tests cover: huggingface_hub takes xet_get only when the HEAD answer
    # carries X-Xet-Hash and a refresh route AND hf_xet is importable (0.36.2 file_download.py 1725-1743).
    # This hub speaks no Xet (no CAS server), so every download here runs http_get, the path that resumes
    # blobs/*.incomplete; for a Xet-backed repository on the real Hub, what survives an interruption is
    # hf_xet's chunk cache, which the role keeps at weight_cache_xet_dir (HF_XET_CACHE) instead of the
    # --rm container. This test pins that the client honours the variable the role sets.
    xet_dir = tmp_path / "xet"
    rc, res, proc = script(hub, hub_client, tmp_path, tmp_path / "hub", HF_XET_CACHE=str(xet_dir))
    assert rc == 0, (res, proc.stderr[-1500:])
    assert res["xet"]["cache"] == str(xet_dir)
    # The pinned clients are installed with their hf_xet dependency; the script turns Xet off unless asked.
    assert res["xet"]["hf_xet"] is False
    rc, res, proc = script(hub, hub_client, tmp_path, tmp_path / "hub2", HF_XET_CACHE=str(xet_dir),
                           HF_HUB_DISABLE_XET="0")  # fmt: skip
    assert rc == 0 and res["xet"]["hf_xet"] is True, (res, proc.stderr[-1500:])


def test_a_xet_backed_repo_resumes_over_http_with_the_script(hub, hub_client, tmp_path):
    # The path the image's client takes for a Xet-backed repository (most of the Hub's): with hf_xet
    # importable and the HEAD answer carrying X-Xet-Hash and a refresh route, 0.36.2 calls xet_get
    # (file_download.py 1725), which cannot resume. The plain client shows it took that path: it asked
    # for a Xet token (this hub has no CAS, so it fails). The role's script turns Xet off, so the same
    # repository downloads over HTTP and a cut shard resumes from its .incomplete.
    cache = tmp_path / "hub"
    proc = hf_download(hub, hub_client, tmp_path, tmp_path / "plain", model=XET_MODEL)
    assert proc.returncode != 0
    assert hub.requests("GET", f"/api/models/{XET_MODEL}/xet-read-token/"), "the client did not take xet_get"
    sha = shard_sha(SHARDS[1])
    hub.cut[sha] = 15 << 20
    hub.log.clear()
    rc, res, proc = script(hub, hub_client, tmp_path, cache, model=XET_MODEL)
    assert rc != 0 and res["xet"]["hf_xet"] is False, res
    assert not hub.requests("GET", f"/api/models/{XET_MODEL}/xet-read-token/")
    partial = repo_dir(cache, XET_MODEL) / "blobs" / f"{sha}.incomplete"
    done = partial.stat().st_size if keeps_partial_blobs(hub_client) else 0
    if keeps_partial_blobs(hub_client):
        assert 0 < done < SHARD_BYTES
    del hub.cut[sha]
    hub.log.clear()
    rc, res, proc = script(hub, hub_client, tmp_path, cache, model=XET_MODEL)
    assert rc == 0, (res, proc.stderr[-2000:])
    gets = [(g["range"], g["status"]) for g in hub.requests("GET", f"/cdn-lfs/{sha}")]
    assert gets == ([(f"bytes={done}-", 206)] if done else [(None, 200)]), gets
    assert not hub.requests("GET", f"/api/models/{XET_MODEL}/xet-read-token/")
    m = run_module(hf_cache_manifest, {"cache_dir": str(cache), "model": XET_MODEL, "revision": "main",
                                       "verify": "full"})  # fmt: skip
    assert m["complete"] and m["hash_failed"] == [], m["message"]
