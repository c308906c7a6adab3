"""Start-up phases of a vLLM deployment, read from the containers' own logs.

`docker logs --timestamps` prefixes every line with the daemon's RFC 3339 time, so the phases get
absolute times even though vLLM's own log prefix has no year. The markers are vLLM 0.19.0's log
lines (read from the release's source; see docs/cold-start.md for file and line):

  weights_loading   "Starting to load model"                  v1/worker/gpu_model_runner.py
  weights_loaded    "Loading weights took" / "Model loading took"  model_loader/default_loader.py,
                                                                   v1/worker/gpu_model_runner.py
  torch_compile     compiled and the first profiling/warmup run done, in every compile mode:
                    AOT compile on (the default with torch >= 2.10, envs.py:285-297):
                    "Initial profiling/warmup run took"         compilation/monitor.py:77
                    (after "torch.compile took %.2f s in total", monitor.py:20,48);
                    AOT compile off: "torch.compile and initial profiling/warmup run together took"
                                                                compilation/decorators.py:605-608
  cuda_graphs       "Graph capturing finished in"              v1/worker/gpu_model_runner.py
  engine_ready      "init engine (profile, create kv cache, warmup model) took"  v1/engine/core.py
  api_ready         "Application startup complete."            uvicorn, after vLLM's app starts
Ray's "Ray runtime started." (ray 2.52.1 scripts/scripts.py) marks Ray ready on the head.
With tensor parallelism every rank logs its own line; the LAST one is when all ranks are done (the
vLLM container runs with RAY_DEDUP_LOGS=0, or Ray's driver would hold the second rank's line back).
Under vLLM's own multi-node executor (mp) a rank on another node runs `vllm serve --headless` in that
node's container and logs there, not through the head (no Ray driver gathers worker output): those
containers' logs come as rank_logs, and their lines count like the head's.
Whether torch.compile reused its cache: hit when a start loads it, "Directly load the compiled
graph(s)" (compilation/backends.py:286; AOT off, and AOT on with torch 2.10/2.11 where the AOT
artifact's graphs are loaded again, caching.py:367-388) or "Directly load AOT compilation from path"
(compilation/decorators.py:303-305; the only one with torch >= 2.12.0.dev's mega-AOT artifact,
envs.py:300-307, caching.py:317-337); miss when any graph was compiled, "Compiling a graph for
compile range" (compilation/backends.py:391), which wins: that start paid for compiling.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

# (phase, markers, which occurrence: first or last)
VLLM_MARKERS = [
    ("weights_loading", ("Starting to load model",), "first"),
    ("weights_loaded", ("Loading weights took", "Model loading took"), "last"),
    (
        "torch_compile",
        ("Initial profiling/warmup run took", "torch.compile and initial profiling/warmup run together took"),
        "last",
    ),
    ("cuda_graphs", ("Graph capturing finished in",), "last"),
    ("engine_ready", ("init engine (profile, create kv cache, warmup model) took",), "last"),
    ("api_ready", ("Application startup complete.",), "first"),
]
RAY_MARKER = "Ray runtime started."
CACHE_HIT = ("Directly load the compiled graph", "Directly load AOT compilation from path")
CACHE_MISS = ("Compiling a graph for compile range",)
# What the vLLM test double of the simulated cluster does not go through: it runs in a container,
# needs the real Ray cluster, serves the API and streams tokens, and prints vLLM 0.19.0's compile
# lines (from a compile cache it keeps where vLLM keeps its own), but it loads no weights onto a GPU,
# captures no CUDA graph and has no engine core.
NOT_IN_TEST_DOUBLE = {"weights_loading", "weights_loaded", "cuda_graphs", "engine_ready"}
ORDER = [
    "container_start",
    "ray_ready",
    "weights_loading",
    "weights_loaded",
    "torch_compile",
    "cuda_graphs",
    "engine_ready",
    "api_ready",
    "first_token",
]
_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)\s?(.*)$")


def parse_ts(text: str) -> datetime | None:
    """An RFC 3339 time as Docker writes it (nanoseconds, Z or an offset); None if it is not one."""
    m = _TS.match((text or "").strip())
    if not m:
        return None
    # Python 3.10's fromisoformat (pyproject's floor) takes neither "Z" nor a nanosecond fraction.
    at = datetime.fromisoformat(m.group(1) + m.group(3).replace("Z", "+00:00"))
    return at.replace(microsecond=int((m.group(2) or "0")[:6].ljust(6, "0"))).astimezone(timezone.utc)


def _timed_lines(text: str):
    for line in (text or "").splitlines():
        m = _TS.match(line)
        if m:
            yield parse_ts(line), m.group(4)


def _find(lines, markers, which):
    hits = [(ts, msg) for ts, msg in lines if any(mk in msg for mk in markers)]
    if not hits:
        return None
    return hits[0] if which == "first" else hits[-1]


def _rank_logs(rank_logs) -> list[tuple[str, str]]:
    """(host, log) for each other rank: {host, log} dicts, or the loop results of `docker logs` over the
    deployment's members ({item: {host}, stdout, stderr}). A rank whose log could not be read is left out."""
    out = []
    for entry in rank_logs or []:
        if not isinstance(entry, dict):
            raise ValueError(f"rank_logs entries must be mappings, not {type(entry).__name__}")
        if "log" in entry:
            host, log = entry.get("host"), entry.get("log")
        else:
            if entry.get("rc") not in (0, None) or entry.get("skipped"):
                continue
            host = (entry.get("item") or {}).get("host")
            log = f"{entry.get('stdout') or ''}\n{entry.get('stderr') or ''}"
        out.append((str(host or "another node"), str(log or "")))
    return out


