"""The vLLM test double (sim/standin/vllm_test_double.py) as a subprocess on 127.0.0.1.

It must agree with the contract recorded from the official vLLM 0.19.0 wheel
(plugins/plugin_utils/vllm_contracts/vllm-0.19.0.json; the double loads its copy
sim/standin/vllm-contract.json): every option accepted, anything else refused like vLLM.
A one-node Ray (1 CPU, 2 declared GPUs) is started for this module on 127.0.0.1 only
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray on loopback), in its own session and temp dir,
and killed by process group afterwards (never `ray stop`, which would stop other people's Ray).
The double must refuse what real vLLM refuses, serve what it serves, and pass vllm_health.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkops.cluster.plugins.module_utils import openai_probe as op
from ansible_collections.sparkops.cluster.plugins.modules import vllm_health
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving_profile import (
    normalize_profile,
    profile_violations,
    vllm_serve_args,
)
from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import load_contract, recorded_versions
from conftest import ROOT
from double_fixtures import MODEL, free_port, tiny_hf_home
from module_runner import run_module

DOUBLE = ROOT / "sim" / "standin" / "vllm_test_double.py"
PROFILES = yaml.safe_load(
    (ROOT / "roles" / "sparkops_defaults" / "defaults" / "main" / "serving_profiles.yml").read_text()
)["sparkops_serving_profiles"]
_STACKS = yaml.safe_load((ROOT / "roles" / "sparkops_defaults" / "defaults" / "main" / "stacks.yml").read_text())
PINNED = _STACKS["sparkops_stacks"][_STACKS["sparkops_stack"]]["vllm_version"]  # the default stack's vLLM
SIM_GROUP_VARS = ROOT / "inventory" / "sim" / "group_vars" / "all"
RAY_BIN = Path(sys.executable).parent / "ray"
KEY = "sk-double-key"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    return tiny_hf_home(tmp_path_factory.mktemp("hf"))


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
        "--num-gpus=2",
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
    env.update(VLLM_CACHE_ROOT=str(hf_home / "vllm-cache"))  # the double's compile marker, never ~/.cache
    for name in ("HF_HUB_CACHE", "SPARKOPS_TEST_DOUBLE_PG_TIMEOUT_S", "RAY_CGRAPH_get_timeout", "VLLM_HOST_IP"):
        env.pop(name, None)
    if ray_address:
        # vLLM puts its first rank on VLLM_HOST_IP's Ray node (ray_utils.py:471-473): the Ray head's address.
        env.update(RAY_ADDRESS=ray_address, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
        env.update(VLLM_HOST_IP="127.0.0.1")
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


def test_refuses_a_speculative_config_vllm_0_19_0_refuses_and_a_drafter_not_in_the_cache(hf_home):
    """SpeculativeConfig(**json) at engine config (exit 1): unknown method or key, tokens < 1, a drafter
    method without a model, tensor_parallel_size; and a drafter that is not in the offline cache."""
    cases = [
        ({"method": "eagle4", "model": "org/head", "num_speculative_tokens": 2}, "method\n  Input should be one of"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens\n  Input should be greater than 0"),
        ({"method": "eagle3", "num_speculative_tokens": 2}, "without speculative model"),
        ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}, "lookahead\n  Unexpected keyword"),
        ({"method": "ngram", "num_speculative_tokens": 2, "tensor_parallel_size": 2}, "draft_tensor_parallel_size"),
    ]
    for spec, needle in cases:
        r = run_double(["serve", MODEL, "--speculative-config", json.dumps(spec)], env_for(hf_home))
        assert r.returncode == 1 and needle in r.stdout, (spec, r.stdout[-800:])
    drafter = {"method": "eagle3", "model": "org/head", "revision": "c" * 40, "num_speculative_tokens": 2}
    r = run_double(["serve", MODEL, "--port", "0", "--speculative-config", json.dumps(drafter)], env_for(hf_home))
    assert r.returncode == 1 and "'org/head' (revision " + "c" * 40 + ") is not in the Hugging Face cache" in r.stdout


def test_refuses_unknown_flag_and_bad_values(hf_home):
    """What argparse refuses in vLLM 0.19.0 exits 2; what its engine config refuses exits 1."""
    r = run_double(["serve", MODEL, "--tensor-parallel", "2"], env_for(hf_home))
    assert r.returncode == 2 and "unrecognized arguments: --tensor-parallel" in r.stderr
    r = run_double(["serve", MODEL, "--kv-cache-dtype", "fp4"], env_for(hf_home))
    assert r.returncode == 2 and "invalid choice: 'fp4'" in r.stderr
    r = run_double(["serve", MODEL, "--speculative-config", "{not json"], env_for(hf_home))
    assert r.returncode == 2 and "argument --speculative-config/-sc: Value {not json cannot be converted" in r.stderr
    r = run_double(["serve", MODEL, "--max-num-seqs", "many"], env_for(hf_home))
    assert r.returncode == 2 and "argument --max-num-seqs: invalid int value: 'many'" in r.stderr
    r = run_double(["serve", MODEL, "--enforce-eager=1"], env_for(hf_home))
    assert r.returncode == 2 and "ignored explicit argument '1'" in r.stderr
    r = run_double(["serve", MODEL, "--gpu-memory-utilization", "1.2"], env_for(hf_home))
    assert r.returncode == 1 and "gpu_memory_utilization" in r.stdout
    for flag, value, message in (
        ("--quantization", "aqlm", "Unknown quantization method: aqlm"),
        ("--quantization", "marlin", "Unknown quantization method: marlin"),
        ("--attention-backend", "XFORMERS", "Unknown attention backend: 'XFORMERS'"),
        ("--attention-backend", "PALLAS", "Unknown attention backend: 'PALLAS'"),
    ):
        r = run_double(["serve", MODEL, flag, value], env_for(hf_home))
        assert r.returncode == 1 and message in r.stdout, (flag, value, r.stdout)
        assert "Starting vLLM API server" not in r.stdout


def test_version_and_help_answer_from_the_recorded_release(hf_home):
    contract = load_contract("0.19.0")
    r = run_double(["--version"], env_for(hf_home))
    assert r.returncode == 0 and r.stdout.strip() == "0.19.0"
    r = run_double(["serve", "--help=all"], env_for(hf_home))
    recorded = (ROOT / "plugins" / "plugin_utils" / "vllm_contracts" / contract["source"]["help_text"]).read_text()
    assert r.returncode == 0 and r.stdout == recorded


def _load_double():
    sys.path.insert(0, str(DOUBLE.parent))
    try:
        import vllm_test_double as d
    finally:
        sys.path.pop(0)
    return d


def _sample_value(spec: dict) -> list[str]:
    if spec.get("choices"):
        return [spec["choices"][0]]
    kind = spec.get("inner_type") if spec.get("type") in ("_optional_type", "_parse_type") else spec.get("type")
    return [{"int": "1", "float": "0.5", "loads": "{}", "parse_dataclass": "{}"}.get(kind, "1")]


def test_double_accepts_every_option_of_the_recorded_parser_and_nothing_else():
    """The double's parser is the fixture's: each of 0.19.0's 295 options (and every alias) parses; options
    only a newer vLLM has are refused with argparse's exit 2."""
    d = _load_double()
    contract = load_contract(PINNED)
    assert d.load_contract() == {**contract, "help_all": d.load_contract()["help_all"]}
    parser = d.build_parser(d.load_contract())
    accepted = 0
    for name, spec in contract["serve_options"].items():
        if spec["action"] == "help":
            continue
        for opt in [name, *spec["aliases"]]:
            argv = ["serve", "some/model", opt] + (_sample_value(spec) if spec["takes_value"] else [])
            args = parser.parse_args(d.flexible(argv))
            assert hasattr(args, spec["dest"]), opt
            accepted += 1
    assert accepted > len(contract["serve_options"])  # aliases and --no- forms too
    newest = load_contract(recorded_versions()[-1])
    only_newer = sorted(set(newest["serve_options"]) - set(contract["serve_options"]))
    assert "--linear-backend" in only_newer
    for opt in only_newer[:25]:
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(["serve", "some/model", opt, "x"])
        assert exc.value.code == 2, opt


