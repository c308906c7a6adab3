"""ssh_facts on keys made by the real ssh-keygen: host keys as Ansible's facts give them, a key pair's public half."""

from __future__ import annotations

import os
import pwd
import subprocess

from ansible_collections.sparkops.cluster.plugins.modules import ssh_facts
from module_runner import run_module


def keygen(path, kind, comment):
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", comment, "-f", str(path)], check=True)


def test_host_keys_key_pair_and_files(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    keygen(etc / "ssh_host_ed25519_key", "ed25519", "root@node")
    keygen(etc / "ssh_host_ecdsa_key", "ecdsa", "root@node")
    key = tmp_path / "fabric"
    keygen(key, "ed25519", "sparkops-fabric@spark-1")
    os.chmod(key, 0o600)
    known = tmp_path / "known_hosts"
    known.write_text("10.0.0.1 ssh-ed25519 AAAA\n")
    os.chmod(known, 0o644)
    r = run_module(
        ssh_facts,
        {"host_keys_dir": str(etc), "key_path": str(key), "files": [str(known), str(tmp_path / "nope")]},
        check_mode=True,
    )
    assert r.get("failed") is not True, r
    ed = (etc / "ssh_host_ed25519_key.pub").read_text().split()
    assert r["host_keys"]["ed25519"] == {"keytype": ed[0], "key": ed[1]}
    assert r["host_keys"]["ecdsa"]["keytype"].startswith("ecdsa-sha2-")
    assert "rsa" not in r["host_keys"]
    pub = (tmp_path / "fabric.pub").read_text().strip()
    assert r["key"]["exists"] and r["key"]["mode"] == "0600" and r["key"]["pub"] == pub
    assert r["key"]["public_key"] == " ".join(pub.split()[:2])
    assert r["files"][str(known)]["mode"] == "0644" and r["files"][str(known)]["kind"] == "file"
    assert r["files"][str(tmp_path / "nope")]["exists"] is False
    assert r["authorized_keys"] == {}


def test_a_pub_file_that_does_not_match_its_private_key_is_visible(tmp_path):
    keygen(tmp_path / "a", "ed25519", "x@a")
    keygen(tmp_path / "b", "ed25519", "x@b")
    (tmp_path / "a.pub").write_text((tmp_path / "b.pub").read_text())
    r = run_module(ssh_facts, {"host_keys_dir": str(tmp_path), "key_path": str(tmp_path / "a")})
    assert r["key"]["public_key"] != " ".join(r["key"]["pub"].split()[:2])


def test_missing_key_and_authorized_keys_of_this_user(tmp_path):
    user = pwd.getpwuid(os.getuid()).pw_name
    r = run_module(
        ssh_facts, {"host_keys_dir": str(tmp_path), "key_path": str(tmp_path / "none"), "authorized_keys_user": user}
    )
    assert r["key"] == {"exists": False, "mode": None, "public_key": None, "pub_exists": False, "pub": None}
    ak = r["authorized_keys"]
    assert ak["path"] == os.path.join(pwd.getpwnam(user).pw_dir, ".ssh", "authorized_keys")
    assert ak["exists"] == os.path.exists(ak["path"])
    f = run_module(ssh_facts, {"authorized_keys_user": "no-such-user-sparkops"})
    assert f["failed"] is True and "does not exist" in f["msg"]


def test_key_in_place_is_what_openssh_keypair_would_leave_alone(tmp_path):
    key = tmp_path / "fabric"
    keygen(key, "ed25519", "sparkops-fabric@spark-1")
    os.chmod(key, 0o600)
    args = {"host_keys_dir": str(tmp_path), "key_path": str(key), "key_comment": "sparkops-fabric@spark-1"}
    assert run_module(ssh_facts, args, check_mode=True)["key_in_place"] is True
    assert run_module(ssh_facts, dict(args, key_comment="sparkops-fabric@spark-2"))["key_in_place"] is False
    assert run_module(ssh_facts, {"host_keys_dir": str(tmp_path), "key_path": str(key)})["key_in_place"] is None
    os.chmod(key, 0o644)
    assert run_module(ssh_facts, args)["key_in_place"] is False
    rsa = tmp_path / "rsa"
    keygen(rsa, "rsa", "sparkops-fabric@spark-1")
    os.chmod(rsa, 0o600)
    assert run_module(ssh_facts, dict(args, key_path=str(rsa)))["key_in_place"] is False
    assert run_module(ssh_facts, dict(args, key_path=str(tmp_path / "none")))["key_in_place"] is False