def startup_phases(
    vllm_log: str,
    vllm_started_at: str,
    ray_log: str = "",
    first_token_at: str | None = None,
    test_double: bool = False,
    *,
    rank_logs=None,
) -> dict:
    """Phases of the last start: {phases: [{phase, at, since_start_s, source, note}], compile_cache}.

    vllm_log / ray_log: `docker logs --timestamps` of the vLLM and the head's Ray container.
    vllm_started_at: `docker inspect` .State.StartedAt of the vLLM container.
    first_token_at: when the first streamed token of the smoke completion arrived (RFC 3339).
    rank_logs: the other ranks' vLLM container logs under vLLM's own multi-node executor (see _rank_logs);
    their lines of this start (at or after the head's StartedAt: a headless rank waits for the head's
    rendezvous before it loads anything) count like the head's, so "last" is the last rank's.
    A phase not found says why: "not applicable (test double)" or "not seen in the logs".
    """
    start = parse_ts(vllm_started_at)
    if start is None:
        raise ValueError(f"vllm_started_at is not an RFC 3339 time: {vllm_started_at!r}")
    # stdout and stderr come from docker separately: order by time (stable for equal times).
    # `docker logs` of a restarted container holds every earlier run too: only the lines this
    # start wrote (at or after StartedAt) describe it.
    tagged = [(ts, m, "vLLM container log") for ts, m in _timed_lines(vllm_log) if ts >= start]
    for host, log in _rank_logs(rank_logs):
        tagged += [(ts, m, f"vLLM container log on {host}") for ts, m in _timed_lines(log) if ts >= start]
    tagged.sort(key=lambda tl: tl[0])
    lines = [(ts, m) for ts, m, _src in tagged]
    found: dict[str, tuple[datetime, str, str]] = {"container_start": (start, "docker inspect StartedAt", "")}
    for phase, markers, which in VLLM_MARKERS:
        hits = [(ts, m, src) for ts, m, src in tagged if any(mk in m for mk in markers)]
        if hits:
            ts, msg, src = hits[0] if which == "first" else hits[-1]
            found[phase] = (ts, src, msg.strip()[:160])
    # Ray may come up before the vLLM container (a negative offset is normal); the Ray start this
    # vLLM start used is the last one before its API was ready (a later one belongs to a later start).
    ray_until = found["api_ready"][0] if "api_ready" in found else None
    ray_lines = sorted(_timed_lines(ray_log), key=lambda tl: tl[0])
    ray = _find([tl for tl in ray_lines if ray_until is None or tl[0] <= ray_until], (RAY_MARKER,), "last")
    if ray:
        found["ray_ready"] = (ray[0], "Ray container log", ray[1].strip()[:160])
    first = parse_ts(first_token_at) if first_token_at else None
    if first:
        found["first_token"] = (first, "smoke completion (streamed)", "")
    phases = []
    for phase in ORDER:
        if phase in found:
            at, source, line = found[phase]
            phases.append(
                {
                    "phase": phase,
                    "at": at.isoformat().replace("+00:00", "Z"),
                    "since_start_s": round((at - start).total_seconds(), 3),
                    "source": source,
                    "note": line,
                }
            )
        else:
            if test_double and phase in NOT_IN_TEST_DOUBLE:
                why = "not applicable (test double)"
            elif phase == "first_token":
                why = "not measured (vLLM was not started by this run)"
            else:
                why = "not seen in the logs"
            phases.append({"phase": phase, "at": None, "since_start_s": None, "source": None, "note": why})
    msgs = [m for _ts, m in lines]
    if any(mk in m for m in msgs for mk in CACHE_MISS):
        cache = "miss"
    elif any(mk in m for m in msgs for mk in CACHE_HIT):
        cache = "hit"
    else:
        cache = "not seen in the logs"
    return {"container_started_at": vllm_started_at.strip(), "phases": phases, "compile_cache": cache}


class FilterModule:
    def filters(self):
        return {"startup_phases": startup_phases}
