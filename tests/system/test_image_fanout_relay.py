"""image_fanout over a real sshd on loopback: the relay tree carries one `docker save | zstd` stream to every node.

Every "node" is this machine reached through the throw-away sshd on 127.0.0.2 (sshd_helpers.py); the relay
is the real one (sent in the ssh command, run by python3 there), with real zstd. Docker is a stand-in on
disk: `save` prints a file, `load` writes its stdin to one file per node (the relay names the node in
SPARKOPS_FANOUT_NODE) and prints what `docker load -q` prints ("Loaded image: NAME:TAG").
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.modules import image_fanout as module

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "unit"))

from module_runner import run_module  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fake_docker(tmp_path):
    """docker save IMAGE -> the image file; docker load -> <loaded>/<node>.tar (a node named 'full' fails)."""
    image = tmp_path / "image.tar"
    image.write_bytes(os.urandom(3 * 1024 * 1024) + b"layer" * 200_000)  # several 1 MiB chunks
    loaded = tmp_path / "loaded"
    loaded.mkdir()
    exe = tmp_path / "docker"
    exe.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f'  save) exec cat "{image}" ;;\n'
        '  load) node="${SPARKOPS_FANOUT_NODE:?}"\n'
        f'    cat > "{loaded}/$node.part" || exit 1\n'
        '    if [ "$node" = full ]; then echo "write /var/lib/docker/tmp: no space left on device" >&2; exit 1; fi\n'
        f'    mv "{loaded}/$node.part" "{loaded}/$node.tar"; echo "Loaded image: vllm-node:test" ;;\n'
        '  *) echo "fake docker: $1 not supported" >&2; exit 2 ;;\n'
        "esac\n"
    )
    exe.chmod(0o755)
    return {"exe": str(exe), "image": image.read_bytes(), "loaded": loaded}


def args(sshd, fake_docker, edges, need, **kw):
    ssh = sshd.module_args()
    out = {
        "image": "vllm-node:test",
        "source": "n1",
        "edges": edges,
        "need": need,
        "ssh_user": ssh["ssh_user"],
        "ssh_args": ["ssh", "-i", ssh["ssh_key"], "-o", "BatchMode=yes", *ssh["ssh_extra_args"]],
        "docker": fake_docker["exe"],
        "python": sys.executable,
        "timeout_s": 60,
    }
    out.update(kw)
    return out


def edge(frm, to, ip="127.0.0.2", wave=1):
    return {"from": frm, "to": to, "ip": ip, "wave": wave}


# n1 -> n2 -> n3 -> n4, and n2 -> n5: three levels below the build host, one branch.
TREE = [edge("n1", "n2"), edge("n2", "n3", wave=2), edge("n2", "n5", wave=2), edge("n3", "n4", wave=3)]


def test_every_node_of_the_chain_gets_identical_bytes(sshd, fake_docker):
    out = run_module(module, args(sshd, fake_docker, TREE, ["n2", "n3", "n4", "n5"]))
    assert not out.get("failed"), out.get("msg")
    assert out["changed"] is True
    assert sorted(out["loaded"]) == ["n2", "n3", "n4", "n5"]
    for node in ("n2", "n3", "n4", "n5"):
        assert (fake_docker["loaded"] / f"{node}.tar").read_bytes() == fake_docker["image"], node
    assert not (fake_docker["loaded"] / "n1.tar").exists()  # the build host only saves
    assert 0 < out["bytes"] < len(fake_docker["image"])  # what travelled is the zstd stream, once


def test_a_node_holding_the_image_relays_without_loading(sshd, fake_docker):
    out = run_module(module, args(sshd, fake_docker, TREE, ["n4"]))
    assert not out.get("failed"), out.get("msg")
    assert out["loaded"] == ["n4"]
    assert out["plan"]["relay_only"] == ["n2", "n3"]
    assert [(h["from"], h["to"]) for h in out["hops"]] == [("n1", "n2"), ("n2", "n3"), ("n3", "n4")]
    assert sorted(p.name for p in fake_docker["loaded"].iterdir()) == ["n4.tar"]  # n5's subtree got nothing
    assert (fake_docker["loaded"] / "n4.tar").read_bytes() == fake_docker["image"]


def test_a_broken_hop_fails_naming_it_and_the_rest_keeps_what_it_loaded(sshd, fake_docker):
    # n3's child is on an address nothing listens on; n5 (another branch) and n3 itself still load.
    tree = [edge("n1", "n2"), edge("n2", "n3"), edge("n2", "n5"), edge("n3", "n4", ip="127.0.0.9")]
    out = run_module(module, args(sshd, fake_docker, tree, ["n2", "n3", "n4", "n5"]))
    assert out["failed"]
    assert "n3 -> n4 (127.0.0.9): ssh exited 255" in out["msg"]
    assert "Connection refused" in out["msg"]
    assert sorted(out["loaded"]) == ["n2", "n3", "n5"]
    assert out["changed"] is True
    for node in ("n2", "n3", "n5"):
        assert (fake_docker["loaded"] / f"{node}.tar").read_bytes() == fake_docker["image"], node


def test_a_failed_load_is_named_with_dockers_message(sshd, fake_docker):
    tree = [edge("n1", "full"), edge("full", "n3", wave=2)]
    out = run_module(module, args(sshd, fake_docker, tree, ["full", "n3"]))
    assert out["failed"]
    assert "n1 -> full (127.0.0.2): zstd -d | docker load failed there" in out["msg"]
    assert "no space left on device" in out["msg"]
    assert out["loaded"] == ["n3"]  # the failing node still relayed what it received


def test_a_missing_image_on_the_build_host_fails_and_loads_nothing(sshd, fake_docker, tmp_path):
    broken = tmp_path / "docker-without-image"
    broken.write_text("#!/bin/sh\necho 'Error response from daemon: reference does not exist' >&2\nexit 1\n")
    broken.chmod(0o755)
    out = run_module(module, args(sshd, fake_docker, TREE[:1], ["n2"], docker=str(broken)))
    assert out["failed"]
    assert "docker save vllm-node:test" in out["msg"] or "reference does not exist" in out["msg"]
    assert out.get("loaded", []) == []
