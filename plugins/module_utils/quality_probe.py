# Copyright: sparkops maintainers
# Apache-2.0
"""Quality canary for a vLLM server: is it answering RIGHT, not only answering? No judge model needed.

Runs on the nodes (the module vllm_quality imports it; the watchdog may copy it and run it as a script:
`python3 quality_probe.py --base-url URL --model NAME --api-key-file F [--baseline F]`), so it uses the
Python standard library only and never imports the rest of the collection.

Two kinds of request, all POST /v1/completions, all greedy (temperature 0, fixed seed):

  passage       REFERENCE_PASSAGE with max_tokens 1 and prompt_logprobs 0: vLLM returns the log-probability
                the model gives to every token of the passage, so its mean (nats per token) and perplexity
                measure the model itself. Garbage weights, a wrong quantization path, a wrong tokenizer or
                a broken kernel move it by nats (a uniform guess over a 32k-150k vocabulary is -10.4 to
                -11.9 nats per token); a healthy restart moves it by hundredths at most.
  known answers a few-shot "Q: ...\\nA:" prompt per question (arithmetic, a fixed fact, a JSON object that
                must parse), stop at the newline, max_tokens small.

vLLM 0.19.0 (the official wheel, vllm-0.19.0-cp38-abi3-manylinux_2_31_x86_64.whl) accepts and answers:
  - CompletionRequest.prompt_logprobs: int | None (vllm/entrypoints/openai/completion/protocol.py:83),
    seed (:60), temperature (:65), max_tokens (:57), stop (:61); prompt_logprobs >= 0 or -1 and only
    without stream (check_logprobs, protocol.py:384-397); passed to SamplingParams (protocol.py:254-256, :312).
  - with prompt_logprobs set, the prefix cache is not read for that request
    (vllm/sampling_params.py:421-425): the whole passage is computed every time.
  - CompletionResponseChoice.prompt_logprobs: list[dict[int, Logprob] | None] | None (protocol.py:469),
    filled from the request's output (completion/serving.py:527); JSON turns the int keys into strings.
  - the first element is None: there is no logprob for the first prompt token
    (vllm/logprobs.py:162-167, create_prompt_logprobs).
  - each later element is {token id: Logprob}: the prompt token itself with its rank, then the top
    prompt_logprobs tokens with ranks 1..k (vllm/logprobs.py:175-205, append_logprobs_for_next_position;
    vllm/v1/engine/logprobs.py:117-178); with prompt_logprobs 0 that is exactly the prompt token.
  - Logprob is {logprob: float, rank: int | None, decoded_token: str | None} (vllm/logprobs.py:12-25);
    -inf is sent as -9999.0 (clamp_prompt_logprobs, vllm/entrypoints/openai/engine/serving.py:985-997).
  - usage.prompt_tokens (vllm/entrypoints/openai/engine/protocol.py:104-107) counts every prompt token.

Everything the server sends is untrusted: sizes are bounded, types checked, and garbage is reported in
the figures' `errors`, never raised as a crash. Transport failures (refused, timeout, 401, 5xx) raise
QualityError with a kind, as module_utils/openai_probe.py's ProbeError does: they are the health
check's business, not a quality verdict.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import socket
import ssl
import sys
import time
from urllib.parse import urlsplit

PROBE_VERSION = 1

# Abraham Lincoln, the Gettysburg Address (1863), the Bliss copy's first two paragraphs: public domain.
REFERENCE_PASSAGE = (
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in "
    "Liberty, and dedicated to the proposition that all men are created equal. Now we are engaged in a great "
    "civil war, testing whether that nation, or any nation so conceived and so dedicated, can long endure. We "
    "are met on a great battle-field of that war. We have come to dedicate a portion of that field, as a final "
    "resting place for those who here gave their lives that that nation might live. It is altogether fitting "
    "and proper that we should do this."
)
PASSAGE_SHA256 = hashlib.sha256(REFERENCE_PASSAGE.encode()).hexdigest()[:16]

# The few shots every known-answer prompt starts with: they fix the format for base and instruct models
# alike (no chat template, so no thinking block eats the tokens) and end each answer at a newline.
FEW_SHOT = (
    "Q: What is 2 + 3?\nA: 5\n"
    "Q: What is the capital of Italy?\nA: Rome\n"
    'Q: Write the JSON object whose key "a" is 1.\nA: {"a": 1}\n'
)
KNOWN_ANSWERS = (
    {"name": "arithmetic", "question": "What is 17 + 25?", "expect": "42", "check": "word", "max_tokens": 6},
    {"name": "fact", "question": "What is the capital of France?", "expect": "Paris", "check": "word", "max_tokens": 6},
    {
        "name": "json",
        "question": 'Write the JSON object whose key "answer" is 42.',
        "expect": {"answer": 42},
        "check": "json",
        "max_tokens": 12,
    },
)
SEED = 1234

# Judging. A healthy restart moves the passage's mean log-likelihood by well under 0.01 nats per token
# (bf16 kernels that are not batch-invariant: last digits only); a quantization or attention-backend change
# of a healthy model by a few hundredths; garbage weights, a wrong tokenizer or a broken kernel by nats
# (towards -ln(vocabulary), -10.4 for 32k tokens). 0.25 nats (perplexity x1.28) sits ten times above the
# first and thirty times below the last; plugin_utils/quality.py proposes a tighter one from measured runs.
DEFAULT_TOLERANCE_NATS = 0.25
# Without a baseline: below this a model is guessing (perplexity e^6 ~ 400 on plain English prose;
# healthy models score this passage between about -0.3 and -3).
ABSOLUTE_FLOOR_NATS = -6.0

MAX_RESPONSE_BYTES = 4 * 1024 * 1024
MAX_POSITIONS = 4096  # the passage is ~100-130 tokens in any tokenizer; more is not our answer
MAX_ENTRIES_PER_POSITION = 64
EXCERPT_CHARS = 120
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


class QualityError(Exception):
    """A transport-level failure (the server did not answer a request properly): `kind` is one of KINDS."""

    def __init__(self, kind: str, message: str, status: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status


def excerpt(data, limit: int = EXCERPT_CHARS) -> str:
    """One line of at most `limit` characters of untrusted text (bytes or anything printable)."""
    if isinstance(data, bytes):
        text = data[: limit * 4].decode("utf-8", "replace")
    else:
        text = data if isinstance(data, str) else repr(data)
    text = " ".join(text[: limit * 4].split())
    return text if len(text) <= limit else text[:limit] + "..."


# --- requests -------------------------------------------------------------------------------------


def known_answer_prompt(question: str) -> str:
    return f"{FEW_SHOT}Q: {question}\nA:"


def build_requests(model: str, seed: int = SEED) -> list[tuple[str, dict]]:
    """The probe's requests, in order: ("passage", body), then (known answer name, body); all for
    POST /v1/completions."""
    passage = {
        "model": model,
        "prompt": REFERENCE_PASSAGE,
        "max_tokens": 1,
        "temperature": 0,
        "seed": seed,
        "prompt_logprobs": 0,
    }
    out = [("passage", passage)]
    for spec in KNOWN_ANSWERS:
        out.append(
            (
                spec["name"],
                {
                    "model": model,
                    "prompt": known_answer_prompt(spec["question"]),
                    "max_tokens": spec["max_tokens"],
                    "temperature": 0,
                    "seed": seed,
                    "stop": ["\n"],
                },
            )
        )
    return out


# --- parsing (pure) -------------------------------------------------------------------------------


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _doc(data: bytes) -> tuple[dict | None, str | None]:
    if not isinstance(data, (bytes, bytearray)):
        return None, "the answer is not bytes"
    if len(data) > MAX_RESPONSE_BYTES:
        return None, f"the answer is larger than {MAX_RESPONSE_BYTES} bytes"
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None, f"the answer is not JSON: {excerpt(data)}"
    if not isinstance(doc, dict):
        return None, f"the answer is JSON but not an object: {excerpt(data)}"
    return doc, None


def _first_choice(doc: dict) -> tuple[dict | None, str | None]:
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None, f"the answer has no choices[0] object: {excerpt(json.dumps(doc)[:2000])}"
    return choices[0], None


def _usage(doc: dict, key: str) -> int | None:
    usage = doc.get("usage")
    if isinstance(usage, dict):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**9:
            return value
    return None


def parse_passage(data: bytes) -> dict:
    """The passage answer -> {mean_logprob, perplexity, prompt_tokens, scored_tokens, top1_fraction,
    min_logprob, error}; every figure None and `error` set when the answer is not usable."""
    out = {
        "mean_logprob": None,
        "perplexity": None,
        "prompt_tokens": None,
        "scored_tokens": 0,
        "top1_fraction": None,
        "min_logprob": None,
        "completion_tokens": None,
        "error": None,
    }
    doc, err = _doc(data)
    choice = None
    if doc is not None:
        choice, err = _first_choice(doc)
    if err:
        out["error"] = err
        return out
    out["prompt_tokens"] = _usage(doc, "prompt_tokens")
    out["completion_tokens"] = _usage(doc, "completion_tokens")
    plp = choice.get("prompt_logprobs")
    if plp is None:
        out["error"] = (
            "choices[0].prompt_logprobs is missing: the server ignored prompt_logprobs (not vLLM, or a vLLM "
            "without it); the passage cannot be scored"
        )
        return out
    if not isinstance(plp, list):
        out["error"] = f"choices[0].prompt_logprobs is a {type(plp).__name__}, not a list"
        return out
    if len(plp) > MAX_POSITIONS:
        out["error"] = f"choices[0].prompt_logprobs has {len(plp)} positions, more than {MAX_POSITIONS}"
        return out
    ids = choice.get("prompt_token_ids")
    ids = ids if isinstance(ids, list) and len(ids) == len(plp) else None
    values: list[float] = []
    ranks: list[int] = []
    problems: list[str] = []
    for pos, entry in enumerate(plp):
        if entry is None:
            if pos:
                problems.append(f"position {pos} has no logprob")
            continue
        if not isinstance(entry, dict) or not entry or len(entry) > MAX_ENTRIES_PER_POSITION:
            problems.append(f"position {pos} is not a small {{token id: logprob}} object: {excerpt(entry)}")
            continue
        if len(entry) == 1:
            item = next(iter(entry.values()))
        elif ids is not None and str(ids[pos]) in entry:
            item = entry[str(ids[pos])]
        else:
            problems.append(f"position {pos} has {len(entry)} tokens and no prompt_token_ids to pick the prompt's")
            continue
        lp = item.get("logprob") if isinstance(item, dict) else None
        if not _number(lp) or lp > 1e-3 or lp < -1e4:
            problems.append(f"position {pos} has no logprob between -10000 and 0: {excerpt(item)}")
            continue
        values.append(float(lp))
        rank = item.get("rank")
        if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 1:
            ranks.append(rank)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        out["error"] = "choices[0].prompt_logprobs is malformed: " + "; ".join(problems[:3]) + more
        return out
    if not values:
        out["error"] = "choices[0].prompt_logprobs scores no token"
        return out
    mean = sum(values) / len(values)
    out.update(
        mean_logprob=round(mean, 6),
        perplexity=round(math.exp(min(-mean, 700.0)), 4),
        scored_tokens=len(values),
        min_logprob=round(min(values), 4),
        top1_fraction=round(sum(1 for r in ranks if r == 1) / len(ranks), 4) if len(ranks) == len(values) else None,
    )
    if out["prompt_tokens"] is None:
        out["prompt_tokens"] = len(plp)
    return out


def parse_completion(data: bytes) -> tuple[str | None, str | None, int | None]:
    """A known-answer answer -> (text, error, completion_tokens); text bounded to 400 characters."""
    doc, err = _doc(data)
    choice = None
    if doc is not None:
        choice, err = _first_choice(doc)
    if err:
        return None, err, None
    text = choice.get("text")
    if not isinstance(text, str):
        return None, f"choices[0].text is not a string: {excerpt(choice)}", _usage(doc, "completion_tokens")
    return text[:400], None, _usage(doc, "completion_tokens")


def check_answer(spec: dict, text: str) -> bool:
    """Does the answer's first line say what `spec` expects?"""
    line = text.strip().split("\n", 1)[0].strip() if isinstance(text, str) else ""
    if spec["check"] == "word":
        words = line.split()
        return bool(words) and words[0].strip(".,;:!\"'").lower() == str(spec["expect"]).lower()
    if spec["check"] == "json":
        start = line.find("{")
        if start < 0:
            return False
        try:
            value, _end = json.JSONDecoder().raw_decode(line[start:])
        except (ValueError, RecursionError):
            return False
        return value == spec["expect"]
    return False