def _profile_argv(profile: dict, port: int) -> list[str]:
    # A not-recommended profile still has to be one vLLM accepts: build its argv past that rule only.
    allow = [{"rule": "not-recommended", "reason": "argv check"}] if profile.get("not_recommended") else None
    argv = vllm_serve_args(profile, "127.0.0.1", port, gpus_per_node=1, allow_rules=allow)
    assert argv[:2] == ["vllm", "serve"]
    return argv[2:]


def _on_the_doubles_release(profile: dict) -> bool:
    """The double carries the default stack's contract (PINNED); a profile written for another recorded release
    (its min_vllm_version) is that stack's: its contract judges it (tests/unit/plugin_utils/test_stacks.py)."""
    wanted = profile.get("min_vllm_version")
    return wanted in (None, PINNED) or wanted not in recorded_versions()


PINNED_PROFILES = sorted(n for n, p in PROFILES.items() if _on_the_doubles_release(p))


@pytest.mark.parametrize("name", PINNED_PROFILES)
def test_every_shipped_profile_passes_the_double_s_parser_and_engine_config(name):
    d = _load_double()
    contract = d.load_contract()
    args = d.build_parser(contract).parse_args(d.flexible(["serve", *_profile_argv(PROFILES[name], 8000)]))
    assert d.engine_config_problems(args, contract) == []
    env = normalize_profile(PROFILES[name])["env"]
    assert [n for n in env if n.startswith("VLLM_") and n not in contract["env_vars"]] == []


