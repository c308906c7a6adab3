"""The vLLM test double (sim/standin/vllm_test_double.py) as a subprocess on 127.0.0.1.

A one-node Ray (1 CPU, 1 declared GPU) is started for this module on 127.0.0.1 only
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray on loopback), in its own session and temp dir,
and killed by process group afterwards (never `ray stop`, which would stop other people's Ray).
The double must refuse what real vLLM refuses, serve what it serves, and pass vllm_health.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import openai_probe as op
from ansible_collections.sparkops.cluster.plugins.modules import vllm_health
from conftest import ROOT
from module_runner import run_module

DOUBLE = ROOT / "sim" / "standin" / "vllm_test_double.py"
RAY_BIN = Path(sys.executable).parent / "ray"
MODEL = "sparkops-org/tiny-model"
KEY = "sk-double-key"
pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("hf")
    repo = home / "hub" / ("models--" + MODEL.replace("/", "--"))
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    (snap / "config.json").write_text('{"model_type": "llama"}')
    (snap / "model.safetensors").write_bytes(b"\0" * 16)
    return home


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    port = free_port()
    temp = tmp_path_factory.mktemp("ray")
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    cmd = [
        str(RAY_BIN),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--num-cpus=1",
        "--num-gpus=1",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
    ]
    proc = subprocess.Popen(
        cmd, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            if "Ray runtime started" in line:
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail("Ray head did not start within 60 s")
        yield f"127.0.0.1:{port}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)


def env_for(hf_home: Path, ray_address: str | None = None, **extra) -> dict:
    env = dict(os.environ, HF_HOME=str(hf_home), SPARKOPS_TEST_DOUBLE_TOK_S="40", PYTHONUNBUFFERED="1")
    env.pop("HF_HUB_CACHE", None)
    if ray_address:
        env.update(RAY_ADDRESS=ray_address, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    env.update(extra)
    return env


def run_double(args: list[str], env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(DOUBLE), *args], env=env, capture_output=True, text=True, check=False, timeout=timeout
    )


@pytest.fixture(scope="module")
def served(ray_head, hf_home, tmp_path_factory):
    """The double serving MODEL as 'tiny' over Ray with TP=1; yields its base URL."""
    port = free_port()
    logf = tmp_path_factory.mktemp("log") / "double.log"
    args = [
        "serve",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--api-key",
        KEY,
        "--served-model-name",
        "tiny",
        "--tensor-parallel-size",
        "1",
        "--distributed-executor-backend",
        "ray",
        "--gpu-memory-utilization",
        "0.85",
        "--max-model-len",
        "32k",
        "--enable-prefix-caching",
        "--kv-cache-dtype",
        "fp8",
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 2}',
        "--compilation-config",
        '{"cudagraph_mode": "FULL"}',
    ]
    with logf.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(DOUBLE), *args],
            env=env_for(hf_home, ray_head),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, logf.read_text()
            try:
                op.get_health(base, timeout=1)
                break
            except op.ProbeError:
                time.sleep(0.2)
        else:
            pytest.fail("double did not listen within 60 s:\n" + logf.read_text())
        yield base, logf
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_refuses_without_weights(tmp_path):
    r = run_double(["serve", "org/absent-model", "--port", "0"], env_for(tmp_path))
    assert r.returncode == 1
    assert "is not in the Hugging Face cache" in r.stdout and "models--org--absent-model" in r.stdout


def test_refuses_wrong_revision_and_missing_shard(hf_home, tmp_path):
    r = run_double(["serve", MODEL, "--revision", "v2"], env_for(hf_home))
    assert r.returncode == 1 and "revision v2" in r.stdout
    snap = tmp_path / "local"
    snap.mkdir()
    (snap / "config.json").write_text("{}")
    (snap / "model-00001-of-00002.safetensors").write_bytes(b"x")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (snap / "model.safetensors.index.json").write_text(json.dumps(index))
    r = run_double(["serve", str(snap)], env_for(hf_home))
    assert r.returncode == 1 and "lacks 1 of 2 shards" in r.stdout


def test_refuses_unknown_flag_and_bad_values(hf_home):
    r = run_double(["serve", MODEL, "--tensor-parallel", "2"], env_for(hf_home))
    assert r.returncode == 2 and "unrecognized arguments: --tensor-parallel" in r.stderr
    r = run_double(["serve", MODEL, "--gpu-memory-utilization", "1.2"], env_for(hf_home))
    assert r.returncode == 2 and "must be in (0, 1]" in r.stderr
    r = run_double(["serve", MODEL, "--kv-cache-dtype", "fp4"], env_for(hf_home))
    assert r.returncode == 2 and "invalid choice: 'fp4'" in r.stderr
    r = run_double(["serve", MODEL, "--speculative-config", "{not json"], env_for(hf_home))
    assert r.returncode == 2 and "not valid JSON" in r.stderr


def test_refuses_when_tp_exceeds_the_gpus(ray_head, hf_home):
    t0 = time.monotonic()
    r = run_double(
        [
            "serve",
            MODEL,
            "--port",
            str(free_port()),
            "--host",
            "127.0.0.1",
            "-tp",
            "2",
            "--distributed-executor-backend",
            "ray",
        ],
        env_for(hf_home, ray_head, SPARKOPS_TEST_DOUBLE_PG_TIMEOUT_S="3"),
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "not placed after 3 s: cluster has 1 GPUs" in r.stdout
    assert "Starting vLLM API server" not in r.stdout  # never listened
    assert time.monotonic() - t0 < 45


def _post(base: str, path: str, body: dict, key: str | None = KEY) -> tuple[int, bytes]:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    conn.request("POST", path, body=json.dumps(body), headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def test_serves_models_and_streams_with_usage_at_the_set_pace(served):
    base, logf = served
    models = op.list_models(base, api_key=KEY)
    assert [(m["id"], m["owned_by"], m["root"]) for m in models] == [("tiny", "sparkops-test-double", MODEL)]
    r = op.stream_chat(base, "tiny", prompt="hello there", max_tokens=9, api_key=KEY, timeout=20)
    assert r["usage_reported"] is True and r["completion_tokens"] == 9 and r["prompt_tokens"] == 2
    assert 30 < r["tok_s"] < 45  # SPARKOPS_TEST_DOUBLE_TOK_S=40
    assert "placement group placed" in logf.read_text()


def test_completions_endpoint_non_streaming_and_streaming(served):
    base, _ = served
    status, data = _post(base, "/v1/completions", {"model": "tiny", "prompt": "a b c", "max_tokens": 3})
    doc = json.loads(data)
    assert status == 200 and doc["usage"] == {"prompt_tokens": 3, "total_tokens": 6, "completion_tokens": 3}
    assert len(doc["choices"][0]["text"].split()) == 3
    status, data = _post(base, "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2, "stream": True})
    assert status == 200 and data.rstrip().endswith(b"data: [DONE]")
    status, data = _post(base, "/v1/chat/completions", {"model": "nope", "messages": []})
    assert status == 404 and b"does not exist" in data


def test_401_on_v1_without_the_right_key_but_health_and_metrics_open(served):
    base, _ = served
    status, data = _post(base, "/v1/chat/completions", {"model": "tiny", "messages": []}, key="wrong")
    assert status == 401 and json.loads(data) == {"error": "Unauthorized"}
    with pytest.raises(op.ProbeError) as exc:
        op.list_models(base, api_key=None)
    assert exc.value.kind == "unauthorized"
    assert op.get_health(base)["status"] == 200
    assert op.get_metrics(base)["model_names"] == ["tiny"]


def test_metrics_names_and_prefix_cache_hits(served):
    base, _ = served
    prompt = " ".join(f"w{i}" for i in range(40))  # two full 16-token blocks
    before = op.get_metrics(base)
    for _ in range(2):
        _post(
            base,
            "/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1},
        )
    after = op.get_metrics(base)
    assert after["prefix_cache_queries"] - before["prefix_cache_queries"] == 80
    assert after["prefix_cache_hits"] - before["prefix_cache_hits"] == 32  # second request hits both blocks
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == 80
    text = urlopen_text(base + "/metrics")
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ):
        assert f'{name}{{engine="0",model_name="tiny"}}' in text


def urlopen_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - 127.0.0.1 only
        return resp.read().decode()


def test_vllm_health_passes_against_the_double(served):
    base, _ = served
    r = run_module(
        vllm_health,
        {"base_url": base, "api_key": KEY, "model": "tiny", "max_tokens": 8, "min_tok_s": 20, "timeout_s": 30},
    )
    assert r.get("failed") is not True, r
    assert r["healthy"] is True and r["completion_tokens"] == 8
    assert r["metrics"]["generation_tokens_total"] >= 8


def test_vllm_health_fails_401_on_a_wrong_key(served):
    base, _ = served
    r = run_module(vllm_health, {"base_url": base, "api_key": "sk-nope", "model": "tiny", "timeout_s": 10})
    assert r["failed"] is True and r["failure_kind"] == "unauthorized"
    assert "the API key is wrong" in r["msg"] and "sk-nope" not in json.dumps(r)


def test_dead_bundle_node_detection():
    sys.path.insert(0, str(DOUBLE.parent))
    try:
        import vllm_test_double as d
    finally:
        sys.path.pop(0)
    nodes = [{"NodeID": "aaa", "Alive": True}, {"NodeID": "bbb", "Alive": False}]
    assert d.dead_bundle_nodes(nodes, {"aaa"}) is None
    assert "bbb" in d.dead_bundle_nodes(nodes, {"aaa", "bbb"})
    assert d.dead_bundle_nodes(nodes[:1], {"aaa", "ccc"}) is not None  # vanished from the list counts as dead
