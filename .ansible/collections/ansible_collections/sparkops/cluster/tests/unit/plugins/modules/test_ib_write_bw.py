"""ib_write_bw module against a fake ``ib_write_bw`` that prints recorded real outputs.

The fake is a small Python script put first on PATH; it records its argv and prints one of the
public outputs in tests/fixtures/perftest (sources: that folder's README.md and
tests/unit/plugins/module_utils/test_perftest.py), or hangs with a child process to test the deadline.
The RDMA devices live in a fake sysfs tree (the module's ``sysfs_root`` option).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.modules import ib_write_bw
from conftest import FIXTURES
from module_runner import run_module

PERF = FIXTURES / "perftest"
EUGR = PERF / "spark-eugr_client_q4_rdmacm_gbits.txt"  # 111.71 Gb/s, one twin, one way
TWIN1 = PERF / "spark-playbooks_client_roceP2p1s0f0_run_infinitely_gbits.txt"  # 97.28 Gb/s
HEALTHY = PERF / "spark-sparkring_bidir_healthy_result.txt"  # 213.05 Gb/s bidirectional
QP_FAIL = PERF / "perftest-issue393_client_qp_rtr_failed.txt"
REFUSED = PERF / "perftest-pr228_client_couldnt_connect.txt"
SERVER_CUT = PERF / "perftest-issue234_server_duration_mbsec_truncated.txt"

FAKE = """#!{python}
import json, os, sys, subprocess, time
with open({argv_file!r}, "w") as f:
    json.dump(sys.argv[1:], f)
mode = {mode!r}
if mode == "hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open({pids_file!r}, "w") as f:
        json.dump([os.getpid(), child.pid], f)
    print("************************************", flush=True)
    print("* Waiting for client to connect... *", flush=True)
    time.sleep(120)
