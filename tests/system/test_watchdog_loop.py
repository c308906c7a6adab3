"""The watchdog's watch loop as a real process against a loopback OpenAI-style server.

A healthy server -> "watching"; the server stops answering (accepts, never replies, as a SIGSTOPped
vLLM does) -> hang_seen within T + N, a group restart begun; the restart's Docker steps fail here (no
serving containers exist) -> restart_ended not ok; after M restarts in the hour -> gave_up, and nothing
more. The key never reaches the events or the state.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "roles/watchdog/files/sparkops_watchdog.py"
KEY = "secret-" + "k" * 40
N, T = 1, 1.5

pytestmark = pytest.mark.skipif(shutil.which("docker") is None, reason="the restart steps call the docker CLI")


class Server(BaseHTTPRequestHandler):
    hang = threading.Event()

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        if Server.hang.is_set():
            time.sleep(10)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b'data: {"choices":[{"text":"ok"}]}\n\ndata: [DONE]\n\n')

    def log_message(self, *args):
        pass


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(path: Path, name: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in events(path):
            if e["event"] == name:
                return e
        time.sleep(0.1)
    raise AssertionError(f"no {name} within {timeout} s: {events(path)}")


def test_watch_loop_hang_restart_give_up(tmp_path):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    (tmp_path / "key").write_text(KEY)
    name = f"sparkops-absent-{socket.gethostname()}-{time.time_ns()}"
    cfg = {
        "node": "head",
        "watch": True,
        "interval_s": N,
        "hang_timeout_s": T,
        "failures_before_restart": 2,
        "max_restarts_per_hour": 2,
        "restart_backoff_s": 0.5,
        "startup_grace_s": 30,
        "ready_timeout_s": 3,
        "ray_join_timeout_s": 2,
        "stop_grace_s": 1,
        "ssh_timeout_s": 2,
        "docker_timeout_s": 10,
        "endpoint": f"http://127.0.0.1:{srv.server_address[1]}",
        "model": "m",
        "api_key_file": str(tmp_path / "key"),
        "vllm_container": name + "-vllm",
        "ray_container": name + "-ray",
        "workers": [],
        "ssh_user": "root",
        "ssh_args": [],
        "events_file": str(tmp_path / "watchdog.jsonl"),
        "state_file": str(tmp_path / "state.json"),
        "floor_marker": str(tmp_path / "memory-floor.json"),
        "memory_floor_bytes": 0,
        # No SPARKOPS chains on this machine: the refusal to restart without them has its own tests
        # (test_watchdog_logic.py); this one follows the restarts and the give-up.
        "firewall_check": False,
    }
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    ev = tmp_path / "watchdog.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--config", str(tmp_path / "cfg.json")], stdout=subprocess.DEVNULL
    )
    try:
        wait_for(ev, "started", 10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            st = json.loads((tmp_path / "state.json").read_text()) if (tmp_path / "state.json").exists() else {}
            if st.get("status") == "watching":
                break
            time.sleep(0.1)
        assert st.get("status") == "watching"
        t0 = time.time()
        Server.hang.set()
        hang = wait_for(ev, "hang_seen", T + N + 5)
        assert hang["epoch"] - t0 <= T + N + 1
        begun = wait_for(ev, "restart_begun", 5)
        assert "hang" in begun["reason"]
        ended = wait_for(ev, "restart_ended", 30)
        assert ended["ok"] is False and "Ray head container did not restart" in ended["detail"]
        gave_up = wait_for(ev, "gave_up", 60)
        assert "max_restarts_per_hour=2" in gave_up["message"]
        time.sleep(3 * N + T)
        names = [e["event"] for e in events(ev)]
        assert names.count("restart_begun") == 2 and names.count("gave_up") == 1
        assert json.loads((tmp_path / "state.json").read_text())["status"] == "gave_up"
        # Healthy again: the watchdog says so and watches again.
        Server.hang.clear()
        wait_for(ev, "recovered", 10 + T)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        Server.hang.clear()
        srv.shutdown()
        srv.server_close()
    text = ev.read_text() + (tmp_path / "state.json").read_text()
    assert KEY not in text
