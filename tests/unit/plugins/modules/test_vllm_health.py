"""vllm_health against a real in-process HTTP server on 127.0.0.1 (ephemeral port).

The handler below plays a vLLM OpenAI server that can be told to misbehave: refuse connections
until its engine is up (vLLM 0.19.0 binds at start and listens once the engine is up), a dead engine
(503, vLLM 0.19.0's only 503 on /health), reset connections, 401 without the right key, a
different served model, malformed stream chunks, no [DONE], a 500 mid-completion, or
answer slower than the request timeout. Its /metrics is the public V1 dump in
tests/fixtures/vllm/metrics_v1_dp2.txt (sources in that folder's README.md).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible_collections.sparkops.cluster.plugins.modules import vllm_health
from conftest import FIXTURES
from module_runner import run_module

KEY = "sk-test-very-secret-key"
MODEL = "qwen-test"
METRICS = (FIXTURES / "vllm" / "metrics_v1_dp2.txt").read_bytes()


class FakeVllm(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    @property
    def cfg(self) -> dict:
        return self.server.cfg

    def _send(self, status: int, body: bytes = b"", ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _gate(self) -> bool:
        """Common misbehaviour before any endpoint; True when the request was answered."""
        with self.server.lock:
            self.server.requests += 1
            n = self.server.requests
        if n <= self.cfg.get("reset_first", 0):
            self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.close_connection = True
            self.request.close()
            return True
        if n <= self.cfg.get("dead_first", 0):
            self._send(503)  # entrypoints/serve/instrumentator/health.py:32-33: an empty 503
            return True
        if self.cfg.get("slow_s"):
            time.sleep(self.cfg["slow_s"])
        if self.path.startswith("/v1/") and self.headers.get("Authorization") != f"Bearer {KEY}":
            self._send(401, b'{"error":"Unauthorized"}')
            return True
        return False

    def do_GET(self):
        if self._gate():
            return
        if self.path == "/health":
            self._send(200)
        elif self.path == "/v1/models":
            served = self.cfg.get("served", MODEL)
            data = {"object": "list", "data": [{"id": served, "object": "model", "root": "org/model"}]}
            self._send(200, json.dumps(data).encode())
        elif self.path == "/metrics":
            self._send(200, self.cfg.get("metrics", METRICS), "text/plain; version=0.0.4")
        else:
            self._send(404, b'{"detail":"Not Found"}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self._gate():
            return
        if self.cfg.get("completion_500"):
            self._send(500, b'{"error":{"message":"EngineCore encountered an issue","code":500}}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        n = body["max_tokens"]

        def emit(obj):
            raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
            self.wfile.write(b"data: " + raw + b"\n\n")
            self.wfile.flush()

        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": body["model"]}
        emit({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for i in range(n):
            time.sleep(1.0 / self.cfg.get("tok_s", 200))
            if self.cfg.get("malformed") and i == 1:
                emit(b'{"id": "chatcmpl-1", "choices": [ {"index": 0, "delta": {"content": "x"')
                return
            emit({**base, "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}]})
            self.server.token_times.append(time.monotonic())
        if self.cfg.get("no_done"):
            return
        if body.get("stream_options", {}).get("include_usage"):
            usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": n + 7}
            emit({**base, "choices": [], "usage": usage})
        emit(b"[DONE]")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # clients that gave up (timeouts) make writes fail; that is the point of those tests


@pytest.fixture
def server():
    made = []

    def start(listen_after_s: float = 0, **cfg) -> str:
        srv = _Server(("127.0.0.1", 0), FakeVllm, bind_and_activate=False)
        srv.server_bind()  # bound, not listening: a connection is refused, as vLLM's before its engine is up
        srv.cfg, srv.requests, srv.lock, srv.token_times = cfg, 0, threading.Lock(), []

        def listen():
            time.sleep(listen_after_s)
            srv.server_activate()
            srv.serve_forever(poll_interval=0.05)

        threading.Thread(target=listen, daemon=True).start()
        if not listen_after_s:
            time.sleep(0.05)
        made.append(srv)
        return f"http://127.0.0.1:{srv.server_port}"

    start.made = made
    yield start
    for srv in made:
        srv.shutdown()
        srv.server_close()


def args(url: str, **kw) -> dict:
    a = {"base_url": url, "api_key": KEY, "model": MODEL, "timeout_s": 10, "request_timeout_s": 5}
    a.update(kw)
    return a


def test_healthy_server_reports_speed_models_and_metrics(server, tmp_path):
    progress = tmp_path / "p.jsonl"
    r = run_module(vllm_health, args(server(tok_s=100), max_tokens=31, progress_file=str(progress)), check_mode=True)
    assert r.get("failed") is not True, r
    assert r["healthy"] is True and r["changed"] is False and r["failure_kind"] is None
    assert r["models"] == [MODEL]
    assert r["completion_tokens"] == 31
    # The rate is the one the server actually sent at (paced at 100 tok/s, slower on a loaded machine):
    # (tokens - 1) over first-to-last token, so neither the time to the first token nor a fixed pace counts.
    sent = server.made[0].token_times
    assert len(sent) == 31
    sent_tok_s = 30 / (sent[-1] - sent[0])
    assert r["tok_s"] == pytest.approx(sent_tok_s, rel=0.3), (r["tok_s"], sent_tok_s)
    assert r["ttft_s"] > 0
    assert r["metrics"]["num_requests_running"] == 5
    assert r["metrics"]["kv_cache_usage"] == pytest.approx(0.375)
    assert set(r["checks"]) == {"health", "models", "completion", "metrics"}
    assert all(c["ok"] for c in r["checks"].values())
    assert r["attempts"] == 1
    lines = [json.loads(x) for x in progress.read_text().splitlines()]
    assert lines[-1]["kind"] == "healthy"
    assert KEY not in json.dumps(r) and KEY not in progress.read_text()


def test_a_starting_vllm_refuses_then_answers_and_is_retried_with_progress(server, tmp_path):
    progress = tmp_path / "p.jsonl"
    url = server(listen_after_s=0.6)
    r = run_module(
        vllm_health,
        args(url, retry_until_healthy=True, backoff={"initial_s": 0.05, "max_s": 0.1}, progress_file=str(progress)),
    )
    assert r["healthy"] is True, r
    lines = [json.loads(x) for x in progress.read_text().splitlines()]
    kinds = [x["kind"] for x in lines]
    assert kinds[-1] == "healthy" and len(kinds) >= 3 and set(kinds[:-1]) == {"refused"}, kinds
    assert r["attempts"] == len(kinds)
    assert all({"elapsed_s", "phase", "kind", "message"} <= set(x) for x in lines)


def test_a_503_is_a_dead_engine_and_is_never_retried(server):
    """vLLM 0.19.0 answers /health 503 only for EngineDeadError; the engine does not come back."""
    r = run_module(vllm_health, args(server(dead_first=100), retry_until_healthy=True, backoff={"initial_s": 0.05}))
    assert r["failed"] is True
    assert r["failure_kind"] == "engine_dead" and r["attempts"] == 1
    assert "503" in r["msg"] and "engine is dead" in r["msg"] and "does not recover" in r["msg"]


def test_a_503_on_the_completion_is_a_dead_engine_too(server):
    r = run_module(vllm_health, args(server(dead_first=100), checks=["completion"]))
    assert r["failure_kind"] == "engine_dead" and r["checks"]["completion"]["kind"] == "engine_dead"


def test_connection_reset_is_retried_as_unreachable(server, tmp_path):
    progress = tmp_path / "p.jsonl"
    r = run_module(
        vllm_health,
        args(server(reset_first=2), retry_until_healthy=True, backoff={"initial_s": 0.05}, progress_file=str(progress)),
    )
    assert r["healthy"] is True, r
    assert r["attempts"] == 3
    assert [json.loads(x)["kind"] for x in progress.read_text().splitlines()][:2] == ["unreachable"] * 2


def test_wrong_key_is_401_and_not_retried(server):
    r = run_module(vllm_health, args(server(), api_key="sk-wrong", retry_until_healthy=True))
    assert r["failed"] is True
    assert r["failure_kind"] == "unauthorized"
    assert r["attempts"] == 1
    assert "401 Unauthorized from http://127.0.0.1:" in r["msg"] and "the API key is wrong" in r["msg"]
    assert "sk-wrong" not in json.dumps(r)


def test_missing_key_says_so(server):
    r = run_module(vllm_health, args(server(), api_key=None))
    assert r["failure_kind"] == "unauthorized"
    assert "no API key was given" in r["msg"]


def test_wrong_model_names_the_served_ones(server):
    r = run_module(vllm_health, args(server(served="other-model")))
    assert r["failure_kind"] == "wrong_model"
    assert "model 'qwen-test' not served" in r["msg"] and "['other-model']" in r["msg"]
    assert r["models"] == ["other-model"]


def test_malformed_stream_chunk(server):
    r = run_module(vllm_health, args(server(malformed=True)))
    assert r["failure_kind"] == "malformed"
    assert "not JSON" in r["msg"]
    assert r["checks"]["health"]["ok"] is True and r["checks"]["completion"]["ok"] is False


def test_stream_without_done_is_malformed(server):
    r = run_module(vllm_health, args(server(no_done=True)))
    assert r["failure_kind"] == "malformed"
    assert "[DONE]" in r["msg"]


def test_server_error_carries_body_excerpt(server):
    r = run_module(vllm_health, args(server(completion_500=True)))
    assert r["failure_kind"] == "server_error"
    assert "500" in r["msg"] and "EngineCore encountered an issue" in r["msg"]


def test_slow_server_times_out_within_the_deadline(server):
    t0 = time.monotonic()
    r = run_module(
        vllm_health,
        args(
            server(slow_s=3),
            request_timeout_s=0.5,
            timeout_s=2,
            checks=["health"],
            retry_until_healthy=True,
            backoff={"initial_s": 0.1},
        ),
    )
    took = time.monotonic() - t0
    assert r["failure_kind"] == "timeout"
    assert r["attempts"] >= 2
    assert took < 4  # the whole deadline holds, not request count x request timeout
    assert "attempts in" in r["msg"]


def test_refused_retries_until_deadline_and_counts_attempts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run_module(
        vllm_health,
        args(
            f"http://127.0.0.1:{port}",
            timeout_s=1,
            retry_until_healthy=True,
            backoff={"initial_s": 0.05, "factor": 2, "max_s": 0.2},
        ),
    )
    assert r["failure_kind"] == "refused"
    assert r["attempts"] >= 4
    assert f"connection refused by http://127.0.0.1:{port}/health" in r["msg"]
    assert f"after {r['attempts']} attempts in" in r["msg"]


def test_min_tok_s_threshold(server):
    r = run_module(vllm_health, args(server(tok_s=50), min_tok_s=500))
    assert r["failure_kind"] == "too_slow"
    assert "below min_tok_s=500" in r["msg"]
    assert r["tok_s"] is not None and r["tok_s"] < 500


def test_only_health_and_metrics_need_no_model(server):
    r = run_module(vllm_health, {"base_url": server(), "checks": ["metrics", "health"]})
    assert r["healthy"] is True, r
    assert list(r["checks"]) == ["health", "metrics"]
    assert r["metrics"]["prefix_cache_hits"] == 32704


def test_argument_errors_say_how_to_fix():
    r = run_module(vllm_health, {"base_url": "http://h:8000/v1", "model": "m"})
    assert r["failed"] and "give the server root" in r["msg"]
    r = run_module(vllm_health, {"base_url": "http://h:8000"})
    assert r["failed"] and "model is required" in r["msg"]
