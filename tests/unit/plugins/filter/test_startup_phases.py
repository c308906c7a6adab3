# ruff: noqa: E501 - the log lines are kept whole, as vLLM prints them
"""plugins/filter/startup_phases.py on `docker logs --timestamps` text.

The vLLM lines are vLLM 0.19.0's own format strings (vllm-0.19.0 wheel, sha256 2d0e5fae...,
files named in the filter's docstring) filled in as vLLM's logger prints them; the double's lines
are what sim/standin/vllm_test_double.py prints. No real GB10 start was recorded (no Spark here).
"""

from __future__ import annotations

import pytest
from ansible_collections.sparkops.cluster.plugins.filter.startup_phases import parse_ts, startup_phases

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
    for phase in ("weights_loading", "weights_loaded", "torch_compile", "cuda_graphs", "engine_ready"):
        assert p[phase]["at"] is None
        assert p[phase]["note"] == "not applicable (test double)"
    assert p["api_ready"]["since_start_s"] == 3.4
    assert p["first_token"]["since_start_s"] == 3.9
    assert got["compile_cache"] == "not applicable (test double)"


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
