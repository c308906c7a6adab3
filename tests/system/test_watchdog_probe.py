"""The watchdog's probe against real HTTP servers on loopback: a token, a hang, a refusal, a 401.

A hung server accepts the connection (the kernel does) and never answers, as a SIGSTOPped vLLM does.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("sparkops_watchdog", ROOT / "roles/watchdog/files/sparkops_watchdog.py")
wd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wd)

KEY = "k-" + "x" * 40


class Streamer(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            self.send_response(401)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b'data: {"choices":[{"text":"hi","index":0}]}\n\ndata: [DONE]\n\n')

    def log_message(self, *args):
        pass


@pytest.fixture
def streamer():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Streamer)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def cfg(url: str) -> dict:
    return {"endpoint": url, "model": "m", "probe_max_tokens": 2}


def test_token_is_ok(streamer):
    result, detail, took = wd.probe(cfg(streamer), KEY, 5)
    assert (result, detail) == ("ok", "") and took < 5


def test_wrong_key_fails(streamer):
    result, detail, _ = wd.probe(cfg(streamer), "wrong", 5)
    assert result == "failed" and detail == "HTTP 401"


def test_accepted_but_silent_is_a_hang_within_t():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)  # never accept(): the kernel completes the handshake, nobody answers
    try:
        start = time.monotonic()
        result, detail, _ = wd.probe(cfg(f"http://127.0.0.1:{sock.getsockname()[1]}"), KEY, 1.5)
        elapsed = time.monotonic() - start
        assert result == "hang" and "no token within 1.5 s" in detail
        assert 1.4 < elapsed < 3.0
    finally:
        sock.close()


def test_refused_is_a_failure_not_a_hang():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    result, detail, _ = wd.probe(cfg(f"http://127.0.0.1:{port}"), KEY, 2)
    assert result == "failed" and "ConnectionRefused" in detail


class DeadEngine(BaseHTTPRequestHandler):
    """vLLM 0.19.0 after EngineDeadError: a request gets 500 with ENGINE_DEAD_MESSAGE (v1/engine/exceptions.py:13);
    a stream already answered 200 gets it as an error chunk; /health gets 503."""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        msg = b'{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause."}}'
        streamed = self.server.streamed
        self.send_response(200 if streamed else self.server.status)
        self.send_header("Content-Type", "text/event-stream" if streamed else "application/json")
        self.end_headers()
        self.wfile.write(b"data: " + msg + b"\n\n" if streamed else msg if self.server.status == 500 else b"")


class Echoer(BaseHTTPRequestHandler):
    """A broken server that echoes the request's Authorization header in its status line: http.client
    raises BadStatusLine with that line, the error path the watchdog reports as its probe detail."""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.wfile.write(f"HTTP/1.1 bad {self.headers.get('Authorization')}\r\n\r\n".encode())

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(("status", "streamed"), [(500, False), (503, False), (200, True)])
def test_a_dead_engine_is_dead_not_a_plain_failure(status, streamed):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), DeadEngine)
    srv.status, srv.streamed = status, streamed
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        result, detail, _ = wd.probe(cfg(f"http://127.0.0.1:{srv.server_address[1]}"), KEY, 5)
    finally:
        srv.shutdown()
        srv.server_close()
    assert result == "dead" and "engine dead" in detail, (result, detail)


def test_another_500_is_a_plain_failure():
    class Other(DeadEngine):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b'{"error":{"message":"out of memory"}}')

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert wd.probe(cfg(f"http://127.0.0.1:{srv.server_address[1]}"), KEY, 5)[:2] == ("failed", "HTTP 500")
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def echoer():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Echoer)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def watchdog(tmp_path: Path, url: str, key: str, monkeypatch) -> wd.Watchdog:
    """The watchdog as its unit runs it (key from its file, events and state files), no workers, and
    no container on this machine (docker inspect of a missing container: wd.container_state's "missing")."""
    monkeypatch.setattr(wd, "container_state", lambda name, timeout=10: {"Status": "missing"})
    (tmp_path / "api_key").write_text(key + "\n")
    return wd.Watchdog(
        cfg(url)
        | {
            "events_file": str(tmp_path / "events" / "watchdog.jsonl"),
            "node": "head",
            "state_file": str(tmp_path / "state.json"),
            "api_key_file": str(tmp_path / "api_key"),
            "hang_timeout_s": 3,
            "failures_before_restart": 3,
            "max_restarts_per_hour": 2,
            "interval_s": 10,
            "workers": [],
            "floor_marker": str(tmp_path / "floor-tripped"),
            "startup_grace_s": 60,
            "vllm_container": "vllm",
            "ray_container": "ray",
        }
    )


def written(tmp_path: Path, capsys) -> str:
    """Everything the watchdog wrote: its events file, its state file and its stdout (the container log)."""
    events = tmp_path / "events" / "watchdog.jsonl"
    return "\n".join(
        [events.read_text() if events.exists() else "", (tmp_path / "state.json").read_text(), capsys.readouterr().out]
    )


def test_a_healthy_round_records_the_probe_without_the_key(tmp_path, streamer, monkeypatch, capsys):
    dog = watchdog(tmp_path, streamer, KEY, monkeypatch)
    assert dog.round(None) == "watching"
    state = json.loads((tmp_path / "state.json").read_text())
    assert (state["status"], state["last_probe"]) == ("watching", "ok")
    assert KEY not in written(tmp_path, capsys)


def test_a_401_round_emits_probe_failed_without_the_key(tmp_path, streamer, monkeypatch, capsys):
    wrong = "k-" + "w" * 40  # the key file holds a stale key: the server answers 401
    dog = watchdog(tmp_path, streamer, wrong, monkeypatch)
    assert dog.round(None) == "degraded"
    events = [json.loads(line) for line in (tmp_path / "events" / "watchdog.jsonl").read_text().splitlines()]
    assert [(e["event"], e["message"], e["consecutive"]) for e in events] == [("probe_failed", "HTTP 401", 1)]
    out = written(tmp_path, capsys)
    assert wrong not in out and KEY not in out


def test_an_error_that_echoes_the_key_is_reported_without_it(tmp_path, echoer, monkeypatch, capsys):
    result, detail, _ = wd.probe(cfg(echoer), KEY, 5)
    assert result == "failed" and detail.startswith("BadStatusLine") and KEY not in detail
    assert "Bearer <api key>" in detail
    dog = watchdog(tmp_path, echoer, KEY, monkeypatch)
    dog.round(None)
    events = [json.loads(line) for line in (tmp_path / "events" / "watchdog.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["probe_failed"]
    assert "BadStatusLine" in events[0]["message"]
    assert KEY not in written(tmp_path, capsys)


class Queued(BaseHTTPRequestHandler):
    """A full engine: the probe's stream opens but gets no token (it waits in the queue), while /metrics shows
    the generation counter moving (``moving``) or stuck (a hung engine)."""

    def do_GET(self):  # noqa: N802 - http.server's name
        srv = self.server
        srv.tokens += 50 if srv.moving else 0
        body = f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {srv.tokens}\n'.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.flush()
        time.sleep(self.server.hold_s)  # no token while the probe waits

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("moving", [True, False])
def test_a_queued_probe_is_busy_when_tokens_flow_and_a_hang_when_they_do_not(tmp_path, monkeypatch, capsys, moving):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Queued)
    srv.daemon_threads = True
    srv.tokens, srv.moving, srv.hold_s = 1000.0, moving, 4.0
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    restarts = []
    try:
        dog = watchdog(tmp_path, f"http://127.0.0.1:{srv.server_address[1]}", KEY, monkeypatch)
        dog.cfg["hang_timeout_s"] = 1
        # The group restart itself (docker on both nodes) is not this test's: record it, end as a restart would.
        monkeypatch.setattr(dog, "restart_group", lambda reason: restarts.append(reason) or dog.save(status="watching"))
        dog.round(None)
    finally:
        srv.shutdown()
        srv.server_close()
    events = [json.loads(line)["event"] for line in (tmp_path / "events" / "watchdog.jsonl").read_text().splitlines()]
    if moving:
        assert restarts == [] and "busy_seen" in events and "hang_seen" not in events, events
    else:
        assert len(restarts) == 1 and "hang" in restarts[0] and "hang_seen" in events, (restarts, events)


class Freezable(Queued):
    """A server that answers (a token, /metrics) until it is frozen; then it accepts and says nothing, on
    every path, as a SIGSTOPped vLLM does (the kernel completes the handshake, the process never reads)."""

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.server.frozen:
            time.sleep(30)
            return
        super().do_GET()

    def do_POST(self):  # noqa: N802 - http.server's name
        if self.server.frozen:
            time.sleep(30)
            return
        Streamer.do_POST(self)


def test_a_frozen_engine_is_seen_within_the_probe_timeout_and_a_short_metrics_read(tmp_path, monkeypatch):
    """The hang is seen within interval + T + METRICS_AFTER_HANG_S of the freeze: the round reads no /metrics
    before its probe (the count comes from the previous round's answer), so a frozen /metrics costs one short
    read, not its full timeout before the probe and again after it (12.3 s against a 7.5 s bound on the
    simulated pair with interval 2 s and T 4 s)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Freezable)
    srv.daemon_threads = True
    srv.tokens, srv.moving, srv.frozen = 1000.0, False, False
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        dog = watchdog(tmp_path, f"http://127.0.0.1:{srv.server_address[1]}", KEY, monkeypatch)
        dog.cfg["hang_timeout_s"] = 2
        monkeypatch.setattr(dog, "restart_group", lambda reason: dog.save(status="watching"))
        assert dog.round(None) == "watching"
        srv.frozen = True
        start = time.monotonic()
        dog.round("watching")
        took = time.monotonic() - start
    finally:
        srv.shutdown()
        srv.server_close()
    events = [json.loads(line) for line in (tmp_path / "events" / "watchdog.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e["event"] == "hang_seen"] == ["hang_seen"], events
    assert took < 2 + wd.METRICS_AFTER_HANG_S + 1.0, took
