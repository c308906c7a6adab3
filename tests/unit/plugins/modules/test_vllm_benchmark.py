"""vllm_benchmark against a real in-process SSE server on 127.0.0.1, plus bench.py's pure helpers."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import bench
from ansible_collections.sparkops.cluster.plugins.modules import vllm_benchmark
from module_runner import run_module

API_KEY = "sekret-key"
TTFT_S = 0.05
TOKEN_S = 0.02
QUERIES_PER_REQUEST = 100
HITS_PER_REQUEST = 75  # every request after the first


class FakeVllm:
    """A stdlib HTTP server that streams tokens at a known pace and counts prefix-cache use."""

    def __init__(self, metrics: bool = True, spec: bool = False):
        self.spec = spec  # MTP counters as vLLM 0.19.0 exports them with --speculative-config
        self.drafts = self.draft_tokens = self.accepted = self.pos0 = self.pos1 = 0.0
        self.lock = threading.Lock()
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.queries = 0.0
        self.hits = 0.0
        self.metrics = metrics
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path != "/metrics" or not fake.metrics:
                    self.send_error(404)
                    return
                with fake.lock:
                    text = (
                        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens.\n"
                        "# TYPE vllm:prefix_cache_queries_total counter\n"
                        f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {fake.queries}\n'
                        f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {fake.hits}\n'
                        "vllm:num_requests_running 0.0\n"
                    )
                    if fake.spec:
                        text += (
                            "# TYPE vllm:spec_decode_num_drafts_total counter\n"
                            f'vllm:spec_decode_num_drafts_total{{model_name="m",engine="0"}} {fake.drafts}\n'
                            "vllm:spec_decode_num_draft_tokens_total"
                            f'{{model_name="m",engine="0"}} {fake.draft_tokens}\n'
                            f'vllm:spec_decode_num_accepted_tokens_total{{model_name="m",engine="0"}} {fake.accepted}\n'
                            "vllm:spec_decode_num_accepted_tokens_per_pos_total"
                            f'{{model_name="m",engine="0",position="0"}} {fake.pos0}\n'
                            "vllm:spec_decode_num_accepted_tokens_per_pos_total"
                            f'{{model_name="m",engine="0",position="1"}} {fake.pos1}\n'
                        )
                data = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.bodies.append(body)
                    fake.headers.append(dict(self.headers))
                if self.headers.get("Authorization") != f"Bearer {API_KEY}":
                    data = b'{"error": "Unauthorized"}'
                    self.send_response(401)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                with fake.lock:
                    # 2 draft tokens a step, 4 steps a request: 7 of 8 first and 5 of 8 second drafts accepted
                    fake.drafts += 8
                    fake.draft_tokens += 16
                    fake.accepted += 12
                    fake.pos0 += 7
                    fake.pos1 += 5
                    first = fake.queries == 0
                    fake.queries += QUERIES_PER_REQUEST
                    fake.hits += 0 if first else HITS_PER_REQUEST
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                time.sleep(TTFT_S)
                n = body["max_tokens"]
                for _i in range(n):
                    chunk = {"choices": [{"index": 0, "delta": {"content": "tok "}}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(TOKEN_S)
                usage = {"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": n}}
                self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def server():
    with FakeVllm() as fake:
        yield fake


def _args(server, **extra) -> dict:
    args = {
        "base_url": server.base_url,
        "api_key": API_KEY,
        "model": "sim-tiny",
        "concurrency": [1, 2, 4],
        "max_tokens": 8,
        "request_timeout_s": 10,
        "deadline_s": 60,
    }
    args.update(extra)
    return args


@pytest.mark.timeout(60)
def test_aggregate_rises_with_concurrency_and_ttft_is_measured(server):
    res = run_module(vllm_benchmark, _args(server))
    assert not res.get("failed"), res
    assert res["changed"] is False
    levels = {lvl["concurrency"]: lvl for lvl in res["levels"]}
    assert sorted(levels) == [1, 2, 4]
    for c, lvl in levels.items():
        assert lvl["requests"] == 2 * c
        assert lvl["errors"] == 0
        assert lvl["completion_tokens"] == 2 * c * 8
        # one request takes TTFT + 8 tokens x pace; TTFT is measured, not guessed
        assert TTFT_S * 0.8 <= lvl["ttft_p50_s"] <= lvl["ttft_p95_s"] < 1.0
        assert 10 < lvl["per_request_tok_s_mean"] < 8 / (TTFT_S + 8 * TOKEN_S) * 1.2
        # the shared prompt prefix hits 75 of every 100 tokens once the warm-up seeded the cache
        assert lvl["prefix_cache_hit_rate"] == pytest.approx(0.75)
        assert lvl["spec_decode"] is None  # no --speculative-config: no counters, no acceptance
    agg = {c: levels[c]["aggregate_tok_s"] for c in levels}
    assert agg[2] > 1.4 * agg[1]
    assert agg[4] > 2.2 * agg[1]
    assert res["metrics_available"] is True
    assert res["metrics_url"].endswith("/metrics")


@pytest.mark.timeout(60)
def test_requests_are_fixed_length_with_shared_prefix(server):
    res = run_module(vllm_benchmark, _args(server, concurrency=[2], requests_per_level=3, prefix_repeats=4))
    assert not res.get("failed"), res
    assert len(server.bodies) == 1 + 3  # warm-up + level
    for body in server.bodies:
        assert body["max_tokens"] == body["min_tokens"] == 8
        assert body["ignore_eos"] is True and body["stream"] is True
        assert body["model"] == "sim-tiny"
    prompts = [b["messages"][0]["content"] for b in server.bodies]
    prefix = "You are benchmarking a language model server. Answer in plain prose. " * 4
    assert all(p.startswith(prefix) for p in prompts)
    assert len(set(prompts)) == len(prompts)
    assert all(h.get("Authorization") == f"Bearer {API_KEY}" for h in server.headers)
    assert res["levels"][0]["requests"] == 3


def test_check_mode_sends_nothing(server):
    res = run_module(vllm_benchmark, _args(server), check_mode=True)
    assert res["changed"] is False
    assert res["levels"] == []
    assert [p["requests"] for p in res["plan"]] == [2, 4, 8]
    assert server.bodies == []


@pytest.mark.timeout(60)
def test_wrong_api_key_fails_with_a_hint(server):
    res = run_module(vllm_benchmark, _args(server, api_key="wrong"))
    assert res["failed"] is True
    assert "HTTP 401" in res["msg"] and "api_key" in res["msg"]
    assert "wrong" not in json.dumps(res.get("invocation", {}))  # no_log


@pytest.mark.timeout(60)
def test_no_metrics_endpoint_gives_no_hit_rate():
    with FakeVllm(metrics=False) as fake:
        res = run_module(vllm_benchmark, _args(fake, concurrency=[1], requests_per_level=1))
    assert not res.get("failed"), res
    assert res["levels"][0]["prefix_cache_hit_rate"] is None
    assert res["metrics_available"] is False


@pytest.mark.timeout(60)
def test_deadline_counts_unsent_requests_as_errors(server):
    res = run_module(vllm_benchmark, _args(server, concurrency=[1], requests_per_level=20, deadline_s=0.6))
    assert not res.get("failed"), res
    lvl = res["levels"][0]
    assert 0 < lvl["errors"] < 20
    assert any("deadline_s" in e for e in lvl["error_samples"])


def test_bad_arguments_fail_clearly(server):
    res = run_module(vllm_benchmark, _args(server, base_url="ftp://127.0.0.1/v1"))
    assert res["failed"] and "http://" in res["msg"]
    res = run_module(vllm_benchmark, _args(server, concurrency=[0]))
    assert res["failed"] and "concurrency" in res["msg"]


def test_server_down_fails():
    res = run_module(
        vllm_benchmark,
        {
            "base_url": "http://127.0.0.1:9/v1",
            "model": "m",
            "concurrency": [1],
            "request_timeout_s": 2,
            "deadline_s": 5,
        },
    )
    assert res["failed"] is True and "warm-up" in res["msg"]


# ------------------------------------------------------------------------------ bench.py, pure


def test_percentile_interpolates():
    assert bench.percentile([], 50) is None
    assert bench.percentile([3.0], 95) == 3.0
    assert bench.percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert bench.percentile(range(1, 101), 95) == pytest.approx(95.05)
    with pytest.raises(ValueError):
        bench.percentile([1], 101)


def test_rates():
    ok = bench.RequestResult(True, ttft_s=0.1, duration_s=2.0, completion_tokens=50)
    assert bench.per_request_tok_s(ok) == 25.0
    assert bench.per_request_tok_s(bench.RequestResult(False, error="x")) is None
    assert bench.aggregate_tok_s(100, 4.0) == 25.0
    assert bench.aggregate_tok_s(100, 0) is None
    summary = bench.summarize_level(2, [ok, ok, bench.RequestResult(False, error="boom")], 4.0, 0.5)
    assert summary["completion_tokens"] == 100 and summary["aggregate_tok_s"] == 25.0
    assert summary["errors"] == 1 and summary["error_samples"] == ["boom"]


def test_parse_prometheus_sums_label_sets():
    text = (
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="a b}c"} 10\n'
        'vllm:prefix_cache_hits_total{engine="1",model_name="x"} 5 1700000000000\n'
        "vllm:gpu_prefix_cache_hit_rate 0.4\n"
        "garbage line\n"
        "broken{unterminated 3\n"
    )
    m = bench.parse_prometheus(text)
    assert m["vllm:prefix_cache_hits_total"] == 15.0
    assert m["vllm:gpu_prefix_cache_hit_rate"] == 0.4
    assert "broken" not in m


def test_hit_rate_from_deltas_and_gauge():
    before = {"vllm:prefix_cache_hits_total": 10, "vllm:prefix_cache_queries_total": 100}
    after = {"vllm:prefix_cache_hits_total": 40, "vllm:prefix_cache_queries_total": 140}
    assert bench.prefix_cache_hit_rate(before, after) == pytest.approx(0.75)
    assert bench.prefix_cache_hit_rate(after, after) is None  # no queries in between
    old = {"vllm:gpu_prefix_cache_hits_total": 5, "vllm:gpu_prefix_cache_queries_total": 10}
    assert bench.prefix_cache_hit_rate({}, old) == 0.5
    assert bench.prefix_cache_hit_rate(None, {"vllm:gpu_prefix_cache_hit_rate": 0.3}) == 0.3
    assert bench.prefix_cache_hit_rate(None, None) is None


def test_metrics_url_for():
    assert bench.metrics_url_for("http://10.0.0.1:8000/v1") == "http://10.0.0.1:8000/metrics"
    assert bench.metrics_url_for("https://h/api/v1/") == "https://h/api/metrics"


# /metrics of vLLM 0.19.0 serving with --speculative-config '{"method":"mtp","num_speculative_tokens":2}', in the
# format prometheus_client writes (labels model_name, engine as vllm/v1/metrics/loggers.py:414 names them;
# counters from vllm/v1/spec_decode/metrics.py:155-193 with the _total suffix and their _created samples).
SPEC_METRICS_BEFORE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{model_name="qwen3.5-122b-a10b-mtp",engine="0"} 1000.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{model_name="qwen3.5-122b-a10b-mtp",engine="0"} 1.7640e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{model_name="qwen3.5-122b-a10b-mtp",engine="0"} 2000.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{model_name="qwen3.5-122b-a10b-mtp",engine="0"} 1500.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="qwen3.5-122b-a10b-mtp",engine="0",position="0"} 900.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="qwen3.5-122b-a10b-mtp",engine="0",position="1"} 600.0
"""
SPEC_METRICS_AFTER = (
    SPEC_METRICS_BEFORE.replace("} 1000.0", "} 1400.0")
    .replace("} 2000.0", "} 2800.0")
    .replace("} 1500.0", "} 2004.0")
    .replace("} 900.0", "} 1200.0")
    .replace("} 600.0", "} 804.0")
)


