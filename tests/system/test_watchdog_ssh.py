"""The watchdog reaches a worker over one kept ssh connection, with the real ssh client and a real sshd.

The watch loop looks at every worker every interval; each new connection is a key exchange on both nodes. These
tests run the watchdog's own command line (ssh_argv) against a throw-away sshd on loopback: two looks share one
TCP connection (the worker sees the same client port), the control sockets are root's only, and a worker whose
sshd went away is reached by a new connection once it is back, not through the dead master.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("sparkops_watchdog", ROOT / "roles/watchdog/files/sparkops_watchdog.py")
wd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wd)


def config(state_dir: str, sshd) -> dict:
    return {
        "interval_s": 1,
        "state_file": f"{state_dir}/watchdog-state.json",
        "ssh_user": sshd.module_args()["ssh_user"],
        "ssh_args": [
            "-i",
            str(sshd.key),
            "-p",
            str(sshd.port),
            "-o",
            f"UserKnownHostsFile={sshd.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
        ],
    }


@pytest.fixture
def cfg(sshd):
    """The watchdog's config for the loopback sshd, its state folder short enough for the control sockets (as
    /var/lib/sparkops is); the kept master is closed and the folder removed afterwards."""
    state_dir = tempfile.mkdtemp(prefix="wd-", dir="/tmp")
    cfg = config(state_dir, sshd)
    wd.make_ssh_control_dir(cfg)
    yield cfg
    subprocess.run([*wd.ssh_argv(cfg, sshd.address, "")[:-1], "-O", "exit"], capture_output=True, check=False)
    shutil.rmtree(state_dir, ignore_errors=True)


def look(cfg: dict, address: str) -> subprocess.CompletedProcess:
    """What the watch loop does each round: one command on the worker, bounded, its output captured."""
    t0 = time.monotonic()
    res = wd.sh(wd.ssh_argv(cfg, address, 'echo "$SSH_CONNECTION"'), 10)
    # A master that kept the captured pipes open would hold this call until ControlPersist ran out.
    assert time.monotonic() - t0 < 8, f"one look took {time.monotonic() - t0:.1f} s"
    return res


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant (sshd's per-connection processes outlive the listener otherwise)."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout.split()
    os.kill(pid, 9)
    for child in children:
        kill_tree(int(child))


def client_port(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stderr
    return res.stdout.split()[1]


def test_two_looks_share_one_connection_and_the_sockets_are_root_only(cfg, sshd):
    first, second = look(cfg, sshd.address), look(cfg, sshd.address)
    assert client_port(first) == client_port(second), "the second look opened a connection of its own"
    mode = os.stat(wd.ssh_control_dir(cfg)).st_mode
    assert stat.S_IMODE(mode) == 0o700
    sockets = list(Path(wd.ssh_control_dir(cfg)).iterdir())
    assert len(sockets) == 1 and stat.S_ISSOCK(sockets[0].stat().st_mode)


def test_a_worker_whose_sshd_came_back_is_reached_by_a_new_connection(cfg, sshd):
    before = client_port(look(cfg, sshd.address))
    # The worker goes away (its sshd and every session of it) and comes back on the same address.
    kill_tree(sshd.proc.pid)
    sshd.proc.wait(timeout=10)
    gone = look(cfg, sshd.address)
    assert gone.returncode != 0, "a look at a worker without sshd succeeded"
    sshd.listen()
    after = client_port(look(cfg, sshd.address))
    assert after != before
