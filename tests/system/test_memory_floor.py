"""The watchdog's memory floor for real: the script reads this machine's memory and stops a real
container through the Docker engine when the floor is crossed (and leaves it alone above it).

Needs a Docker engine and the test bed's base image (made by `make sim-up`); skips without them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "roles/watchdog/files/sparkops_watchdog.py"
IMAGE = "sparkops-sim/vllm-base:bookworm"


def _docker_ok() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, check=False).returncode == 0


pytestmark = pytest.mark.skipif(not _docker_ok(), reason=f"needs a Docker engine with {IMAGE} (make sim-up)")


@pytest.fixture
def victim():
    name = f"sparkops-floor-victim-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "run", "-d", "--name", name, IMAGE, "sleep", "300"], check=True, capture_output=True)
    yield name
    subprocess.run(["docker", "rm", "-f", name], check=False, capture_output=True)


def run_floor(tmp_path: Path, victim: str, floor_bytes: int, seconds: float) -> tuple[Path, Path]:
    marker, events = tmp_path / "memory-floor.json", tmp_path / "memory-floor.jsonl"
    cfg = {
        "node": "test-node",
        "watch": False,
        "memory_floor_bytes": floor_bytes,
        "memory_check_s": 0.2,
        "floor_stop_container": victim,
        "stop_grace_s": 1,
        "floor_marker": str(marker),
        "floor_events_file": str(events),
    }
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--config", str(tmp_path / "cfg.json")], stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (events.exists() and "floor_acted" in events.read_text()):
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    return marker, events


def status(name: str) -> str:
    return subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Status}}", name], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_floor_crossed_stops_the_container(tmp_path, victim):
    # A floor above this machine's memory is crossed at once.
    marker, events = run_floor(tmp_path, victim, 1 << 50, 30)
    assert status(victim) == "exited"
    rec = json.loads(marker.read_text())
    assert rec["stopped"] == victim and rec["available_bytes"] < rec["floor_bytes"]
    names = [json.loads(line)["event"] for line in events.read_text().splitlines()]
    assert names[:3] == ["floor_armed", "floor_crossed", "floor_acted"]


def test_floor_not_crossed_leaves_it_running(tmp_path, victim):
    marker, events = run_floor(tmp_path, victim, 1, 2)
    assert status(victim) == "running"
    assert not marker.exists()
    assert [json.loads(line)["event"] for line in events.read_text().splitlines()] == ["floor_armed"]
