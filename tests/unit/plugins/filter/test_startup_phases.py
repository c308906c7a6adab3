# ruff: noqa: E501 - the log lines are kept whole, as vLLM prints them
"""plugins/filter/startup_phases.py on `docker logs --timestamps` text.

The vLLM lines are vLLM 0.19.0's own format strings (vllm-0.19.0 wheel, sha256 2d0e5fae...,
files named in the filter's docstring) filled in as vLLM's logger prints them; the double's lines
are what sim/standin/vllm_test_double.py prints. No real GB10 start was recorded (no Spark here).
"""

from __future__ import annotations

import pytest
from ansible_collections.sparkops.cluster.plugins.filter.startup_phases import (
    FilterModule,
    parse_ts,
    startup_phases,
)

VLLM_COLD = """\
2026-11-23T10:00:01.000000001Z INFO 11-23 10:00:01 [api_server.py:1351] vLLM API server version 0.19.0
2026-11-23T10:00:30.500000000Z (RayWorkerWrapper pid=211, ip=10.0.0.12)\
 INFO 11-23 10:00:30 [gpu_model_runner.py:4736] Starting to load model Qwen/Qwen3-235B-A22B-GPTQ-Int4...
2026-11-23T10:00:31.000000000Z INFO 11-23 10:00:31 [gpu_model_runner.py:4736] Starting to load model Qwen/Qwen3-235B-A22B-GPTQ-Int4...
2026-11-23T10:02:10.000000000Z INFO 11-23 10:02:10 [default_loader.py:385] Loading weights took 98.12 seconds
2026-11-23T10:02:15.250000000Z (RayWorkerWrapper pid=211, ip=10.0.0.12)\
 INFO 11-23 10:02:15 [gpu_model_runner.py:4821] Model loading took 57.61 GiB memory and 104.200000 seconds
2026-11-23T10:02:40.000000000Z INFO 11-23 10:02:40 [backends.py:391] Compiling a graph for compile range (1, 8192) takes 21.33 s
2026-11-23T10:03:20.000000000Z INFO 11-23 10:03:20 [decorators.py:607] torch.compile and initial profiling/warmup run together took 64.20 s in total
2026-11-23T10:04:30.000000000Z INFO 11-23 10:04:30 [gpu_model_runner.py:6047] Graph capturing finished in 70 secs, took 1.52 GiB
2026-11-23T10:04:35.000000000Z INFO 11-23 10:04:35 [core.py:284] init engine (profile, create kv cache, warmup model) took 140.50 seconds
2026-11-23T10:04:40.000000000Z INFO 11-23 10:04:40 [api_server.py:594] Starting vLLM server on http://10.0.0.11:8000
2026-11-23T10:04:41.000000000Z INFO:     Application startup complete.
"""
RAY = """\
2026-11-23T09:59:40.000000000Z Local node IP: 10.0.0.11
2026-11-23T09:59:58.000000000Z Ray runtime started.
"""
DOUBLE = """\
2026-11-23T10:00:01.100000000Z INFO 11-23 10:00:01 [test-double] vLLM API server version 0.0.0 (TEST DOUBLE, not vLLM)
2026-11-23T10:00:03.900000000Z INFO 11-23 10:00:03 [test-double] placement group placed on 2 nodes; GPU workers up
2026-11-23T10:00:03.910000000Z INFO 11-23 10:00:03 [test-double] Compiling a graph for compile range (1, 8192) takes 0.00 s
2026-11-23T10:00:03.920000000Z INFO 11-23 10:00:03 [test-double] saved AOT compiled function to /root/.cache/vllm/torch_compile_cache/torch_aot_compile/f3/r0
2026-11-23T10:00:03.930000000Z INFO 11-23 10:00:03 [test-double] torch.compile took 0.02 s in total
2026-11-23T10:00:03.950000000Z INFO 11-23 10:00:03 [test-double] Initial profiling/warmup run took 0.00 s
2026-11-23T10:00:04.000000000Z INFO 11-23 10:00:04 [test-double] Application startup complete.
"""


