"""How many users a server holds: the concurrency sweep's control, its SLO judgment and, per level, the
statistics `vllm bench serve --save-result` writes, with the same keys and the same meaning.

Stdlib only (runs on the target with Python >= 3.10); everything here is pure.

The keys and definitions follow vLLM 0.19.0's vllm/benchmarks/serve.py (the wheel, read at
/work/upstream/vllm-0.19.0/vllm/benchmarks/):
- result keys `duration`, `completed`, `failed`, `total_input_tokens`, `total_output_tokens`,
  `request_throughput`, `output_throughput`, `total_token_throughput` (serve.py:983-1001) and
  `max_concurrency` (serve.py:1852); throughputs are per second of the level's duration (serve.py:562-570);
- for each of ttft, tpot, itl, e2el: `mean_<m>_ms`, `median_<m>_ms`, `std_<m>_ms` and `p<q>_<m>_ms`
  (serve.py:1055-1067), numpy's mean / median / population std / linear-interpolated percentile of the
  successful requests' values (serve.py:571-597); here q = 95 and 99, as `--metric-percentiles 95,99`
  would give (the default is 99 alone, serve.py:1446-1448; 95 is what the SLO judges);
- TTFT: send to first content token; ITL: the gaps between content chunks; E2EL (latency): send to the last
  content chunk (vllm/benchmarks/lib/endpoint_request_func.py:229-249); TPOT: (latency - TTFT) /
  (output tokens - 1), only for requests of more than one token (serve.py:441-447).
Ours, next to them: `per_user_tok_s` (mean over successful requests of output tokens / the request's
whole time, TTFT included; what a user sees) and the prefix-cache hit rate.
"""

from __future__ import annotations

import math

# The SLO of a usable interactive seat (issue 26): each user gets at least this decode rate...
DEFAULT_SLO_MIN_TOK_S = 10.0
# ...and 95% of requests see their first token within this many seconds.
DEFAULT_SLO_MAX_TTFT_P95_S = 2.0
# A level breaks the SLO "clearly" when it misses a bound by this factor (half the tok/s, twice the TTFT):
# past it, higher levels only cost time.
DEFAULT_BREAK_FACTOR = 2.0
PERCENTILES = (95, 99)
METRICS = ("ttft", "tpot", "itl", "e2el")


def sweep_levels(max_concurrency: int, start: int = 1) -> list[int]:
    """1, 2, 4, 8, ... doubling from `start` up to `max_concurrency` (included even off the doubling)."""
    if start < 1 or max_concurrency < start:
        raise ValueError(f"the sweep needs 1 <= start <= max_concurrency, got start={start}, max={max_concurrency}")
    levels, level = [], start
    while level < max_concurrency:
        levels.append(level)
        level *= 2
    return [*levels, max_concurrency]


def _percentile(data: list[float], q: float) -> float:
    """numpy.percentile's default (linear) on sorted data; 0 for none, as serve.py's `np.percentile(x or 0)`."""
    if not data:
        return 0.0
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _stats(values: list[float], name: str) -> dict:
    data = sorted(values)
    n = len(data)
    mean = sum(data) / n if n else 0.0
    std = math.sqrt(sum((v - mean) ** 2 for v in data) / n) if n else 0.0
    out = {
        f"mean_{name}_ms": mean * 1000,
        f"median_{name}_ms": _percentile(data, 50) * 1000,
        f"std_{name}_ms": std * 1000,
    }
    out.update({f"p{q}_{name}_ms": _percentile(data, q) * 1000 for q in PERCENTILES})
    return out


