# Copyright: sparkops maintainers
# Apache-2.0
"""Wait for a vLLM server to answer, with an absolute deadline, one round at a time.

Runs on the API host (vllm_serve_wait). Readiness is the server's own answers, asked as vllm_health
asks them (openai_probe: /health, /v1/models naming the served model, a streamed completion). While
it does not answer, the vLLM container's state and last log lines say whether waiting longer is
pointless: a container that has stopped (exited, dead, never started, being removed, or gone) will
not answer, since its restart policy is not bringing it back (Docker shows such a container as
`restarting`). A restart count above zero is history: a vLLM that crash-looped and then came up
is ready.

One call is one round: it returns after about `round_s` with done=False so the playbook can print
progress, and the next call gets the same `deadline`, so calling again cannot wait longer than it.
Pure Python with injected clock, sleep, probe and container reader: tested without Ansible, Docker
or vLLM (tests/unit/plugins/module_utils/test_vllm_wait.py).
"""

from __future__ import annotations

import time

from ansible_collections.sparkops.cluster.plugins.module_utils.openai_probe import (
    RETRYABLE_KINDS,
    ProbeError,
    get_health,
    list_models,
    require_model,
    stream_chat,
)

# Docker's states (`docker inspect` .State.Status) in which the container runs no vLLM and nothing
# restarts it; `unknown` is sparkops's name for a container docker cannot inspect (gone).
STOPPED_STATUSES = frozenset({"exited", "dead", "created", "removing", "unknown"})
# Failures that waiting may cure: a server not yet listening or answering (openai_probe's retryable
# kinds), a dead engine (vLLM 0.19.0's API server exits right after, and the container then reads
# exited), and other 5xx while the app comes up. A wrong key, a wrong model name or an answer that is
# not OpenAI's stays wrong however long one waits.
WAITABLE_KINDS = RETRYABLE_KINDS | {"engine_dead", "server_error"}
LOG_TAIL_READ = 40  # lines read from `docker logs` each round
LOG_TAIL_SHOWN = 15  # lines quoted in a failure message
INSPECT_FORMAT = "{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}"

FIX_HINTS = {
    "unauthorized": "the API key the role passes (vllm_serve_api_key) is not the one vLLM was started with; "
    "run serve.yml again so both come from the same key file",
    "wrong_model": "vLLM serves another --served-model-name than the profile's served_model_name; "
    "run serve.yml again so the container is started from the current profile",
    "client_error": "the server refused the request; check vllm_serve_smoke_prompt and vllm_serve_smoke_max_tokens",
    "malformed": "what answers at the replica's endpoint is not vLLM's OpenAI server; check vllm_serve_host and "
    "vllm_serve_port (plan.yml prints each replica's endpoint)",
}


def probe_ready(
    base_url: str, model: str, *, api_key: str | None, prompt: str, max_tokens: int, timeout: float
) -> dict:
    """Ask /health, /v1/models and a streamed completion, as vllm_health's checks do; raise ProbeError.

    `timeout` bounds the three together (each request gets what is left, at least half a second).
    Returns vllm_health's result keys: checks (per check, elapsed_s included), ttft_s, tok_s,
    completion_tokens.
    """
    checks: dict = {}
    t0 = time.monotonic()

    def left() -> float:
        return max(0.5, t0 + timeout - time.monotonic())

    checks["health"] = get_health(base_url, timeout=left())
    t1 = time.monotonic()
    found = require_model(list_models(base_url, api_key=api_key, timeout=left()), model, base_url)
    # Milliseconds, as vllm_health reports them: a figure's precision, which no verdict depends on.
    models_s = round(time.monotonic() - t1, 3)  # pragma: no mutate
    checks["models"] = {"ok": True, "model": found.get("id"), "elapsed_s": models_s}
    t2 = time.monotonic()
    chat = stream_chat(base_url, model, prompt=prompt, max_tokens=max_tokens, api_key=api_key, timeout=left())
    chat.pop("text", None)  # the model's words are not needed to judge readiness
    chat.setdefault("elapsed_s", round(time.monotonic() - t2, 3))  # pragma: no mutate
    checks["completion"] = chat
    return {
        "checks": checks,
        "ttft_s": chat.get("ttft_s"),
        "tok_s": chat.get("tok_s"),
        "completion_tokens": chat.get("completion_tokens"),
    }


def parse_inspect(rc: int, out: str) -> dict:
    """`docker inspect --format INSPECT_FORMAT` output -> status, exit_code, restarts (None when unknown)."""
    fields = out.split() if rc == 0 else []

    def num(i: int) -> int | None:
        try:
            return int(fields[i])
        except (IndexError, ValueError):
            return None

    return {"status": fields[0] if fields else "unknown", "exit_code": num(1), "restarts": num(2)}