def by_phase(result):
    return {p["phase"]: p for p in result["phases"]}


def test_a_cold_start_gives_every_phase_in_order_with_the_last_rank():
    got = startup_phases(VLLM_COLD, "2026-11-23T10:00:00.5Z", RAY, "2026-11-23T10:04:45.25Z")
    p = by_phase(got)
    assert [x["phase"] for x in got["phases"]] == [
        "container_start", "ray_ready", "weights_loading", "weights_loaded", "torch_compile",
        "cuda_graphs", "engine_ready", "api_ready", "first_token",
    ]  # fmt: skip
    assert p["container_start"]["since_start_s"] == 0
    assert p["ray_ready"]["since_start_s"] == -2.5  # Ray came up before the vLLM container
    assert p["weights_loading"]["since_start_s"] == 30.0  # the first rank to start
    assert p["weights_loaded"]["since_start_s"] == 134.75  # the last rank to finish
    assert "Model loading took" in p["weights_loaded"]["note"]
    assert p["torch_compile"]["since_start_s"] == 199.5
    assert p["cuda_graphs"]["since_start_s"] == 269.5
    assert p["engine_ready"]["since_start_s"] == 274.5
    assert p["api_ready"]["since_start_s"] == 280.5
    assert p["first_token"]["since_start_s"] == 284.75
    assert got["compile_cache"] == "miss"


def test_a_warm_start_shows_the_compile_cache_hit():
    warm = VLLM_COLD.replace(
        "Compiling a graph for compile range (1, 8192) takes 21.33 s",
        "Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 2.1 s",
    )
    assert startup_phases(warm, "2026-11-23T10:00:00Z")["compile_cache"] == "hit"


def test_the_test_double_says_which_phases_it_does_not_go_through():
    got = startup_phases(DOUBLE, "2026-11-23T10:00:00.6Z", RAY, "2026-11-23T10:00:04.5Z", test_double=True)
    p = by_phase(got)
    for phase in ("weights_loading", "weights_loaded", "cuda_graphs", "engine_ready"):
        assert p[phase]["at"] is None
        assert p[phase]["note"] == "not applicable (test double)"
    assert p["torch_compile"]["since_start_s"] == 3.35  # the double prints vLLM 0.19.0's AOT-on lines
    assert p["api_ready"]["since_start_s"] == 3.4
    assert p["first_token"]["since_start_s"] == 3.9
    assert got["compile_cache"] == "miss"
    warm = DOUBLE.replace(
        "Compiling a graph for compile range (1, 8192) takes 0.00 s", "Directly load AOT compilation from path /x"
    )
    assert startup_phases(warm, "2026-11-23T10:00:00.6Z", test_double=True)["compile_cache"] == "hit"


def test_a_phase_missing_from_real_logs_is_reported_as_not_seen():
    truncated = "\n".join(VLLM_COLD.splitlines()[:4])
    p = by_phase(startup_phases(truncated, "2026-11-23T10:00:00Z"))
    assert p["cuda_graphs"]["note"] == "not seen in the logs"
    assert p["ray_ready"]["note"] == "not seen in the logs"
    assert p["first_token"]["at"] is None
    assert p["first_token"]["note"] == "not measured (vLLM was not started by this run)"


def test_docker_nanoseconds_and_offsets_parse_and_garbage_is_refused():
    assert parse_ts("2026-11-23T10:00:00.123456789Z").microsecond == 123456
    assert parse_ts("2026-11-23T12:00:00+02:00").hour == 10
    assert parse_ts("yesterday") is None
    with pytest.raises(ValueError, match="RFC 3339"):
        startup_phases("", "not a time")