def test_spec_decode_acceptance_from_recorded_metrics_text():
    before, after = bench.parse_prometheus(SPEC_METRICS_BEFORE), bench.parse_prometheus(SPEC_METRICS_AFTER)
    got = bench.spec_decode_acceptance(before, after)
    # deltas: 400 drafts, 800 draft tokens, 504 accepted (300 at position 0, 204 at position 1)
    assert got == {
        "drafts": 400,
        "draft_tokens": 800,
        "accepted_tokens": 504,
        "acceptance_rate": 0.63,
        "mean_acceptance_length": 2.26,
        "per_position": [0.75, 0.51],
    }
    # lifetime totals would say 0.75 / 0.7: the figure must be the run's own delta
    assert bench.spec_decode_acceptance({}, before)["acceptance_rate"] == 0.75
    # no drafting in between, or no spec-decode counters at all: nothing to report
    assert bench.spec_decode_acceptance(after, after) is None
    assert bench.spec_decode_acceptance(None, {"vllm:num_requests_running": 0.0}) is None
    assert bench.spec_decode_acceptance(before, None) is None


def test_the_benchmark_reports_acceptance_per_level_for_a_spec_decode_server():
    with FakeVllm(spec=True) as fake:
        res = run_module(vllm_benchmark, _args(fake))
    assert not res.get("failed"), res
    for lvl in res["levels"]:
        sd = lvl["spec_decode"]
        assert sd["drafts"] == 8 * lvl["requests"], lvl
        assert sd["acceptance_rate"] == 0.75 and sd["mean_acceptance_length"] == 2.5
        assert sd["per_position"] == [0.875, 0.625]


