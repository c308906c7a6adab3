#!/usr/bin/env python3
"""Does an interactive client keep its speed while a batch key fires 16 parallel streams? Measured in one run.

Against a running gateway (roles/gateway) with two client keys made by playbooks/keys.yml: one `interactive`, one
`batch`. Three phases, one after another:

1. **alone**: the interactive client sends its requests one after another (streaming, greedy) and nothing else runs:
   time to first token and tokens/s per request.
2. **batch beside it**: the batch key's job (a fixed number of requests) runs on 16 parallel streams that retry what
   is refused (429: they wait what Retry-After says) or stopped; the interactive client sends the same requests as in
   phase 1 meanwhile. The batch job's wall time is measured to its end.
3. **batch alone**: the same batch job with no interactive client: the time it takes when nobody waits.

It prints, for the interactive client, tok/s per request (mean) and TTFT p95 in each phase, and the ratios of
phase 2 to phase 1; for the batch job, its 429s (with the Retry-After values seen), the streams stopped for an
interactive request and its wall time in phases 2 and 3. Run it once with the batch key's class `batch` (the
gateway's limits at work) and once with that key made `interactive` with no limit (`keys.yml -e
sparkops_key_class=interactive`): the second run shows what 16 streams do to the interactive client without them.

    python3 benchmarks/gateway_admission.py --gateway http://192.168.213.11:4000 \\
        --interactive-key .sim/credentials/keys/bench-inter --batch-key .sim/credentials/keys/bench-batch
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

PROMPT = "Count slowly from one to forty, one number per line."


def stream(url: str, key: str, model: str, max_tokens: int, timeout: float = 120) -> dict:
    """One streaming chat completion: {status, ttft, tok_s, tokens, retry_after, stopped}."""
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    t0 = time.monotonic()
    first = last = None
    tokens = 0
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the URL given on the command line
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return {"status": 200, "stopped": True, "tokens": tokens}
                delta = (event.get("choices") or [{}])[0].get("delta") or {}
                if delta.get("content"):
                    now = time.monotonic()
                    first = first or now
                    last = now
                    tokens += 1
    except urllib.error.HTTPError as err:
        return {"status": err.code, "retry_after": err.headers.get("Retry-After"), "tokens": 0}
    rate = (tokens - 1) / (last - first) if tokens > 1 and last > first else None
    return {"status": 200, "ttft": (first - t0) if first else None, "tok_s": rate, "tokens": tokens, "stopped": False}


def p95(values: list[float]) -> float:
    """Linear between the order statistics (numpy's default): one slow request of twelve moves it."""
    return statistics.quantiles(values, n=20, method="inclusive")[18] if len(values) > 1 else values[0]


def interactive_run(args, key: str) -> dict:
    results = [stream(args.gateway, key, args.model, args.max_tokens) for _ in range(args.requests)]
    served = [r for r in results if r["status"] == 200 and r.get("tok_s")]
    missed = [r for r in served if r["tok_s"] < args.slo_tok_s or r["ttft"] > args.slo_ttft_s]
    return {
        "requests": len(results),
        "served": len(served),
        "tok_s": statistics.mean(r["tok_s"] for r in served) if served else 0.0,
        "tok_s_min": min((r["tok_s"] for r in served), default=0.0),
        "ttft_p95": p95([r["ttft"] for r in served]) if served else float("inf"),
        "missed": len(missed) + len(results) - len(served),
        "ttfts": [round(r["ttft"], 3) for r in served],
    }


def batch_job(args, key: str, out: dict, deadline: float) -> None:
    """args.batch_requests requests over args.streams parallel streams, each retried until served whole."""
    todo = list(range(args.batch_requests))
    lock = threading.Lock()
    out.update(done=0, refused=0, stopped=0, retry_after=set(), started=time.monotonic())

    def worker():
        while time.monotonic() < deadline:
            with lock:
                if not todo:
                    return
                todo.pop()
            while time.monotonic() < deadline:
                res = stream(args.gateway, key, args.model, args.batch_max_tokens)
                if res["status"] == 429:
                    with lock:
                        out["refused"] += 1
                        out["retry_after"].add(res.get("retry_after"))
                    time.sleep(min(float(res.get("retry_after") or 1), 10))
                    continue
                if res.get("stopped"):
                    with lock:
                        out["stopped"] += 1
                    continue
                with lock:
                    out["done"] += 1
                break

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    out["wall_s"] = time.monotonic() - out["started"]


def batch_process(args, key: str, bound_s: float) -> dict:
    out: dict = {}
    batch_job(args, key, out, time.monotonic() + bound_s)
    out["retry_after"] = sorted(map(str, out["retry_after"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", required=True, help="the gateway's client URL, without /v1")
    parser.add_argument("--interactive-key", required=True, type=Path, help="file holding the interactive key")
    parser.add_argument("--batch-key", required=True, type=Path, help="file holding the batch key")
    parser.add_argument("--model", default="sim-tiny", help="the served model name")
    parser.add_argument("--requests", type=int, default=12, help="the interactive client's requests per phase")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--streams", type=int, default=16, help="the batch job's parallel streams")
    parser.add_argument("--batch-requests", type=int, default=24, help="the batch job's requests")
    parser.add_argument("--batch-max-tokens", type=int, default=128, help="each batch request's tokens")
    parser.add_argument("--slo-tok-s", type=float, default=10.0, help="tokens/s per user the SLO asks")
    parser.add_argument("--slo-ttft-s", type=float, default=2.0, help="the first token's time the SLO allows")
    parser.add_argument("--bound-s", type=float, default=600, help="the longest a batch job may run")
    args = parser.parse_args()
    inter = args.interactive_key.read_text().strip()
    batch = args.batch_key.read_text().strip()

    alone = interactive_run(args, inter)
    time.sleep(6)  # past the gateway's quiet time (5 s by default): the batch job's first stream is admitted
    # The batch job in a process of its own: its 16 threads never hold the interactive client's interpreter lock
    # while that one waits for its first token.
    with multiprocessing.get_context("fork").Pool(1) as pool:
        pending = pool.apply_async(batch_process, (args, batch, args.bound_s))
        time.sleep(3)  # a batch stream is in flight (and the others refused) when the interactive client starts
        beside = interactive_run(args, inter)
        job = pending.get(args.bound_s + 60)
        time.sleep(6)  # past the gateway's quiet time after the last interactive request
        solo = pool.apply(batch_process, (args, batch, args.bound_s))

    print(
        f"interactive client, {args.requests} requests of {args.max_tokens} tokens each phase "
        f"(batch requests: {args.batch_max_tokens} tokens):"
    )
    for name, run in (("alone", alone), ("beside the batch job", beside)):
        print(
            f"  {name:22s} served {run['served']}/{run['requests']}, {run['tok_s']:.2f} tok/s per request "
            f"(slowest {run['tok_s_min']:.2f}), TTFT p95 {run['ttft_p95']:.3f} s, {run['missed']} below the SLO"
        )
    print(f"  TTFT of each request beside the batch job, in order: {beside['ttfts']}")
    print(
        f"  ratio beside/alone: tok/s {beside['tok_s'] / alone['tok_s']:.3f}, TTFT p95 "
        f"{beside['ttft_p95'] / alone['ttft_p95']:.3f} (SLO: {args.slo_tok_s} tok/s, TTFT {args.slo_ttft_s} s)"
    )
    for name, run in (("beside the interactive client", job), ("alone", solo)):
        print(
            f"batch job ({args.batch_requests} requests on {args.streams} streams) {name}: {run['done']} done in "
            f"{run['wall_s']:.1f} s, {run['refused']} refused (429, Retry-After {run['retry_after']}), "
            f"{run['stopped']} stopped for an interactive request"
        )
    print(f"batch job's time beside / alone: {job['wall_s'] / solo['wall_s']:.2f}")


if __name__ == "__main__":
    main()
