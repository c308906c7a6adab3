"""http_probes against real sockets on loopback: a server that answers 401, one that accepts and never
answers (a port whose answers are dropped after the handshake), and a closed port. What doctor's
API-exposure verdict reads: connected and status per URL, -1 for no answer, every URL asked at once."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest
from ansible_collections.sparkops.cluster.plugins.modules import http_probes as mod
from module_runner import run_module


class _Refuses(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        length = int(self.headers.get("Content-Length") or 0)
        self.server.bodies.append(self.rfile.read(length))
        self.send_response(401)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def answers_401():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuses)
    srv.bodies = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def silent():
    """Accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock.getsockname()[1]
    sock.close()


def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def test_each_url_says_whether_it_connected_and_what_it_answered(answers_401, silent):
    closed = closed_port()
    urls = [
        f"http://127.0.0.1:{answers_401.server_port}/tokenize",
        f"http://127.0.0.1:{silent}/invocations",
        f"http://127.0.0.1:{closed}/tokenize",
        f"http://127.0.0.1:{answers_401.server_port}/tokenize",  # asked once
    ]
    res = run_module(mod, {"urls": urls, "method": "POST", "body": {"prompt": "doctor"}, "timeout_s": 1})
    assert not res.get("failed") and res["changed"] is False
    by_url = {p["url"]: p for p in res["probes"]}
    assert [p["url"] for p in res["probes"]] == urls[:3]
    assert by_url[urls[0]] | {"elapsed_s": 0} == {
        "url": urls[0],
        "connected": True,
        "status": 401,
        "msg": "HTTP 401",
        "elapsed_s": 0,
    }
    assert by_url[urls[1]]["connected"] is True and by_url[urls[1]]["status"] == -1
    assert "no answer" in by_url[urls[1]]["msg"]
    assert by_url[urls[2]]["connected"] is False and by_url[urls[2]]["status"] == -1
    assert answers_401.bodies == [b'{"prompt": "doctor"}']  # the body only: no key, no other header's secret


def test_silent_urls_are_waited_for_at_the_same_time(silent):
    urls = [f"http://127.0.0.1:{silent}/p{i}" for i in range(4)]
    start = time.monotonic()
    probes = mod.probe_all(urls, "GET", None, timeout_s=1.5)
    took = time.monotonic() - start
    assert [p["status"] for p in probes] == [-1] * 4
    # One after another they would take 4 x 1.5 s; at once about 1.5 s (a wide margin for a loaded machine).
    assert took < 4.0, took


@pytest.fixture
def drops_syns():
    """A port whose SYNs go unanswered, as behind a firewall that drops them: a listener with a backlog of 0 and
    its one queued connection never accepted (Linux drops the SYNs that do not fit)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(0)
    port = sock.getsockname()[1]
    queued = []
    for _attempt in range(2):  # fills the accept queue
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
        queued.append(c)
    time.sleep(0.2)
    yield port
    for c in queued:
        c.close()
    sock.close()


def test_a_dropped_connection_is_given_up_after_the_connect_timeout_not_the_whole_timeout(drops_syns):
    url = f"http://127.0.0.1:{drops_syns}/tokenize"
    start = time.monotonic()
    (got,) = mod.probe_all([url], "POST", {"prompt": "doctor"}, timeout_s=6, connect_timeout_s=0.5)
    took = time.monotonic() - start
    assert got["connected"] is False and got["status"] == -1, got
    assert took < 3.0, took  # the connect timeout, not the 6 s timeout


def test_a_url_that_is_not_http_or_a_bad_timeout_fails_and_says_what_to_give():
    res = run_module(mod, {"urls": ["file:///etc/passwd", "http://"], "timeout_s": 0})
    assert res["failed"]
    assert "'file:///etc/passwd' is not an http:// or https:// URL" in res["msg"]
    assert "'http://' is not" in res["msg"]
    assert "timeout_s must be more than 0" in res["msg"]
    assert "connect_timeout_s" in run_module(mod, {"urls": ["http://127.0.0.1:1/"], "connect_timeout_s": 0})["msg"]