def test_a_restarted_container_is_read_from_its_last_start_only():
    """`docker logs` of a restarted container holds the earlier runs too (CI: api_ready at -279 s)."""
    earlier = VLLM_COLD.replace("2026-11-23T10:", "2026-11-23T09:")
    ray = RAY + "2026-11-23T10:30:00.000000000Z Ray runtime started.\n"  # a later Ray restart
    got = startup_phases(earlier + VLLM_COLD, "2026-11-23T10:00:00.5Z", ray, "2026-11-23T10:04:45.25Z")
    p = by_phase(got)
    assert p["weights_loading"]["since_start_s"] == 30.0
    assert p["api_ready"]["since_start_s"] == 280.5
    assert all(x["since_start_s"] >= 0 for x in got["phases"] if x["phase"] != "ray_ready" and x["at"])
    assert p["ray_ready"]["since_start_s"] == -2.5  # not the Ray start after this vLLM's API was up
    # The earlier run's compile-cache line does not count for this start.
    hit_then = earlier.replace("Compiling a graph for", "Directly load the compiled graph(s) for")
    assert startup_phases(hit_then + VLLM_COLD, "2026-11-23T10:00:00.5Z")["compile_cache"] == "miss"


# --- every compile mode of vLLM 0.19.0, cold and warm ------------------------------------------------
# Each line is (where vLLM prints it, the format string as it is in the 0.19.0 wheel, the arguments).
# AOT compile is on by default with torch >= 2.10 (vllm/envs.py:285-297; the wheel pins torch==2.10.0)
# and the mega-AOT artifact with torch >= 2.12.0.dev (envs.py:300-307; eugr's image builds on nightly).
PATH_AOT = "/root/.cache/vllm/torch_compile_cache/torch_aot_compile/5b1c0e/rank_0_0/model"
RANGE = "(1, 8192)"  # str(Range): vllm/config/utils.py:375-376
MONITOR_TOOK = ("monitor.py:48", "torch.compile took %.2f s in total", 35.2)  # monitor.py:20, logged at :48
WARMUP_TOOK = ("monitor.py:77", "Initial profiling/warmup run took %.2f s", 3.1)  # monitor.py:77-81
COMPILED = ("backends.py:391", "Compiling a graph for compile range %s takes %.2f s", RANGE, 21.33)  # :390-395
CACHED = ("backends.py:373", "Cache the graph of compile range %s for later use", RANGE)  # backends.py:372-376
SAVED = ("decorators.py:641", "saved AOT compiled function to %s", PATH_AOT)  # decorators.py:640-644
LOADED_GRAPHS = (  # backends.py:285-291 (AOT on with torch 2.10: finalize_loading, caching.py:367-388)
    "backends.py:286",
    "Directly load the compiled graph(s) for compile range %s from the cache, took %.3f s",
    RANGE,
    1.52,
)
LOADED_AOT = ("decorators.py:303", "Directly load AOT compilation from path %s", PATH_AOT)  # :303-305
MEGA = (  # caching.py:332-337, the mega-AOT artifact rebuilt (torch >= 2.12.0.dev)
    "caching.py:332",
    "reconstructed serializable fn from standalone compile artifacts. num_artifacts=%d num_submods=%d",
    49,
    49,
)
TOGETHER = (  # AOT compile off: decorators.py:605-608
    "decorators.py:605",
    "torch.compile and initial profiling/warmup run together took %.2f s in total",
    64.2,
)
MODES = {
    # mode: (compile lines of one rank, in the order vLLM prints them, the cache verdict)
    "aot_off_cold": ([CACHED, COMPILED, TOGETHER], "miss"),
    "aot_off_warm": ([LOADED_GRAPHS, TOGETHER], "hit"),
    "aot_on_cold": ([CACHED, COMPILED, SAVED, MONITOR_TOOK, WARMUP_TOOK], "miss"),
    "aot_on_warm": ([LOADED_GRAPHS, LOADED_AOT, MONITOR_TOOK, WARMUP_TOOK], "hit"),
    "mega_aot_cold": ([CACHED, COMPILED, SAVED, MONITOR_TOOK, WARMUP_TOOK], "miss"),
    "mega_aot_warm": ([MEGA, LOADED_AOT, MONITOR_TOOK, WARMUP_TOOK], "hit"),
}
WORKER = "(RayWorkerWrapper pid=211, ip=10.0.0.12) "  # Ray's prefix on the second rank's lines


