"""capacity.py at its boundaries: the cases a sweep meets that the main tests leave out (a one-token answer,
a request without a measured duration, a level shorter than a second, an SLO exactly met or missed by
exactly its break factor, a sweep whose deadline passed before its first level).

Equivalent mutants (tests/mutation/equivalents.py lists them, `make mutation` does not run them):
- `zip(..., strict=True)` -> `strict=False` (vllm_bench_run, twice): the zipped lists are built from the
  same `good` list (and METRICS has as many names as the tuple of lists), so their lengths are always equal.
- `round(v, 4) if isinstance(v, float) and math.isfinite(v)`: dropping `math.isfinite(v)` changes nothing,
  since round(nan, 4) is nan and round(inf, 4) is inf (only round() without digits raises on them).
- `r.get("completion_tokens") or 0` -> without `or 0`: the records come from bench.RequestResult.as_dict(),
  whose completion_tokens is an int (0 by default), never None.
- `duration_s and duration_s > 0` -> `duration_s > 0`: the level's duration is the wall clock the module
  measured (a float), never None; for 0 and below both give nan throughputs.
- judge's `run["completed"] == 0 or ...` without that clause: a level with no success has per_user_tok_s
  0.0 (vllm_bench_run), and 0 * break_factor is below any SLO's min_tok_s_per_user (slo() refuses <= 0),
  so the next clause already calls it clearly broken.
- capacity's peak key `r["output_throughput"] or 0` -> `or -1`: every falsy throughput (0.0, None) maps to
  the same constant either way and real throughputs are >= 0 or nan (truthy), so the peak is the same run.
"""

from __future__ import annotations

import math

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import capacity as cap
from ansible_collections.sparkops.cluster.plugins.module_utils.bench import RequestResult

SLO = cap.slo()  # 10 tok/s per user, TTFT p95 2 s


def _run(concurrency, tok_s, ttft_s, failed=0):
    return {
        "max_concurrency": concurrency,
        "per_user_tok_s": tok_s,
        "p95_ttft_ms": ttft_s * 1000,
        "failed": failed,
        "completed": 2 * concurrency - failed,
        "output_throughput": tok_s * concurrency,
    }


def test_a_sweep_starts_at_one_user_at_least():
    with pytest.raises(ValueError, match=r"1 <= start <= max_concurrency, got start=0, max=8"):
        cap.sweep_levels(8, start=0)
    assert cap.sweep_levels(8, start=1) == [1, 2, 4, 8]
    assert cap.sweep_levels(20, start=3) == [3, 6, 12, 20]


def test_a_one_token_answer_has_no_gaps_and_no_tpot():
    # A streamed answer of one content chunk: no gap between chunks (itl_s stays None), no TPOT (serve.py
    # counts TPOT only for more than one token); its latency is its TTFT.
    one = RequestResult(ok=True, ttft_s=0.25, duration_s=0.3, completion_tokens=1, prompt_tokens=50).as_dict()
    run = cap.vllm_bench_run(1, [one], duration_s=1.0, hit_rate=None)
    assert run["completed"] == 1 and run["total_output_tokens"] == 1
    assert run["mean_itl_ms"] == 0.0 and run["mean_tpot_ms"] == 0.0
    assert run["mean_e2el_ms"] == 250.0 and run["mean_ttft_ms"] == 250.0


def test_a_two_token_answer_has_a_tpot():
    two = RequestResult(ok=True, ttft_s=0.2, duration_s=0.5, completion_tokens=2, itl_s=[0.3]).as_dict()
    run = cap.vllm_bench_run(1, [two], duration_s=1.0, hit_rate=None)
    assert math.isclose(run["mean_tpot_ms"], 300.0)  # (e2el 500 ms - ttft 200 ms) / (2 - 1)
    assert math.isclose(run["mean_e2el_ms"], 500.0)


def test_a_success_without_a_measured_duration_is_left_out_of_the_per_user_rate():
    timed = RequestResult(ok=True, ttft_s=0.1, duration_s=0.5, completion_tokens=10, itl_s=[0.04] * 9).as_dict()
    untimed = RequestResult(ok=True, ttft_s=0.1, completion_tokens=10, itl_s=[0.04] * 9).as_dict()
    run = cap.vllm_bench_run(2, [timed, untimed], duration_s=1.0, hit_rate=None)
    assert run["per_user_tok_s"] == 20.0  # 10 tokens / 0.5 s, the untimed one not counted
    assert run["completed"] == 2 and run["total_output_tokens"] == 20


def test_a_level_shorter_than_a_second_reports_per_second_rates_and_its_duration():
    reqs = [RequestResult(ok=True, ttft_s=0.1, duration_s=0.4, completion_tokens=4, itl_s=[0.1] * 3).as_dict()]
    run = cap.vllm_bench_run(1, reqs, duration_s=0.5, hit_rate=None)
    assert run["duration"] == 0.5
    assert (run["request_throughput"], run["output_throughput"]) == (2.0, 8.0)
    zero = cap.vllm_bench_run(1, reqs, duration_s=0.0, hit_rate=None)
    assert math.isnan(zero["output_throughput"])  # no duration: no rate, not a division error


def test_an_slo_may_be_below_one():
    assert cap.slo(0.5, 0.5) == {"min_tok_s_per_user": 0.5, "max_ttft_p95_s": 0.5}
    with pytest.raises(ValueError, match="SLO bounds must be above 0, got min_tok_s=10, max_ttft_p95_s=0"):
        cap.slo(10, 0)
    with pytest.raises(ValueError, match="above 0"):
        cap.slo(-1, 2)


def test_an_slo_met_exactly_is_met():
    assert cap.judge(_run(4, 10.0, 2.0), SLO) == {"met": True, "missed": [], "clearly_broken": False}


def test_missing_by_exactly_the_break_factor_is_not_yet_clearly_broken():
    # "clearly" is past half the tok/s or twice the TTFT: at exactly half / twice the sweep goes on.
    assert cap.judge(_run(8, 5.0, 0.3), SLO) == {"met": False, "missed": ["tok_s_per_user"], "clearly_broken": False}
    assert cap.judge(_run(8, 12.0, 4.0), SLO) == {"met": False, "missed": ["ttft_p95"], "clearly_broken": False}
    assert cap.next_step([_run(8, 5.0, 4.0)], SLO) is None
    assert cap.next_step([_run(8, 4.99, 4.0)], SLO).startswith("SLO clearly broken at concurrency 8: 4.99 tok/s")
    assert cap.next_step([_run(8, 5.0, 4.01)], SLO).endswith("TTFT p95 4.01 s, 0 failed")


def test_a_sweep_stopped_before_its_first_level_has_no_capacity_and_says_why():
    result = cap.capacity([], SLO, stopped="deadline_s 60 passed before concurrency 1")
    assert result == {
        "slo": SLO,
        "users_at_slo": 0,
        "first_failing": None,
        "peak_output_throughput": None,
        "stopped": "deadline_s 60 passed before concurrency 1",
    }
    assert cap.capacity([_run(1, 17.0, 0.3)], SLO)["stopped"] is None
