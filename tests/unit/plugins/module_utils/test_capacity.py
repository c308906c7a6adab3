"""capacity.py: the sweep's levels, vLLM bench serve's per-level keys and definitions, the SLO judgment."""

from __future__ import annotations

import math

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import capacity as cap

SLO = cap.slo()


def _req(ttft, itl, prompt=100, ok=True):
    tokens = len(itl) + 1
    return {
        "ok": ok,
        "ttft_s": ttft,
        "itl_s": itl,
        "completion_tokens": tokens if ok else 0,
        "prompt_tokens": prompt,
        "duration_s": (ttft or 0) + sum(itl) + 0.01,
        "error": None if ok else "HTTP 500: boom",
    }


def _run(concurrency, tok_s, ttft_s, failed=0):
    return {
        "max_concurrency": concurrency,
        "per_user_tok_s": tok_s,
        "p95_ttft_ms": ttft_s * 1000,
        "failed": failed,
        "completed": 2 * concurrency - failed,
        "output_throughput": tok_s * concurrency,
    }


def test_sweep_levels_double_up_to_the_bound():
    assert cap.sweep_levels(32) == [1, 2, 4, 8, 16, 32]
    assert cap.sweep_levels(12) == [1, 2, 4, 8, 12]
    assert cap.sweep_levels(1) == [1]
    with pytest.raises(ValueError, match="start <= max_concurrency"):
        cap.sweep_levels(0)


def test_a_run_has_vllm_bench_serves_keys_with_their_definitions():
    reqs = [_req(0.2, [0.1, 0.1, 0.1]), _req(0.4, [0.1, 0.3, 0.2]), _req(None, [], ok=False)]
    run = cap.vllm_bench_run(2, reqs, duration_s=2.0, hit_rate=0.5)
    for key in ("max_concurrency", "completed", "failed", "output_throughput", "total_token_throughput"):
        assert key in run
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p95", "p99"):
            assert f"{stat}_{metric}_ms" in run
    assert (run["max_concurrency"], run["num_prompts"], run["completed"], run["failed"]) == (2, 3, 2, 1)
    assert run["total_output_tokens"] == 8 and run["total_input_tokens"] == 200
    assert run["output_throughput"] == 4.0 and run["total_token_throughput"] == 104.0  # per second of duration
    assert run["request_throughput"] == 1.0
    assert math.isclose(run["mean_ttft_ms"], 300.0) and math.isclose(run["median_ttft_ms"], 300.0)
    assert math.isclose(run["std_ttft_ms"], 100.0)  # numpy's population std
    assert math.isclose(run["p99_ttft_ms"], 398.0)  # linear interpolation, numpy's default
    # e2el = ttft + the gaps (to the last chunk); tpot = (e2el - ttft) / (tokens - 1)
    assert math.isclose(run["mean_e2el_ms"], (500 + 1000) / 2)
    assert math.isclose(run["mean_tpot_ms"], (100 + 200) / 2)
    assert math.isclose(run["median_itl_ms"], 100.0)
    assert run["prefix_cache_hit_rate"] == 0.5 and run["errors"] == ["HTTP 500: boom"]
    assert 2.6 < run["per_user_tok_s"] < 8.0


def test_a_run_without_any_success_reports_zeroes_like_vllm():
    run = cap.vllm_bench_run(1, [_req(None, [], ok=False)], duration_s=1.0, hit_rate=None)
    assert run["completed"] == 0 and run["mean_ttft_ms"] == 0.0 and run["per_user_tok_s"] == 0.0
    assert cap.judge(run, SLO)["clearly_broken"] is True


def test_judge_names_the_missed_bound_and_clear_breaks():
    assert cap.judge(_run(1, 17.0, 0.3), SLO) == {"met": True, "missed": [], "clearly_broken": False}
    assert cap.judge(_run(4, 9.1, 0.3), SLO) == {"met": False, "missed": ["tok_s_per_user"], "clearly_broken": False}
    assert cap.judge(_run(16, 4.8, 0.7), SLO)["clearly_broken"] is True  # below half of 10 tok/s
    assert cap.judge(_run(32, 12.0, 4.5), SLO) == {"met": False, "missed": ["ttft_p95"], "clearly_broken": True}
    assert cap.judge(_run(2, 12.0, 0.3, failed=1), SLO)["missed"] == ["errors"]


def test_capacity_users_at_slo_is_the_highest_level_with_every_lower_one_meeting_it():
    runs = [_run(1, 17.0, 0.3), _run(2, 12.1, 0.4), _run(4, 9.1, 0.5), _run(8, 10.5, 0.6), _run(16, 4.8, 1.0)]
    result = cap.capacity(runs, SLO, stopped="SLO clearly broken")
    assert result["users_at_slo"] == 2  # 8 met it again by chance: not counted past the first failure
    assert result["first_failing"] == {"max_concurrency": 4, "missed": ["tok_s_per_user"]}
    assert result["peak_output_throughput"] == {"max_concurrency": 8, "output_throughput": 84.0}
    assert result["slo"] == {"min_tok_s_per_user": 10.0, "max_ttft_p95_s": 2.0}
    assert cap.capacity([_run(1, 5.0, 0.3)], SLO)["users_at_slo"] == 0
    assert cap.capacity(runs[:2], cap.slo(12.0, 2.0))["users_at_slo"] == 2
    assert cap.capacity(runs[:2], cap.slo(12.2, 2.0))["users_at_slo"] == 1  # the SLO is a variable


def test_the_sweep_stops_after_a_clear_break_only():
    runs = [_run(1, 17.0, 0.3), _run(2, 12.1, 0.4), _run(4, 9.1, 0.5)]
    assert cap.next_step(runs, SLO) is None  # missed, not clearly: the curve goes on
    assert cap.next_step([*runs, _run(8, 6.6, 0.6)], SLO) is None
    reason = cap.next_step([*runs, _run(8, 6.6, 0.6), _run(16, 4.8, 0.7)], SLO)
    assert reason.startswith("SLO clearly broken at concurrency 16: 4.80 tok/s per user")
    assert cap.next_step([*runs, _run(8, 6.6, 0.6)], SLO, break_factor=1.5) is not None
    with pytest.raises(ValueError, match="above 0"):
        cap.slo(0, 2)
