"""Benchmark helpers for an OpenAI-compatible server (vLLM): a minimal streaming client, a Prometheus
text parser for vLLM's prefix-cache counters, and the statistics a benchmark level reports.

Stdlib only (runs on the target with Python >= 3.10). Everything except stream_chat is pure.

Definitions used throughout:
- TTFT: seconds from sending the request to the first streamed content token.
- per-request tok/s: completion tokens / the request's total time (TTFT included).
- aggregate tok/s: all completion tokens of a level / the level's wall time (first send to last end).
- prefix-cache hit rate: delta(hits) / delta(queries) of vLLM's counters over the level.
- speculative decoding (MTP, EAGLE, n-gram): acceptance rate = delta(accepted draft tokens) /
  delta(draft tokens), mean acceptance length = 1 + delta(accepted) / delta(drafts), and per draft
  position delta(accepted at position) / delta(drafts), over the level, as vLLM 0.19.0 logs them
  (vllm/v1/spec_decode/metrics.py:87-98).
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import math
import re
import ssl
import time
import urllib.parse
from dataclasses import asdict, dataclass

# Where a benchmark's figures come from. One value for every file of a report (JSON, Markdown, PNG):
# real hardware, or the vLLM TEST DOUBLE of the simulated cluster, whose pace is a setting
# (SPARKOPS_TEST_DOUBLE_TOK_S) and says nothing about a model on a GPU.
SOURCE_HARDWARE = "hardware"
SOURCE_TEST_DOUBLE = "test-double"
SOURCES = (SOURCE_HARDWARE, SOURCE_TEST_DOUBLE)
SOURCE_LABELS = {
    SOURCE_HARDWARE: "measured on hardware",
    SOURCE_TEST_DOUBLE: "vLLM TEST DOUBLE (simulated cluster): not a model, not hardware",
}
# Aggregate tok/s by concurrency, Qwen3-235B-A22B GPTQ-Int4 on two DGX Sparks (TP=2, EP=2). Only
# hardware figures are compared with it.
HARDWARE_REFERENCE = {1: 17.0, 2: 24.1, 4: 36.4}

# vLLM V1 counters (tokens), and the V0-era names for the same, newest first.
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
# Older vLLM exposed only a gauge of the running hit rate (a fraction).
PREFIX_HIT_RATE_GAUGE = "vllm:gpu_prefix_cache_hit_rate"
# vLLM 0.19.0's speculative-decoding counters (vllm/v1/spec_decode/metrics.py:155-193), registered
# only when --speculative-config is set; prometheus_client exports a Counter with the _total suffix.
# The per-position counter carries a "position" label (0 .. num_speculative_tokens - 1).
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_POSITION_LABEL = re.compile(r'[{,]\s*position="(\d+)"')


@dataclass
class RequestResult:
    """What one streamed request measured."""

    ok: bool
    ttft_s: float | None = None
    duration_s: float | None = None
    completion_tokens: int = 0
    error: str | None = None
    # the gaps between content chunks (vLLM bench's ITL) and the usage chunk's prompt tokens (capacity.py)
    itl_s: list | None = None
    prompt_tokens: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------------- stats


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between closest ranks; None when empty."""
    data = sorted(float(v) for v in values if v is not None)
    if not data:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0-100, got {q}")
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return data[lo]
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def per_request_tok_s(result: RequestResult) -> float | None:
    """Completion tokens over the request's total time; None for failed or empty requests."""
    if not result.ok or not result.duration_s or result.duration_s <= 0 or result.completion_tokens <= 0:
        return None
    return result.completion_tokens / result.duration_s


def aggregate_tok_s(total_completion_tokens: int, wall_s: float) -> float | None:
    """All completion tokens of a level over its wall time; None when the wall time is not positive."""
    if wall_s is None or wall_s <= 0:
        return None
    return total_completion_tokens / wall_s


