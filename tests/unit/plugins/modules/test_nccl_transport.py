"""nccl_transport on the recorded real NCCL logs in tests/fixtures/nccl (sources in its README)."""

import shutil

from ansible_collections.sparkops.cluster.plugins.modules import nccl_transport
from conftest import FIXTURES
from module_runner import run_module

NCCL = FIXTURES / "nccl"
TWINS = ["rocep1s0f1", "roceP2p1s0f1"]


def test_both_twins_over_roce_passes_from_files(tmp_path):
    shutil.copy(NCCL / "spark_2node_roce_both_twins_nccl2.28.9.log", tmp_path / "worker-1.err")
    out = run_module(nccl_transport, {"paths": [str(tmp_path / "worker-*.err")], "expected_hcas": TWINS})
    assert not out.get("failed"), out
    assert out["ok"] is True
    assert out["transports"] == ["IB"]
    assert out["files_read"] == [str(tmp_path / "worker-1.err")]


def test_socket_fallback_fails_naming_sockets():
    text = (NCCL / "spark_2node_socket_enP7s7_nccl2.29.7.log").read_text()
    out = run_module(nccl_transport, {"text": text, "expected_hcas": TWINS})
    assert out["failed"]
    assert "Socket" in out["msg"]
    assert out["ok"] is False


def test_one_twin_only_fails_naming_the_missing_one():
    text = (NCCL / "spark_2node_single_twin_vllm.log").read_text()
    out = run_module(nccl_transport, {"text": text, "expected_hcas": TWINS})
    assert out["failed"]
    assert "roceP2p1s0f1" in out["msg"]


def test_no_nccl_lines_is_a_failure_not_a_pass(tmp_path):
    (tmp_path / "worker-1.err").write_text("INFO 11-23 vLLM test double: nothing about NCCL here\n")
    out = run_module(nccl_transport, {"paths": [str(tmp_path / "*.err")], "expected_hcas": TWINS})
    assert out["failed"]
    assert "no NCCL transport lines" in out["msg"]


def test_report_only_mode_does_not_fail():
    text = (NCCL / "spark_2node_socket_enP7s7_nccl2.29.7.log").read_text()
    out = run_module(nccl_transport, {"text": text, "fail_on_mismatch": False}, check_mode=True)
    assert not out.get("failed")
    assert out["ok"] is False


# ------------------------------------------------------------------ a log another user could forge
class _St:
    def __init__(self, uid, mode, gid=0):
        self.st_uid, self.st_mode, self.st_gid = uid, mode, gid


def _tree(entries):
    """A stat stand-in over {path: (uid, mode)}; folders carry S_IFDIR."""

    def stat_fn(path):
        uid, mode = entries[path]
        return _St(uid, mode)

    return stat_fn


ROOT_DIRS = {"/": (0, 0o40755), "/var": (0, 0o40755), "/var/lib": (0, 0o40755), "/var/lib/sparkops": (0, 0o40755)}
LOG = "/var/lib/sparkops/ray/session_latest/logs/worker-1.err"


def test_a_log_under_the_old_world_writable_ray_folder_is_forgeable():
    tree = dict(ROOT_DIRS)
    tree.update({
        "/var/lib/sparkops/ray": (0, 0o40777),  # the old layout: 0777, no sticky bit
        "/var/lib/sparkops/ray/session_latest": (0, 0o40777),
        "/var/lib/sparkops/ray/session_latest/logs": (0, 0o40777),
        LOG: (0, 0o100644),
    })  # fmt: skip
    why = nccl_transport.forgeable(LOG, _tree(tree))
    assert why and "/var/lib/sparkops/ray is writable by other users" in why


def test_a_log_under_a_root_only_folder_is_trusted_even_in_a_0777_ray_folder():
    log = "/var/lib/sparkops/private/ray/session_latest/logs/worker-1.err"
    tree = dict(ROOT_DIRS)
    tree.update({
        "/var/lib/sparkops/private": (0, 0o40700),
        "/var/lib/sparkops/private/ray": (0, 0o40777),
        "/var/lib/sparkops/private/ray/session_latest": (0, 0o40777),
        "/var/lib/sparkops/private/ray/session_latest/logs": (0, 0o40777),
        log: (0, 0o100644),
    })  # fmt: skip
    assert nccl_transport.forgeable(log, _tree(tree)) is None
    tree["/var/lib/sparkops/private"] = (0, 0o40711)  # others may pass through: no longer closed
    assert "private/ray is writable" in nccl_transport.forgeable(log, _tree(tree))
    tree["/var/lib/sparkops/private"] = (0, 0o40700)
    tree[log] = (1000, 0o100644)  # planted before the folder was closed: not root's
    assert nccl_transport.forgeable(log, _tree(tree)) == f"{log} belongs to uid 1000"
    tree[log] = (0, 0o100666)
    assert "writable by other users (mode 0666)" in nccl_transport.forgeable(log, _tree(tree))


def test_a_sticky_world_writable_folder_on_the_way_is_fine_but_not_a_foreign_one():
    tree = {"/": (0, 0o40755), "/tmp": (0, 0o41777), "/tmp/logs": (0, 0o40755), "/tmp/logs/w.err": (0, 0o100644)}
    assert nccl_transport.forgeable("/tmp/logs/w.err", _tree(tree)) is None
    tree["/tmp/logs"] = (1000, 0o40755)
    assert nccl_transport.forgeable("/tmp/logs/w.err", _tree(tree)) == "/tmp/logs belongs to uid 1000"


def test_a_forgeable_log_is_not_read_and_the_proof_fails(tmp_path):
    planted = tmp_path / "worker-1.err"
    shutil.copy(NCCL / "spark_2node_roce_both_twins_nccl2.28.9.log", planted)
    planted.chmod(0o666)  # anyone could have written it
    out = run_module(nccl_transport, {"paths": [str(tmp_path / "worker-*.err")], "expected_hcas": TWINS})
    assert out["failed"] and out["ok"] is False
    assert out["files_read"] == []
    assert out["files_refused"] == [f"{planted}: {planted} is writable by other users (mode 0666)"]
    planted.chmod(0o644)
    out = run_module(nccl_transport, {"paths": [str(tmp_path / "worker-*.err")], "expected_hcas": TWINS})
    assert out["ok"] is True and out["files_refused"] == []