def figures_from(passage: dict, answers: dict) -> dict:
    """The probe's figures from parse_passage's dict and {name: {"ok", "got"[, "error"]}}."""
    errors = [f"passage: {passage['error']}"] if passage.get("error") else []
    errors += [f"{name}: {a['error']}" for name, a in answers.items() if a.get("error")]
    return {
        "probe_version": PROBE_VERSION,
        "passage_sha256": PASSAGE_SHA256,
        "mean_logprob": passage.get("mean_logprob"),
        "perplexity": passage.get("perplexity"),
        "prompt_tokens": passage.get("prompt_tokens"),
        "scored_tokens": passage.get("scored_tokens", 0),
        "top1_fraction": passage.get("top1_fraction"),
        "min_logprob": passage.get("min_logprob"),
        "known_answers": answers,
        "errors": errors,
    }


# --- judging (pure) -------------------------------------------------------------------------------


def _mean_of(figures) -> float | None:
    value = figures.get("mean_logprob") if isinstance(figures, dict) else None
    return float(value) if _number(value) else None


def baseline_figures(stored):
    """The figures in a baseline file: either the figures themselves, or a record that holds them under
    "figures" (the watchdog's file, {"key", "recorded", "figures"}), so the record is read where it lies."""
    if isinstance(stored, dict) and "mean_logprob" not in stored and isinstance(stored.get("figures"), dict):
        return stored["figures"]
    return stored


