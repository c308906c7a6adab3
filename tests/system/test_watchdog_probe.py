"""The watchdog's probe against real HTTP servers on loopback: a token, a hang, a refusal, a 401.

A hung server accepts the connection (the kernel does) and never answers, as a SIGSTOPped vLLM does.
"""

from __future__ import annotations

import importlib.util
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


def test_events_never_carry_the_key(tmp_path, streamer):
    ev = wd.Events(str(tmp_path / "w.jsonl"), "head")
    result, detail, _ = wd.probe(cfg(streamer), KEY, 5)
    ev.emit("probe_ok", detail or result)
    assert KEY not in (tmp_path / "w.jsonl").read_text()


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
