"""Weight sync faults on the simulated cluster: a real interruption, a corrupted blob, a full disk.

The sync runs the way the weight_cache role runs it: hf_cache_sync on spark-sim-1, over the fast link
(10.213.0.0/24) with the fabric key, to spark-sim-2. A separate model (``BENCH``) in a separate cache
is used for the interruption so the deployed model stays intact.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from conftest import NODES, ROOT, SIM_STATE, ansible_env, failure, node_sh, run_adhoc, run_playbook

pytestmark = pytest.mark.usefixtures("sim_cluster")

SOURCE, TARGET = NODES
SOURCE_FAST, TARGET_FAST = "10.213.0.11", "10.213.0.12"
HUB = "/var/lib/sparkops/huggingface/hub"
MODEL = "sparkops-sim/tiny-test-model"
REVISION = "5157000000000000000000000000000000000001"
REPO = f"{HUB}/models--sparkops-sim--tiny-test-model"
FAULT_HUB = "/var/tmp/sparkops-fault-hub"
FAULT_MODEL = "sparkops-test/interrupt"
FAULT_REPO = f"{FAULT_HUB}/models--sparkops-test--interrupt"
FAULT_SHARDS, FAULT_SHARD_MIB = 32, 16

SEED = (ROOT / "sim" / "seed_shards.py").read_text()


def sync_args(**kw) -> dict:
    args = {
        "cache_dir": HUB,
        "model": MODEL,
        "revision": REVISION,
        "targets": [TARGET_FAST],
        "source_address": SOURCE_FAST,
        "ssh_key": "/root/.ssh/sparkops_fabric_ed25519",
        "ssh_extra_args": ["-o", "UserKnownHostsFile=/root/.ssh/sparkops_fabric_known_hosts"],
        "streams": 2,
    }
    args.update(kw)
    return args


def blobs(node: str, repo: str) -> dict:
    """name -> (inode, size) of complete blobs (rsync's hidden temp files excluded)."""
    out = node_sh(node, f"cd {repo}/blobs 2>/dev/null && stat -c '%n %i %s' [0-9a-f]* || true").stdout
    return {n: (int(i), int(s)) for n, i, s in (line.split() for line in out.splitlines() if line.strip())}


@pytest.fixture
def fault_model():
    node_sh(TARGET, f"rm -rf {FAULT_HUB}")
    node_sh(SOURCE, f"rm -rf {FAULT_HUB}")
    subprocess.run(
        [
            "docker",
            "exec",
            "-i",
            SOURCE,
            "python3",
            "-",
            FAULT_REPO,
            "2" * 40,
            str(FAULT_SHARDS),
            str(FAULT_SHARD_MIB << 20),
        ],
        input=SEED,
        text=True,
        check=True,
        timeout=120,
    )
    yield
    node_sh(TARGET, f"rm -rf {FAULT_HUB}", check=False)
    node_sh(SOURCE, f"rm -rf {FAULT_HUB}", check=False)


def test_deployed_model_is_the_same_on_both_nodes():
    assert run_playbook("playbooks/weights.yml").returncode == 0
    src, dst = blobs(SOURCE, REPO), blobs(TARGET, REPO)
    assert src and {n: v[1] for n, v in src.items()} == {n: v[1] for n, v in dst.items()}
    # Every snapshot link on the target resolves (the layout, not only the bytes).
    res = node_sh(TARGET, f"find {REPO}/snapshots -type l ! -exec test -e {{}} \\; -print")
    assert res.stdout.strip() == ""


def test_the_model_came_from_the_hub_and_the_worker_holds_its_file_list():
    """The user's path on the defaults (issue 22): the head downloaded through the image's huggingface_hub
    from the test bed's Hub, and the tcp sync carried the Hub's file list to the worker with the blobs."""
    listing = f"{REPO}/.sparkops/{REVISION}.json"
    head = json.loads(node_sh(SOURCE, f"cat {listing}").stdout)
    worker = json.loads(node_sh(TARGET, f"cat {listing}").stdout)
    assert worker == head
    names = json.dumps(head)
    assert "config.json" in names and "model-00001-of-00004.safetensors" in names
    # The head asked the test bed's Hub with the image's client, from its management address.
    hub_log = (SIM_STATE / "hub" / "hub.log").read_text().splitlines()
    head_gets = [line for line in hub_log if line.startswith("192.168.213.11 GET ")]
    assert any("/cdn-lfs/" in line and "hf_hub/0.36.2" in line for line in head_gets), hub_log[-20:]


# What receives on the target, per transport: the session's own receiver (tcp) or rsync's daemon.
RECEIVER_PROCESS = {"tcp": "-f sparkops_hf_cache_remote", "rsyncd": "-x rsync"}


@pytest.mark.parametrize("transport", ["tcp", "rsyncd"])
def test_interrupted_sync_resumes_with_only_what_is_missing(fault_model, transport):
    args = sync_args(cache_dir=FAULT_HUB, model=FAULT_MODEL, revision="main", streams=1, transport=transport)
    cmd = [
        str(ROOT / ".venv" / "bin" / "ansible"),
        SOURCE,
        "-i",
        str(ROOT / "inventory" / "sim"),
        "-m",
        "sparkops.cluster.hf_cache_sync",
        "-a",
        json.dumps(args),
    ]
    # Kill the receiving process once 3 blobs are complete on the target. The watch runs inside the
    # node (a 5 ms poll, bounded to 120 s): a copy at disk speed takes well under a second, far less
    # than one `docker exec` per look would need to catch it midway.
    watch = subprocess.Popen(
        [
            "docker",
            "exec",
            TARGET,
            "timeout",
            "120",
            "bash",
            "-c",
            f"until [ $(ls {FAULT_REPO}/blobs 2>/dev/null | grep -c '^[0-9a-f]') -ge 3 ]; do sleep 0.005; done; "
            f"pkill -KILL {RECEIVER_PROCESS[transport]}",
        ]
    )
    time.sleep(0.5)  # the watch is running before the copy starts
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.communicate(timeout=180)[0].decode(errors="replace")
    watch.wait(timeout=130)
    complete = blobs(TARGET, FAULT_REPO)
    if not 3 <= len(complete) < FAULT_SHARDS:
        pytest.fail(f"could not interrupt the copy midway (complete blobs: {len(complete)}): {out[-1500:]}")
    assert proc.returncode != 0, "the killed copy must fail"
    assert f"the copy ({transport}) failed" in out and "run again" in out

    res = run_adhoc(SOURCE, "sparkops.cluster.hf_cache_sync", args)
    assert not res.get("failed"), res.get("msg")
    shard = FAULT_SHARD_MIB << 20
    # Only what was missing (the blob being written when the receiver died included) travels again,
    # and what the killed one left half-written is cleaned up.
    assert res["totals"]["files_copied"] == FAULT_SHARDS - len(complete)
    assert res["totals"]["bytes_copied"] == (FAULT_SHARDS - len(complete)) * shard
    after = blobs(TARGET, FAULT_REPO)
    assert node_sh(TARGET, f"ls -A {FAULT_REPO}/blobs | grep '^[.]' || true").stdout.strip() == ""
    assert len(after) == FAULT_SHARDS
    for name, (inode, _size) in complete.items():
        assert after[name][0] == inode, f"{name} was complete and was copied again"
    again = run_adhoc(SOURCE, "sparkops.cluster.hf_cache_sync", args)
    assert not again["changed"] and again["totals"]["bytes_copied"] == 0


def test_corrupt_blob_on_target_is_found_and_only_it_is_resynced():
    shard = sorted(n for n, (_inode, size) in blobs(TARGET, REPO).items() if size > 1 << 20)[0]
    others = {n: v for n, v in blobs(TARGET, REPO).items() if n != shard}
    # Flip one byte in the middle: same size, so only a hash can see it.
    node_sh(TARGET, f"printf '\\x00' | dd of={REPO}/blobs/{shard} bs=1 seek=4194304 count=1 conv=notrunc 2>/dev/null")
    assert node_sh(TARGET, f"sha256sum {REPO}/blobs/{shard}").stdout.split()[0] != shard
    res = run_playbook("playbooks/weights.yml", extra_vars={"weight_cache_verify": "full"})
    assert res.returncode == 0, failure(res)
    assert "copied 8388608 bytes in 1 files" in res.stdout
    assert node_sh(TARGET, f"sha256sum {REPO}/blobs/{shard}").stdout.split()[0] == shard
    assert {n: v for n, v in blobs(TARGET, REPO).items() if n != shard} == others


def test_target_disk_too_small_is_refused_before_copying():
    shard = sorted(n for n, (_inode, size) in blobs(TARGET, REPO).items() if size > 1 << 20)[0]
    node_sh(TARGET, f"rm -f {REPO}/blobs/{shard}")
    try:
        res = run_playbook("playbooks/weights.yml", extra_vars={"weight_cache_min_free_gib": 1000000})
        assert res.returncode != 0
        assert "not enough space, nothing was copied" in res.stdout
        assert "10.213.0.12 needs 8.0 MiB for the copy plus 1000000.0 GiB margin but has" in res.stdout
        assert shard not in blobs(TARGET, REPO), "a refused sync must not copy anything"
    finally:
        assert run_playbook("playbooks/weights.yml").returncode == 0
    assert shard in blobs(TARGET, REPO)


def test_sync_never_uses_the_management_lan():
    # The fabric key is authorized from the fast subnets only: from the management address the same
    # sync is refused by the target's sshd, so a role that sent weights over the LAN could not pass.
    res = run_adhoc(
        SOURCE, "sparkops.cluster.hf_cache_sync", sync_args(source_address="192.168.213.11", targets=["192.168.213.12"])
    )
    assert res.get("failed")
    assert "ssh to 192.168.213.12 from 192.168.213.11 failed" in res["msg"]


def flat(text: str) -> str:
    """Output with the YAML callback's line wrapping undone."""
    return " ".join(text.split())


def shard_of(node: str, index: int = 1) -> tuple:
    """(snapshot file name, blob name) of the deployed model's shard ``index``."""
    name = f"model-{index:05d}-of-00004.safetensors"
    target = node_sh(node, f"readlink {REPO}/snapshots/{REVISION}/{name}").stdout.strip()
    return name, target.rsplit("/", 1)[1]


def test_incomplete_snapshot_is_refused_when_preseeded_and_resumed_from_the_hub():
    # Issue 16 item 2: one shard's blob and link gone, a partial blob left as an interrupted download.
    name, blob = shard_of(SOURCE, 3)
    saved = f"/var/tmp/sparkops-saved-{blob}"
    node_sh(
        SOURCE,
        f"mv {REPO}/blobs/{blob} {saved} && rm {REPO}/snapshots/{REVISION}/{name} "
        f"&& head -c 1048576 {saved} > {REPO}/blobs/{blob}.incomplete",
    )
    manifest_args = {"cache_dir": HUB, "model": MODEL, "revision": REVISION}
    try:
        m = run_adhoc(SOURCE, "sparkops.cluster.hf_cache_manifest", manifest_args)
        assert not m["complete"], m["message"]
        # The Hub's file list the download wrote says what the snapshot must hold.
        assert m["expected_from"] == "hub listing"
        assert m["missing_files"] == [name] and m["incomplete_downloads"] == {blob: 1048576}
        # A cache the site put there itself (preseeded): nothing may download it, so the run stops.
        # weights.yml is site.yml's weights play (playbooks/site.yml imports it), without the plays before it.
        res = run_playbook("playbooks/weights.yml", extra_vars={"weight_cache_source": "preseeded"})
        out = flat(res.stdout)
        assert res.returncode != 0, out[-3000:]
        assert "nothing to copy" not in out
        assert "is NOT complete (hub listing)" in out and name in out and "interrupted download" in out
        assert "Nothing was synced" in out
        # The default (the Hub): the image's client resumes the partial blob where it stopped.
        hub_log = SIM_STATE / "hub" / "hub.log"
        seen = len(hub_log.read_text().splitlines())
        res = run_playbook("playbooks/weights.yml")
        assert res.returncode == 0, flat(res.stdout)[-3000:]
        asked = hub_log.read_text().splitlines()[seen:]
        assert any(line.startswith("192.168.213.11 GET ") and f"/cdn-lfs/{blob} 206 " in line for line in asked), asked
        assert run_adhoc(SOURCE, "sparkops.cluster.hf_cache_manifest", manifest_args)["complete"]
    finally:
        node_sh(
            SOURCE,
            f"[ -e {REPO}/blobs/{blob} ] || mv {saved} {REPO}/blobs/{blob}; "
            f"rm -f {saved} {REPO}/blobs/{blob}.incomplete; "
            f"ln -sfn ../../blobs/{blob} {REPO}/snapshots/{REVISION}/{name}",
            check=False,
        )
    assert run_playbook("playbooks/weights.yml").returncode == 0


def test_flipped_byte_sizes_check_says_so_and_verify_finds_it():
    # Issue 16 item 3. verify.yml first: every blob hashed on both nodes, the hashes recorded.
    first = run_playbook("playbooks/verify.yml")
    assert first.returncode == 0, failure(first)
    assert "every blob hashed" in flat(first.stdout)
    _name, blob = shard_of(TARGET, 2)
    node_sh(TARGET, f"printf '\\xff' | dd of={REPO}/blobs/{blob} bs=1 seek=1000 count=1 conv=notrunc 2>/dev/null")
    assert node_sh(TARGET, f"sha256sum {REPO}/blobs/{blob}").stdout.split()[0] != blob
    try:
        res = run_playbook("playbooks/weights.yml")  # site.yml's weights play
        assert res.returncode == 0, failure(res)
        # The default check says what it compared, and the hash record shows the blob changed since.
        out = flat(res.stdout)
        assert "sizes match; contents not hashed" in out, out[-3000:]
        assert "changed (size or mtime) since they were last hashed" in out and blob in out
        bad = run_playbook("playbooks/verify.yml")
        out = flat(bad.stdout)
        assert bad.returncode != 0, out[-3000:]
        assert "spark-sim-2" in out and "do not match their hash" in out and blob in out
        assert "weight_cache_verify=full" in out
    finally:
        fix = run_playbook("playbooks/weights.yml", extra_vars={"weight_cache_verify": "full"})
    assert fix.returncode == 0, failure(fix)
    assert node_sh(TARGET, f"sha256sum {REPO}/blobs/{blob}").stdout.split()[0] == blob
