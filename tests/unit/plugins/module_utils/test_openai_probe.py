"""openai_probe: Prometheus parsing on public vLLM /metrics dumps, SSE parsing on public streams.

Fixtures under tests/fixtures/vllm/ (sources in its README.md):
- metrics_v0_llama31.txt: V0 dump, vLLM ~0.6 (hit rates -1.0 while prefix caching is off)
- metrics_v0_hit_rate.txt: V0 with vllm:gpu_prefix_cache_hit_rate (vLLM 0.6.3 sample)
- metrics_v1_dp2.txt: V1 names (vLLM 0.10.2 capture) with two engines
- sse_chat_vllm05_no_usage.txt: vllm-project/vllm issue #6083
- sse_chat_include_usage.txt: vllm-project/vllm issue #7299 + vLLM's usage chunk
- sse_chat_continuous_usage_v054.txt: vllm-project/vllm issue #7262
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import openai_probe as op
from conftest import FIXTURES

VLLM = FIXTURES / "vllm"


def test_v1_metrics_sum_over_engines_and_prefer_new_names():
    m = op.parse_vllm_metrics((VLLM / "metrics_v1_dp2.txt").read_text())
    assert m["num_requests_running"] == 5
    assert m["num_requests_waiting"] == 1
    assert m["kv_cache_usage"] == pytest.approx(0.375)  # mean of 0.5 and 0.25: a fraction, not summed
    assert m["prefix_cache_queries"] == 32832
    assert m["prefix_cache_hits"] == 32704
    assert m["prefix_cache_hit_rate"] == pytest.approx(32704 / 32832, abs=1e-4)
    assert m["prompt_tokens_total"] == 1500
    assert m["generation_tokens_total"] == 500
    assert m["model_names"] == ["Qwen/Qwen2.5-7B-Instruct"]


def test_v0_metrics_fall_back_to_old_names_and_drop_minus_one_hit_rate():
    m = op.parse_vllm_metrics((VLLM / "metrics_v0_llama31.txt").read_text())
    assert m["kv_cache_usage"] == 0.0
    assert m["prefix_cache_queries"] is None
    assert m["prefix_cache_hit_rate"] is None  # -1.0 means "no data", never a rate
    assert m["num_requests_running"] == 0
    assert m["generation_tokens_total"] == 0
    m2 = op.parse_vllm_metrics((VLLM / "metrics_v0_hit_rate.txt").read_text())
    assert m2["kv_cache_usage"] == pytest.approx(0.82)
    assert m2["prefix_cache_hit_rate"] == pytest.approx(0.71)
    assert m2["num_requests_running"] == 47
    assert m2["prompt_tokens_total"] is None  # absent -> None, not 0


def test_prometheus_parser_handles_escapes_timestamps_and_junk():
    text = 'vllm:x{a="q\\"uote",b="c,d"} 2.5 1787328000\ngarbage line\nvllm:y NaN\nvllm:z{le="+Inf"} +Inf\n'
    s = op.parse_prometheus(text)
    assert s["vllm:x"] == [({"a": 'q"uote', "b": "c,d"}, 2.5)]
    assert "garbage" not in s
    assert s["vllm:z"][0][1] == float("inf")
    assert op.parse_vllm_metrics("")["vllm_metrics_found"] is False


class _Replay(BaseHTTPRequestHandler):
    body = b""
    pace_s = 0.0

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for event in self.body.split(b"\n\n"):
            if event.strip():
                self.wfile.write(event + b"\n\n")
                self.wfile.flush()
                self.sent.append(time.monotonic())
                time.sleep(self.pace_s)


@pytest.fixture
def replay():
    servers = []

    def start(name: str, pace_s: float = 0.0) -> str:
        handler = type("H", (_Replay,), {"body": (VLLM / name).read_bytes(), "pace_s": pace_s, "sent": []})
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(srv)
        start.sent = handler.sent
        return f"http://127.0.0.1:{srv.server_port}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_stream_with_usage_chunk_counts_usage_tokens(replay):
    r = op.stream_chat(replay("sse_chat_include_usage.txt", pace_s=0.1), "m", timeout=10)
    assert r["usage_reported"] is True
    assert r["completion_tokens"] == 4
    assert r["prompt_tokens"] == 16
    assert r["text"] == "1, 2,"
    # 4 tokens: the first is TTFT, 3 more over 3 pauses of 0.1 s (longer on a loaded machine): the rate is the
    # one the replay sent at, events 1 to 4 (event 0 is the role chunk with empty content)
    sent_tok_s = 3 / (replay.sent[4] - replay.sent[1])
    assert sent_tok_s < 10.5
    assert r["tok_s"] == pytest.approx(sent_tok_s, rel=0.3), (r["tok_s"], sent_tok_s)
    assert r["ttft_s"] >= 0.1  # the role chunk with empty content does not count as the first token


def test_stream_without_usage_falls_back_to_text_chunks(replay):
    r = op.stream_chat(replay("sse_chat_vllm05_no_usage.txt"), "m", timeout=10)
    assert r["usage_reported"] is False
    assert r["completion_tokens"] == 5
    assert r["text"] == "我是阿里云开发的一款"


def test_stream_with_usage_on_every_chunk_takes_the_last(replay):
    r = op.stream_chat(replay("sse_chat_continuous_usage_v054.txt"), "m", timeout=10)
    assert r["completion_tokens"] == 3


def test_require_model_names_what_is_served():
    with pytest.raises(op.ProbeError) as exc:
        op.require_model([{"id": "a"}, {"id": "b"}], "x", "http://h:1")
    assert exc.value.kind == "wrong_model"
    assert "['a', 'b']" in str(exc.value)


def test_refused_is_classified(unused_port):
    with pytest.raises(op.ProbeError) as exc:
        op.get_health(f"http://127.0.0.1:{unused_port}", timeout=2)
    assert exc.value.kind == "refused"


@pytest.fixture
def unused_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_base_url_is_rejected():
    with pytest.raises(ValueError, match="not an http"):
        op.get_health("ftp://x", timeout=1)


def test_a_503_is_a_dead_engine_not_a_start_and_is_not_retryable():
    """vLLM 0.19.0: /health is 503 only for EngineDeadError (entrypoints/serve/instrumentator/health.py:29-33);
    before the engine is up the port refuses (api_server.py:541-548 binds, serve_http listens later)."""
    err = op._classify_status(503, "Service Unavailable", b"", "http://h:8000/health", None)
    assert err.kind == "engine_dead" and err.status == 503
    assert "engine is dead" in err.message
    assert "engine_dead" in op.KINDS and "loading" not in op.KINDS
    assert {"refused", "unreachable", "timeout"} == op.RETRYABLE_KINDS
    assert op._classify_status(500, "Internal Server Error", b"x", "u", None).kind == "server_error"


def test_a_reset_connection_is_unreachable_and_retryable():
    err = op._classify_os_error(ConnectionResetError(104, "reset"), "http://h:8000/health", 5)
    assert err.kind == "unreachable" and err.kind in op.RETRYABLE_KINDS