def vline(second: int, line: tuple, worker: bool = False) -> str:
    """One line as `docker logs --timestamps` shows vLLM's logger output (vllm/logger.py's format)."""
    where, fmt, *args = line
    at = f"10:{second // 60:02d}:{second % 60:02d}"
    return f"2026-11-23T{at}.000000000Z {WORKER if worker else ''}INFO 11-23 {at} [{where}] {fmt % tuple(args)}"


def start_log(compile_lines: list) -> str:
    """A TP=2 start: rank 0 in the API server's engine, rank 1 behind Ray; rank 1 is always the later."""
    common = [
        (30, ("gpu_model_runner.py:4736", "Starting to load model %s...", "Qwen/Qwen3-235B-A22B-GPTQ-Int4"), False),
        (31, ("gpu_model_runner.py:4736", "Starting to load model %s...", "Qwen/Qwen3-235B-A22B-GPTQ-Int4"), True),
        (130, ("default_loader.py:385", "Loading weights took %.2f seconds", 98.12), False),
        (134, ("default_loader.py:385", "Loading weights took %.2f seconds", 101.0), True),
    ]
    for i, line in enumerate(compile_lines):
        common += [(140 + 10 * i, line, False), (145 + 10 * i, line, True)]
    common += [
        (260, ("gpu_model_runner.py:6047", "Graph capturing finished in %.0f secs, took %.2f GiB", 70, 1.52), False),
        (262, ("gpu_model_runner.py:6047", "Graph capturing finished in %.0f secs, took %.2f GiB", 71, 1.52), True),
        (270, ("core.py:284", "init engine (profile, create kv cache, warmup model) took %.2f seconds", 140.5), False),
    ]
    lines = [vline(t, line, w) for t, line, w in common]
    return "\n".join(lines) + "\n2026-11-23T10:04:41.000000000Z INFO:     Application startup complete.\n"


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_compile_mode_gives_every_phase_and_the_cache_verdict(mode):
    lines, verdict = MODES[mode]
    got = startup_phases(start_log(lines), "2026-11-23T10:00:00Z", RAY, "2026-11-23T10:04:45Z")
    p = by_phase(got)
    assert [x["phase"] for x in got["phases"] if x["at"] is None] == []
    assert got["compile_cache"] == verdict
    # torch_compile ends when the LAST rank has compiled and run its first profiling/warmup pass.
    assert p["torch_compile"]["since_start_s"] == 145 + 10 * (len(lines) - 1)
    assert p["torch_compile"]["note"].startswith(WORKER.strip())
    assert ("Initial profiling/warmup run took" in p["torch_compile"]["note"]) != mode.startswith("aot_off")
    assert p["weights_loaded"]["since_start_s"] == 134  # the second rank, not held back by Ray's dedup
    assert p["cuda_graphs"]["since_start_s"] == 262


def test_a_failed_aot_load_that_recompiles_is_a_miss_and_one_that_reloads_graphs_a_hit():
    """decorators.py:313-317: a stale artifact is compiled again; the graphs may still be in the cache."""
    failed = ("decorators.py:313", "Compiling model again due to a load failure from %s, reason: %s", PATH_AOT, "x")
    recompiled = start_log([failed, CACHED, COMPILED, SAVED, MONITOR_TOOK, WARMUP_TOOK])
    assert startup_phases(recompiled, "2026-11-23T10:00:00Z")["compile_cache"] == "miss"
    reloaded = start_log([failed, LOADED_GRAPHS, SAVED, MONITOR_TOOK, WARMUP_TOOK])
    assert startup_phases(reloaded, "2026-11-23T10:00:00Z")["compile_cache"] == "hit"
    # Some ranges loaded, one compiled: that start paid for compiling.
    partly = start_log([LOADED_GRAPHS, COMPILED, MONITOR_TOOK, WARMUP_TOOK])
    assert startup_phases(partly, "2026-11-23T10:00:00Z")["compile_cache"] == "miss"


