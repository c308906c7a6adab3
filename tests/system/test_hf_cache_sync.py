"""hf_cache_manifest and hf_cache_sync against a real sshd and real rsync on loopback.

The target is 127.0.0.2 (sshd bound there, key authorized ``from="127.0.0.1"`` only, like the fabric
key on the fast subnets); the source binds 127.0.0.1. Nothing leaves loopback.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess

import pytest
from ansible_collections.sparkops.cluster.plugins.modules import hf_cache_manifest, hf_cache_sync
from hf_cache_helpers import MODEL, REVISION, make_model
from module_runner import run_module
from sshd_helpers import free_port


@pytest.fixture
def caches(tmp_path):
    src = tmp_path / "src-hub"
    dst = tmp_path / "dst-hub"
    model = make_model(src, shards=4, shard_bytes=512 * 1024)
    dst.mkdir()
    return {"src": src, "dst": dst, "names": model["names"]}


def sync_args(sshd, caches, **kw):
    args = {
        "cache_dir": str(caches["src"]),
        "target_cache_dir": str(caches["dst"]),
        "model": MODEL,
        "revision": "main",
        "streams": 3,
        "receiver_port": free_port(),  # the receiver (tcp or rsyncd) listens on it: never a fixed port in tests
        **sshd.module_args(),
    }
    args.update(kw)
    return args


def target_manifest(caches, verify="sizes"):
    return run_module(
        hf_cache_manifest,
        {"cache_dir": str(caches["dst"]), "model": MODEL, "revision": REVISION, "verify": verify},
    )


def test_manifest_module_reports_complete_and_fails_when_required(caches):
    res = run_module(hf_cache_manifest, {"cache_dir": str(caches["src"]), "model": MODEL, "revision": "main"})
    assert not res.get("failed") and not res["changed"]
    assert res["present"] and res["complete"] and res["revision"] == REVISION
    assert len(res["manifest"]["blobs"]) == 5
    res = run_module(
        hf_cache_manifest,
        {"cache_dir": str(caches["dst"]), "model": MODEL, "revision": REVISION, "require_complete": True},
    )
    assert res["failed"] and "is not in" in res["msg"] and "Download the model again" in res["msg"]
    res = run_module(hf_cache_manifest, {"cache_dir": str(caches["src"]), "model": "../etc", "revision": "main"})
    assert res["failed"] and "not a Hugging Face model id" in res["msg"]


def test_sync_copies_everything_then_nothing(sshd, caches, tmp_path):
    progress = tmp_path / "progress.json"
    check = run_module(hf_cache_sync, sync_args(sshd, caches), check_mode=True)
    assert check["changed"] and check["totals"]["bytes_to_copy"] > 2 * 1024 * 1024
    assert not (caches["dst"] / f"models--{MODEL.replace('/', '--')}").exists(), "check mode wrote on the target"

    res = run_module(hf_cache_sync, sync_args(sshd, caches, progress_file=str(progress)))
    assert not res.get("failed"), res.get("msg")
    assert res["changed"]
    assert res["totals"]["files_copied"] == 5
    assert res["totals"]["bytes_copied"] == check["totals"]["bytes_to_copy"]
    assert res["totals"]["MB_per_s"] > 0
    assert json.loads(progress.read_text())["bytes_done"] == res["totals"]["bytes_copied"]
    m = target_manifest(caches, verify="full")
    assert m["complete"], m
    # Links are relative, as huggingface_hub writes them, so the cache can be mounted anywhere.
    link = caches["dst"] / f"models--{MODEL.replace('/', '--')}" / "snapshots" / REVISION / "config.json"
    assert os.readlink(link).startswith("../../blobs/")
    again = run_module(hf_cache_sync, sync_args(sshd, caches))
    assert not again.get("failed") and not again["changed"]
    assert again["totals"]["bytes_copied"] == 0


def test_interrupted_sync_copies_only_what_is_missing(sshd, caches):
    assert not run_module(hf_cache_sync, sync_args(sshd, caches)).get("failed")
    repo = caches["dst"] / f"models--{MODEL.replace('/', '--')}"
    names = caches["names"]
    # As a killed copy leaves it: one blob absent, one cut short, an rsync temp file.
    (repo / "blobs" / names["model-00001-of-00004.safetensors"]).unlink()
    cut = repo / "blobs" / names["model-00002-of-00004.safetensors"]
    cut.write_bytes(cut.read_bytes()[:4096])
    temp = repo / "blobs" / ("." + names["model-00001-of-00004.safetensors"] + ".aB3dE9")
    temp.write_bytes(b"partial")
    untouched = repo / "blobs" / names["model-00003-of-00004.safetensors"]
    before = untouched.stat().st_ino, untouched.stat().st_mtime_ns
    res = run_module(hf_cache_sync, sync_args(sshd, caches))
    assert not res.get("failed"), res.get("msg")
    assert res["totals"]["files_copied"] == 2
    assert res["totals"]["bytes_copied"] == 2 * 512 * 1024
    assert res["targets"][0]["stale_temp_removed"] == [temp.name]
    assert (untouched.stat().st_ino, untouched.stat().st_mtime_ns) == before, "a complete blob was copied again"
    assert target_manifest(caches, verify="full")["complete"]


def test_corrupt_blob_is_found_and_recopied_only_with_full_verify(sshd, caches):
    assert not run_module(hf_cache_sync, sync_args(sshd, caches)).get("failed")
    repo = caches["dst"] / f"models--{MODEL.replace('/', '--')}"
    bad = repo / "blobs" / caches["names"]["model-00004-of-00004.safetensors"]
    data = bytearray(bad.read_bytes())
    data[12345] ^= 0x01
    bad.write_bytes(bytes(data))
    sizes_only = run_module(hf_cache_sync, sync_args(sshd, caches))
    assert not sizes_only["changed"], "a same-size corruption cannot be seen by sizes"
    res = run_module(hf_cache_sync, sync_args(sshd, caches, verify="full"))
    assert not res.get("failed"), res.get("msg")
    assert res["changed"] and res["targets"][0]["hash_failed"] == [bad.name]
    assert res["totals"]["files_copied"] == 1
    assert target_manifest(caches, verify="full")["complete"]


def test_not_enough_space_is_refused_with_figures_and_copies_nothing(sshd, caches):
    res = run_module(hf_cache_sync, sync_args(sshd, caches, min_free_bytes_margin=1 << 60))
    assert res["failed"]
    assert "not enough space, nothing was copied" in res["msg"]
    assert "127.0.0.2 needs 2.0 MiB for the copy" in res["msg"] and "free on" in res["msg"]
    assert not (caches["dst"] / f"models--{MODEL.replace('/', '--')}" / "blobs").exists()


def test_rsyncd_transport_copies_and_stops_its_daemon(sshd, caches):
    port = free_port()
    res = run_module(hf_cache_sync, sync_args(sshd, caches, transport="rsyncd", receiver_port=port))
    assert not res.get("failed"), res.get("msg")
    assert res["totals"]["files_copied"] == 5
    assert target_manifest(caches, verify="full")["complete"]
    # The daemon is gone once the module returns: nothing listens on its port any more.
    with socket.socket() as s, pytest.raises(OSError):
        s.settimeout(1)
        s.connect(("127.0.0.2", port))


def test_tcp_transport_hashes_on_receipt_records_it_and_stops_its_receiver(sshd, caches):
    port = free_port()
    res = run_module(hf_cache_sync, sync_args(sshd, caches, transport="tcp", receiver_port=port))
    assert not res.get("failed"), res.get("msg")
    target = res["targets"][0]
    assert target["files_copied"] == 5 and target["verified_on_receipt"] == 5
    assert target["write"] in ("O_DIRECT", "buffered, then dropped from the page cache")
    # The receiver recorded what it hashed, so the check after the copy did not read it again and a
    # later sizes check on that node trusts it.
    repo = caches["dst"] / f"models--{MODEL.replace('/', '--')}"
    record = json.loads((repo / ".sparkops" / "hashed-blobs.json").read_text())["blobs"]
    assert set(record) == set(caches["names"].values())
    assert target_manifest(caches, verify="full")["complete"]
    with socket.socket() as s, pytest.raises(OSError):
        s.settimeout(1)
        s.connect(("127.0.0.2", port))


def test_tcp_receiver_port_in_use_fails_clearly_and_copies_nothing(sshd, caches):
    with socket.socket() as busy:
        busy.bind(("127.0.0.2", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        res = run_module(hf_cache_sync, sync_args(sshd, caches, transport="tcp", receiver_port=port))
    assert res["failed"]
    assert f"the temporary receiver did not start on port {port}" in res["msg"]
    assert "Is the port free (receiver_port)?" in res["msg"]
    assert not list((caches["dst"] / f"models--{MODEL.replace('/', '--')}" / "blobs").iterdir())


def test_ssh_transport_copies_and_opens_no_listener(sshd, caches, monkeypatch):
    listening = []
    real = hf_cache_sync.Rsyncd.__enter__
    monkeypatch.setattr(hf_cache_sync.Rsyncd, "__enter__", lambda self: listening.append(1) or real(self))
    real_tcp = hf_cache_sync.Receiver.__enter__
    monkeypatch.setattr(hf_cache_sync.Receiver, "__enter__", lambda self: listening.append(1) or real_tcp(self))
    res = run_module(hf_cache_sync, sync_args(sshd, caches, transport="ssh"))
    assert not res.get("failed"), res.get("msg")
    assert res["totals"]["files_copied"] == 5
    assert target_manifest(caches, verify="full")["complete"]
    assert listening == [], "transport=ssh started a daemon"


def test_one_ssh_session_per_target_for_the_whole_sync(sshd, caches, monkeypatch):
    # Every step on the target (manifest, folders, daemon, links, the check after the copy) goes
    # through one ssh connection: a connection per step cost more than the copy (benchmark).
    opened = []
    real = hf_cache_sync.Target._open
    monkeypatch.setattr(hf_cache_sync.Target, "_open", lambda self: opened.append(self.address) or real(self))
    res = run_module(hf_cache_sync, sync_args(sshd, caches))
    assert not res.get("failed"), res.get("msg")
    assert res["totals"]["files_copied"] == 5 and target_manifest(caches, verify="full")["complete"]
    assert opened == ["127.0.0.2"]


class _Params:
    def __init__(self, params):
        self.params = params
        self.check_mode = False


def _session(sshd, caches):
    p = sync_args(sshd, caches, ssh_cipher="aes128-gcm@openssh.com", connect_timeout_s=15, io_timeout_s=60)
    return hf_cache_sync.Target(_Params(p), "127.0.0.2"), p


def _start_daemon(target, caches, port, secret):
    """The temporary daemon on the target's 127.0.0.2, accepting only the source 127.0.0.1."""
    return target.call(
        "rsyncd_start",
        address="127.0.0.2",
        port=port,
        path=str(caches["dst"]),
        allow="127.0.0.1",
        user="sparkops",
        secret=secret,
        io_timeout=60,
    )


