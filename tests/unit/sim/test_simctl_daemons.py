"""simctl owns the test bed's daemons whichever checkout started them.

A Hub server left running by another checkout's `make sim` answered this checkout's cluster from that
checkout's files (its log in the other folder): `simctl up`/`down` stop and replace it, naming it. The
system tests' own Hub servers on loopback are not the test bed's and are left alone. Real processes,
each a copy of the command line the daemon runs under, in a scratch folder standing for the other checkout.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def simctl(tmp_path):
    spec = importlib.util.spec_from_file_location("simctl_daemons", ROOT / "sim" / "simctl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.STATE = tmp_path / "ours" / ".sim"
    mod.log = lambda msg: None
    # A port of these tests' own: stop_daemon stops EVERY process with the marker, and a simulated cluster that
    # is up while the unit tests run (make test brings it up beside them) must keep its Hub.
    mod.HUB_PORT = 15080 + os.getpid() % 1000
    mod.HUB_MARKER = (
        b"tests/system/hub_server.py",
        f"--address\0{mod.REGISTRY_HOST}\0--port\0{mod.HUB_PORT}\0".encode(),
    )
    return mod


def fake_daemon(folder: Path, *args: str) -> subprocess.Popen:
    """A process whose command line is `python <folder>/tests/system/hub_server.py <args>` (it only sleeps)."""
    script = folder / "tests" / "system" / "hub_server.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("import time\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, str(script), *args])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and b"hub_server.py" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
        time.sleep(0.05)
    return proc


def test_another_checkouts_hub_is_found_and_stopped_and_a_loopback_one_is_not(simctl, tmp_path):
    bridge = ["--address", simctl.REGISTRY_HOST, "--port", str(simctl.HUB_PORT), "--model", "m"]
    theirs = fake_daemon(tmp_path / "other-checkout", *bridge)
    system_test = fake_daemon(tmp_path / "system", "--address", "127.0.0.1", "--port", str(simctl.HUB_PORT))
    try:
        found = simctl.daemon_pids(simctl.HUB_MARKER)
        assert list(found) == [theirs.pid]
        assert str(tmp_path / "other-checkout") in found[theirs.pid]  # the log names the checkout holding it
        assert not simctl.own_daemon_runs("hub", simctl.HUB_MARKER)
        stopped = simctl.stop_daemon("hub", simctl.HUB_MARKER, timeout_s=5)
        assert len(stopped) == 1 and f"pid {theirs.pid}:" in stopped[0] and "other-checkout" in stopped[0]
        assert theirs.wait(timeout=5) is not None
        assert system_test.poll() is None, "the system tests' loopback Hub is not the test bed's"
    finally:
        for proc in (theirs, system_test):
            proc.kill()
            proc.wait()


def test_ensure_keeps_its_own_answering_daemon_and_replaces_a_foreign_one(simctl, tmp_path, monkeypatch):
    bridge = ["--address", simctl.REGISTRY_HOST, "--port", str(simctl.HUB_PORT)]
    theirs = fake_daemon(tmp_path / "other-checkout", *bridge)
    started = []

    def start(name, argv, answers, what):
        proc = subprocess.Popen(argv)
        (simctl.STATE / name).mkdir(parents=True, exist_ok=True)
        (simctl.STATE / name / "pid").write_text(f"{proc.pid}\n")
        started.append(proc)

    monkeypatch.setattr(simctl, "start_daemon", start)
    ours_script = simctl.ROOT / "tests" / "system" / "hub_server.py"
    argv = [sys.executable, "-c", "import time; time.sleep(120)", str(ours_script), *bridge]
    try:
        # A foreign daemon answers on the port: it is stopped, ours started.
        simctl.ensure_daemon("hub", simctl.HUB_MARKER, argv, lambda: True, "Hub")
        assert theirs.wait(timeout=5) is not None and len(started) == 1
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not simctl.own_daemon_runs("hub", simctl.HUB_MARKER):
            time.sleep(0.05)
        assert simctl.own_daemon_runs("hub", simctl.HUB_MARKER)
        # Ours runs and answers: kept, nothing started.
        simctl.ensure_daemon("hub", simctl.HUB_MARKER, argv, lambda: True, "Hub")
        assert len(started) == 1 and started[0].poll() is None
        # Ours runs but does not answer: replaced.
        simctl.ensure_daemon("hub", simctl.HUB_MARKER, argv, lambda: False, "Hub")
        assert len(started) == 2 and started[0].wait(timeout=5) is not None
    finally:
        for proc in [theirs, *started]:
            proc.kill()
            proc.wait()