def test_compile_done_but_warmup_not_is_not_a_finished_compile_phase():
    """AOT on: `torch.compile took` alone (the start died in the profiling run) does not end the phase."""
    p = by_phase(startup_phases(start_log([COMPILED, MONITOR_TOOK]), "2026-11-23T10:00:00Z"))
    assert p["torch_compile"]["at"] is None


def test_the_test_double_says_when_its_compile_lines_are_missing():
    """The double prints the AOT-on lines: in the simulated cluster their absence is a finding."""
    old_double = "\n".join(x for x in DOUBLE.splitlines() if " took " not in x and " compile" not in x)
    got = startup_phases(old_double, "2026-11-23T10:00:00.6Z", RAY, test_double=True)
    p = by_phase(got)
    assert p["torch_compile"]["note"] == "not seen in the logs"
    assert got["compile_cache"] == "not seen in the logs"
    assert p["cuda_graphs"]["note"] == "not applicable (test double)"


# --- partial input and several Ray starts (issue 30) -------------------------------------------------


def test_a_start_that_never_became_ready_reports_the_phases_it_has():
    """vLLM died before its API was up (no `Application startup complete.`), Ray had started."""
    died = "\n".join(VLLM_COLD.splitlines()[:6])  # up to the second rank's `Model loading took`
    got = startup_phases(died, "2026-11-23T10:00:00.5Z", RAY)
    p = by_phase(got)
    assert p["ray_ready"]["since_start_s"] == -2.5
    assert p["weights_loaded"]["since_start_s"] == 134.75
    assert p["api_ready"]["note"] == "not seen in the logs"
    assert p["torch_compile"]["at"] is None


@pytest.mark.parametrize("order", [1, -1], ids=["in_order", "stderr_before_stdout"])
def test_of_two_ray_starts_before_the_api_was_up_the_newest_counts(order):
    """A Ray restart before this vLLM start (the watchdog's restart); docker gives streams unsorted."""
    older = "2026-11-23T09:40:00.000000000Z Ray runtime started."
    newer = "2026-11-23T09:59:58.000000000Z Ray runtime started."
    ray = "\n".join([older, newer][::order])
    for api_ready in (True, False):
        log = VLLM_COLD if api_ready else "\n".join(VLLM_COLD.splitlines()[:6])
        p = by_phase(startup_phases(log, "2026-11-23T10:00:00.5Z", ray))
        assert p["ray_ready"]["since_start_s"] == -2.5, (api_ready, p["ray_ready"])


def test_the_filter_is_registered_under_its_name():
    assert FilterModule().filters() == {"startup_phases": startup_phases}


# --- edges a mutation run found unpinned (issue 30) --------------------------------------------------


def test_an_absent_start_time_or_log_is_a_clear_answer_not_a_crash():
    """`docker inspect` of a missing container gives no StartedAt; a container without logs gives no text."""
    assert parse_ts(None) is None
    with pytest.raises(ValueError, match="RFC 3339"):
        startup_phases("", None)
    got = startup_phases(None, "2026-11-23T10:00:00Z", None)
    assert [p["note"] for p in got["phases"] if p["at"] is None] == ["not seen in the logs"] * 7 + [
        "not measured (vLLM was not started by this run)"
    ]
    assert got["compile_cache"] == "not seen in the logs"


def test_fractions_of_every_length_and_offsets_parse_exactly():
    assert parse_ts("2026-11-23T10:00:00Z").microsecond == 0
    assert parse_ts("2026-11-23T10:00:00.5Z").microsecond == 500000
    assert parse_ts("2026-11-23T10:00:00.1234567Z").microsecond == 123456
    assert parse_ts("2026-11-23T09:30:00.25-00:30").isoformat() == "2026-11-23T10:00:00.250000+00:00"


