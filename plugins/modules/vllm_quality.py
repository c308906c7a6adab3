#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_quality
short_description: Check that a vLLM server answers right, not only that it answers (a quality canary)
description:
  - Scores a fixed public-domain reference passage with vLLM's C(prompt_logprobs) (one C(POST /v1/completions),
    C(max_tokens=1), C(temperature=0)) gives the model's mean log-likelihood of the passage, in nats per token, and its
    perplexity. Garbage weights, a wrong tokenizer, a wrong quantization path or a broken kernel move it by nats
    (towards -ln of the vocabulary size, about -10.4 to -11.9); a healthy restart moves it by hundredths at most.
  - Asks three greedy known-answer questions (C(temperature=0), fixed seed, few-shot, stopped at a newline) -
    arithmetic, a fixed fact, and a JSON object that must parse.
  - Judges the figures - always against an absolute floor (below -6 nats per token the model is guessing), and
    against I(baseline) (the figures this module returned on the first verified deployment of the same model
    revision and stack) with I(tolerance) on the mean log-likelihood; a known answer that was right in the
    baseline and is wrong now fails.
  - The whole probe costs 4 requests, 218 words of prompt (some 250 tokens) and at most 25 generated tokens; the
    passage is computed in full every time (vLLM does not read its prefix cache for a request with
    C(prompt_logprobs)).
  - Read-only. The API key never appears in results or messages.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  base_url:
    description: Server URL without C(/v1), for example C(http://10.0.0.1:8000).
    type: str
    required: true
  api_key:
    description: Bearer key the server was started with (C(--api-key)); omit if it has none.
    type: str
  model:
    description: Served model name (C(--served-model-name)).
    type: str
    required: true
  baseline:
    description:
      - The C(figures) a previous run of this module returned on a verified deployment of the same model revision
        and stack. Omitted, null or empty - the figures are judged against the absolute floor only.
    type: dict
  tolerance:
    description:
      - Largest allowed difference, in nats per token, between the mean log-likelihood now and the baseline's.
      - The default sits far above a healthy restart's spread and far below a broken model's shift; the
        C(sparkops.cluster) controller helper C(plugin_utils/quality.py propose_tolerance) proposes one from
        measured healthy runs.
    type: float
    default: 0.25
  fail_on_wrong:
    description:
      - Fail the task when the verdict is not ok (the figures and verdict are returned either way).
      - Set false where the caller reports the verdict itself (doctor, a watchdog reading).
    type: bool
    default: true
  timeout_s:
    description: Timeout of each of the probe's requests, in seconds.
    type: float
    default: 30
extends_documentation_fragment:
  - sparkops.cluster.attributes
  - sparkops.cluster.attributes.read_only
notes:
  - Target side needs only the Python standard library.
  - Needs a server that returns C(prompt_logprobs) (vLLM; checked against vLLM 0.19.0's OpenAI server).
"""

EXAMPLES = r"""
- name: Record the canary's baseline on the first verified deployment
  sparkops.cluster.vllm_quality:
    base_url: "http://{{ sparkops_head_ip }}:8000"
    api_key: "{{ sparkops_vllm_api_key }}"
    model: qwen3-235b
  register: quality_baseline

- name: Judge the serving model against it
  sparkops.cluster.vllm_quality:
    base_url: "http://{{ sparkops_head_ip }}:8000"
    api_key: "{{ sparkops_vllm_api_key }}"
    model: qwen3-235b
    baseline: "{{ quality_baseline.figures }}"
    tolerance: 0.25
"""

RETURN = r"""
ok:
  description: Whether the verdict is ok.
  returned: always
  type: bool
figures:
  description:
    - What the probe measured - probe_version, passage_sha256 (which probe made them), mean_logprob (nats per
      token), perplexity, prompt_tokens (the passage's, in the model's tokenizer), scored_tokens, top1_fraction
      (share of passage tokens the model ranked first), min_logprob, known_answers
      ({name - {ok, got}}, C(got) cut to 80 characters; C(error) when the answer was unusable), errors (answers
      that were not usable, said in words).
    - Keep them as the baseline of later runs when this deployment is verified.
  returned: when the server answered every request
  type: dict
  sample:
    {"probe_version": 1, "passage_sha256": "380a69210e2152fe", "mean_logprob": -1.796, "perplexity": 6.03,
     "prompt_tokens": 102, "scored_tokens": 101, "top1_fraction": 0.52, "min_logprob": -4.9,
     "known_answers": {"arithmetic": {"ok": true, "got": "42"}}, "errors": []}
verdict:
  description:
    - ok, reasons (what is wrong, in words; also why a baseline was not compared), compared (whether a baseline
      was compared), delta_mean_logprob (now minus baseline, null when not compared), tolerance.
  returned: when the server answered every request
  type: dict
cost:
  description: The probe's cost - requests, prompt_tokens, completion_tokens, seconds.
  returned: always
  type: dict
failure_kind:
  description:
    - Null when ok; C(wrong_answers) when the verdict is not ok; else why a request failed - refused,
      unreachable, timeout, engine_dead, unauthorized, wrong_model, server_error, client_error, malformed;
      C(usage) when the arguments are wrong.
  returned: always
  type: str
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.quality_probe import (
    DEFAULT_TOLERANCE_NATS,
    SEED,
    QualityError,
    judge,
    probe,
)

HINTS = {
    "refused": "is vLLM running on that address and port? It refuses connections until its engine is up",
    "unauthorized": "give the key vLLM was started with (--api-key) as api_key",
    "wrong_model": "give the served model name (--served-model-name) as model",
    "engine_dead": "vLLM's engine died; the first error in the vLLM container's log is the cause",
    "timeout": "the server is slow or hung; check the vLLM log, or raise timeout_s",
    "client_error": "the server refused the probe's request: is it vLLM (prompt_logprobs is vLLM's)?",
}


def _scrub(value, secret: str | None):
    if not secret:
        return value
    if isinstance(value, str):
        return value.replace(secret, "********")
    if isinstance(value, dict):
        return {k: _scrub(v, secret) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, secret) for v in value]
    return value


def run(module: AnsibleModule) -> None:
    p = module.params
    key = p["api_key"] or None
    start = time.monotonic()
    result = {"changed": False, "ok": False, "cost": {}, "failure_kind": None}
    try:
        out = probe(p["base_url"], p["model"], api_key=key, timeout=p["timeout_s"], seed=SEED)
    except QualityError as err:
        result["failure_kind"] = err.kind
        result["cost"] = {"seconds": round(time.monotonic() - start, 3)}
        hint = f": {HINTS[err.kind]}" if err.kind in HINTS else ""
        module.fail_json(msg=_scrub(f"vllm_quality could not probe [{err.kind}]: {err.message}{hint}", key), **result)
        return
    verdict = judge(out["figures"], p["baseline"] or None, p["tolerance"])
    result.update(ok=verdict["ok"], figures=out["figures"], verdict=verdict, cost=out["cost"])
    result = _scrub(result, key)
    if not verdict["ok"]:
        result["failure_kind"] = "wrong_answers"
        if p["fail_on_wrong"]:
            module.fail_json(
                msg=_scrub(
                    f"vllm_quality: {p['model']} at {p['base_url']} answers wrongly: "
                    + "; ".join(verdict["reasons"])
                    + ". The engine answers but its output is not the model's: check the image (kernels, "
                    "quantization path), the weights (hf_cache_manifest verify) and the tokenizer files; a restart "
                    "that does not bring the figures back means the change must be rolled back",
                    key,
                ),
                **result,
            )
            return
    module.exit_json(**result)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "model": {"type": "str", "required": True},
            "baseline": {"type": "dict"},
            "tolerance": {"type": "float", "default": DEFAULT_TOLERANCE_NATS},
            "fail_on_wrong": {"type": "bool", "default": True},
            "timeout_s": {"type": "float", "default": 30},
        },
        supports_check_mode=True,
    )
    p = module.params
    p["base_url"] = p["base_url"].rstrip("/")
    problems = []
    if p["base_url"].endswith("/v1"):
        problems.append(f"base_url {p['base_url']!r} ends in /v1; give the server root, e.g. http://10.0.0.1:8000")
    elif not p["base_url"].startswith(("http://", "https://")):
        problems.append(f"base_url {p['base_url']!r} must start with http:// or https://")
    if not p["model"].strip():
        problems.append("model is empty; give the served model name (--served-model-name)")
    if not p["tolerance"] > 0:
        problems.append(f"tolerance must be more than 0 nats (default {DEFAULT_TOLERANCE_NATS}), not {p['tolerance']}")
    if not p["timeout_s"] > 0:
        problems.append(f"timeout_s must be more than 0, not {p['timeout_s']}")
    base = p["baseline"]
    if base and not (
        isinstance(base.get("mean_logprob"), (int, float)) and not isinstance(base.get("mean_logprob"), bool)
    ):
        problems.append(
            "baseline has no numeric mean_logprob: give the 'figures' a previous vllm_quality run returned on a "
            "verified deployment (or omit baseline)"
        )
    if problems:
        module.fail_json(msg=_scrub("; ".join(problems), p["api_key"]), ok=False, cost={}, failure_kind="usage")
    run(module)


if __name__ == "__main__":
    main()
