#!/usr/bin/python
"""Ansible module: measure an OpenAI-compatible (vLLM) server's throughput at several concurrency levels."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_benchmark
short_description: Measure tok/s, TTFT and prefix-cache hit rate of a vLLM server at several concurrencies
description:
  - With O(max_concurrency), sweeps concurrency upward (1, 2, 4, 8, ... up to it) and stops early once a
    level breaks the SLO clearly (by O(slo_break_factor)); returns one record per level in C(runs) with the
    keys C(vllm bench serve --save-result) writes (vLLM 0.19.0's vllm/benchmarks/serve.py, same meaning) and
    a C(capacity) object with the SLO and C(users_at_slo).
  - Sends streamed chat completions of a fixed length (C(max_tokens), with vLLM's C(min_tokens) and
    C(ignore_eos) so every answer has exactly that many tokens) at each concurrency level, from as
    many threads as the level's concurrency.
  - Every prompt starts with the same long prefix, so vLLM's prefix cache is exercised; the hit rate
    of each level comes from the server's C(/metrics) counters read before and after the level.
  - Aggregate tok/s is all completion tokens of a level over the level's wall time; per-request tok/s
    is a request's completion tokens over its total time (time to first token included).
  - Never changes anything (C(changed) is always false). In check mode it returns the plan and sends
    nothing.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  base_url:
    description: OpenAI-compatible base URL, including C(/v1) (e.g. C(http://10.0.0.1:8000/v1)).
    type: str
    required: true
  api_key:
    description: Bearer token the server expects (vLLM's C(VLLM_API_KEY)); omitted when not set.
    type: str
    required: false
  model:
    description: The served model name to ask for (the profile's C(served_model_name)).
    type: str
    required: true
  concurrency:
    description: Concurrency levels to run, in order (ignored when O(max_concurrency) is set).
    type: list
    elements: int
    default: [1, 2, 4]
  max_concurrency:
    description:
      - Sweep 1, 2, 4, 8, ... up to this concurrency (included), stopping after the first level that
        breaks the SLO clearly. Unset, O(concurrency) runs as given, every level.
    type: int
    required: false
  slo_min_tok_s:
    description: SLO, each user's decode rate (completion tokens over the request's whole time) at least this.
    type: float
    default: 10
  slo_max_ttft_p95_s:
    description: SLO, the 95th percentile time to first token at most this many seconds.
    type: float
    default: 2
  slo_break_factor:
    description: A level breaks the SLO clearly (the sweep stops) when it misses a bound by this factor.
    type: float
    default: 2
  requests_per_level:
    description: Requests sent at each level; default twice the level's concurrency.
    type: int
    required: false
  max_tokens:
    description: Completion length of every request, in tokens.
    type: int
    default: 256
  prompt_prefix:
    description: Text every prompt starts with (repeated C(prefix_repeats) times) so the prefix cache can hit.
    type: str
    default: "You are benchmarking a language model server. Answer in plain prose. "
  prefix_repeats:
    description: How many times C(prompt_prefix) is repeated at the start of every prompt.
    type: int
    default: 32
  warmup_requests:
    description: Requests sent (one at a time, not measured) before the first level.
    type: int
    default: 1
  request_timeout_s:
    description: Seconds one request may take from send to the end of its stream.
    type: float
    default: 300
  deadline_s:
    description: Seconds the whole benchmark may take; requests not started by then count as errors.
    type: float
    default: 1800
  metrics_url:
    description: Prometheus endpoint of the server; default C(base_url) without C(/v1) plus C(/metrics).
    type: str
    required: false
  validate_certs:
    description: Verify TLS certificates for https URLs.
    type: bool
    default: true
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: Returns the plan (levels, requests, tokens) without sending any request.
  diff_mode:
    support: none
    details: A measurement; it changes nothing.
"""