def test_a_line_written_at_the_start_instant_belongs_to_this_start():
    log = "2026-11-23T10:00:00.500000000Z INFO [gpu_model_runner.py:4736] Starting to load model m...\n"
    p = by_phase(startup_phases(log, "2026-11-23T10:00:00.5Z"))
    assert p["weights_loading"]["since_start_s"] == 0


def test_a_missing_phase_has_the_same_keys_as_a_found_one_and_notes_are_cut():
    long_line = "Starting to load model " + "x" * 300
    log = f"2026-11-23T10:00:01.0054Z {long_line}\n2026-11-23T10:00:02Z Ray runtime started. {'y' * 300}\n"
    got = startup_phases(log, " 2026-11-23T10:00:00Z\n", log)
    p = by_phase(got)
    assert got["container_started_at"] == "2026-11-23T10:00:00Z"  # docker inspect's newline dropped
    # since_start_s is rounded to the millisecond, the note cut at 160 characters
    assert p["weights_loading"] == {
        "phase": "weights_loading",
        "at": "2026-11-23T10:00:01.005400Z",
        "since_start_s": 1.005,
        "source": "vLLM container log",
        "note": long_line[:160],
    }
    assert p["ray_ready"]["note"] == ("Ray runtime started. " + "y" * 300)[:160]
    assert p["cuda_graphs"] == {
        "phase": "cuda_graphs",
        "at": None,
        "since_start_s": None,
        "source": None,
        "note": "not seen in the logs",
    }


def test_the_test_double_without_a_smoke_completion_says_first_token_was_not_measured():
    got = startup_phases(DOUBLE, "2026-11-23T10:00:00.6Z", RAY, test_double=True)
    p = by_phase(got)
    assert p["first_token"]["note"] == "not measured (vLLM was not started by this run)"
    assert p["container_start"]["since_start_s"] == 0
    assert p["ray_ready"]["note"] == "Ray runtime started."


def test_a_ray_start_logged_at_the_instant_the_api_came_up_is_this_starts():
    ray = RAY + "2026-11-23T10:04:41.000000000Z Ray runtime started.\n"  # the api_ready line's time
    p = by_phase(startup_phases(VLLM_COLD, "2026-11-23T10:00:00.5Z", ray))
    assert p["ray_ready"]["since_start_s"] == p["api_ready"]["since_start_s"] == 280.5


# vLLM's own multi-node executor (mp): the head (rank 0) runs the API and its own rank; the other node's
# rank runs `vllm serve --headless` in its own container and logs there. Same 0.19.0 format strings as above (the
# "(Worker pid=...)" prefix is illustrative: the markers are matched anywhere in a line).
MP_HEAD = """\
2026-11-23T10:00:01.000000000Z INFO 11-23 10:00:01 [api_server.py:1351] vLLM API server version 0.19.0
2026-11-23T10:00:20.000000000Z (Worker pid=301) INFO 11-23 10:00:20 [gpu_model_runner.py:4736] Starting to load model Qwen/Qwen3-235B-A22B-GPTQ-Int4...
2026-11-23T10:02:00.000000000Z (Worker pid=301) INFO 11-23 10:02:00 [default_loader.py:385] Loading weights took 95.00 seconds
2026-11-23T10:03:00.000000000Z (Worker pid=301) INFO 11-23 10:03:00 [monitor.py:77] Initial profiling/warmup run took 20.00 s
2026-11-23T10:04:00.000000000Z (Worker pid=301) INFO 11-23 10:04:00 [gpu_model_runner.py:6047] Graph capturing finished in 50 secs, took 1.52 GiB
2026-11-23T10:04:35.000000000Z INFO 11-23 10:04:35 [core.py:284] init engine (profile, create kv cache, warmup model) took 140.50 seconds
2026-11-23T10:04:41.000000000Z INFO:     Application startup complete.
"""
MP_RANK1 = """\
2026-11-23T09:40:00.000000000Z (Worker pid=77) INFO 11-23 09:40:00 [default_loader.py:385] Loading weights took 1.00 seconds
2026-11-23T10:00:22.000000000Z (Worker pid=401) INFO 11-23 10:00:22 [gpu_model_runner.py:4736] Starting to load model Qwen/Qwen3-235B-A22B-GPTQ-Int4...
2026-11-23T10:02:30.000000000Z (Worker pid=401) INFO 11-23 10:02:30 [default_loader.py:385] Loading weights took 120.00 seconds
2026-11-23T10:03:10.000000000Z (Worker pid=401) INFO 11-23 10:03:10 [monitor.py:77] Initial profiling/warmup run took 22.00 s
2026-11-23T10:04:20.000000000Z (Worker pid=401) INFO 11-23 10:04:20 [gpu_model_runner.py:6047] Graph capturing finished in 60 secs, took 1.52 GiB
"""