def _rsync_to_daemon(caches, port, source, password, tmp_path):
    (tmp_path / "probe").write_bytes(b"x")
    return subprocess.run(
        [
            "rsync",
            f"--address={source}",
            "--timeout=20",
            str(tmp_path / "probe"),
            f"rsync://sparkops@127.0.0.2:{port}/hf/",
        ],
        env=dict(os.environ, RSYNC_PASSWORD=password),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_temporary_daemon_accepts_only_the_source_with_the_secret(sshd, caches, tmp_path):
    target, p = _session(sshd, caches)
    port = p["receiver_port"]
    try:
        target.call("mkdirs", repo=target.repo)
        _start_daemon(target, caches, port, "s3cret-for-this-run")
        wrong_source = _rsync_to_daemon(caches, port, "127.0.0.3", "s3cret-for-this-run", tmp_path)
        # rsync refuses a host outside "hosts allow" before auth; with "list = no" it does not even
        # admit the module exists (rsync 3.5: "Unknown module"; older: "access denied").
        err = wrong_source.stderr.lower()
        assert wrong_source.returncode != 0 and ("unknown module" in err or "access denied" in err), err
        wrong_secret = _rsync_to_daemon(caches, port, "127.0.0.1", "guess", tmp_path)
        assert wrong_secret.returncode != 0 and "auth failed" in wrong_secret.stderr.lower()
        assert not (caches["dst"] / "probe").exists()
        right = _rsync_to_daemon(caches, port, "127.0.0.1", "s3cret-for-this-run", tmp_path)
        assert right.returncode == 0, right.stderr
        assert (caches["dst"] / "probe").read_bytes() == b"x"
        # It listens on the target's address only, not on every address of the node.
        with socket.socket() as s, pytest.raises(OSError):
            s.settimeout(1)
            s.connect(("127.0.0.3", port))
    finally:
        target.close()


def test_temporary_daemon_is_write_only_on_the_model_folder_with_links_munged(sshd, caches, tmp_path):
    # issue 23: the daemon ran without a chroot and without munging, read-write, on the whole cache.
    target, p = _session(sshd, caches)
    port = p["receiver_port"]
    repo = caches["dst"] / f"models--{MODEL.replace('/', '--')}"
    (caches["dst"] / "other-model").mkdir()
    (caches["dst"] / "other-model" / "secret").write_bytes(b"not yours")
    env = dict(os.environ, RSYNC_PASSWORD="s3cret")
    url = f"rsync://sparkops@127.0.0.2:{port}/hf/"
    try:
        target.call("mkdirs", repo=target.repo)
        target.call(
            "rsyncd_start", address="127.0.0.2", port=port, path=target.repo, allow="127.0.0.1",
            user="sparkops", secret="s3cret", io_timeout=60,
        )  # fmt: skip
        (tmp_path / "up").mkdir()
        (tmp_path / "up" / "escape").symlink_to("/")
        (tmp_path / "up" / "file").write_bytes(b"x")
        push = subprocess.run(
            ["rsync", "--address=127.0.0.1", "--timeout=20", "-rl", f"{tmp_path / 'up'}/", url],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert push.returncode == 0, push.stderr
        # Written into the model's folder, not the cache; the link stored munged (never followed).
        assert (repo / "file").read_bytes() == b"x" and not (caches["dst"] / "file").exists()
        assert os.readlink(repo / "escape").startswith("/rsyncd-munged/")
        pull = subprocess.run(
            ["rsync", "--address=127.0.0.1", "--timeout=20", "-r", url, str(tmp_path / "down")],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert pull.returncode != 0 and "write only" in pull.stderr.lower() + pull.stdout.lower(), pull.stderr
        assert not (tmp_path / "down" / "file").exists()
    finally:
        target.close()


def test_temporary_daemon_stops_when_the_session_closes(sshd, caches):
    # As when the module dies mid-copy: no rsyncd_stop, only the channel's EOF.
    target, p = _session(sshd, caches)
    port = p["receiver_port"]
    _start_daemon(target, caches, port, "x" * 48)
    socket.create_connection(("127.0.0.2", port), timeout=2).close()
    target.close()
    with socket.socket() as s, pytest.raises(OSError):
        s.settimeout(1)
        s.connect(("127.0.0.2", port))


def test_source_address_must_be_local_and_targets_valid(sshd, caches):
    res = run_module(hf_cache_sync, sync_args(sshd, caches, source_address="10.255.255.1"))
    assert res["failed"] and "is not an address of this node" in res["msg"]
    res = run_module(hf_cache_sync, sync_args(sshd, caches, targets=["spark-2"]))
    assert res["failed"] and "is not an IP address" in res["msg"]
    res = run_module(hf_cache_sync, sync_args(sshd, caches, streams=0))
    assert res["failed"] and "1 to 64" in res["msg"]


def test_key_not_authorized_from_another_address_fails_clearly(sshd, caches):
    # The key is authorized from 127.0.0.1 only: connecting from 127.0.0.3 (a "management LAN")
    # must be refused, as the fabric key refuses anything but the fast subnets.
    res = run_module(hf_cache_sync, sync_args(sshd, caches, source_address="127.0.0.3"))
    assert res["failed"]
    assert "ssh to 127.0.0.2 from 127.0.0.3 failed" in res["msg"]
    assert not (caches["dst"] / f"models--{MODEL.replace('/', '--')}").exists()


def test_incomplete_source_is_refused(sshd, caches):
    repo = caches["src"] / f"models--{MODEL.replace('/', '--')}"
    shutil.move(repo / "blobs" / caches["names"]["config.json"], caches["src"] / "moved")
    res = run_module(hf_cache_sync, sync_args(sshd, caches))
    assert res["failed"] and "incomplete on the source" in res["msg"]


def test_ipv6_addresses_are_bracketed_for_rsync():
    assert hf_cache_sync.url_host("fd00:213::12") == "[fd00:213::12]"
    assert hf_cache_sync.url_host("10.213.0.12") == "10.213.0.12"
