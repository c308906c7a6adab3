# Copyright: sparkops maintainers
# Apache-2.0
"""Probe an OpenAI-compatible (vLLM) server with the Python standard library only.

Runs on the target, so: no requests, no third-party imports. Every failure is raised
as ProbeError with a `kind` a caller can act on:

    refused       nothing listens on that address (TCP connection refused); vLLM 0.19.0 binds its
                  port at start but listens only once its engine is up (entrypoints/openai/
                  api_server.py:541-548 binds, :596 serve_http listens), so a start refuses
    unreachable   the address cannot be resolved or routed to, or the connection was reset
                  before an answer (the server went away: shutting down or restarting)
    timeout       no answer (or the stream stalled) within the request timeout
    engine_dead   503 Service Unavailable: vLLM 0.19.0 answers /health 503 only when its engine
                  is dead (EngineDeadError, entrypoints/serve/instrumentator/health.py:29-33); the
                  engine does not come back and the API server exits next (launcher.py:144-166)
    unauthorized  401/403: the API key is missing or wrong
    wrong_model   the expected served model name is not in /v1/models (or 404 for it)
    server_error  5xx other than 503 (body excerpt in the message), or the stream broke
    client_error  another 4xx (body excerpt in the message)
    malformed     the answer is not what an OpenAI-compatible server sends
"""

from __future__ import annotations

import http.client
import json
import math
import re
import socket
import ssl
import time
from urllib.parse import urlsplit

KINDS = (
    "refused",
    "unreachable",
    "timeout",
    "engine_dead",
    "unauthorized",
    "wrong_model",
    "server_error",
    "client_error",
    "malformed",
)
# A dead engine is never retried: vLLM's EngineCore does not recover, its server exits (with status 0).
RETRYABLE_KINDS = frozenset({"refused", "unreachable", "timeout"})
EXCERPT_CHARS = 300


