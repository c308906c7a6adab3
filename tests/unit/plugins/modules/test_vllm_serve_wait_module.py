"""vllm_serve_wait against vllm_health's loopback vLLM server (test_vllm_health.FakeVllm) and a fake docker CLI.

The docker stand-in is a script that prints what `docker inspect --format '<the module's format>'` and
`docker logs` print for the state under test, and records its argv, so no Docker engine is needed.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils.vllm_wait import INSPECT_FORMAT
from ansible_collections.sparkops.cluster.plugins.modules import vllm_serve_wait
from module_runner import run_module

# vllm_health's loopback server, shared: its folder is on the path under pytest's rootdir and under
# ansible-test units alike (which does not put a test's own folder there).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_vllm_health as health  # noqa: E402

KEY, MODEL = health.KEY, health.MODEL
server = health.server  # the fixture, under the name the tests ask for

pytestmark = pytest.mark.timeout(60)


def fake_docker(tmp_path: Path, state: str, log_lines: list[str]) -> tuple[Path, Path]:
    (tmp_path / "logs.txt").write_text("\n".join(log_lines) + "\n")
    calls = tmp_path / "calls.txt"
    script = tmp_path / "docker"
    script.write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        f'case "$1" in inspect) [ "$3" = \'{INSPECT_FORMAT}\' ] || exit 9; echo "{state}";; '
        f"logs) cat {tmp_path / 'logs.txt'} >&2;; *) exit 3;; esac\n"
    )
    script.chmod(0o755)
    return script, calls


@pytest.fixture
def refusing_url():
    """A loopback port bound and never listening: connections are refused, as vLLM's before its engine is up."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def args(url: str, docker: Path, **kw) -> dict:
    a = {
        "base_url": url,
        "api_key": KEY,
        "model": MODEL,
        "container": "sparkops-vllm",
        "host": "spark-1",
        "timeout_s": 20,
        "round_s": 5,
        "max_tokens": 4,
        "docker_path": str(docker),
    }
    a.update(kw)
    return a


def test_a_ready_server_is_ready_at_the_first_ask_without_reading_docker(server, tmp_path):  # noqa: F811
    docker, calls = fake_docker(tmp_path, "running 0 0", ["x"])
    r = run_module(vllm_serve_wait, args(server(tok_s=200), docker), check_mode=True)
    assert r.get("failed") is not True, r
    assert r["done"] and r["ready"] and r["healthy"] and r["changed"] is False
    assert r["ttft_s"] > 0 and r["tok_s"] > 0 and r["completion_tokens"] == 4
    assert set(r["checks"]) == {"health", "models", "completion"}
    assert r["checks"]["health"]["ok"] is True and r["checks"]["health"]["status"] == 200
    assert r["checks"]["models"]["ok"] is True and r["checks"]["models"]["model"] == MODEL
    assert r["checks"]["completion"]["elapsed_s"] >= r["ttft_s"]
    assert all(c["elapsed_s"] >= 0 for c in r["checks"].values())
    assert r["container"] is None and not calls.exists()
    assert r["msg"].startswith("vLLM on spark-1: READY after 0 s of waiting; ttft ")
    assert KEY not in json.dumps(r)


def test_restarted_and_starting_then_ready_over_rounds(server, tmp_path):  # noqa: F811
    """`running 0 5`: five restarts, then up. Rounds of 0.5 s return progress until the server listens."""
    docker, calls = fake_docker(tmp_path, "running 0 5", ["INFO crash-looped before", "INFO loading weights"])
    url = server(listen_after_s=2.5)
    started = time.time()
    rounds = []
    for _n in range(20):
        rounds.append(run_module(vllm_serve_wait, args(url, docker, started=started, round_s=0.5)))
        if rounds[-1]["done"]:
            break
    assert len(rounds) >= 3 and rounds[-1]["ready"] and rounds[-1].get("failed") is not True, rounds[-1]
    first = rounds[0]
    assert first["done"] is False and first.get("failed") is not True
    assert "container running (exit code 0, 5 restarts); API: refused; last log: INFO loading weights" in first["msg"]
    assert first["container"]["restarts"] == 5
    assert rounds[-1]["elapsed_s"] >= 2.5
    assert "inspect --format" in calls.read_text() and "logs --tail 40 sparkops-vllm" in calls.read_text()