def vllm_bench_run(concurrency: int, requests: list[dict], duration_s: float, hit_rate: float | None) -> dict:
    """One level's record with `vllm bench serve --save-result`'s keys (see the module docstring).

    Each request: ok, ttft_s, itl_s (list of gaps), completion_tokens, prompt_tokens, duration_s, error.
    """
    good = [r for r in requests if r.get("ok")]
    out_tokens = sum(r.get("completion_tokens") or 0 for r in good)
    in_tokens = sum(r.get("prompt_tokens") or 0 for r in good)
    ttfts = [r["ttft_s"] for r in good]
    itls = [gap for r in good for gap in r.get("itl_s") or []]
    e2els = [r["ttft_s"] + sum(r.get("itl_s") or []) for r in good]
    tpots = [
        (e2e - r["ttft_s"]) / (r["completion_tokens"] - 1)
        for r, e2e in zip(good, e2els, strict=True)
        if r.get("completion_tokens", 0) > 1
    ]
    users = [r["completion_tokens"] / r["duration_s"] for r in good if r.get("duration_s") and r["completion_tokens"]]
    dur = duration_s if duration_s and duration_s > 0 else float("nan")
    run = {
        "max_concurrency": concurrency,
        "num_prompts": len(requests),
        "duration": duration_s,
        "completed": len(good),
        "failed": len(requests) - len(good),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(good) / dur,
        "output_throughput": out_tokens / dur,
        "total_token_throughput": (in_tokens + out_tokens) / dur,
    }
    for name, values in zip(METRICS, (ttfts, tpots, itls, e2els), strict=True):
        run.update(_stats(values, name))
    run["per_user_tok_s"] = sum(users) / len(users) if users else 0.0
    run["prefix_cache_hit_rate"] = hit_rate
    run["errors"] = sorted({r.get("error") or "?" for r in requests if not r.get("ok")})[:3]
    return {k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v) for k, v in run.items()}


def slo(min_tok_s: float = DEFAULT_SLO_MIN_TOK_S, max_ttft_p95_s: float = DEFAULT_SLO_MAX_TTFT_P95_S) -> dict:
    if min_tok_s <= 0 or max_ttft_p95_s <= 0:
        raise ValueError(f"SLO bounds must be above 0, got min_tok_s={min_tok_s}, max_ttft_p95_s={max_ttft_p95_s}")
    return {"min_tok_s_per_user": float(min_tok_s), "max_ttft_p95_s": float(max_ttft_p95_s)}


def judge(run: dict, target: dict, break_factor: float = DEFAULT_BREAK_FACTOR) -> dict:
    """Whether one level met the SLO (every request done, per-user tok/s and TTFT p95 within bounds), which
    bound it missed, and whether it missed clearly (by break_factor, or no request succeeded)."""
    tok_s, ttft = run["per_user_tok_s"], run["p95_ttft_ms"] / 1000
    missed = []
    if run["failed"]:
        missed.append("errors")
    if tok_s < target["min_tok_s_per_user"]:
        missed.append("tok_s_per_user")
    if ttft > target["max_ttft_p95_s"]:
        missed.append("ttft_p95")
    clearly = (
        run["completed"] == 0
        or tok_s * break_factor < target["min_tok_s_per_user"]
        or ttft > target["max_ttft_p95_s"] * break_factor
    )
    return {"met": not missed, "missed": missed, "clearly_broken": clearly}


def capacity(runs: list[dict], target: dict, stopped: str | None = None) -> dict:
    """The `capacity` object: the SLO, users_at_slo (the highest concurrency that met the SLO with every
    lower level also meeting it; 0 when the first level failed), the first level that failed and why, the
    level of peak aggregate throughput, and why the sweep stopped."""
    at_slo, first_fail = 0, None
    for run in sorted(runs, key=lambda r: r["max_concurrency"]):
        verdict = judge(run, target)
        if verdict["met"] and first_fail is None:
            at_slo = run["max_concurrency"]
        elif not verdict["met"] and first_fail is None:
            first_fail = {"max_concurrency": run["max_concurrency"], "missed": verdict["missed"]}
    peak = max(runs, key=lambda r: r["output_throughput"] or 0, default=None)
    return {
        "slo": target,
        "users_at_slo": at_slo,
        "first_failing": first_fail,
        "peak_output_throughput": peak and {k: peak[k] for k in ("max_concurrency", "output_throughput")},
        "stopped": stopped,
    }


def next_step(runs: list[dict], target: dict, break_factor: float = DEFAULT_BREAK_FACTOR) -> str | None:
    """Why the sweep stops after the runs so far (None: go on): the last level broke the SLO clearly."""
    if runs and judge(runs[-1], target, break_factor)["clearly_broken"]:
        last = runs[-1]
        return (
            f"SLO clearly broken at concurrency {last['max_concurrency']}: {last['per_user_tok_s']:.2f} tok/s per "
            f"user, TTFT p95 {last['p95_ttft_ms'] / 1000:.2f} s, {last['failed']} failed"
        )
    return None