EXAMPLES = r"""
- name: Benchmark the served model at 1, 2 and 4 concurrent requests
  sparkops.cluster.vllm_benchmark:
    base_url: "http://{{ sparkops_head_fast_ip }}:8000/v1"
    api_key: "{{ sparkops_vllm_api_key }}"
    model: qwen3-235b-a22b
    concurrency: [1, 2, 4]
    max_tokens: 256
  register: bench

- name: Write the report on the control node
  sparkops.cluster.benchmark_report:
    results: "{{ bench.levels }}"
    output_dir: "{{ sparkops_reports_dir }}/benchmarks"
    cluster_name: two-sparks
  delegate_to: localhost
"""

RETURN = r"""
levels:
  description: One entry per concurrency level, in the order run.
  returned: success
  type: list
  elements: dict
  contains:
    concurrency:
      description: Concurrent requests in flight.
      type: int
    requests:
      description: Requests sent (or skipped at the deadline) at this level.
      type: int
    completion_tokens:
      description: Completion tokens of the successful requests.
      type: int
    wall_s:
      description: Seconds from the first send to the last stream's end.
      type: float
    aggregate_tok_s:
      description: completion_tokens / wall_s.
      type: float
    per_request_tok_s_mean:
      description: Mean over successful requests of completion tokens / request time.
      type: float
    ttft_p50_s:
      description: Median time to first token, seconds.
      type: float
    ttft_p95_s:
      description: 95th percentile time to first token, seconds.
      type: float
    errors:
      description: Failed or skipped requests.
      type: int
    error_samples:
      description: Up to three distinct error messages.
      type: list
      elements: str
    prefix_cache_hit_rate:
      description: Prefix-cache hits / queries over the level from /metrics; null when unavailable.
      type: float
    spec_decode:
      description:
        - Speculative-decoding (MTP, EAGLE, n-gram) acceptance over the level, from the deltas of vLLM's
          C(vllm:spec_decode_num_drafts), C(vllm:spec_decode_num_draft_tokens),
          C(vllm:spec_decode_num_accepted_tokens) and C(vllm:spec_decode_num_accepted_tokens_per_pos) counters;
          null when the profile has no speculative decoding or nothing was drafted.
        - C(acceptance_rate) is accepted / draft tokens (0-1), C(mean_acceptance_length) 1 + accepted / drafts
          (the bonus token counted, as vLLM logs it), C(per_position) the share of drafts whose token at each
          position was accepted.
      type: dict
  sample:
    - concurrency: 1
      requests: 2
      completion_tokens: 512
      wall_s: 30.1
      aggregate_tok_s: 17.0
      per_request_tok_s_mean: 17.0
      ttft_p50_s: 0.41
      ttft_p95_s: 0.45
      errors: 0
      error_samples: []
      prefix_cache_hit_rate: 0.92
runs:
  description:
    - One record per level run, with C(vllm bench serve --save-result)'s keys (C(max_concurrency),
      C(num_prompts), C(duration), C(completed), C(failed), C(total_input_tokens), C(total_output_tokens),
      C(request_throughput), C(output_throughput), C(total_token_throughput), and C(mean_/median_/std_/p95_/p99_)
      for C(ttft), C(tpot), C(itl) and C(e2el) in ms) plus C(per_user_tok_s), C(prefix_cache_hit_rate) and
      C(errors) (up to three messages).
  returned: success
  type: list
  elements: dict
  sample:
    - max_concurrency: 4
      completed: 8
      failed: 0
      output_throughput: 36.4
      mean_ttft_ms: 310.2
      p95_ttft_ms: 402.5
      median_itl_ms: 109.9
      per_user_tok_s: 9.1
      prefix_cache_hit_rate: 0.92
capacity:
  description: The SLO, C(users_at_slo) (the highest concurrency that met it, every lower level meeting it
    too; 0 when none did), C(first_failing) (concurrency and the bounds missed), C(peak_output_throughput)
    and why the sweep C(stopped) (null when it ran every level).
  returned: success
  type: dict
  sample:
    slo: {min_tok_s_per_user: 10.0, max_ttft_p95_s: 2.0}
    users_at_slo: 2
    first_failing: {max_concurrency: 4, missed: [tok_s_per_user]}
    peak_output_throughput: {max_concurrency: 16, output_throughput: 77.2}
    stopped: null
plan:
  description: The levels that would run (concurrency, requests, max_tokens); in check mode only this.
  returned: always
  type: list
  elements: dict
metrics_url:
  description: Where the prefix-cache counters were read.
  returned: always
  type: str
metrics_available:
  description: Whether /metrics could be read at all.
  returned: success
  type: bool
warmup_errors:
  description: Errors of the warm-up requests (the module fails only when all of them failed).
  returned: success
  type: list
  elements: str
"""