def summarize_level(
    concurrency: int, results: list[RequestResult], wall_s: float, hit_rate: float | None, spec_decode=None
) -> dict:
    """The per-level record the vllm_benchmark module returns (spec_decode: spec_decode_acceptance's)."""
    good = [r for r in results if r.ok]
    tokens = sum(r.completion_tokens for r in good)
    rates = [x for x in (per_request_tok_s(r) for r in good) if x is not None]
    ttfts = [r.ttft_s for r in good if r.ttft_s is not None]
    errors = [r.error for r in results if not r.ok]

    def _round(value, digits=4):
        return None if value is None else round(value, digits)

    return {
        "concurrency": concurrency,
        "requests": len(results),
        "completion_tokens": tokens,
        "wall_s": _round(wall_s),
        "aggregate_tok_s": _round(aggregate_tok_s(tokens, wall_s) if good else None, 3),
        "per_request_tok_s_mean": _round(sum(rates) / len(rates) if rates else None, 3),
        "ttft_p50_s": _round(percentile(ttfts, 50)),
        "ttft_p95_s": _round(percentile(ttfts, 95)),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:3],
        "prefix_cache_hit_rate": _round(hit_rate),
        "spec_decode": spec_decode,
    }


# ------------------------------------------------------------------------------------------- metrics


def _split_sample(line: str) -> tuple[str, str] | None:
    """Split a Prometheus sample line into (name, rest after the labels); None if malformed."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        i, in_quotes, escaped = brace + 1, False, False
        while i < len(line):
            ch = line[i]
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_quotes = not in_quotes
            elif ch == "}" and not in_quotes:
                return name, line[i + 1 :]
            i += 1
        return None
    if space == -1:
        return None
    return line[:space], line[space:]


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum every sample of each metric name across its label sets (engines, models).

    Comment and malformed lines are skipped; values may be NaN/+Inf as Prometheus writes them.
    """
    totals: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        split = _split_sample(line)
        if split is None:
            continue
        name, rest = split
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        totals[name] = totals.get(name, 0.0) + value
        if name == SPEC_ACCEPTED_PER_POS:
            # kept per position too ("<name>[0]", "<name>[1]", ...), summed over engines
            label = _POSITION_LABEL.search(line[len(name) : len(line) - len(rest)])
            if label:
                key = f"{name}[{label.group(1)}]"
                totals[key] = totals.get(key, 0.0) + value
    return totals


def _first(metrics: dict[str, float], names) -> float | None:
    for name in names:
        if name in metrics:
            return metrics[name]
    return None


