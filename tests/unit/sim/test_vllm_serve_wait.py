"""roles/vllm_serve/tasks/wait.yml judged on the server's answers (issue 16.4).

ansible-playbook runs the role's wait tasks on localhost: the vllm_serve_wait module through its
action plugin, in the until loop of wait.yml. The server is the vLLM test double
(sim/standin/vllm_test_double.py, TP=1, no Ray) on 127.0.0.1; `docker` is a stand-in script on
PATH that prints what `docker inspect`/`docker logs` print for the state under test (the format
string the module passes is Docker's own), so no Docker engine is needed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from double_fixtures import MODEL, free_port, tiny_hf_home

DOUBLE = ROOT / "sim" / "standin" / "vllm_test_double.py"
VENV_BIN = Path(sys.executable).parent
KEY = "sk-wait-test"
pytestmark = pytest.mark.timeout(180)

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Wait the way vllm_serve does
      ansible.builtin.include_tasks: {wait}
"""


def fake_docker(tmp_path: Path, state: str, log_lines: list[str]) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "logs.txt").write_text("\n".join(log_lines) + "\n")
    script = bindir / "docker"
    script.write_text(
        f'#!/bin/sh\ncase "$1" in inspect) echo "{state}";; logs) cat {tmp_path / "logs.txt"} >&2;; *) exit 3;; esac\n'
    )
    script.chmod(0o755)
    return bindir


def run_wait(tmp_path: Path, bindir: Path, port: int, timeout_s: int, every_s: int) -> subprocess.CompletedProcess:
    pb = tmp_path / "wait.yml"
    pb.write_text(PLAYBOOK.format(wait=ROOT / "roles" / "vllm_serve" / "tasks" / "wait.yml"))
    extra = {
        "ansible_python_interpreter": sys.executable,
        # The serving plan's API members (serving.py vllm_members), one replica here.
        "sparkops_cluster": {
            "serving": {
                "vllm_members": [
                    {
                        "role": "api",
                        "host": "localhost",
                        "deployment": "main",
                        "replica": 0,
                        "endpoint": {"url": f"http://127.0.0.1:{port}"},
                        "served_model_name": "tiny",
                        "vllm": {"container": "sparkops-vllm"},
                    }
                ]
            }
        },
        "vllm_serve_api_key": KEY,
        "vllm_serve_progress_every_s": every_s,
        "vllm_serve_ready_timeout_s": timeout_s,
        "vllm_serve_smoke_prompt": "Say hello",
        "vllm_serve_smoke_max_tokens": 4,
    }
    env = dict(
        os.environ,
        PATH=f"{bindir}:{VENV_BIN}:{os.environ['PATH']}",
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
    )
    return subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", str(pb), "-e", json.dumps(extra)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=150,
        check=False,
    )


@pytest.fixture
def hf_home(tmp_path) -> Path:
    return tiny_hf_home(tmp_path / "hf")


def test_a_vllm_that_restarted_and_came_up_is_ready(tmp_path, hf_home):
    """Docker says `running 0 11` (11 restarts: a crash loop that was fixed) and the API is not up yet
    in the first round; it comes up a few seconds later. Today's wait failed in round one
    ("is not running ... restarts"); it must wait for the answers and report READY."""
    port = free_port()
    bindir = fake_docker(tmp_path, "running 0 11", ["INFO crash-looped before", "INFO loading weights"])
    env = dict(os.environ, HF_HOME=str(hf_home), SPARKOPS_TEST_DOUBLE_TOK_S="200", PYTHONUNBUFFERED="1")
    env.update(VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"))  # the double keeps its compile marker there
    env.pop("HF_HUB_CACHE", None)
    # The server starts 8 s late: the first 2-s rounds see no answer.
    cmd = (
        f"sleep 8; exec {sys.executable} {DOUBLE} serve {MODEL} --host 127.0.0.1 --port {port} "
        f"--api-key {KEY} --served-model-name tiny --tensor-parallel-size 1"
    )
    with (tmp_path / "double.log").open("w") as log:
        server = subprocess.Popen(["sh", "-c", cmd], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        res = run_wait(tmp_path, bindir, port, timeout_s=60, every_s=2)
        took = time.monotonic() - t0
    finally:
        server.terminate()
        server.wait(timeout=10)
    out = res.stdout
    assert res.returncode == 0, out[-3000:] + (tmp_path / "double.log").read_text()[-1000:]
    flat = " ".join(out.split())
    # Each round's progress line shows without -v (the action plugin marks the round's result).
    assert "vLLM on localhost: starting after" in flat, out[-3000:]
    assert "container running (exit code 0, 11 restarts); API: refused" in flat, out[-3000:]
    ready = re.search(
        r"vLLM on localhost: READY after (\d+) s of waiting \((\d+) rounds\); ttft [0-9.]+ s, [0-9.]+ tok/s", flat
    )
    assert ready, out[-3000:]
    # Not ready in round one: at least one more round after a whole round of 2 s. (The server starts 8 s after it
    # is launched, but the wait's clock starts only once ansible-playbook has started, which takes seconds more on
    # a loaded machine, so the seconds waited say less than the rounds.)
    assert int(ready.group(1)) >= 2 and int(ready.group(2)) >= 2, ready.group(0)
    assert KEY not in out
    assert took < 60


def test_a_stopped_container_fails_with_readable_log_lines(tmp_path):
    """Nothing answers and Docker says `exited 1 3`: the wait stops at once, and the message carries the
    log lines one per line (today they were joined with a literal backslash-n)."""
    port = free_port()  # nothing listens there
    lines = ["INFO starting", "ERROR Traceback (most recent call last):", "ValueError: shard 2 of 4 is missing"]
    bindir = fake_docker(tmp_path, "exited 1 3", lines)
    t0 = time.monotonic()
    res = run_wait(tmp_path, bindir, port, timeout_s=120, every_s=1)
    took = time.monotonic() - t0
    out = res.stdout
    assert res.returncode != 0
    flat = " ".join(out.split())
    assert "stopped without answering: container sparkops-vllm is exited (exit code 1, 3 restarts)" in flat, out
    assert "\\n" not in out.split("stopped without answering", 1)[1]
    assert "\n      ValueError: shard 2 of 4 is missing\n" in out or "  ValueError: shard 2 of 4 is missing\n" in out
    assert took < 60, "a stopped container must not be waited on until the deadline"


def test_no_answer_until_the_deadline_names_the_deadline(tmp_path):
    """Running but never answering: the wait ends at the deadline, not before, and says so."""
    port = free_port()
    bindir = fake_docker(tmp_path, "running 0 2", ["INFO still loading"])
    t0 = time.monotonic()
    res = run_wait(tmp_path, bindir, port, timeout_s=4, every_s=1)
    took = time.monotonic() - t0
    assert res.returncode != 0
    assert "did not answer within 4 s" in res.stdout, res.stdout[-3000:]
    assert "  INFO still loading\n" in res.stdout
    assert took >= 4