import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils import capacity as cap
from ansible_collections.sparkops.cluster.plugins.module_utils.bench import (
    RequestResult,
    chat_request_body,
    fetch_metrics,
    metrics_url_for,
    prefix_cache_hit_rate,
    spec_decode_acceptance,
    stream_chat,
    summarize_level,
)


def _prompt(prefix: str, repeats: int, level: int, index: int) -> str:
    return (
        prefix
        * repeats
        + f"\nRequest {level}-{index}: describe, in as much detail as you can, how a compiler turns source "
        "code into machine code."
    )


def _run_level(module_args: dict, concurrency: int, requests: int, deadline: float) -> tuple[list, float]:
    def one(index: int) -> RequestResult:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return RequestResult(False, error="not sent: the benchmark deadline_s passed")
        body = chat_request_body(
            module_args["model"],
            _prompt(module_args["prompt_prefix"], module_args["prefix_repeats"], concurrency, index),
            module_args["max_tokens"],
        )
        return stream_chat(
            module_args["base_url"],
            body,
            api_key=module_args["api_key"],
            timeout_s=min(module_args["request_timeout_s"], remaining),
            validate_certs=module_args["validate_certs"],
        )

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, range(requests)))
    return results, time.monotonic() - start


def main():
    module = AnsibleModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "api_key": {"type": "str", "required": False, "no_log": True},
            "model": {"type": "str", "required": True},
            "concurrency": {"type": "list", "elements": "int", "default": [1, 2, 4]},
            "max_concurrency": {"type": "int", "required": False},
            "slo_min_tok_s": {"type": "float", "default": cap.DEFAULT_SLO_MIN_TOK_S},
            "slo_max_ttft_p95_s": {"type": "float", "default": cap.DEFAULT_SLO_MAX_TTFT_P95_S},
            "slo_break_factor": {"type": "float", "default": cap.DEFAULT_BREAK_FACTOR},
            "requests_per_level": {"type": "int", "required": False},
            "max_tokens": {"type": "int", "default": 256, "no_log": False},  # a count, not a secret
            "prompt_prefix": {
                "type": "str",
                "default": "You are benchmarking a language model server. Answer in plain prose. ",
            },
            "prefix_repeats": {"type": "int", "default": 32},
            "warmup_requests": {"type": "int", "default": 1},
            "request_timeout_s": {"type": "float", "default": 300},
            "deadline_s": {"type": "float", "default": 1800},
            "metrics_url": {"type": "str", "required": False},
            "validate_certs": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    if not p["base_url"].startswith(("http://", "https://")):
        module.fail_json(msg=f"base_url must start with http:// or https://, got {p['base_url']!r}")
    if not p["concurrency"] or any(c < 1 for c in p["concurrency"]):
        module.fail_json(msg=f"concurrency must be a non-empty list of integers >= 1, got {p['concurrency']}")
    if p["requests_per_level"] is not None and p["requests_per_level"] < 1:
        module.fail_json(
            msg=f"requests_per_level must be >= 1 (or unset for 2x concurrency), got {p['requests_per_level']}"
        )
    if p["max_concurrency"] is not None and p["max_concurrency"] < 1:
        module.fail_json(
            msg=f"max_concurrency must be >= 1 (or unset to run concurrency as given), got {p['max_concurrency']}"
        )
    if p["slo_break_factor"] < 1:
        module.fail_json(msg=f"slo_break_factor must be 1 or more, got {p['slo_break_factor']}")
    for key in ("max_tokens", "request_timeout_s", "deadline_s", "slo_min_tok_s", "slo_max_ttft_p95_s"):
        if p[key] <= 0:
            module.fail_json(msg=f"{key} must be above 0, got {p[key]}")
    for key in ("prefix_repeats", "warmup_requests"):
        if p[key] < 0:
            module.fail_json(msg=f"{key} must be 0 or more, got {p[key]}")

    metrics_url = p["metrics_url"] or metrics_url_for(p["base_url"])
    plan = [
        {
            "concurrency": c,
            "requests": p["requests_per_level"] or 2 * c,
            "max_tokens": p["max_tokens"],
        }
        for c in (cap.sweep_levels(p["max_concurrency"]) if p["max_concurrency"] else p["concurrency"])
    ]
    target = cap.slo(p["slo_min_tok_s"], p["slo_max_ttft_p95_s"])
    if module.check_mode:
        module.exit_json(changed=False, plan=plan, metrics_url=metrics_url, levels=[])

    deadline = time.monotonic() + p["deadline_s"]
    metric_kwargs = {"api_key": p["api_key"], "timeout_s": 10.0, "validate_certs": p["validate_certs"]}

    warmup_errors = []
    for i in range(p["warmup_requests"]):
        body = chat_request_body(p["model"], _prompt(p["prompt_prefix"], p["prefix_repeats"], 0, i), p["max_tokens"])
        result = stream_chat(
            p["base_url"],
            body,
            api_key=p["api_key"],
            timeout_s=min(p["request_timeout_s"], max(deadline - time.monotonic(), 0.001)),
            validate_certs=p["validate_certs"],
        )
        if not result.ok:
            warmup_errors.append(result.error)
    if p["warmup_requests"] and len(warmup_errors) == p["warmup_requests"]:
        module.fail_json(
            msg=f"every warm-up request to {p['base_url']} failed ({warmup_errors[0]}); check that the server is up, "
            f"that model {p['model']!r} is its served model name and that api_key matches VLLM_API_KEY",
            plan=plan,
            metrics_url=metrics_url,
        )

    levels, runs, stopped = [], [], None
    metrics_seen = False
    for step in plan:
        if time.monotonic() >= deadline:
            stopped = f"deadline_s {p['deadline_s']:g} passed before concurrency {step['concurrency']}"
            break
        before = fetch_metrics(metrics_url, **metric_kwargs)
        results, wall = _run_level(p, step["concurrency"], step["requests"], deadline)
        after = fetch_metrics(metrics_url, **metric_kwargs)
        metrics_seen = metrics_seen or after is not None
        hit_rate = prefix_cache_hit_rate(before, after)
        spec = spec_decode_acceptance(before, after)
        levels.append(summarize_level(step["concurrency"], results, wall, hit_rate, spec))
        run = cap.vllm_bench_run(step["concurrency"], [r.as_dict() for r in results], wall, hit_rate)
        run["spec_decode"] = spec  # MTP/EAGLE acceptance over the level (None without speculative decoding)
        runs.append(run)
        stopped = cap.next_step(runs, target, p["slo_break_factor"]) if p["max_concurrency"] else None
        if stopped:
            break

    if all(level["errors"] == level["requests"] for level in levels):
        samples = [s for level in levels for s in level["error_samples"]]
        module.fail_json(
            msg=f"no benchmark request to {p['base_url']} succeeded ({samples[0] if samples else 'no detail'}); "
            "check the server's health, the model name and the api_key",
            levels=levels,
            plan=plan,
            metrics_url=metrics_url,
        )
    module.exit_json(
        changed=False,
        levels=levels,
        runs=runs,
        capacity=cap.capacity(runs, target, stopped),
        plan=plan,
        metrics_url=metrics_url,
        metrics_available=metrics_seen,
        warmup_errors=warmup_errors,
    )


if __name__ == "__main__":
    main()
