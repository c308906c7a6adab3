"""node_facts on this machine: the same answers as `du -sb`, `df -P`, uname and Ansible's own facts code."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from ansible_collections.sparkops.cluster.plugins.modules import node_facts
from module_runner import run_module


def test_reads_the_system_like_uname_and_sysfs():
    r = run_module(node_facts, {}, check_mode=True)
    assert r.get("failed") is not True, r
    assert r["changed"] is False
    assert r["architecture"] == platform.machine()
    assert r["kernel"] == subprocess.run(["uname", "-r"], capture_output=True, text=True, check=True).stdout.strip()
    assert r["distribution"] and r["distribution_version"] is not None
    assert set(r["interfaces"]) == set(os.listdir("/sys/class/net"))
    assert r["interfaces"]["lo"]["mtu"] == int(Path("/sys/class/net/lo/mtu").read_text())
    assert r["free_space"] == {} and r["usage"] == {}


def test_usage_counts_like_du_sb_hard_links_once_links_not_followed(tmp_path):
    cache = tmp_path / "hub" / "models--org--m"
    (cache / "blobs").mkdir(parents=True)
    (cache / "snapshots" / "rev").mkdir(parents=True)
    blob = cache / "blobs" / "abc"
    blob.write_bytes(b"x" * 100_000)
    os.link(blob, cache / "blobs" / "abc-hardlink")
    (cache / "snapshots" / "rev" / "model.safetensors").symlink_to("../../blobs/abc")
    (tmp_path / "outside").write_bytes(b"y" * 50_000)
    (cache / "snapshots" / "rev" / "elsewhere").symlink_to(tmp_path / "outside")
    du = subprocess.run(["du", "-sb", str(cache)], capture_output=True, text=True, check=True)
    r = run_module(node_facts, {"usage_paths": [str(cache), str(tmp_path / "absent")]})
    assert r["usage"][str(cache)] == int(du.stdout.split()[0])
    assert r["usage"][str(tmp_path / "absent")] is None


def test_free_space_of_the_nearest_existing_folder_like_df(tmp_path):
    want = tmp_path / "not" / "there" / "yet"
    r = run_module(node_facts, {"free_space_path": str(want)})
    assert r["free_space"]["path"] == str(tmp_path)
    df = subprocess.run(["df", "-PB1", str(tmp_path)], capture_output=True, text=True, check=True)
    avail, mount = df.stdout.splitlines()[1].split()[3], df.stdout.splitlines()[1].split()[5]
    assert r["free_space"]["mount"] == mount
    # The filesystem is live (other processes write to it): same within 64 MiB.
    assert abs(r["free_space"]["free_bytes"] - int(avail)) < 64 * 2**20