class ProbeError(Exception):
    """A classified probe failure: `kind` is one of KINDS."""

    def __init__(self, kind: str, message: str, status: int | None = None, url: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.url = url


def _excerpt(data: bytes | str, limit: int = EXCERPT_CHARS) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _split_base(base_url: str) -> tuple[str, str, int, str]:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base_url {base_url!r} is not an http:// or https:// URL with a host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname, port, parts.path.rstrip("/")


def _connect(base_url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    scheme, host, port, prefix = _split_base(base_url)
    if scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    return conn, prefix


def _classify_os_error(exc: BaseException, url: str, timeout: float) -> ProbeError:
    if isinstance(exc, ConnectionRefusedError):
        return ProbeError("refused", f"connection refused by {url}", url=url)
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return ProbeError("timeout", f"no answer from {url} within {timeout:g} s", url=url)
    if isinstance(exc, (ConnectionResetError, http.client.RemoteDisconnected, BrokenPipeError)):
        return ProbeError(
            "unreachable", f"connection to {url} was reset before an answer (server going away?): {exc}", url=url
        )
    if isinstance(exc, socket.gaierror):
        return ProbeError("unreachable", f"cannot resolve the host of {url}: {exc}", url=url)
    if isinstance(exc, ssl.SSLError):
        return ProbeError("malformed", f"TLS error talking to {url}: {exc}", url=url)
    return ProbeError("unreachable", f"cannot reach {url}: {exc}", url=url)


def _classify_status(status: int, reason: str, body: bytes, url: str, api_key: str | None) -> ProbeError:
    excerpt = _excerpt(body)
    if status in (401, 403):
        why = "the API key is wrong" if api_key else "no API key was given but the server requires one (set api_key)"
        return ProbeError("unauthorized", f"{status} {reason or 'Unauthorized'} from {url}: {why}", status, url)
    if status == 503:
        return ProbeError(
            "engine_dead",
            f"503 Service Unavailable from {url}: vLLM's engine is dead (EngineDeadError), its API server exits "
            f"next; the vLLM log's first error is the cause{': ' + excerpt if excerpt else ''}",
            status,
            url,
        )
    if status >= 500:
        return ProbeError("server_error", f"{status} {reason} from {url}: {excerpt}", status, url)
    if status == 404 and "model" in excerpt.lower():
        return ProbeError("wrong_model", f"404 from {url}: {excerpt}", status, url)
    return ProbeError("client_error", f"{status} {reason} from {url}: {excerpt}", status, url)


def _headers(api_key: str | None, json_body: bool) -> dict:
    headers = {"Accept": "*/*", "User-Agent": "sparkops-openai-probe"}
    if json_body:
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def request(
    base_url: str,
    method: str,
    path: str,
    *,
    api_key: str | None = None,
    payload: dict | None = None,
    timeout: float = 30.0,
) -> tuple[int, bytes]:
    """Send one request and read the whole answer; raise ProbeError unless it is 2xx."""
    conn, prefix = _connect(base_url, timeout)
    url = base_url.rstrip("/") + path
    body = json.dumps(payload).encode() if payload is not None else None
    try:
        conn.request(method, prefix + path, body=body, headers=_headers(api_key, body is not None))
        resp = conn.getresponse()
        data = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise _classify_os_error(exc, url, timeout) from exc
    finally:
        conn.close()
    if not 200 <= resp.status < 300:
        raise _classify_status(resp.status, resp.reason, data, url, api_key)
    return resp.status, data


def get_health(base_url: str, timeout: float = 10.0, api_key: str | None = None) -> dict:
    """GET /health: 200 (empty body) while the engine lives, 503 once it is dead; refused before it is up."""
    start = time.monotonic()
    status = request(base_url, "GET", "/health", api_key=api_key, timeout=timeout)[0]
    return {"ok": True, "status": status, "elapsed_s": round(time.monotonic() - start, 3)}


def _json(data: bytes, url: str) -> dict:
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ProbeError("malformed", f"{url} did not answer JSON: {_excerpt(data)}", url=url) from exc
    if not isinstance(doc, dict):
        raise ProbeError("malformed", f"{url} answered JSON that is not an object: {_excerpt(data)}", url=url)
    return doc


def list_models(base_url: str, api_key: str | None = None, timeout: float = 10.0) -> list[dict]:
    """GET /v1/models; return the `data` entries (each has at least `id`)."""
    url = base_url.rstrip("/") + "/v1/models"
    data = request(base_url, "GET", "/v1/models", api_key=api_key, timeout=timeout)[1]
    doc = _json(data, url)
    entries = doc.get("data")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "id" in e for e in entries):
        raise ProbeError("malformed", f"{url} has no list of models with ids under 'data': {_excerpt(data)}", url=url)
    return entries


def require_model(entries: list[dict], model: str, base_url: str) -> dict:
    """Return the entry serving `model`, or raise wrong_model naming what is served."""
    for entry in entries:
        if entry.get("id") == model:
            return entry
    served = [e.get("id") for e in entries]
    raise ProbeError("wrong_model", f"model {model!r} not served by {base_url}; served: {served}")


def _iter_sse_events(resp, deadline: float, url: str):
    """Yield the `data` payload of each server-sent event (multi-line data joined by newlines)."""
    data_lines: list[str] = []
    while True:
        if time.monotonic() > deadline:
            raise ProbeError("timeout", f"stream from {url} did not finish before the deadline", url=url)
        raw = resp.readline()
        if not raw:
            if data_lines:
                yield "\n".join(data_lines)
            return
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data_lines:
                yield "\n".join(data_lines)
                data_lines = []
            continue
        if line.startswith(":"):
            continue  # SSE comment / keep-alive
        field, _sep, value = line.partition(":")
        if field == "data":
            data_lines.append(value[1:] if value.startswith(" ") else value)


def _chunk_text(chunk: dict) -> str:
    text = ""
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            # Reasoning models stream their thinking first; it is generated output too.
            for key in ("content", "reasoning_content", "reasoning"):
                if isinstance(delta.get(key), str):
                    text += delta[key]
        elif isinstance(choice.get("text"), str):  # /v1/completions
            text += choice["text"]
    return text


def stream_chat(
    base_url: str,
    model: str,
    *,
    prompt: str = "Say hello.",
    max_tokens: int = 16,
    api_key: str | None = None,
    timeout: float = 60.0,
) -> dict:
    """POST /v1/chat/completions with stream=true and measure it.

    ttft_s: request sent -> first chunk with generated text.
    tok_s: decode rate, (completion_tokens - 1) / (last token - first token): the first
    token is what TTFT measures, so it is not counted in the decode interval.
    completion_tokens comes from the usage chunk (stream_options.include_usage); if the
    server sends none, the number of text chunks stands in (usage_reported False).
    """
    url = base_url.rstrip("/") + "/v1/chat/completions"
    payload = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    conn, prefix = _connect(base_url, timeout)
    start = time.monotonic()
    deadline = start + timeout
    try:
        try:
            conn.request(
                "POST",
                prefix + "/v1/chat/completions",
                body=json.dumps(payload).encode(),
                headers=_headers(api_key, True),
            )
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise _classify_os_error(exc, url, timeout) from exc
        if resp.status != 200:
            try:
                body = resp.read()
            except (OSError, http.client.HTTPException):
                body = b""
            raise _classify_status(resp.status, resp.reason, body, url, api_key)
        ctype = resp.getheader("Content-Type", "")
        if "text/event-stream" not in ctype:
            raise ProbeError(
                "malformed",
                f"{url} answered {ctype or 'no Content-Type'} to stream=true, "
                f"not text/event-stream: {_excerpt(resp.read())}",
                url=url,
            )
        first = last = None
        chunks = text_chunks = 0
        text = ""
        usage = None
        done = False
        try:
            for data in _iter_sse_events(resp, deadline, url):
                if data.strip() == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except ValueError as exc:
                    raise ProbeError(
                        "malformed", f"{url} streamed a chunk that is not JSON: {_excerpt(data)}", url=url
                    ) from exc
                if not isinstance(chunk, dict):
                    raise ProbeError("malformed", f"{url} streamed a non-object chunk: {_excerpt(data)}", url=url)
                if "error" in chunk:
                    raise ProbeError("server_error", f"{url} streamed an error: {_excerpt(json.dumps(chunk))}", url=url)
                if "choices" not in chunk:
                    raise ProbeError(
                        "malformed", f"{url} streamed a chunk without 'choices': {_excerpt(data)}", url=url
                    )
                chunks += 1
                piece = _chunk_text(chunk)
                if piece:
                    now = time.monotonic()
                    first = now if first is None else first
                    last = now
                    text_chunks += 1
                    text += piece
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
        except TimeoutError as exc:
            raise ProbeError("timeout", f"stream from {url} stalled for more than {timeout:g} s", url=url) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise ProbeError("server_error", f"stream from {url} broke off: {exc!r}", url=url) from exc
    finally:
        conn.close()
    end = time.monotonic()
    if not done:
        raise ProbeError("malformed", f"stream from {url} ended without 'data: [DONE]' after {chunks} chunks", url=url)
    if first is None:
        raise ProbeError("malformed", f"stream from {url} carried no generated text in {chunks} chunks", url=url)
    usage_ok = isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int)
    completion_tokens = usage["completion_tokens"] if usage_ok else text_chunks
    decode_s = (last or first) - first
    tok_s = (completion_tokens - 1) / decode_s if completion_tokens > 1 and decode_s > 0 else None
    return {
        "ok": True,
        "ttft_s": round(first - start, 4),
        "tok_s": round(tok_s, 2) if tok_s is not None else None,
        "completion_tokens": completion_tokens,
        "prompt_tokens": usage.get("prompt_tokens") if usage_ok else None,
        "usage_reported": usage_ok,
        "chunks": chunks,
        "text": text[:EXCERPT_CHARS],
        "elapsed_s": round(end - start, 4),
    }