def judge(figures: dict, baseline: dict | None = None, tolerance: float = DEFAULT_TOLERANCE_NATS) -> dict:
    """Verdict on `figures` (from probe()), against `baseline` (the figures of the first verified
    deployment of this model revision and stack) when given.

    Returns {"ok": bool, "reasons": [str], "compared": bool, "delta_mean_logprob": float | None,
    "tolerance": float}; `reasons` says what is wrong (empty when ok) and, when not compared, why not.
    """
    reasons: list[str] = []
    notes: list[str] = []
    ok = True
    figures = figures if isinstance(figures, dict) else {}
    for err in (figures.get("errors") or [])[:5]:
        ok = False
        reasons.append(f"the probe's answer is unusable: {excerpt(err, 300)}")
    mean = _mean_of(figures)
    if mean is None:
        ok = False
        if not figures.get("errors"):
            reasons.append("no mean log-likelihood of the reference passage was measured")
    elif mean < ABSOLUTE_FLOOR_NATS:
        ok = False
        reasons.append(
            f"mean log-likelihood of the reference passage {mean:.3f} nats/token (perplexity "
            f"{figures.get('perplexity')}) is below {ABSOLUTE_FLOOR_NATS} whatever the baseline: the model is "
            f"guessing (garbage weights, wrong tokenizer, broken kernel or quantization path)"
        )
    answers = figures.get("known_answers") if isinstance(figures.get("known_answers"), dict) else {}
    base_answers = {}
    compared = False
    delta = None
    if baseline is not None:
        if not isinstance(baseline, dict) or _mean_of(baseline) is None:
            notes.append("the baseline has no mean_logprob: not compared (record one from a verified deployment)")
        elif baseline.get("probe_version") != PROBE_VERSION or baseline.get("passage_sha256") != PASSAGE_SHA256:
            notes.append(
                f"the baseline was recorded by another probe (version {baseline.get('probe_version')!r}, passage "
                f"{baseline.get('passage_sha256')!r}; this is version {PROBE_VERSION}, passage {PASSAGE_SHA256}): "
                f"not compared; record a new baseline from a verified deployment"
            )
        else:
            compared = True
            base_answers = baseline.get("known_answers") if isinstance(baseline.get("known_answers"), dict) else {}
            bt, ft = baseline.get("prompt_tokens"), figures.get("prompt_tokens")
            if isinstance(bt, int) and isinstance(ft, int) and bt != ft:
                ok = False
                reasons.append(
                    f"the reference passage is {ft} tokens now and was {bt} in the baseline: another tokenizer "
                    f"(wrong model or tokenizer files) answers"
                )
            if mean is not None:
                base = _mean_of(baseline)
                delta = round(mean - base, 6)
                if abs(delta) > tolerance:
                    ok = False
                    way = "lower" if delta < 0 else "higher"
                    reasons.append(
                        f"mean log-likelihood of the reference passage is {mean:.4f} nats/token, {abs(delta):.4f} "
                        f"{way} than the baseline's {base:.4f} (tolerance {tolerance:g}; perplexity "
                        f"{figures.get('perplexity')} vs {baseline.get('perplexity')})"
                    )
    for name, got in sorted(answers.items()):
        if not isinstance(got, dict) or got.get("ok") is True:
            continue
        was = base_answers.get(name) if compared else None
        if compared and isinstance(was, dict) and was.get("ok") is not True:
            notes.append(f"known answer {name!r} is wrong, as it was in the baseline (not counted)")
            continue
        ok = False
        reasons.append(
            f"known answer {name!r} is wrong: got {excerpt(got.get('got', ''), 80)!r}"
            + (" (right in the baseline)" if compared else "")
        )
    return {
        "ok": ok,
        "reasons": reasons + notes,
        "compared": compared,
        "delta_mean_logprob": delta,
        "tolerance": tolerance,
    }