def test_under_mp_the_last_rank_is_read_from_its_own_nodes_container():
    """issue 43: headless ranks log in their own containers; the report took the head's times as the last rank's."""
    head_only = by_phase(startup_phases(MP_HEAD, "2026-11-23T10:00:00Z"))
    assert head_only["weights_loaded"]["since_start_s"] == 120.0  # what the report said before: the head's rank
    got = by_phase(startup_phases(MP_HEAD, "2026-11-23T10:00:00Z", rank_logs=[{"host": "spark-2", "log": MP_RANK1}]))
    assert got["weights_loading"]["since_start_s"] == 20.0 and got["weights_loading"]["source"] == "vLLM container log"
    assert got["weights_loaded"]["since_start_s"] == 150.0
    assert got["weights_loaded"]["source"] == "vLLM container log on spark-2"
    assert got["torch_compile"]["since_start_s"] == 190.0
    assert got["cuda_graphs"]["since_start_s"] == 260.0 and "60 secs" in got["cuda_graphs"]["note"]
    assert got["engine_ready"]["source"] == "vLLM container log"  # the engine core runs on the head


def test_rank_logs_come_as_the_roles_loop_results_and_an_unreadable_one_is_left_out():
    results = [
        {"item": {"host": "spark-2", "rank": 1}, "rc": 0, "stdout": MP_RANK1, "stderr": ""},
        {"item": {"host": "spark-3", "rank": 2}, "rc": 1, "stdout": "", "stderr": "No such container: vllm"},
    ]
    got = by_phase(startup_phases(MP_HEAD, "2026-11-23T10:00:00Z", rank_logs=results))
    assert got["weights_loaded"]["source"] == "vLLM container log on spark-2"
    with pytest.raises(ValueError, match="mappings"):
        startup_phases(MP_HEAD, "2026-11-23T10:00:00Z", rank_logs=["text"])


def test_the_role_reads_every_other_ranks_container_under_mp():
    import yaml  # noqa: PLC0415
    from conftest import ROOT  # noqa: PLC0415

    tasks = yaml.safe_load((ROOT / "roles/vllm_serve/tasks/phases.yml").read_text())
    block = next(t for t in tasks if "block" in t)["block"]
    read = next(t for t in block if t.get("register") == "vllm_serve_rank_logs")
    # every other member the plan gives a vLLM container (only mp ranks have one besides the head): no executor named
    assert read["delegate_to"] == "{{ item.host }}" and "selectattr('vllm')" in read["loop"]
    assert "rejectattr('host', 'equalto', inventory_hostname)" in read["loop"] and "executor" not in read["loop"]
    assert read["ansible.builtin.command"]["argv"][:3] == ["docker", "logs", "--timestamps"]
    work = next(t for t in block if "vllm_serve_startup" in t.get("ansible.builtin.set_fact", {}))
    assert "rank_logs=vllm_serve_rank_logs.results" in work["ansible.builtin.set_fact"]["vllm_serve_startup"]