sys.stdout.write(open({fixture!r}).read())
sys.stdout.flush()
sys.exit({rc})
"""


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    for device in ("rocep1s0f1", "roceP2p1s0f1"):
        (root / "class" / "infiniband" / device / "ports" / "1").mkdir(parents=True)
    return root


@pytest.fixture
def fake(tmp_path: Path, monkeypatch):
    """Install a fake ib_write_bw on PATH: fake(fixture, rc=0, mode="print") -> argv file path."""
    bindir = tmp_path / "bin"
    bindir.mkdir()

    def install(fixture: Path | None = None, rc: int = 0, mode: str = "print") -> Path:
        script = bindir / "ib_write_bw"
        script.write_text(
            FAKE.format(
                python=sys.executable,
                argv_file=str(tmp_path / "argv.json"),
                pids_file=str(tmp_path / "pids.json"),
                mode=mode,
                fixture=str(fixture or HEALTHY),
                rc=rc,
            )
        )
        script.chmod(0o755)
        monkeypatch.setenv("PATH", str(bindir))
        return tmp_path / "argv.json"

    return install


def client(sysfs: Path, **extra) -> dict:
    return {"role": "client", "device": "rocep1s0f1", "peer": "192.168.177.12", "sysfs_root": str(sysfs)} | extra


# --- arguments ------------------------------------------------------------------------------------------


def test_client_needs_a_peer(sysfs):
    r = run_module(ib_write_bw, {"role": "client", "device": "rocep1s0f1", "sysfs_root": str(sysfs)})
    assert r["failed"] and "peer" in r["msg"]


def test_bad_role_is_refused(sysfs):
    r = run_module(ib_write_bw, {"role": "both", "device": "rocep1s0f1", "sysfs_root": str(sysfs)})
    assert r["failed"] and "role" in r["msg"]


def test_threshold_and_line_rate_exclude_each_other(sysfs):
    r = run_module(ib_write_bw, client(sysfs, threshold_gbps=190, line_rate_gbps=200))
    assert r["failed"] and "mutually exclusive" in r["msg"]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"qps": 0}, "qps must be at least 1"),
        ({"port": 70000}, "port must be 1-65535"),
        ({"duration_s": 30, "timeout_s": 20}, "must exceed duration_s"),
        ({"line_rate_gbps": 200, "min_fraction": 1.5}, "fraction must be in (0, 1]"),
        ({"threshold_gbps": -1}, "threshold_gbps must be positive"),
    ],
)
def test_invalid_values_say_what_is_wrong(sysfs, fake, extra, words):
    fake()
    r = run_module(ib_write_bw, client(sysfs, **extra))
    assert r["failed"] and words in r["msg"] and r["msg"].startswith("Invalid ib_write_bw options")


def test_server_refuses_a_peer(sysfs, fake):
    fake()
    r = run_module(ib_write_bw, {"role": "server", "device": "rocep1s0f1", "peer": "1.2.3.4", "sysfs_root": str(sysfs)})
    assert r["failed"] and "peer is only for role=client" in r["msg"]


# --- preconditions ----------------------------------------------------------------------------------------


def test_missing_binary(sysfs, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    r = run_module(ib_write_bw, client(sysfs))
    assert r["failed"] and "perftest is not installed" in r["msg"] and "apt-get install perftest" in r["msg"]
    assert r["not_installed"] is True and r["reason"] == "not_installed" and r["ran"] is False


def test_missing_device_lists_the_present_ones(sysfs, fake):
    fake()
    r = run_module(ib_write_bw, client(sysfs, device="rocep1s0f0"))
    assert r["failed"] and "rocep1s0f0 does not exist" in r["msg"]
    assert "roceP2p1s0f1, rocep1s0f1" in r["msg"] and r["reason"] == "no_rdma_device"


def test_no_rdma_devices_at_all(tmp_path, fake):
    fake()
    r = run_module(ib_write_bw, client(tmp_path / "nosys"))
    assert r["failed"] and "devices present: none" in r["msg"]


def test_check_mode_returns_the_command_and_runs_nothing(sysfs, fake):
    argv = fake()
    r = run_module(ib_write_bw, client(sysfs, bidirectional=True, duration_s=5, port=18620), check_mode=True)
    assert not r.get("failed") and r["changed"] is False and r["ran"] is False
    assert r["cmd"][1:] == [
        "-d",
        "rocep1s0f1",
        "-p",
        "18620",
        "-q",
        "4",
        "-s",
        "1048576",
        "-F",
        "--report_gbits",
        "-b",
        "-D",
        "5",
        "-x",
        "3",
        "192.168.177.12",
    ]
    assert not argv.exists()


# --- runs -------------------------------------------------------------------------------------------------


def test_client_pass(sysfs, fake):
    argv = fake(TWIN1)
    r = run_module(ib_write_bw, client(sysfs, device="roceP2p1s0f1", threshold_gbps=90))
    assert not r.get("failed") and r["changed"] is False and r["ran"] is True and r["rc"] == 0
    assert r["passed"] is True and r["threshold_gbps"] == 90 and r["bw_avg_gbps"] == 97.28
    # The device is what perftest reports (the recorded output is of the port-0 twin).
    assert r["device"] == "roceP2p1s0f0" and r["gid_index"] == 3 and r["link_type"] == "Ethernet"
    assert r["reason"] is None and "97.28" in r["stdout_tail"]
    assert json.loads(argv.read_text())[-1] == "192.168.177.12"


def test_client_line_rate_fraction(sysfs, fake):
    fake(EUGR)
    r = run_module(ib_write_bw, client(sysfs, line_rate_gbps=200, min_fraction=0.5, rdma_cm=True))
    assert not r.get("failed") and r["passed"] is True and r["threshold_gbps"] == 100.0
    assert "-R" in r["cmd"] and "-x" not in r["cmd"] and r["rdma_cm"] is True and r["qps"] == 4


def test_client_below_threshold_names_link_figure_and_threshold(sysfs, fake):
    fake(EUGR)
    r = run_module(ib_write_bw, client(sysfs, threshold_gbps=190, bidirectional=True))
    assert r["failed"] and r["passed"] is False
    assert "rocep1s0f1" in r["msg"] and "111.71 Gb/s" in r["msg"] and "190.00 Gb/s" in r["msg"]
    assert "192.168.177.12" in r["msg"]


def test_below_threshold_without_failing(sysfs, fake):
    fake(EUGR)
    r = run_module(ib_write_bw, client(sysfs, threshold_gbps=190, fail_on_threshold=False))
    assert not r.get("failed") and r["passed"] is False and r["bw_avg_gbps"] == 111.71


def test_qp_failure(sysfs, fake):
    fake(QP_FAIL, rc=1)
    r = run_module(ib_write_bw, client(sysfs, threshold_gbps=190))
    assert r["failed"] and r["error_kind"] == "qp_setup_failed" and r["reason"] == "qp_setup_failed"
    assert "Failed to modify QP to RTR" in r["msg"] and "rocep1s0f1" in r["msg"] and r["rc"] == 1
    assert r["passed"] is None


def test_refused_connection(sysfs, fake):
    fake(REFUSED, rc=1)
    r = run_module(ib_write_bw, client(sysfs))
    assert r["failed"] and r["reason"] == "peer_unreachable" and "Couldn't connect" in r["msg"]


def test_client_without_result_fails(sysfs, fake):
    fake(SERVER_CUT, rc=0)
    r = run_module(ib_write_bw, client(sysfs))
    assert r["failed"] and "printed no bandwidth result" in r["msg"] and r["reason"] == "no_result"


def test_server_returns_its_parsed_output(sysfs, fake):
    argv = fake(HEALTHY)
    r = run_module(
        ib_write_bw,
        {
            "role": "server",
            "device": "rocep1s0f1",
            "sysfs_root": str(sysfs),
            "bidirectional": True,
            "duration_s": 5,
            "timeout_s": 30,
        },
    )
    assert not r.get("failed") and r["bw_avg_gbps"] == 213.05 and r["duration_s"] == 5
    args = json.loads(argv.read_text())
    assert "192.168.177.12" not in args and args[-2:] == ["-x", "3"] and "-b" in args


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_hang_past_the_deadline_is_killed_with_its_children(sysfs, fake, tmp_path):
    fake(mode="hang")
    start = time.monotonic()
    r = run_module(ib_write_bw, client(sysfs, timeout_s=1.5))
    assert time.monotonic() - start < 20
    assert r["failed"] and r["timed_out"] is True and r["rc"] is None
    assert r["reason"] == "timed_out" and r["error_kind"] == "timed_out"
    assert "did not finish within 1.5 s and was killed" in r["msg"]
    pids = json.loads((tmp_path / "pids.json").read_text())
    deadline = time.monotonic() + 5
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(pid) for pid in pids), f"left running: {pids}"
    assert "Waiting for client" in r["stdout_tail"]


def test_server_hang_says_no_client_connected(sysfs, fake):
    fake(mode="hang")
    r = run_module(ib_write_bw, {"role": "server", "device": "rocep1s0f1", "sysfs_root": str(sysfs), "timeout_s": 1})
    assert r["failed"] and r["timed_out"] and "no client connected" in r["msg"] and r["side"] == "server"


def test_absolute_binary_path(sysfs, fake, tmp_path):
    fake(TWIN1)
    r = run_module(ib_write_bw, client(sysfs, binary=str(tmp_path / "bin" / "ib_write_bw"), threshold_gbps=90))
    assert not r.get("failed") and r["cmd"][0] == str(tmp_path / "bin" / "ib_write_bw")
    assert os.path.isabs(r["cmd"][0])
