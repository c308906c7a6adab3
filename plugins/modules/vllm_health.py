#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_health
short_description: Check that a vLLM OpenAI-compatible server is up and actually generating
description:
  - Asks a vLLM server (or any OpenAI-compatible server) in up to four ways, in this order -
    C(GET /health), C(GET /v1/models) (the expected served model must be listed), a short streamed
    C(POST /v1/chat/completions) that measures time to first token and decode tokens per second,
    and C(GET /metrics) (vLLM's Prometheus metrics, parsed).
  - A health check that only asks C(/health) does not see an engine that hangs while the API
    answers; the timed completion does. Keep C(completion) in I(checks) for that reason.
  - With I(retry_until_healthy), failures that go away on their own (connection refused, as vLLM 0.19.0 refuses
    until its engine is up; timeouts; a connection reset) are retried with exponential backoff until
    I(timeout_s) is spent; wrong keys, wrong models, malformed answers and a dead engine fail at once.
  - A 503 means a dead engine (C(engine_dead)); vLLM 0.19.0 answers C(/health) 503 only for EngineDeadError
    (C(entrypoints/serve/instrumentator/health.py)), and its API server exits right after.
  - Read-only; never changes anything. The API key never appears in results, messages or the
    progress file.
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
    description:
      - Served model name expected in C(/v1/models) (C(--served-model-name)), also used for the completion.
      - Required when I(checks) contains C(models) or C(completion).
    type: str
  checks:
    description: Which checks to run; they always run in the order health, models, completion, metrics.
    type: list
    elements: str
    choices: [health, models, completion, metrics]
    default: [health, models, completion, metrics]
  prompt:
    description: User message sent in the test completion.
    type: str
    default: "Count from one to twenty in words."
  max_tokens:
    description: Tokens to generate in the test completion; at least 2 to measure a decode rate.
    type: int
    default: 16
  timeout_s:
    description: Deadline for the whole module run, retries and waits included, in seconds.
    type: float
    default: 60
  request_timeout_s:
    description:
      - Timeout of one HTTP request (for the completion, of the whole stream).
      - Capped by what is left of I(timeout_s).
    type: float
    default: 30
  retry_until_healthy:
    description: Retry transient failures (refused, unreachable, timeout) until I(timeout_s) is spent.
    type: bool
    default: false
  initial_delay_s:
    description: Seconds to wait before the first attempt (counts against I(timeout_s)).
    type: float
    default: 0
  backoff:
    description: Exponential backoff between attempts when I(retry_until_healthy) is set.
    type: dict
    default: {}
    suboptions:
      initial_s:
        description: First wait between attempts, in seconds.
        type: float
        default: 2
      factor:
        description: Each wait is the previous one times this.
        type: float
        default: 2
      max_s:
        description: Cap on one wait, in seconds.
        type: float
        default: 30
  min_tok_s:
    description: Fail (kind C(too_slow)) if the measured decode rate is below this many tokens per second.
    type: float
  progress_file:
    description:
      - Path of a file to which one JSON line per attempt is appended,
        C({"time", "elapsed_s", "attempt", "phase", "kind", "message"}), so a playbook can show
        progress while this module waits (for example with a parallel C(tail)).
    type: path
extends_documentation_fragment:
  - sparkops.cluster.attributes
  - sparkops.cluster.attributes.read_only
notes:
  - Target side needs only the Python standard library.
  - I(tok_s) is (completion_tokens - 1) / (time of last token - time of first token).
"""

EXAMPLES = r"""
- name: Wait up to 20 minutes for vLLM to load and serve
  sparkops.cluster.vllm_health:
    base_url: "http://{{ sparkops_head_ip }}:8000"
    api_key: "{{ sparkops_vllm_api_key }}"
    model: qwen3-235b
    retry_until_healthy: true
    timeout_s: 1200
    initial_delay_s: 30
    backoff: {initial_s: 5, max_s: 30}
    progress_file: /tmp/sparkops-vllm-health.jsonl
    min_tok_s: 10
  register: vllm

- name: Only ask /health and /metrics
  sparkops.cluster.vllm_health:
    base_url: http://10.0.0.1:8000
    checks: [health, metrics]
"""

RETURN = r"""
healthy:
  description: Whether every requested check passed.
  returned: always
  type: bool
checks:
  description: One entry per requested check, with C(ok), C(elapsed_s) and on failure C(kind) and C(message).
  returned: always
  type: dict
  sample: {"health": {"ok": true, "status": 200, "elapsed_s": 0.002}}
models:
  description: Model ids listed by C(/v1/models).
  returned: always
  type: list
  elements: str
ttft_s:
  description: Seconds from sending the completion to the first generated token.
  returned: always (null without a completion)
  type: float
tok_s:
  description: Decode rate of the test completion, tokens per second.
  returned: always (null without a completion)
  type: float
completion_tokens:
  description: Tokens generated by the test completion (from the usage chunk).
  returned: always (null without a completion)
  type: int
metrics:
  description:
    - Parsed C(/metrics) - num_requests_running, num_requests_waiting, kv_cache_usage (fraction),
      prefix_cache_queries, prefix_cache_hits, prefix_cache_hit_rate, prompt_tokens_total,
      generation_tokens_total, model_names; a metric the server does not export is null.
  returned: always (empty without the metrics check)
  type: dict
attempts:
  description: Attempts made.
  returned: always
  type: int
elapsed_s:
  description: Seconds the module ran.
  returned: always
  type: float
failure_kind:
  description:
    - Null when healthy, else one of refused, unreachable, timeout, engine_dead, unauthorized, wrong_model,
      server_error, client_error, malformed, too_slow.
  returned: always
  type: str
"""

import datetime
import json
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.openai_probe import (
    RETRYABLE_KINDS,
    ProbeError,
    get_health,
    get_metrics,
    list_models,
    require_model,
    stream_chat,
)

CHECK_ORDER = ("health", "models", "completion", "metrics")


class _Run:
    def __init__(self, module: AnsibleModule):
        self.module = module
        self.p = module.params
        self.api_key = self.p["api_key"] or None
        self.start = time.monotonic()
        self.deadline = self.start + self.p["timeout_s"]
        self.result = {
            "changed": False,
            "healthy": False,
            "checks": {},
            "models": [],
            "ttft_s": None,
            "tok_s": None,
            "completion_tokens": None,
            "metrics": {},
            "attempts": 0,
            "elapsed_s": 0.0,
            "failure_kind": None,
        }

    def scrub(self, text: str) -> str:
        if self.api_key and text:
            text = text.replace(self.api_key, "********")
        return text

    def elapsed(self) -> float:
        return round(time.monotonic() - self.start, 3)

    def progress(self, phase: str, kind: str, message: str) -> None:
        path = self.p["progress_file"]
        if not path:
            return
        line = {
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "elapsed_s": self.elapsed(),
            "attempt": self.result["attempts"],
            "phase": phase,
            "kind": kind,
            "message": self.scrub(message),
        }
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")
        except OSError as exc:
            self.module.warn(f"cannot append to progress_file {path}: {exc}")
            self.p["progress_file"] = None

    def req_timeout(self) -> float:
        return max(0.5, min(self.p["request_timeout_s"], self.deadline - time.monotonic()))

    def run_check(self, name: str) -> None:
        p, base, t0 = self.p, self.p["base_url"], time.monotonic()
        if name == "health":
            entry = get_health(base, timeout=self.req_timeout())
        elif name == "models":
            entries = list_models(base, api_key=self.api_key, timeout=self.req_timeout())
            self.result["models"] = [e.get("id") for e in entries]
            found = require_model(entries, p["model"], base)
            entry = {
                "ok": True,
                "model": found.get("id"),
                "root": found.get("root"),
                "max_model_len": found.get("max_model_len"),
            }
        elif name == "completion":
            entry = stream_chat(
                base,
                p["model"],
                prompt=p["prompt"],
                max_tokens=p["max_tokens"],
                api_key=self.api_key,
                timeout=self.req_timeout(),
            )
            entry["text"] = self.scrub(entry["text"])
            for key in ("ttft_s", "tok_s", "completion_tokens"):
                self.result[key] = entry[key]
            if p["min_tok_s"] is not None and (entry["tok_s"] is None or entry["tok_s"] < p["min_tok_s"]):
                raise ProbeError(
                    "too_slow",
                    f"decode rate {entry['tok_s']} tok/s from {base} is below "
                    f"min_tok_s={p['min_tok_s']:g} ({entry['completion_tokens']} tokens, "
                    f"TTFT {entry['ttft_s']} s)",
                )
        else:
            entry = {"ok": True, **get_metrics(base, timeout=self.req_timeout())}
            self.result["metrics"] = {k: v for k, v in entry.items() if k not in ("ok", "vllm_metrics_found")}
        entry.setdefault("elapsed_s", round(time.monotonic() - t0, 3))
        self.result["checks"][name] = entry

    def fail(self, err: ProbeError, phase: str) -> None:
        r = self.result
        r["failure_kind"] = err.kind
        r["elapsed_s"] = self.elapsed()
        msg = self.scrub(err.message)
        if r["attempts"] > 1 or self.p["retry_until_healthy"]:
            msg += f" (after {r['attempts']} attempts in {r['elapsed_s']:.0f} s)"
        hints = {
            "refused": "is vLLM running on that address and port? It refuses connections until its engine is up "
            "(minutes): raise timeout_s or set retry_until_healthy",
            "engine_dead": "vLLM's engine died and does not recover; its API server exits with status 0 (a restart "
            "policy on-failure does not restart it): the first error in the vLLM container's log is the cause; "
            "the watchdog or site.yml starts serving again",
            "timeout": "the server or network is slow or hung; check the vLLM log",
        }
        if err.kind in hints:
            msg += f": {hints[err.kind]}"
        self.module.fail_json(msg=f"vllm_health {phase} check failed [{err.kind}]: {msg}", **r)

    def go(self) -> None:
        p = self.p
        checks = [c for c in CHECK_ORDER if c in p["checks"]]
        delay = min(p["initial_delay_s"], max(0.0, self.deadline - time.monotonic()))
        if delay > 0:
            self.progress("wait", "initial_delay", f"waiting {delay:g} s before the first attempt")
            time.sleep(delay)
        wait = p["backoff"]["initial_s"]
        while True:
            self.result["attempts"] += 1
            self.result["checks"] = {}
            phase = checks[0] if checks else "none"
            try:
                for phase in checks:
                    self.run_check(phase)
            except ProbeError as err:
                self.result["checks"][phase] = {"ok": False, "kind": err.kind, "message": self.scrub(err.message)}
                self.progress(phase, err.kind, err.message)
                remaining = self.deadline - time.monotonic()
                if p["retry_until_healthy"] and err.kind in RETRYABLE_KINDS and remaining > 0.05:
                    time.sleep(min(wait, remaining))
                    wait = min(wait * p["backoff"]["factor"], p["backoff"]["max_s"])
                    if time.monotonic() < self.deadline:
                        continue
                self.fail(err, phase)
                return
            break
        self.result["healthy"] = True
        self.result["elapsed_s"] = self.elapsed()
        summary = ", ".join(f"{k}={self.result[k]}" for k in ("ttft_s", "tok_s") if self.result[k] is not None)
        self.progress("done", "healthy", f"all checks passed ({', '.join(checks)}) {summary}".strip())
        self.module.exit_json(**self.result)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "model": {"type": "str"},
            "checks": {"type": "list", "elements": "str", "choices": list(CHECK_ORDER), "default": list(CHECK_ORDER)},
            "prompt": {"type": "str", "default": "Count from one to twenty in words."},
            "max_tokens": {"type": "int", "default": 16, "no_log": False},  # a count, not a secret
            "timeout_s": {"type": "float", "default": 60},
            "request_timeout_s": {"type": "float", "default": 30},
            "retry_until_healthy": {"type": "bool", "default": False},
            "initial_delay_s": {"type": "float", "default": 0},
            "backoff": {
                "type": "dict",
                "default": {},
                "options": {
                    "initial_s": {"type": "float", "default": 2},
                    "factor": {"type": "float", "default": 2},
                    "max_s": {"type": "float", "default": 30},
                },
            },
            "min_tok_s": {"type": "float"},
            "progress_file": {"type": "path"},
        },
        supports_check_mode=True,
    )
    p = module.params
    p["base_url"] = p["base_url"].rstrip("/")
    if p["base_url"].endswith("/v1"):
        module.fail_json(msg=f"base_url {p['base_url']!r} ends in /v1; give the server root, e.g. http://10.0.0.1:8000")
    if not p["base_url"].startswith(("http://", "https://")):
        module.fail_json(msg=f"base_url {p['base_url']!r} must start with http:// or https://")
    if not p["checks"]:
        module.fail_json(msg="checks is empty; name at least one of health, models, completion, metrics")
    if {"models", "completion"} & set(p["checks"]) and not p["model"]:
        module.fail_json(msg="model is required for the models and completion checks (the --served-model-name)")
    if p["timeout_s"] <= 0 or p["request_timeout_s"] <= 0:
        module.fail_json(msg="timeout_s and request_timeout_s must be greater than 0")
    if "completion" in p["checks"] and p["max_tokens"] < 1:
        module.fail_json(msg="max_tokens must be at least 1 (2 or more to measure tok_s)")
    b = p["backoff"]
    if b["initial_s"] < 0 or b["factor"] < 1 or b["max_s"] < b["initial_s"]:
        module.fail_json(msg="backoff needs initial_s >= 0, factor >= 1 and max_s >= initial_s")
    _Run(module).go()


if __name__ == "__main__":
    main()