def read_container(run, docker: str, name: str) -> dict:
    """The container's state and last log lines; `run(argv) -> (rc, stdout, stderr)`."""
    rc, out, _err = run([docker, "inspect", "--format", INSPECT_FORMAT, name])
    state = parse_inspect(rc, out)
    rc, out, err = run([docker, "logs", "--tail", str(LOG_TAIL_READ), name])
    # vLLM logs to stderr, which `docker logs` gives back on stderr; its stdout lines come first.
    lines = [line for line in (out.splitlines() + err.splitlines()) if line.strip()]
    state["log_tail"] = lines[-LOG_TAIL_READ:]
    return state


def _num(value) -> str:
    return "?" if value is None else str(value)


def _log_block(state: dict) -> str:
    lines = state.get("log_tail") or ["(no log lines)"]
    return "".join(f"  {line}\n" for line in lines[-LOG_TAIL_SHOWN:])


def stopped_message(host: str, name: str, state: dict) -> str:
    return (
        f"vLLM on {host} stopped without answering: container {name} is {state['status']} "
        f"(exit code {_num(state['exit_code'])}, {_num(state['restarts'])} restarts). Its last log lines:\n"
        f"{_log_block(state)}Full log: docker logs {name} on {host}."
    )


def deadline_message(host: str, name: str, timeout_s: float, last_error: str, state: dict) -> str:
    return (
        f"vLLM on {host} did not answer within {timeout_s:g} s ({last_error}); container "
        f"{state['status']} ({_num(state['restarts'])} restarts). Its last log lines:\n"
        f"{_log_block(state)}Full log: docker logs {name} on {host}."
    )


def progress_message(host: str, elapsed: float, state: dict, kind: str) -> str:
    last = (state.get("log_tail") or ["(none)"])[-1]
    if len(last) > 200:
        last = last[:197] + "..."
    return (
        f"vLLM on {host}: starting after {elapsed:.0f} s of waiting; container {state['status']} "
        f"(exit code {_num(state['exit_code'])}, {_num(state['restarts'])} restarts); API: {kind}; last log: {last}"
    )


def wait_round(
    *,
    probe,
    container,
    host: str,
    name: str,
    started: float,
    timeout_s: float,
    round_s: float,
    clock=time.time,
    sleep=time.sleep,
    backoff=(2.0, 2.0, 10.0),
) -> dict:
    """One round of the wait. `probe(timeout) -> dict` raises ProbeError; `container() -> dict`.

    The deadline is started + timeout_s, fixed by the caller: a round never runs past it, and a
    round begun after it asks once (at most a second) and fails. Returns a dict with done, failed,
    ready, msg, elapsed_s, probes, container (None when never read), failure_kind and the probe's
    keys when ready.
    """
    deadline = started + timeout_s
    round_end = min(clock() + round_s, deadline)
    wait, factor, max_wait = backoff
    result = {"done": False, "failed": False, "ready": False, "probes": 0, "container": None, "failure_kind": None}

    def finish(**kw) -> dict:
        result.update(kw)
        result["elapsed_s"] = round(clock() - started, 1)
        return result

    while True:
        result["probes"] += 1
        try:
            answer = probe(max(1.0, min(20.0, deadline - clock())))
        except ProbeError as err:
            kind, last_error = err.kind, f"{err.kind}: {err.message}"
        else:
            result.update(answer)
            return finish(
                done=True,
                ready=True,
                msg=f"vLLM on {host}: READY after {clock() - started:.0f} s of waiting; "
                f"ttft {answer.get('ttft_s')} s, {answer.get('tok_s')} tok/s",
            )
        result["failure_kind"] = kind
        result["last_error"] = last_error
        if kind not in WAITABLE_KINDS:
            hint = FIX_HINTS[kind]  # every other kind has one (test_every_kind_is_waited_on_or_has_a_fix)
            return finish(
                done=True,
                failed=True,
                msg=f"vLLM on {host} answers, but not as a ready server ({last_error}): {hint}. "
                f"Full log: docker logs {name} on {host}.",
            )
        state = container()
        result["container"] = state
        if state["status"] in STOPPED_STATUSES:
            return finish(done=True, failed=True, msg=stopped_message(host, name, state))
        now = clock()
        if now >= deadline:
            return finish(done=True, failed=True, msg=deadline_message(host, name, timeout_s, last_error, state))
        if now >= round_end:
            return finish(msg=progress_message(host, now - started, state, kind))
        sleep(min(wait, round_end - now))
        wait = min(wait * factor, max_wait)