# --- transport ------------------------------------------------------------------------------------


def _classify(exc: BaseException, url: str, timeout: float) -> QualityError:
    if isinstance(exc, ConnectionRefusedError):
        return QualityError("refused", f"connection refused by {url}")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return QualityError("timeout", f"no answer from {url} within {timeout:g} s")
    if isinstance(exc, socket.gaierror):
        return QualityError("unreachable", f"cannot resolve the host of {url}: {exc}")
    if isinstance(exc, ssl.SSLError):
        return QualityError("malformed", f"TLS error talking to {url}: {exc}")
    return QualityError("unreachable", f"cannot reach {url}: {exc!r}")


def _status_error(status: int, body: bytes, url: str, api_key: str | None) -> QualityError:
    text = excerpt(body, 300)
    if api_key:
        text = text.replace(api_key, "********")
    if status in (401, 403):
        why = "the API key is wrong" if api_key else "no API key was given but the server requires one"
        return QualityError("unauthorized", f"{status} from {url}: {why}", status)
    if status == 503:
        return QualityError("engine_dead", f"503 from {url}: vLLM's engine is dead (EngineDeadError): {text}", status)
    if status == 404 and "model" in text.lower():
        return QualityError("wrong_model", f"404 from {url}: {text}", status)
    if status >= 500:
        return QualityError("server_error", f"{status} from {url}: {text}", status)
    return QualityError("client_error", f"{status} from {url}: {text}", status)


