"""The vLLM test double's pace (sim/standin/vllm_test_double.py, PACING) on 127.0.0.1, without Ray.

What must hold: per-request tok/s at concurrency 1, 2 and 4 within 5% of the reference (17.0, 12.1, 9.1 on
two Sparks), measured the way the benchmark measures it (bench.stream_chat, TTFT included); prefill time
grows with uncached prompt tokens and prefix-cache hits skip it; max_num_seqs and KV blocks make requests
wait, with vllm:num_requests_waiting rising. The engine runs SCALE times faster than the calibration
(SPARKOPS_TEST_DOUBLE_TOK_S) so the tests take seconds; the ratios are what is checked.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import bench
from conftest import ROOT
from double_fixtures import MODEL, free_port, tiny_hf_home

DOUBLE = ROOT / "sim" / "standin" / "vllm_test_double.py"
TOK_S_ALONE = 68.0  # ~4x the reference, steps of ~15-30 ms: the double's own overhead stays small
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    return tiny_hf_home(tmp_path_factory.mktemp("hf"))


def _load_double():
    spec = importlib.util.spec_from_file_location("vllm_test_double_pacing", DOUBLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vtd = _load_double()
SCALE = TOK_S_ALONE * vtd.STEP_A_S


def _serve(hf_home: Path, *extra: str):
    port = free_port()
    env = dict(os.environ, HF_HOME=str(hf_home), PYTHONUNBUFFERED="1", SPARKOPS_TEST_DOUBLE_TOK_S=str(TOK_S_ALONE))
    env.update(VLLM_CACHE_ROOT=str(hf_home / "vllm-cache"))
    for name in ("HF_HUB_CACHE", "RAY_ADDRESS"):
        env.pop(name, None)
    cmd = [sys.executable, str(DOUBLE), "serve", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--served-model-name", "tiny", *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while bench.fetch_metrics(base + "/metrics", timeout_s=1) is None:
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail("the test double did not come up within 30 s")
        time.sleep(0.1)
    return proc, base


@pytest.fixture
def double(hf_home):
    procs = []

    def start(*extra: str) -> str:
        proc, base = _serve(hf_home, *extra)
        procs.append(proc)
        return base

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def _level(base: str, concurrency: int, tokens: int, prompt: str = "hello there") -> list[bench.RequestResult]:
    def one(i: int) -> bench.RequestResult:
        body = bench.chat_request_body("tiny", f"{prompt} {i}", tokens)
        return bench.stream_chat(base + "/v1", body, timeout_s=60)

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(concurrency)))


def test_the_calibration_fits_the_reference_within_5_percent_and_is_the_benchmarks_reference():
    for batch, tok_s in vtd.REFERENCE_TOK_S.items():
        assert abs(1 / vtd.STEP_A_S / batch**vtd.STEP_P / tok_s - 1) < 0.02
        # the same seed figures as the benchmark's hardware reference (aggregate = concurrency x per request)
        assert abs(bench.HARDWARE_REFERENCE[batch] / batch / tok_s - 1) < 0.01
    # the batch curve bends: 8 and 16 users get less each, more together
    rates = [1 / vtd.STEP_A_S / b**vtd.STEP_P for b in (4, 8, 16)]
    assert rates[0] > rates[1] > rates[2] and 4 * rates[0] < 8 * rates[1] < 16 * rates[2]


def test_per_request_tok_s_at_1_2_4_match_the_reference_within_5_percent(double):
    base = double()
    _level(base, 1, 4)  # first contact
    for concurrency, reference in vtd.REFERENCE_TOK_S.items():
        results = _level(base, concurrency, 64)
        assert all(r.ok and r.completion_tokens == 64 for r in results), results
        rate = sum(bench.per_request_tok_s(r) for r in results) / concurrency / SCALE
        assert abs(rate / reference - 1) < 0.05, (concurrency, rate, reference)


def test_prefill_grows_with_uncached_prompt_tokens_and_cache_hits_skip_it(double):
    base = double()
    long_prompt = " ".join(f"w{i}" for i in range(1600))  # 100 blocks: 1600 / (1000 x SCALE) = ~0.4 s
    cold = _level(base, 1, 2, long_prompt)[0]
    warm = _level(base, 1, 2, long_prompt)[0]  # same prefix: every full block hits
    short = _level(base, 1, 2)[0]
    assert cold.ok and warm.ok and short.ok
    assert cold.ttft_s > 1600 / vtd.PREFILL_TOK_S / SCALE * 0.9
    assert warm.ttft_s < cold.ttft_s / 3 and short.ttft_s < cold.ttft_s / 3


def _watch(base: str, stop: threading.Event, seen: list) -> None:
    while not stop.is_set():
        m = bench.fetch_metrics(base + "/metrics", timeout_s=2) or {}
        seen.append((m.get("vllm:num_requests_running"), m.get("vllm:num_requests_waiting")))
        time.sleep(0.02)


def test_max_num_seqs_makes_requests_wait_and_the_gauges_show_it(double):
    base = double("--max-num-seqs", "2")
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(base, stop, seen), daemon=True)
    watcher.start()
    results = _level(base, 4, 24)
    stop.set()
    watcher.join(5)
    assert all(r.ok and r.completion_tokens == 24 for r in results)
    assert max(w for _, w in seen) == 2 and max(r for r, _ in seen) == 2
    ttfts = sorted(r.ttft_s for r in results)
    # two wait for the first two to finish: their TTFT holds a whole request's time
    assert ttfts[2] > 20 / (vtd.REFERENCE_TOK_S[2] * SCALE)


def test_kv_blocks_make_requests_wait_when_full(double):
    # 8 blocks of 16 tokens: one request of ~3 prompt tokens + 100 out needs 7; the second waits for them
    base = double("--num-gpu-blocks-override", "8", "--max-model-len", "128")
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(base, stop, seen), daemon=True)
    watcher.start()
    results = _level(base, 2, 100)
    stop.set()
    watcher.join(5)
    assert all(r.ok and r.completion_tokens == 100 for r in results), results
    assert any(w and w >= 1 for _, w in seen) and max(r for r, _ in seen) <= 2
    # not both at batch-2 speed: the blocks let one run at a time for most of the level
    slower = max(r.duration_s for r in results)
    assert slower > 1.5 * 100 / (vtd.REFERENCE_TOK_S[1] * SCALE)


def test_the_benchmark_sweep_finds_the_doubles_knee(double):
    """vllm_benchmark's sweep against the double, the SLO scaled like the pace: what `make benchmark` does on
    the simulated pair, SCALE times faster (12 tokens, 2 requests a level)."""
    from ansible_collections.sparkops.cluster.plugins.modules import vllm_benchmark  # noqa: PLC0415
    from module_runner import run_module  # noqa: PLC0415

    base = double("--max-num-seqs", "16")
    args = {
        "base_url": base + "/v1",
        "model": "tiny",
        "max_concurrency": 32,
        "max_tokens": 24,
        "prefix_repeats": 2,
        "slo_min_tok_s": 10 * SCALE,
        "slo_max_ttft_p95_s": 2 / SCALE,
    }
    res = run_module(vllm_benchmark, args)
    assert not res.get("failed"), res
    levels = [r["max_concurrency"] for r in res["runs"]]
    assert levels == [1, 2, 4, 8, 16]  # 16 users get under half the SLO's rate: the sweep stops there
    assert res["capacity"]["users_at_slo"] == 2  # 9.1 tok/s each at 4 misses 10
    assert res["capacity"]["first_failing"]["missed"] == ["tok_s_per_user"]
    assert res["capacity"]["stopped"].startswith("SLO clearly broken at concurrency 16")
    throughput = [r["output_throughput"] for r in res["runs"]]
    assert throughput == sorted(throughput)  # more users, more tokens together, fewer each
    assert all(r["completed"] == 2 * r["max_concurrency"] and r["failed"] == 0 for r in res["runs"])


def test_speculative_acceptance_is_drawn_like_0_19_0s_synthetic_sampler():
    """accepted <= num_speculative_tokens, positions accepted as a prefix, per-position rates falling by the
    sampler's decay, and the mean over positions the target rate (synthetic_rejection_sampler_utils.py)."""
    double = _load_double()
    for k, rate in ((2, 0.5), (2, 0.8), (4, 0.3)):
        draws = double.SpecDraws(k, rate, seed=7)
        got = [draws.draw() for _ in range(20000)]
        assert all(0 <= a <= k for a in got)
        per_pos = [sum(a > i for a in got) / len(got) for i in range(k)]
        assert all(per_pos[i] >= per_pos[i + 1] for i in range(k - 1)), per_pos
        assert sum(per_pos) / k == pytest.approx(rate, abs=0.015), (k, rate, per_pos)
    assert double.SpecDraws(2, 0.0, seed=1).draw() == 0
    assert double.SpecDraws(2, 1.0, seed=1).a0 == 1.0  # capped by the decay: at most 1 and 0.85
