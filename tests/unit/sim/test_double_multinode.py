"""The vLLM test double in vLLM 0.19.0's own multi-node mode (--nnodes/--node-rank/--master-addr/--master-port,
ranks > 0 --headless), several processes on 127.0.0.x, without Ray.

What must hold, as in 0.19.0 (sources cited in sim/standin/vllm_test_double.py, MultiNode): the head serves only
once every rank has joined its store on --master-addr:--master-port, and gives up after the process-group timeout
(--distributed-timeout-seconds here, 600 s by default) with torch's message; a headless rank serves no API and
announces VLLM_HOST_IP (else the default route's address); an idle head keeps answering /health 200 when a rank
dies, its next request waits VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS and kills the engine (500, then the API server
exits 0); a headless rank whose head dies does NOT exit; --distributed-executor-backend ray with --nnodes 2 is
refused with ParallelConfig's message.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import openai_probe as op
from conftest import ROOT
from double_fixtures import MODEL, free_port, tiny_hf_home

DOUBLE = ROOT / "sim" / "standin" / "vllm_test_double.py"
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    return tiny_hf_home(tmp_path_factory.mktemp("hf"))


def _env(hf_home: Path, **extra) -> dict:
    env = dict(os.environ, HF_HOME=str(hf_home), SPARKOPS_TEST_DOUBLE_TOK_S="200", PYTHONUNBUFFERED="1")
    env.update(VLLM_CACHE_ROOT=str(hf_home / "vllm-cache"))
    for name in ("HF_HUB_CACHE", "VLLM_HOST_IP", "HOST_IP", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "RAY_ADDRESS"):
        env.pop(name, None)
    env.update(extra)
    return env


class Rank:
    """One `vllm serve` rank as a process of its own session, its output in a file."""

    def __init__(self, tmp: Path, name: str, args: list[str], env: dict):
        self.log = tmp / f"{name}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(DOUBLE), "serve", MODEL, *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text()

    def wait_for(self, needle: str, within: float = 15) -> None:
        deadline = time.monotonic() + within
        while needle not in self.text():
            assert self.proc.poll() is None, self.text()
            assert time.monotonic() < deadline, f"{needle!r} not logged within {within} s:\n{self.text()}"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture
def ranks():
    started: list[Rank] = []
    yield started
    for r in started:
        r.stop()


def _mp_args(nnodes: int, rank: int, master_port: int, *extra: str) -> list[str]:
    args = ["-tp", str(nnodes), "--nnodes", str(nnodes), "--node-rank", str(rank)]
    args += ["--master-addr", "127.0.0.1", "--master-port", str(master_port), "--distributed-timeout-seconds", "20"]
    return args + (["--headless"] if rank else []) + list(extra)


def _healthy(base: str) -> bool:
    try:
        return op.get_health(base, timeout=1)["status"] == 200
    except op.ProbeError:
        return False


def _wait_healthy(head: Rank, base: str, within: float = 15) -> None:
    deadline = time.monotonic() + within
    while not _healthy(base):
        assert head.proc.poll() is None, head.text()
        assert time.monotonic() < deadline, head.text()
        time.sleep(0.05)


def _complete(base: str) -> tuple[int, dict]:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = json.dumps({"model": "tiny", "prompt": "a b c", "max_tokens": 12})
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read() or b"{}")
    conn.close()
    return resp.status, data


def test_two_nodes_serve_only_once_the_headless_rank_joined_and_a_dead_rank_kills_the_engine(hf_home, tmp_path, ranks):
    port, master = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    head_args = _mp_args(2, 0, master, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny")
    head = Rank(
        tmp_path, "head", head_args, _env(hf_home, VLLM_HOST_IP="127.0.0.1", VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="1")
    )
    ranks.append(head)
    head.wait_for("DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=127.0.0.1, mq_connect_ip=127.0.0.1")
    head.wait_for(f"world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://127.0.0.1:{master} backend=nccl")
    time.sleep(1.0)
    assert not _healthy(base), "the head serves while rank 1 has not joined"
    assert "Application startup complete" not in head.text()

    rank1 = Rank(tmp_path, "rank1", _mp_args(2, 1, master), _env(hf_home, VLLM_HOST_IP="127.0.0.2"))
    ranks.append(rank1)
    _wait_healthy(head, base)
    status, data = _complete(base)
    assert status == 200, data
    assert data["usage"]["completion_tokens"] == 12
    assert "rank 1 at 127.0.0.2" in head.text()  # what rank 1 announced: its VLLM_HOST_IP
    r1 = rank1.text()
    assert (
        f"Launching vLLM (v0.19.0) headless multiproc executor, with head node address 127.0.0.1:{master} for "
        "torch.distributed process group." in r1
    )
    assert f"world_size=2 rank=1 local_rank=0 distributed_init_method=tcp://127.0.0.1:{master} backend=nccl" in r1
    assert "vLLM API server version" not in r1 and "Starting vLLM API server" not in r1  # headless

    rank1.stop()  # SIGKILL: the node's vLLM is gone
    time.sleep(0.5)
    assert _healthy(base), "idle: 0.19.0's head does not probe its ranks"
    t0 = time.monotonic()
    status, data = _complete(base)
    waited = time.monotonic() - t0
    assert status == 500, data
    assert data["error"]["message"].startswith("EngineCore encountered an issue")
    assert 0.9 < waited < 10, waited  # VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=1
    assert head.proc.wait(timeout=15) == 0  # the API server shuts down by itself, status 0
    assert not _healthy(base)
    assert "EngineCore encountered a fatal error: TimeoutError: RPC call to execute_model timed out." in head.text()


def test_three_nodes_wait_for_the_last_rank_and_headless_ranks_outlive_their_head(hf_home, tmp_path, ranks):
    port, master = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    # the store on --master-addr, the step queue on VLLM_HOST_IP: two addresses, as on a Spark's two networks
    head = Rank(
        tmp_path,
        "head",
        _mp_args(3, 0, master, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny"),
        _env(hf_home, VLLM_HOST_IP="127.0.0.3"),
    )
    ranks.append(head)
    rank2 = Rank(tmp_path, "rank2", _mp_args(3, 2, master), _env(hf_home, VLLM_HOST_IP="127.0.0.5"))
    ranks.append(rank2)
    head.wait_for("mq_connect_ip=127.0.0.3 (local), world_size=3")
    rank2.wait_for("world_size=3 rank=2")
    time.sleep(1.0)
    assert not _healthy(base), "the head serves while rank 1 of 3 has not joined"
    rank1 = Rank(tmp_path, "rank1", _mp_args(3, 1, master), _env(hf_home, VLLM_HOST_IP="127.0.0.4"))
    ranks.append(rank1)
    _wait_healthy(head, base)
    assert _complete(base)[0] == 200
    assert "rank 0 at 127.0.0.3, rank 1 at 127.0.0.4, rank 2 at 127.0.0.5" in head.text()
    assert "head's queue at 127.0.0.3" in rank1.text()

    head.stop()
    time.sleep(1.5)
    for r in (rank1, rank2):
        assert r.proc.poll() is None, "a headless rank exited with its head; 0.19.0's does not"
        assert 'Failed to check the "should dump" flag on TCPStore' in r.text()
    rank1.proc.send_signal(signal.SIGTERM)  # serve.py:176-184: SystemExit
    assert rank1.proc.wait(timeout=10) == 0


def test_the_head_gives_up_after_the_process_group_timeout_and_never_listens(hf_home, tmp_path, ranks):
    port, master = free_port(), free_port()
    args = _mp_args(2, 0, master, "--host", "127.0.0.1", "--port", str(port))
    args[args.index("--distributed-timeout-seconds") + 1] = "1"
    head = Rank(tmp_path, "head", args, _env(hf_home, VLLM_HOST_IP="127.0.0.1"))
    ranks.append(head)
    assert head.proc.wait(timeout=15) == 1
    out = head.text()
    assert "torch.distributed.DistStoreError: Timed out after 2 seconds waiting for clients. 1/2 clients joined." in out
    assert "RuntimeError: Engine core initialization failed. See root cause above." in out
    assert "Application startup complete" not in out


def test_a_headless_rank_without_its_head_gives_up_after_the_timeout(hf_home, tmp_path, ranks):
    master = free_port()
    args = _mp_args(2, 1, master)
    args[args.index("--distributed-timeout-seconds") + 1] = "1"
    rank1 = Rank(tmp_path, "rank1", args, _env(hf_home, VLLM_HOST_IP="127.0.0.2"))
    ranks.append(rank1)
    assert rank1.proc.wait(timeout=15) == 1
    assert (
        f"The client socket has timed out after 1000ms while trying to connect to (127.0.0.1, {master})."
        in rank1.text()
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["-tp", "2", "--nnodes", "2", "--distributed-executor-backend", "ray"],
            "ValidationError: 1 validation error for ParallelConfig\n  Value error, nnodes > 1 can only be set when "
            "distributed executor backend is mp, uni or external_launcher.",
        ),
        (["-tp", "3", "--nnodes", "2"], "AssertionError: world_size=3 must be divisible by nnodes=2."),
        (["--nnodes", "2"], "AssertionError: world_size=1 must be divisible by nnodes=2."),
        (["-tp", "2", "-n", "2", "-r", "2", "--headless"], "AssertionError: node_rank=2 must be less than nnodes=2."),
        (
            ["-tp", "2", "-n", "2", "-r", "1", "--headless", "--api-server-count", "1"],
            "ValueError: --api-server-count=1 cannot be used with --headless "
            "(no API servers are started in headless mode).",
        ),
        (["-tp", "2", "-n", "2", "-r", "1"], "AssertionError: collective_rpc should not be called on follower node"),
    ],
)
def test_refuses_what_0_19_0_refuses_in_multi_node_mode(hf_home, args, message):
    r = subprocess.run(
        [sys.executable, str(DOUBLE), "serve", MODEL, "--port", str(free_port()), *args],
        env=_env(hf_home),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert message in r.stdout, r.stdout


def test_each_rank_announces_vllm_host_ip_else_the_default_route_s_address(monkeypatch):
    spec = importlib.util.spec_from_file_location("vllm_test_double_mn", DOUBLE)
    d = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(d)
    monkeypatch.delenv("VLLM_HOST_IP", raising=False)
    monkeypatch.setenv("HOST_IP", "127.0.0.9")  # deprecated and ignored (network_utils.py:29-37)
    assert d.get_ip() == d.default_route_ip()
    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.7")
    assert d.get_ip() == "127.0.0.7"
    monkeypatch.delenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", raising=False)
    assert d.execute_model_timeout() == 300  # envs.py:186
    assert d.TORCH_NCCL_PG_TIMEOUT_S == 600 and (d.MASTER_ADDR, d.MASTER_PORT) == ("127.0.0.1", 29501)


def test_a_stuck_headless_rank_ends_the_engine_after_vllm_execute_model_timeout_seconds(hf_home, tmp_path, ranks):
    """A rank stopped (SIGSTOP: alive, never answering): the head's step waits VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS
    (300 s by default; 2 s here), then the engine is dead."""
    port, master = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    head_env = _env(hf_home, VLLM_HOST_IP="127.0.0.1", VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="2")
    head_args = _mp_args(2, 0, master, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny")
    head = Rank(tmp_path, "head", head_args, head_env)
    rank1 = Rank(tmp_path, "rank1", _mp_args(2, 1, master), _env(hf_home, VLLM_HOST_IP="127.0.0.2"))
    ranks += [head, rank1]
    _wait_healthy(head, base)
    os.killpg(rank1.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        status, _ = _complete(base)
        waited = time.monotonic() - t0
    finally:
        os.killpg(rank1.proc.pid, signal.SIGCONT)
    assert status == 500
    assert 1.9 < waited < 10, waited
    assert head.proc.wait(timeout=15) == 0