# --- Prometheus text ---------------------------------------------------------------

_SAMPLE_RE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?\s*$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Prometheus text exposition -> {metric name: [(labels, value), ...]}; bad lines are skipped."""
    out: dict[str, list[tuple[dict, float]]] = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        labels = {}
        for key, raw in _LABEL_RE.findall(m.group("labels") or ""):
            labels[key] = raw.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        out.setdefault(m.group("name"), []).append((labels, value))
    return out


def _sum(samples: dict, *names: str) -> float | None:
    """Sum over label sets of the first of `names` that is present (newer name first)."""
    for name in names:
        values = [v for _labels, v in samples.get(name, []) if not math.isnan(v)]
        if values:
            return sum(values)
    return None


def _mean(samples: dict, *names: str) -> float | None:
    for name in names:
        values = [v for _labels, v in samples.get(name, []) if not math.isnan(v)]
        if values:
            return sum(values) / len(values)
    return None


def parse_vllm_metrics(text: str) -> dict:
    """Pick vLLM's serving numbers out of /metrics text; a metric that is absent is None.

    Counters and request gauges are summed over label sets (engines, data-parallel ranks);
    kv_cache_usage is a fraction (0..1), so it is averaged over engines instead.
    Newer names are preferred; older vLLM names are the fallback:
      kv cache:     vllm:kv_cache_usage_perc        <- vllm:gpu_cache_usage_perc
      prefix cache: vllm:prefix_cache_{queries,hits}_total <- vllm:gpu_prefix_cache_{queries,hits}_total
                    (hit rate only: vllm:gpu_prefix_cache_hit_rate, V0)
    """
    s = parse_prometheus(text)
    queries = _sum(s, "vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
    hits = _sum(s, "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
    if queries:
        hit_rate = (hits or 0.0) / queries
    else:
        hit_rate = _mean(s, "vllm:gpu_prefix_cache_hit_rate")
        if hit_rate is not None and hit_rate < 0:
            hit_rate = None  # V0 reports -1 while prefix caching is off or nothing was queried
    running = _sum(s, "vllm:num_requests_running")
    waiting = _sum(s, "vllm:num_requests_waiting")
    prompt = _sum(s, "vllm:prompt_tokens_total")
    generation = _sum(s, "vllm:generation_tokens_total")
    models = sorted({lab["model_name"] for series in s.values() for lab, _value in series if "model_name" in lab})
    return {
        "num_requests_running": int(running) if running is not None else None,
        "num_requests_waiting": int(waiting) if waiting is not None else None,
        "kv_cache_usage": _mean(s, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "prefix_cache_queries": int(queries) if queries is not None else None,
        "prefix_cache_hits": int(hits) if hits is not None else None,
        "prefix_cache_hit_rate": round(hit_rate, 4) if hit_rate is not None else None,
        "prompt_tokens_total": int(prompt) if prompt is not None else None,
        "generation_tokens_total": int(generation) if generation is not None else None,
        "model_names": models,
        "vllm_metrics_found": any(name.startswith("vllm:") for name in s),
    }


def get_metrics(base_url: str, timeout: float = 10.0, api_key: str | None = None) -> dict:
    """GET /metrics and parse it; malformed if it carries no vllm: metric at all."""
    url = base_url.rstrip("/") + "/metrics"
    data = request(base_url, "GET", "/metrics", api_key=api_key, timeout=timeout)[1]
    parsed = parse_vllm_metrics(data.decode("utf-8", "replace"))
    if not parsed["vllm_metrics_found"]:
        raise ProbeError("malformed", f"{url} carries no vllm: metrics: {_excerpt(data)}", url=url)
    return parsed