def prefix_cache_hit_rate(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """Hit rate over the interval between two parsed /metrics snapshots.

    Uses the hits/queries counters' deltas; falls back to the old gauge in `after`; None when neither
    is there or no query happened in between.
    """
    if after is None:
        return None
    before = before or {}
    hits_after, queries_after = _first(after, PREFIX_HITS), _first(after, PREFIX_QUERIES)
    if hits_after is not None and queries_after is not None:
        hits = hits_after - (_first(before, PREFIX_HITS) or 0.0)
        queries = queries_after - (_first(before, PREFIX_QUERIES) or 0.0)
        if queries <= 0:
            return None
        return max(0.0, min(1.0, hits / queries))
    gauge = after.get(PREFIX_HIT_RATE_GAUGE)
    if gauge is not None and math.isfinite(gauge):
        return max(0.0, min(1.0, gauge))
    return None


def spec_decode_acceptance(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """Speculative-decoding acceptance over the interval between two parsed /metrics snapshots.

    None when the server has no spec-decode counters (no --speculative-config) or drafted nothing in
    between; else {drafts, draft_tokens, accepted_tokens, acceptance_rate, mean_acceptance_length,
    per_position}: the rate is accepted/draft tokens (0-1), the length counts the bonus token as vLLM's
    own log line does, per_position[i] is the share of drafts whose token i was accepted.
    """
    if after is None or SPEC_DRAFTS not in after or SPEC_DRAFT_TOKENS not in after or SPEC_ACCEPTED not in after:
        return None
    before = before or {}

    def delta(name: str) -> float:
        return max(0.0, after.get(name, 0.0) - before.get(name, 0.0))

    drafts, draft_tokens, accepted = delta(SPEC_DRAFTS), delta(SPEC_DRAFT_TOKENS), delta(SPEC_ACCEPTED)
    if drafts <= 0 or draft_tokens <= 0:
        return None
    positions = sorted(
        int(key[len(SPEC_ACCEPTED_PER_POS) + 1 : -1]) for key in after if key.startswith(SPEC_ACCEPTED_PER_POS + "[")
    )
    return {
        "drafts": int(drafts),
        "draft_tokens": int(draft_tokens),
        "accepted_tokens": int(accepted),
        "acceptance_rate": round(min(1.0, accepted / draft_tokens), 4),
        "mean_acceptance_length": round(1 + accepted / drafts, 3),
        "per_position": [round(delta(f"{SPEC_ACCEPTED_PER_POS}[{pos}]") / drafts, 4) for pos in positions],
    }


# ---------------------------------------------------------------------------------------------- http


def metrics_url_for(base_url: str) -> str:
    """http://host:8000/v1 -> http://host:8000/metrics (vLLM serves /metrics at the root)."""
    parts = urllib.parse.urlsplit(base_url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path + "/metrics", "", ""))


@functools.lru_cache(maxsize=2)
def _ssl_context(validate_certs: bool) -> ssl.SSLContext:
    # Made once per setting: loading the CA store per request costs tens of ms of CPU, which under
    # the GIL would serialise the concurrent requests the benchmark times.
    ctx = ssl.create_default_context()
    if not validate_certs:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


@contextlib.contextmanager
def _http(method: str, url: str, headers: dict, *, timeout_s: float, validate_certs: bool, body: bytes | None = None):
    """One request with http.client, straight to the server (the endpoint is on the cluster's private
    link: no proxy applies), yielding the response whatever its status."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=timeout_s, context=_ssl_context(validate_certs)
        )
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        conn.request(method, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), body, headers)
        yield conn.getresponse()
    finally:
        conn.close()


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _require_http(url: str) -> None:
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"only http:// and https:// URLs are supported, got {url!r}")


def fetch_metrics(url: str, api_key: str | None = None, timeout_s: float = 10.0, validate_certs: bool = True):
    """Parsed /metrics, or None when the endpoint cannot be read (the benchmark then reports no hit rate)."""
    _require_http(url)
    headers = {k: v for k, v in _headers(api_key).items() if k != "Accept"}
    try:
        with _http("GET", url, headers, timeout_s=timeout_s, validate_certs=validate_certs) as resp:
            if resp.status >= 400:
                return None
            return parse_prometheus(resp.read().decode("utf-8", "replace"))
    except (http.client.HTTPException, OSError, ValueError):
        return None


def chat_request_body(model: str, prompt: str, max_tokens: int) -> dict:
    """A streamed chat completion of exactly `max_tokens` tokens (vLLM's ignore_eos/min_tokens)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def stream_chat(
    base_url: str,
    body: dict,
    api_key: str | None = None,
    timeout_s: float = 300.0,
    validate_certs: bool = True,
) -> RequestResult:
    """POST {base_url}/chat/completions with stream=true and time the server-sent events.

    The completion token count comes from the final usage chunk when the server sends one, else from
    the number of content-bearing chunks (vLLM streams one token a chunk). Never raises for a server or
    network fault: the error is in the result.
    """
    url = base_url.rstrip("/") + "/chat/completions"
    _require_http(url)
    data = json.dumps(body).encode("utf-8")
    start = time.monotonic()
    deadline = start + timeout_s
    ttft = None
    chunks = 0
    usage_tokens = None
    prompt_tokens, itl, last = 0, [], None
    try:
        with _http(
            "POST", url, _headers(api_key), timeout_s=timeout_s, validate_certs=validate_certs, body=data
        ) as resp:
            if resp.status >= 400:
                detail = resp.read(300).decode("utf-8", "replace")
                return RequestResult(False, None, time.monotonic() - start, 0, f"HTTP {resp.status}: {detail}".strip())
            while True:
                if time.monotonic() > deadline:
                    return RequestResult(False, ttft, time.monotonic() - start, chunks, f"timed out after {timeout_s}s")
                raw = resp.readline()
                if not raw:
                    break
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[len("data:") :].strip()
                if payload == "[DONE]":
                    break
                try:
                    event = json.loads(payload)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("error"):
                    message = event["error"].get("message") if isinstance(event["error"], dict) else event["error"]
                    return RequestResult(False, ttft, time.monotonic() - start, chunks, f"server error: {message}")
                usage = event.get("usage") if isinstance(event, dict) else None
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    usage_tokens = usage["completion_tokens"]
                    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else 0
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                    if text:
                        chunks += 1
                        now = time.monotonic()
                        if ttft is None:
                            ttft = now - start
                        else:
                            itl.append(now - last)
                        last = now
    except (TimeoutError, http.client.HTTPException, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return RequestResult(False, ttft, time.monotonic() - start, chunks, f"{type(exc).__name__}: {reason}")
    duration = time.monotonic() - start
    tokens = usage_tokens if usage_tokens is not None else chunks
    if ttft is None:
        return RequestResult(False, None, duration, tokens, "the stream ended without any content token")
    return RequestResult(True, ttft, duration, tokens, None, itl, prompt_tokens)
