"""hf_cache_sync follow mode against a real sshd and real rsync on loopback: a chain source -> B -> C.

B is filled the way an upstream's rsync fills it (each blob written under a temporary name, then
renamed; the snapshot links and refs last), slowly, by a thread, while hf_cache_sync runs ON B with
follow=true and C as its target. Nothing leaves loopback (C is the sshd on 127.0.0.2).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time

import pytest
from ansible_collections.sparkops.cluster.plugins.modules import hf_cache_manifest, hf_cache_sync
from hf_cache_helpers import MODEL, REVISION, make_model, write_listing
from module_runner import run_module
from sshd_helpers import free_port

REPO = "models--" + MODEL.replace("/", "--")
SHARDS, SHARD_BYTES = 6, 1024 * 1024


@pytest.fixture
def chain(tmp_path):
    src, b, c = tmp_path / "src-hub", tmp_path / "b-hub", tmp_path / "c-hub"
    model = make_model(src, shards=SHARDS, shard_bytes=SHARD_BYTES)
    write_listing(model["repo"])
    b.mkdir()
    c.mkdir()
    return {"src": src / REPO, "b": b, "c": c, "c_repo": c / REPO}


class Upstream(threading.Thread):
    """Fills B from the source as a copy does: blob by blob (temp name, then rename), links and refs last.

    ``stall_after``: stop after that many blobs and never finish (a dead upstream). ``wait_for_c``:
    before the last blob, wait (bounded) until C holds a blob - proof that B forwards while it receives.
    """

    def __init__(self, src, dst_hub, delay_s=0.3, stall_after=None, wait_for_c=None):
        super().__init__(daemon=True)
        self.src, self.dst = src, dst_hub / REPO
        self.delay_s, self.stall_after, self.wait_for_c = delay_s, stall_after, wait_for_c
        self.c_had_blobs_before_b_was_complete = None
        self.error = None

    def run(self):
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _run(self):
        (self.dst / "blobs").mkdir(parents=True)
        names = sorted(os.listdir(self.src / "blobs"), key=lambda n: -os.path.getsize(self.src / "blobs" / n))
        for i, name in enumerate(names):
            if self.stall_after is not None and i >= self.stall_after:
                return
            if i == len(names) - 1 and self.wait_for_c is not None:
                end = time.monotonic() + 30
                while time.monotonic() < end and not _complete_blobs(self.wait_for_c):
                    time.sleep(0.05)
                self.c_had_blobs_before_b_was_complete = bool(_complete_blobs(self.wait_for_c))
            temp = self.dst / "blobs" / f".{name}.Xy12Ab"
            data = (self.src / "blobs" / name).read_bytes()
            with open(temp, "wb") as f:
                for off in range(0, len(data), 256 * 1024):  # grows while it is written, like rsync's temp file
                    f.write(data[off : off + 256 * 1024])
                    f.flush()
                    time.sleep(self.delay_s / 4)
            os.replace(temp, self.dst / "blobs" / name)
        shutil.copytree(self.src / ".sparkops", self.dst / ".sparkops")
        for sub in ("snapshots", "refs"):
            shutil.copytree(self.src / sub, self.dst / sub, symlinks=True)


def _complete_blobs(repo) -> dict:
    blobs = repo / "blobs"
    if not blobs.is_dir():
        return {}
    return {p.name: p.stat().st_size for p in blobs.iterdir() if not p.name.startswith(".")}


def _digest(repo) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (repo / "blobs").iterdir()}


def follow_args(sshd, chain, **kw):
    args = {
        "cache_dir": str(chain["b"]),
        "target_cache_dir": str(chain["c"]),
        "model": MODEL,
        "revision": "main",
        "streams": 2,
        "receiver_port": free_port(),
        "follow": True,
        "upstream": "spark-up",
        "io_timeout_s": 10,
        "follow_timeout_s": 120,
        **sshd.module_args(),
    }
    args.update(kw)
    return args


@pytest.mark.parametrize("transport", ["tcp", "rsyncd", "ssh"])
def test_follower_forwards_while_it_receives_and_ends_identical(sshd, chain, transport):
    up = Upstream(chain["src"], chain["b"], wait_for_c=chain["c_repo"])
    up.start()
    res = run_module(hf_cache_sync, follow_args(sshd, chain, transport=transport))
    up.join(timeout=60)
    assert up.error is None, up.error
    assert not res.get("failed"), res.get("msg")
    assert up.c_had_blobs_before_b_was_complete, "C got nothing before B was complete: no forwarding while receiving"
    assert res["followed_s"] > 0
    # Every blob travelled once: forwarded during the follow or in the final pass, never twice.
    assert res["totals"]["files_copied"] == SHARDS + 1 + 1  # shards, config.json, the Hub listing
    assert res["totals"]["bytes_copied"] >= SHARDS * SHARD_BYTES
    assert _digest(chain["c_repo"]) == _digest(chain["src"])
    m = run_module(hf_cache_manifest, {"cache_dir": str(chain["c"]), "model": MODEL, "revision": REVISION})
    assert m["complete"] and m["expected_from"] == "hub listing", m
    # Forwarded blobs were hashed on C like copied ones (hash_copied), so a later size check can trust them.
    hashed = json.loads((chain["c_repo"] / ".sparkops" / "hashed-blobs.json").read_text())["blobs"]
    assert set(hashed) == set(_digest(chain["src"])), "a forwarded blob was not hashed on C"
    again = run_module(hf_cache_sync, follow_args(sshd, chain))
    assert not again.get("failed") and not again["changed"] and again["totals"]["bytes_copied"] == 0


def test_stalled_upstream_fails_within_the_stall_limit_naming_it(sshd, chain):
    up = Upstream(chain["src"], chain["b"], delay_s=0.05, stall_after=2)
    up.start()
    start = time.monotonic()
    res = run_module(hf_cache_sync, follow_args(sshd, chain, io_timeout_s=2))
    took = time.monotonic() - start
    up.join(timeout=30)
    assert res["failed"]
    assert "spark-up sent nothing for 2 s" in res["msg"] and "run again" in res["msg"], res["msg"]
    assert took < 2 + 8, f"the stall was noticed after {took:.1f} s, limit 2 s"
    # What B had was forwarded and stays on C; nothing is linked there (C is not complete).
    assert len(_complete_blobs(chain["c_repo"])) == 2
    assert not (chain["c_repo"] / "refs" / "main").exists()


def test_follow_gives_up_after_follow_timeout(sshd, chain):
    up = Upstream(chain["src"], chain["b"], delay_s=4.0)  # slow, never stalled: a blob grows every second
    up.start()
    start = time.monotonic()
    res = run_module(hf_cache_sync, follow_args(sshd, chain, follow_timeout_s=2, io_timeout_s=30))
    took = time.monotonic() - start
    assert res["failed"] and "follow_timeout_s=2" in res["msg"] and "spark-up" in res["msg"], res["msg"]
    assert took < 2 + 8
    up.stall_after = 0  # let the thread end soon
    up.join(timeout=60)


def test_follow_checks_free_space_before_it_forwards(sshd, chain):
    # issue 23: the final pass refused a short disk before copying, the follow copied first.
    up = Upstream(chain["src"], chain["b"], delay_s=0.05, stall_after=3)  # B never completes: only the follow copies
    up.start()
    res = run_module(hf_cache_sync, follow_args(sshd, chain, min_free_bytes_margin=1 << 60, io_timeout_s=5))
    up.join(timeout=60)
    assert res["failed"], res
    assert "not enough space on 127.0.0.2 to forward" in res["msg"] and "free on" in res["msg"], res["msg"]
    assert _complete_blobs(chain["c_repo"]) == {}, "a blob was forwarded before the space was checked"


def test_per_target_source_address_must_be_local_and_name_a_target(sshd, chain):
    make_model(chain["b"], shards=1)
    res = run_module(hf_cache_sync, follow_args(sshd, chain, follow=False, source_addresses={"127.0.0.2": "192.0.2.7"}))
    assert res["failed"] and "192.0.2.7 is not an address of this node" in res["msg"]
    res = run_module(hf_cache_sync, follow_args(sshd, chain, follow=False, source_addresses={"127.0.0.9": "127.0.0.1"}))
    assert res["failed"] and "not among the targets" in res["msg"]
    ok = run_module(hf_cache_sync, follow_args(sshd, chain, follow=False, source_addresses={"127.0.0.2": "127.0.0.1"}))
    assert not ok.get("failed"), ok.get("msg")
    assert ok["totals"]["files_copied"] == 2