def test_check_mode_plans_the_sweep_and_bad_sweep_inputs_fail(server):
    res = run_module(vllm_benchmark, _args(server, max_concurrency=12), check_mode=True)
    assert [p["concurrency"] for p in res["plan"]] == [1, 2, 4, 8, 12] and server.bodies == []
    for bad, words in (
        ({"max_concurrency": 0}, "max_concurrency must be >= 1"),
        ({"slo_break_factor": 0.5}, "slo_break_factor must be 1 or more"),
        ({"slo_min_tok_s": 0}, "slo_min_tok_s must be above 0"),
    ):
        res = run_module(vllm_benchmark, _args(server, **bad))
        assert res["failed"] and words in res["msg"], res
    assert server.bodies == []


@pytest.mark.timeout(60)
def test_runs_carry_vllm_bench_keys_and_a_fixed_level_list_is_never_cut_short(server):
    # the fake streams 8 tokens in ~0.21 s (~38 tok/s a user): an SLO of 200 tok/s breaks clearly at once,
    # but fixed levels (no max_concurrency) all run; capacity still says 0 users at that SLO
    res = run_module(vllm_benchmark, _args(server, concurrency=[1, 2], slo_min_tok_s=200))
    assert not res.get("failed"), res
    assert [r["max_concurrency"] for r in res["runs"]] == [1, 2]
    run = res["runs"][1]
    assert run["completed"] == 4 and run["failed"] == 0 and run["total_output_tokens"] == 32
    assert run["mean_ttft_ms"] >= TTFT_S * 800 and run["median_itl_ms"] >= TOKEN_S * 800
    assert run["prefix_cache_hit_rate"] == pytest.approx(0.75)
    assert res["capacity"]["users_at_slo"] == 0 and res["capacity"]["stopped"] is None
    swept = run_module(vllm_benchmark, _args(server, max_concurrency=4, slo_min_tok_s=200))
    assert [r["max_concurrency"] for r in swept["runs"]] == [1]
    assert swept["capacity"]["stopped"].startswith("SLO clearly broken at concurrency 1")
