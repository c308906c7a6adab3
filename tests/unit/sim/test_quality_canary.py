"""The quality canary against the vLLM test double on 127.0.0.1 (one process, no Ray, TP=1).

The double answers /v1/completions' prompt_logprobs as vLLM 0.19.0 does (vllm/entrypoints/openai/completion/
protocol.py:83, :384-397, :469; vllm/logprobs.py:12-25, :162-205): honest, from a deterministic text model plus
a per-request jitter standing for kernels that are not batch-invariant; wrong on purpose (SIGUSR1, or
SPARKOPS_TEST_DOUBLE_ANSWERS=wrong at start) with /health still 200. Shown here: 20 probes and 3 restarts of the
honest double spread inside the tolerance proposed from them, and the wrong double lands far outside it.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import openai_probe as op
from ansible_collections.sparkops.cluster.plugins.module_utils import quality_probe as qp
from ansible_collections.sparkops.cluster.plugins.plugin_utils import quality
from conftest import ROOT
from double_fixtures import MODEL, free_port, tiny_hf_home

DOUBLE = ROOT / "sim" / "standin" / "vllm_test_double.py"
KEY = "sk-canary-key"
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    return tiny_hf_home(tmp_path_factory.mktemp("hf"))


class Double:
    def __init__(self, hf_home: Path, logdir: Path, **env):
        self.hf_home, self.logdir, self.extra = hf_home, logdir, env
        self.proc: subprocess.Popen | None = None
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.starts = 0

    def start(self) -> None:
        env = dict(os.environ, HF_HOME=str(self.hf_home), PYTHONUNBUFFERED="1", SPARKOPS_TEST_DOUBLE_TOK_S="400")
        env.update(VLLM_CACHE_ROOT=str(self.hf_home / "vllm-cache"), **self.extra)
        for name in ("HF_HUB_CACHE", "VLLM_HOST_IP", "RAY_ADDRESS"):
            env.pop(name, None)
        self.starts += 1
        self.log = self.logdir / f"double-{self.starts}.log"
        argv = ["serve", MODEL, "--host", "127.0.0.1", "--port", str(self.port), "--api-key", KEY]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(DOUBLE), *argv, "--served-model-name", "tiny"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                op.get_health(self.base, timeout=1)
                return
            except op.ProbeError:
                time.sleep(0.1)
        pytest.fail("the double did not answer /health:\n" + self.log.read_text())

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)
        time.sleep(0.3)

    def probe(self) -> dict:
        return qp.probe(self.base, "tiny", api_key=KEY, timeout=20)

    def post(self, body: dict) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        conn.request("POST", "/v1/completions", json.dumps(body), {"Authorization": f"Bearer {KEY}"})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, data


@pytest.fixture
def double(hf_home, tmp_path):
    made: list[Double] = []

    def make(**env) -> Double:
        d = Double(hf_home, tmp_path, **env)
        made.append(d)
        d.start()
        return d

    yield make
    for d in made:
        d.stop()


def test_prompt_logprobs_are_answered_as_vllm_0_19_0_does(double):
    d = double()
    prompt = "one two three four five"
    status, data = d.post({"model": "tiny", "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0})
    assert status == 200
    choice = json.loads(data)["choices"][0]
    plp = choice["prompt_logprobs"]
    assert len(plp) == 5 and plp[0] is None  # vllm/logprobs.py:162-167
    for word, pos in zip(prompt.split()[1:], plp[1:], strict=True):
        ((tid, lp),) = pos.items()  # prompt_logprobs 0: the prompt token alone (vllm/logprobs.py:175-205)
        assert tid.isdigit() and set(lp) == {"logprob", "rank", "decoded_token"}
        assert lp["decoded_token"] == word and -5.1 < lp["logprob"] < 0 and lp["rank"] >= 1
    status, data = d.post({"model": "tiny", "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 2})
    top = json.loads(data)["choices"][0]["prompt_logprobs"]
    assert all({1, 2} <= {v["rank"] for v in pos.values()} for pos in top[1:])
    # check_logprobs (protocol.py:384-397): no positive prompt_logprobs with stream; no negative but -1
    status, data = d.post({"model": "tiny", "prompt": prompt, "prompt_logprobs": 1, "stream": True})
    assert status == 400 and b"`prompt_logprobs` are not available when `stream=True`." in data
    status, data = d.post({"model": "tiny", "prompt": prompt, "prompt_logprobs": -2})
    assert status == 400 and b"must be a positive value or -1" in data
    status, data = d.post({"model": "tiny", "prompt": prompt, "max_tokens": 2, "prompt_logprobs": 0, "stream": True})
    assert status == 200 and b"prompt_logprobs" not in data  # no such field in a stream choice (protocol.py:489)
    # Without it, the answer is what it was: no prompt_logprobs key, WORDS as the text.
    status, data = d.post({"model": "tiny", "prompt": prompt, "max_tokens": 3})
    choice = json.loads(data)["choices"][0]
    assert "prompt_logprobs" not in choice and choice["text"] == "the quick brown"


def test_honest_spread_over_20_probes_and_3_restarts_stays_inside_the_tolerance_and_wrong_is_far_outside(double):
    d = double()
    runs = [d.probe() for _ in range(20)]
    for _ in range(3):
        d.stop()
        d.start()
        runs.append(d.probe())
    figures = [r["figures"] for r in runs]
    assert all(qp.judge(f)["ok"] for f in figures), [qp.judge(f) for f in figures]
    tol = quality.propose_tolerance(figures)
    baseline = quality.pick_baseline(figures)
    means = [f["mean_logprob"] for f in figures]
    spread = max(means) - min(means)
    assert 0 < spread < tol["tolerance"] and tol["stable"]  # the jitter is real, and inside
    assert all(qp.judge(f, baseline, tol["tolerance"])["ok"] for f in figures)
    cost = runs[0]["cost"]
    assert cost["requests"] == 4 and cost["prompt_tokens"] > 200 and cost["completion_tokens"] <= 10

    d.signal(signal.SIGUSR1)  # answers turn wrong; the server stays up
    assert op.get_health(d.base, timeout=2)["status"] == 200
    wrong = d.probe()["figures"]
    verdict = qp.judge(wrong, baseline, tol["tolerance"])
    assert not verdict["ok"] and verdict["compared"]
    assert abs(verdict["delta_mean_logprob"]) > 20 * tol["tolerance"]
    assert wrong["mean_logprob"] == pytest.approx(-math.log(32000), abs=0.06)  # near-uniform over the vocabulary
    assert not any(a["ok"] for a in wrong["known_answers"].values())
    assert "TEST DOUBLE: answers are now wrong" in d.log.read_text()
    d.signal(signal.SIGUSR2)  # and honest again
    assert qp.judge(d.probe()["figures"], baseline, tol["tolerance"])["ok"]
    print(  # noqa: T201 - the figures the report quotes (pytest -s)
        f"\n[canary] {len(figures)} honest probes over {d.starts} starts: mean_logprob "
        f"{min(means):.5f}..{max(means):.5f} (spread {spread:.5f}), proposed {tol}; probe cost {cost}; "
        f"wrong mode: mean_logprob "
        f"{wrong['mean_logprob']}, perplexity {wrong['perplexity']}, delta {verdict['delta_mean_logprob']}, "
        f"known answers {wrong['known_answers']}"
    )


def test_the_double_can_start_wrong_and_refuses_an_unknown_answer_mode(double, hf_home, tmp_path):
    d = double(SPARKOPS_TEST_DOUBLE_ANSWERS="wrong")
    assert op.get_health(d.base, timeout=2)["status"] == 200
    status, data = d.post({"model": "tiny", "prompt": qp.known_answer_prompt("What is 17 + 25?"), "max_tokens": 6})
    assert status == 200 and json.loads(data)["choices"][0]["text"].split()[0] != "42"
    assert not qp.judge(d.probe()["figures"])["ok"]
    env = dict(os.environ, HF_HOME=str(hf_home), SPARKOPS_TEST_DOUBLE_ANSWERS="subtle")
    env.pop("HF_HUB_CACHE", None)
    res = subprocess.run(
        [sys.executable, str(DOUBLE), "serve", MODEL, "--host", "127.0.0.1", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 1 and "SPARKOPS_TEST_DOUBLE_ANSWERS='subtle': one of honest, wrong" in res.stdout