def _sim_fits(profile: dict) -> bool:
    cluster = yaml.safe_load((SIM_GROUP_VARS / "cluster.yml").read_text()) or {}
    nodes = 2  # inventory/sim: spark-sim-1 and spark-sim-2, one (declared) GPU each
    memory = float(cluster.get("sparkops_node_memory_gib", 128))
    return profile_violations(profile, nodes, node_memory_gib=memory, gpus_per_node=1) == []


def test_the_sim_profile_fits_the_simulated_cluster():
    assert _sim_fits(PROFILES["sim-tiny-tp2"])


@pytest.mark.parametrize(
    "name", sorted(n for n in PINNED_PROFILES if normalize_profile(PROFILES[n])["tensor_parallel_size"] == 1)
)
def test_every_single_gpu_shipped_profile_starts_under_the_double(name, tmp_path):
    """Each shipped one-GPU profile's real argv and env start the double and serve /health.
    (TP=2 profiles need two nodes: sim-tiny-tp2 is started by the simulated cluster's site.yml.)"""
    p = normalize_profile(PROFILES[name])
    repo = tmp_path / "hub" / ("models--" + p["model"].replace("/", "--"))
    snap = repo / "snapshots" / "c0ffee"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / p["revision"]).write_text("c0ffee")
    (snap / "config.json").write_text("{}")
    (snap / "model.safetensors").write_bytes(b"\0" * 8)
    port = free_port()
    argv = _profile_argv(PROFILES[name], port)
    env = env_for(tmp_path, **p["env"])
    proc = subprocess.Popen(
        [sys.executable, str(DOUBLE), "serve", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            try:
                assert op.get_health(f"http://127.0.0.1:{port}", timeout=1)["status"] == 200
                break
            except op.ProbeError:
                time.sleep(0.3)
        else:
            pytest.fail(f"{name} did not start within 60 s")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert "Unknown vLLM environment variable" not in out, out


def _start(args: list[str], env: dict, logf: Path) -> subprocess.Popen:
    with logf.open("w") as out:
        return subprocess.Popen(
            [sys.executable, str(DOUBLE), "serve", MODEL, "--host", "127.0.0.1", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _wait_healthy(proc: subprocess.Popen, base: str, logf: Path, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        assert proc.poll() is None, logf.read_text()
        try:
            op.get_health(base, timeout=1)
            return
        except op.ProbeError:
            time.sleep(0.2)
    pytest.fail("the double did not answer /health:\n" + logf.read_text())


def test_the_real_timeouts_are_the_defaults_and_only_the_stand_in_image_shortens_them(monkeypatch):
    """vLLM 0.19.0: 1800 s for the placement group (ray_utils.py:27, :284), RAY_CGRAPH_get_timeout 300 s
    (ray_executor.py:551-558). The simulated cluster's short values are set in one place, the image."""
    d = _load_double()
    monkeypatch.delenv("SPARKOPS_TEST_DOUBLE_PG_TIMEOUT_S", raising=False)
    monkeypatch.delenv("RAY_CGRAPH_get_timeout", raising=False)
    assert d.Engine.pg_wait_s() == 1800
    assert d.Engine.step_timeout() == 300
    monkeypatch.setenv("RAY_CGRAPH_get_timeout", "7")  # vLLM's os.environ.setdefault keeps a set value
    assert d.Engine.step_timeout() == 7
    setters = [
        str(f.relative_to(ROOT))
        for f in [*ROOT.glob("sim/**/*"), *ROOT.glob("inventory/**/*"), *ROOT.glob("roles/**/*")]
        if f.is_file() and "Dockerfile" not in f.name and f.suffix not in (".py", ".json", ".pyc")
        and any(knob in f.read_text(errors="replace")
                for knob in ("SPARKOPS_TEST_DOUBLE_PG_TIMEOUT_S", "RAY_CGRAPH_get_timeout",
                             "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"))
    ]  # fmt: skip
    assert setters == []
    image = (ROOT / "sim" / "standin" / "Dockerfile").read_text()
    assert "LISTED SIMULATION DIFFERENCE" in image
    assert "SPARKOPS_TEST_DOUBLE_PG_TIMEOUT_S=120" in image and "RAY_CGRAPH_get_timeout=30" in image
    assert "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=30" in image  # the mp executor's (--nnodes) stuck-rank timeout
    monkeypatch.delenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", raising=False)
    assert d.execute_model_timeout() == 300  # envs.py:186


def test_refuses_when_tp_exceeds_the_gpus_and_refuses_connections_until_then(ray_head, hf_home, tmp_path):
    """PACK over 2 GPUs cannot place 3 bundles; vLLM waits (here 3 s), names the GPUs and exits 1. Its port is
    bound from the start (api_server.py:541-548) but listens only once the engine is up: refused until then."""
    port, logf = free_port(), tmp_path / "double.log"
    t0 = time.monotonic()
    proc = _start(
        ["--port", str(port), "-tp", "3", "--distributed-executor-backend", "ray"],
        env_for(hf_home, ray_head, SPARKOPS_TEST_DOUBLE_PG_TIMEOUT_S="3"),
        logf,
    )
    try:
        while "connected to Ray" not in logf.read_text() and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        with pytest.raises(op.ProbeError) as exc:
            op.get_health(f"http://127.0.0.1:{port}", timeout=1)
        assert exc.value.kind == "refused"
        with socket.socket() as s, pytest.raises(OSError):
            s.bind(("127.0.0.1", port))  # the port is the double's already
        assert proc.wait(timeout=40) == 1
    finally:
        _stop(proc)
    out = logf.read_text()
    assert "Cannot provide a placement group requiring 3 GPUs" in out and "within 3 seconds" in out, out
    assert "exceeds the total number of available GPUs" in out
    assert "Starting vLLM API server" not in out  # never listened
    assert time.monotonic() - t0 < 45


def test_the_first_rank_is_placed_on_vllm_host_ip_s_node(ray_head, hf_home, tmp_path):
    """ray_utils.py:471-473: bundle 0 needs `node:<VLLM_HOST_IP>`; no Ray node has 127.0.0.2, so nothing places."""
    logf = tmp_path / "double.log"
    proc = _start(
        ["--port", str(free_port()), "--distributed-executor-backend", "ray"],
        env_for(hf_home, ray_head, SPARKOPS_TEST_DOUBLE_PG_TIMEOUT_S="3", VLLM_HOST_IP="127.0.0.2"),
        logf,
    )
    try:
        assert proc.wait(timeout=40) == 1
    finally:
        _stop(proc)
    assert "'node:127.0.0.2': 0.001" in logf.read_text()


def test_tp2_packs_on_one_node_and_the_second_start_loads_the_compile_cache(ray_head, hf_home, tmp_path):
    """PACK, not STRICT_SPREAD: two bundles on the one node with 2 GPUs. vLLM 0.19.0's AOT-on lines with
    torch 2.10.0: cold compiles and saves the artifact, warm loads it (no `Compiling a graph`)."""
    env = env_for(hf_home, ray_head, VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"))
    logs = []
    for n in (1, 2):
        port, logf = free_port(), tmp_path / f"double{n}.log"
        proc = _start(["--port", str(port), "-tp", "2", "--distributed-executor-backend", "ray"], env, logf)
        try:
            _wait_healthy(proc, f"http://127.0.0.1:{port}", logf)
        finally:
            _stop(proc)
        logs.append(logf.read_text())
    cold, warm = logs
    assert "placement group placed on 1 nodes" in cold
    assert "RAY_CGRAPH_get_timeout is set to 300" in cold
    for line in ("Compiling a graph for compile range (1, 8192) takes", "saved AOT compiled function to "):
        assert line in cold and line not in warm
    for line in ("Directly load the compiled graph(s) for compile range (1, 8192)", "Directly load AOT compilation"):
        assert line in warm and line not in cold
    for log in logs:
        assert "torch.compile took " in log and "Initial profiling/warmup run took " in log
        assert log.index("Initial profiling/warmup run took") < log.index("Application startup complete.")
    assert list((tmp_path / "vllm-cache" / "torch_compile_cache" / "torch_aot_compile").glob("*/rank_0_0/model"))


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


def _families(text: str) -> dict:
    """Parsed with prometheus_client's own text parser (what a scraper sees)."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_are_the_recorded_families_of_0_19_0_and_promtool_accepts_them(served):
    base, _ = served
    text = urlopen_text(base + "/metrics")
    contract = load_contract("0.19.0")
    fams = _families(text)
    for rec in contract["metrics"]:
        fam = fams.get(rec["family"]) or fams.get(rec["name"])
        assert fam is not None, rec["name"]
        assert fam.type == rec["type"], rec["name"]
        for sample in fam.samples:
            extra = set(sample.labels) - set(rec["labels"]) - {"le", "quantile"}
            assert not extra, (rec["name"], extra)
    exposed = {n for n in fams if n.startswith("vllm:") and not n.endswith("_created")}
    # served with --speculative-config: 0.19.0 adds its four spec_decode counters to a default serve's
    # families (vllm/v1/spec_decode/metrics.py:155-193), and nothing else
    spec = {
        "vllm:spec_decode_num_drafts",
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
    }
    assert exposed == {r["family"] for r in contract["metrics"] if r["source"] == "vllm"} | spec
    for name in spec:
        assert fams[name].type == "counter", name
    assert {s.labels["position"] for s in fams["vllm:spec_decode_num_accepted_tokens_per_pos"].samples} >= {"0", "1"}
    assert "vllm:gpu_cache_usage_perc" not in text and "vllm:time_per_output_token_seconds" not in text
    if shutil.which("promtool"):  # Debian's prometheus (.ci/run installs it); the families are checked above
        r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False)
        assert "error" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr


def _sample(fams: dict, family: str, suffix: str = "", **labels) -> float:
    for s in fams[family].samples:
        if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no {family}{suffix} {labels}")


def _has(fams: dict, family: str, labels: dict) -> bool:
    return family in fams and any(all(s.labels.get(k) == v for k, v in labels.items()) for s in fams[family].samples)


def test_metrics_move_with_real_timings(served):
    base, _ = served
    before = _families(urlopen_text(base + "/metrics"))
    r = op.stream_chat(base, "tiny", prompt="one two three", max_tokens=6, api_key=KEY, timeout=20)
    assert r["completion_tokens"] == 6
    after = _families(urlopen_text(base + "/metrics"))
    ok = {"finished_reason": "length"}
    assert (
        _sample(after, "vllm:request_success", "_total", **ok) - _sample(before, "vllm:request_success", "_total", **ok)
        == 1
    )
    assert _sample(after, "vllm:generation_tokens", "_total") - _sample(before, "vllm:generation_tokens", "_total") == 6
    ttft = "vllm:time_to_first_token_seconds"
    assert _sample(after, ttft, "_count") - _sample(before, ttft, "_count") == 1
    assert _sample(after, ttft, "_sum") > _sample(before, ttft, "_sum")
    itl = "vllm:inter_token_latency_seconds"
    assert _sample(after, itl, "_count") - _sample(before, itl, "_count") == 5
    spent = _sample(after, itl, "_sum") - _sample(before, itl, "_sum")
    first = _sample(after, ttft, "_sum") - _sample(before, ttft, "_sum")
    # 40 tok/s: five gaps of ~25 ms, really waited. Counted with the first token: on a loaded machine a late first
    # token is followed by tokens already made (the engine makes up a lag within one step), so the gaps alone can
    # be short while the request as a whole still took every step.
    assert first + spent > 5 / 40 * 0.8 and spent < 5 / 40 * 8, (first, spent)
    e2e = "vllm:e2e_request_latency_seconds"
    assert _sample(after, e2e, "_sum") - _sample(before, e2e, "_sum") >= spent
    http = "http_requests"
    sel = {"handler": "/v1/chat/completions", "method": "POST", "status": "2xx"}
    # The instrumentator makes a handler's sample at its first request: none before it on a server this test asks first.
    was = _sample(before, http, "_total", **sel) if _has(before, http, sel) else 0
    assert _sample(after, http, "_total", **sel) - was == 1

    # speculative decoding (ngram, 2 tokens): one draft per decode step of the request (5 after the
    # prefill's token), 2 draft tokens each, accepted <= drafted, and a position counted only when every
    # earlier one was (metrics.py:39-45); the pace above is the paced 40 tok/s all the same (never kinder)
    def delta(family, **labels):
        return _sample(after, family, "_total", **labels) - _sample(before, family, "_total", **labels)

    assert delta("vllm:spec_decode_num_drafts") == 5
    assert delta("vllm:spec_decode_num_draft_tokens") == 10
    accepted = delta("vllm:spec_decode_num_accepted_tokens")
    per_pos = [delta("vllm:spec_decode_num_accepted_tokens_per_pos", position=str(i)) for i in range(2)]
    assert 0 <= accepted <= 10 and sum(per_pos) == accepted and per_pos[0] >= per_pos[1] and per_pos[0] <= 5


def test_disable_log_stats_removes_vllm_families(hf_home):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(DOUBLE),
            "serve",
            MODEL,
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--disable-log-stats",
        ],
        env=env_for(hf_home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                op.get_health(base, timeout=1)
                break
            except op.ProbeError:
                time.sleep(0.2)
        text = urlopen_text(base + "/metrics")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    fams = _families(text)
    assert not [n for n in fams if n.startswith("vllm:")]
    assert "http_requests" in fams and "process_resident_memory_bytes" in fams


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


def test_a_dead_tp_member_kills_the_engine_like_vllm_0_19_0(ray_head, hf_home, tmp_path):
    """A TP worker process killed (SIGKILL, a real death): idle /health stays 200 (vLLM 0.19.0's Ray executor
    does not probe its workers), the next request fails with EngineDeadError's 500, /health turns 503 or the
    port closes, and the API server exits by itself with status 0."""
    port = free_port()
    logf = tmp_path / "double.log"
    with logf.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(DOUBLE),
                "serve",
                MODEL,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--served-model-name",
                "tiny",
                "--distributed-executor-backend",
                "ray",
            ],
            env=env_for(hf_home, ray_head),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "GPU workers up" not in logf.read_text():
            assert proc.poll() is None, logf.read_text()
            time.sleep(0.2)
        pids = [int(p) for p in logf.read_text().split("worker pids ")[1].split()[0].split(",")]
        while time.monotonic() < deadline:
            try:
                op.get_health(base, timeout=1)
                break
            except op.ProbeError:
                time.sleep(0.2)
        os.kill(pids[0], signal.SIGKILL)
        time.sleep(2)
        assert op.get_health(base)["status"] == 200  # idle: nothing asks the workers
        status, data = _post(base, "/v1/completions", {"model": "tiny", "prompt": "a b", "max_tokens": 4}, key=None)
        assert status == 500, data
        assert json.loads(data)["error"]["message"].startswith("EngineCore encountered an issue")
        with pytest.raises(op.ProbeError):
            op.get_health(base, timeout=2)  # 503, or already refused
        assert proc.wait(timeout=20) == 0
        assert "EngineDeadError" in logf.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_stuck_tp_member_ends_the_engine_after_ray_cgraph_get_timeout(ray_head, hf_home, tmp_path):
    """A TP worker stopped (SIGSTOP: alive, never answering): vLLM 0.19.0's compiled-graph get gives up after
    RAY_CGRAPH_get_timeout (300 s by default, ray_executor.py:551-558; 3 s here) and the engine is dead."""
    port, logf = free_port(), tmp_path / "double.log"
    proc = _start(
        ["--port", str(port), "--served-model-name", "tiny", "--distributed-executor-backend", "ray"],
        env_for(hf_home, ray_head, RAY_CGRAPH_get_timeout="3"),
        logf,
    )
    base, pid = f"http://127.0.0.1:{port}", None
    try:
        _wait_healthy(proc, base, logf)
        pid = int(logf.read_text().split("worker pids ")[1].split()[0].split(",")[0])
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        status, data = _post(base, "/v1/completions", {"model": "tiny", "prompt": "a b", "max_tokens": 4}, key=None)
        waited = time.monotonic() - t0
        assert status == 500, data
        assert 2.5 < waited < 15, waited
        assert "GetTimeoutError" in logf.read_text()
        assert proc.wait(timeout=20) == 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)  # the stopped Ray actor this test stopped
        _stop(proc)


# --- the double speaks each stack's release -------------------------------------------------------------


def test_the_double_picks_the_contract_of_the_release_its_image_carries():
    d = _load_double()
    standin = DOUBLE.parent
    assert d.contract_file("0.33.0") == standin / "vllm-contract-0.33.0.json"  # vLLM's own image of the stack
    assert d.contract_file("0.33.0+cu130") == standin / "vllm-contract-0.33.0.json"
    # eugr's dirty-tree build of v0.19.0, and a release with no recording: the default stack's contract
    assert d.contract_file("0.19.1.dev0+g2a69949bd.d20260410.cu132") == standin / "vllm-contract.json"
    assert d.contract_file("0.19.0") == standin / "vllm-contract.json"
    assert d.contract_file("0.31.0") == standin / "vllm-contract.json"
    # every recorded release has its copy, the recording plus its help text
    for release in recorded_versions():
        path = standin / ("vllm-contract.json" if release == PINNED else f"vllm-contract-{release}.json")
        copy = json.loads(path.read_text())
        help_text = (ROOT / "plugins" / "plugin_utils" / "vllm_contracts" / f"vllm-{release}.help.txt").read_text()
        assert copy == {**load_contract(release), "help_all": help_text}, release


@pytest.mark.parametrize("name", sorted(n for n in PROFILES if n not in PINNED_PROFILES))
def test_the_double_on_0_33_0_takes_the_profiles_written_for_it(name):
    d = _load_double()
    newer = json.loads(d.contract_file("0.33.0").read_text())
    allow = [{"rule": r, "reason": "argv check"} for r in ("not-recommended", "mxfp4-only-gpt-oss")]
    argv = vllm_serve_args(PROFILES[name], "127.0.0.1", 8000, gpus_per_node=1, allow_rules=allow)[2:]
    args = d.build_parser(newer).parse_args(d.flexible(["serve", *argv, "--no-enable-prefix-caching"]))
    assert args.enable_prefix_caching is False  # the hidden form 0.33.0 still takes
    assert d.engine_config_problems(args, newer) == []
    with pytest.raises(SystemExit) as exc:  # the default stack's release refuses it
        d.build_parser(d.load_contract()).parse_args(d.flexible(["serve", *argv]))
    assert exc.value.code == 2


def test_version_answers_from_the_selected_release(hf_home):
    env = dict(env_for(hf_home), SPARKOPS_TEST_DOUBLE_CONTRACT=str(DOUBLE.parent / "vllm-contract-0.33.0.json"))
    r = run_double(["--version"], env)
    assert r.returncode == 0 and r.stdout.strip() == "0.33.0"


def test_the_double_s_enable_disable_pairs_set_their_dest_like_0_33_0():
    """vllm/utils/argparse_utils.py:120-145 of 0.33.0: the field's own option sets True, its inverse and --no- False."""
    d = _load_double()
    parser = d.build_parser(json.loads(d.contract_file("0.33.0").read_text()))
    for argv, dest, value in (
        (["--enable-prefix-caching"], "enable_prefix_caching", True),
        (["--disable-prefix-caching"], "enable_prefix_caching", False),
        (["--no-enable-prefix-caching"], "enable_prefix_caching", False),
        (["--disable-custom-all-reduce"], "disable_custom_all_reduce", True),
        (["--enable-custom-all-reduce"], "disable_custom_all_reduce", False),
        (["--no-disable-custom-all-reduce"], "disable_custom_all_reduce", False),
    ):
        assert getattr(parser.parse_args(d.flexible(["serve", "m", *argv])), dest) is value, argv


def test_sigterm_ends_the_api_server_with_a_stream_in_flight_and_exit_status_0(hf_home, tmp_path):
    """vLLM 0.19.0's serve_http turns SIGTERM into a shutdown (launcher.py:97-104): the engine stops at once
    (shutdown_timeout 0), the stream in flight ends, the process exits 0 with uvicorn's last line. A double
    without the handler dies of the signal here (status -15) and, as PID 1 of a container, ignores
    `docker stop` until its timeout kills it."""
    port, logf = free_port(), tmp_path / "double.log"
    proc = _start(["--port", str(port)], env_for(hf_home), logf)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}", logf)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 4000, "stream": True})
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.fp.readline()  # the stream has begun
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, logf.read_text()
    finally:
        _stop(proc)
    log = logf.read_text()
    assert "Shutting down FastAPI HTTP server." in log and "Application shutdown complete." in log, log