def post_completion(base_url: str, body: dict, api_key: str | None, timeout: float) -> bytes:
    """POST /v1/completions; the 2xx body (at most MAX_RESPONSE_BYTES + 1 bytes read) or QualityError."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base_url {base_url!r} is not an http:// or https:// URL with a host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if parts.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname, port, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(parts.hostname, port, timeout=timeout)
    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"Content-Type": "application/json", "User-Agent": "sparkops-quality-probe"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        conn.request("POST", parts.path.rstrip("/") + "/v1/completions", json.dumps(body).encode(), headers)
        resp = conn.getresponse()
        data = resp.read(MAX_RESPONSE_BYTES + 1)
    except (OSError, http.client.HTTPException) as exc:
        raise _classify(exc, url, timeout) from exc
    finally:
        conn.close()
    if not 200 <= resp.status < 300:
        raise _status_error(resp.status, data, url, api_key)
    return data


def probe(
    base_url: str, model: str, *, api_key: str | None = None, timeout: float = 30.0, seed: int = SEED, post=None
) -> dict:
    """Run the whole probe: {"figures": figures_from(...), "cost": {"requests", "prompt_tokens",
    "completion_tokens", "seconds"}}. Raises QualityError on a transport failure; `post` (the same
    signature as post_completion) lets callers swap the transport."""
    post = post or post_completion
    start = time.monotonic()
    passage: dict = {}
    answers: dict = {}
    prompt_tokens = completion_tokens = 0
    requests = build_requests(model, seed)
    specs = {s["name"]: s for s in KNOWN_ANSWERS}
    for name, body in requests:
        data = post(base_url, body, api_key, timeout)
        if name == "passage":
            passage = parse_passage(data)
            prompt_tokens += passage["prompt_tokens"] or 0
            completion_tokens += passage["completion_tokens"] or 0
            continue
        text, err, used = parse_completion(data)
        completion_tokens += used or 0
        doc, _doc_err = _doc(data)
        prompt_tokens += (_usage(doc, "prompt_tokens") or 0) if doc else 0
        if err:
            answers[name] = {"ok": False, "got": "", "error": err}
        else:
            answers[name] = {"ok": check_answer(specs[name], text), "got": excerpt(text, 80)}
    return {
        "figures": figures_from(passage, answers),
        "cost": {
            "requests": len(requests),
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "seconds": round(time.monotonic() - start, 3),
        },
    }


# --- script ---------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """`quality_probe.py --base-url URL --model NAME [--api-key-file F] [--baseline F] [--tolerance T]
    [--timeout S]`: one JSON line {figures, cost, verdict} or {error_kind, error}; exit 0 when the verdict
    is ok, 1 when it is not, 2 on a transport failure or bad arguments. The key is read from a file, never
    from argv."""
    import argparse  # noqa: PLC0415 - only the script needs it

    parser = argparse.ArgumentParser(prog="quality_probe.py")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key-file")
    parser.add_argument("--baseline", help='JSON file holding the baseline figures, bare or under "figures"')
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE_NATS)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    try:
        api_key = None
        if args.api_key_file:
            with open(args.api_key_file, encoding="utf-8") as fh:
                api_key = fh.read().strip() or None
        baseline = None
        if args.baseline and os.path.exists(args.baseline):
            with open(args.baseline, encoding="utf-8") as fh:
                baseline = baseline_figures(json.load(fh))
        result = probe(args.base_url, args.model, api_key=api_key, timeout=args.timeout)
    except QualityError as exc:
        sys.stdout.write(json.dumps({"error_kind": exc.kind, "error": exc.message}) + "\n")
        return 2
    except (OSError, ValueError) as exc:
        sys.stdout.write(json.dumps({"error_kind": "usage", "error": str(exc)}) + "\n")
        return 2
    result["verdict"] = judge(result["figures"], baseline, args.tolerance)
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0 if result["verdict"]["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