def test_a_stopped_container_fails_at_once_quoting_its_log(refusing_url, tmp_path):
    lines = [f"INFO {i}" for i in range(20)] + ["ValueError: shard 2 of 4 is missing"]
    docker, _calls = fake_docker(tmp_path, "exited 1 3", lines)
    url = refusing_url
    t0 = time.monotonic()
    r = run_module(vllm_serve_wait, args(url, docker, timeout_s=120, round_s=60))
    assert time.monotonic() - t0 < 5
    assert r["failed"] is True and r["done"] is True
    assert r["msg"].startswith(
        "vLLM on spark-1 stopped without answering: container sparkops-vllm is exited (exit code 1, 3 restarts). "
        "Its last log lines:\n"
    )
    assert "\n  ValueError: shard 2 of 4 is missing\nFull log: docker logs sparkops-vllm on spark-1." in r["msg"]
    assert "  INFO 5\n" not in r["msg"] and "  INFO 6\n" in r["msg"]  # the last 15 lines


def test_the_deadline_holds_however_often_the_round_is_called(refusing_url, tmp_path):
    docker, _calls = fake_docker(tmp_path, "running 0 0", ["INFO still loading"])
    url = refusing_url
    started = time.time() - 9  # 9 of 10 s already spent
    t0 = time.monotonic()
    r = run_module(vllm_serve_wait, args(url, docker, started=started, timeout_s=10, round_s=30))
    assert 0.5 < time.monotonic() - t0 < 3, "a 30-s round ends at the deadline"
    assert r["failed"] is True and r["done"] is True
    assert r["msg"].startswith("vLLM on spark-1 did not answer within 10 s (refused: ")
    assert "container running (0 restarts). Its last log lines:\n  INFO still loading\n" in r["msg"]
    t0 = time.monotonic()
    again = run_module(vllm_serve_wait, args(url, docker, started=started, timeout_s=10, round_s=30))
    assert time.monotonic() - t0 < 2 and again["failed"] is True and "did not answer within 10 s" in again["msg"]


def test_a_wrong_key_fails_at_once_with_the_fix(server, tmp_path):  # noqa: F811
    docker, calls = fake_docker(tmp_path, "running 0 0", ["x"])
    r = run_module(vllm_serve_wait, args(server(), docker, api_key="sk-not-the-key"))
    assert r["failed"] is True and r["failure_kind"] == "unauthorized"
    assert "vllm_serve_api_key" in r["msg"] and "sk-not-the-key" not in json.dumps(r)
    assert not calls.exists()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"base_url": "http://127.0.0.1:1/v1"}, "ends in /v1"),
        ({"base_url": "127.0.0.1:1"}, "must start with http://"),
        ({"timeout_s": 0}, "vllm_serve_ready_timeout_s"),
        ({"round_s": -1}, "vllm_serve_progress_every_s"),
        ({"max_tokens": 0}, "vllm_serve_smoke_max_tokens"),
        ({"docker_path": "no-such-docker-cli"}, "no docker CLI (no-such-docker-cli) on spark-1"),
    ],
)
def test_bad_input_is_named(change, words, tmp_path):
    docker, calls = fake_docker(tmp_path, "running 0 0", ["x"])
    r = run_module(vllm_serve_wait, {**args("http://127.0.0.1:1", docker), **change})
    assert r["failed"] is True and words in r["msg"], r
    assert not calls.exists()


def test_a_slow_server_cannot_carry_an_ask_past_the_deadline(server, tmp_path):  # noqa: F811
    """Each request answers after 1.5 s; with 2 s left, health answers, /v1/models gets the rest and times
    out, and the wait ends at the deadline instead of giving each of the three requests its own timeout."""
    docker, _calls = fake_docker(tmp_path, "running 0 0", ["INFO loading"])
    url = server(slow_s=1.5)
    started = time.time() - 8
    t0 = time.monotonic()
    r = run_module(vllm_serve_wait, args(url, docker, started=started, timeout_s=10, round_s=30))
    assert time.monotonic() - t0 < 3.2, r
    assert r["failed"] is True and r["failure_kind"] == "timeout"
    assert r["msg"].startswith("vLLM on spark-1 did not answer within 10 s (timeout: ")


def test_a_server_slower_than_half_a_second_per_request_is_ready_with_time_left(server, tmp_path):  # noqa: F811
    """Each request answers after 0.7 s: with 20 s left, every request gets what is left (not the 0.5-s floor)."""
    docker, _calls = fake_docker(tmp_path, "running 0 0", ["x"])
    r = run_module(vllm_serve_wait, args(server(slow_s=0.7), docker))
    assert r.get("failed") is not True and r["ready"], r
    assert r["checks"]["health"]["elapsed_s"] >= 0.7
