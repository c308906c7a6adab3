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


def _watchdog():
    import importlib.util  # noqa: PLC0415 - the watchdog script is a file, not a package

    spec = importlib.util.spec_from_file_location(
        "sparkops_watchdog", ROOT / "roles/watchdog/files/sparkops_watchdog.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_watchdog_records_a_baseline_then_catches_wrong_answers_and_asks_a_restart(double, tmp_path):
    """The watchdog's quality thread against the double: the first right answers are the deployment's baseline,
    the switch to wrong answers (/health still 200) is a quality_failed event, and with quality_action "restart"
    the watch loop's decide() restarts the group within its budget; a new deployment key records a new baseline."""
    wdm = _watchdog()
    d = double()
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    cfg = {
        "endpoint": d.base, "model": "tiny", "api_key_file": str(key_file),
        "quality_script": str(ROOT / "plugins/module_utils/quality_probe.py"), "quality_interval_s": 60,
        "quality_baseline_file": str(tmp_path / "quality-baseline.json"), "vllm_container": "sparkops-vllm",
        "quality_tolerance": 0.25, "quality_action": "restart", "quality_timeout_s": 20,
        "max_restarts_per_hour": 2, "failures_before_restart": 2, "hang_timeout_s": 4,
    }  # fmt: skip

    class FakeWatchdog:  # what the checker reads of the watch loop: its config, its state, its events
        state = {"status": "watching"}
        events = wdm.Events(str(tmp_path / "watchdog.jsonl"), "head")

    fake = FakeWatchdog()
    fake.cfg = cfg
    checker = wdm.QualityChecker(fake)
    running = {"key": "image-a tiny"}  # what `docker inspect` of the vLLM container would say
    checker.deployment_key = lambda: running["key"]

    def events() -> list[dict]:
        return [json.loads(x) for x in (tmp_path / "watchdog.jsonl").read_text().splitlines()]

    checker.judge()
    assert [e["event"] for e in events()] == ["quality_baseline", "quality_ok"]
    stored = json.loads((tmp_path / "quality-baseline.json").read_text())
    assert stored["key"] == "image-a tiny" and stored["figures"]["mean_logprob"] > -6
    written = (tmp_path / "quality-baseline.json").stat().st_mtime_ns
    checker.judge()  # judged against the baseline now
    assert events()[-1]["event"] == "quality_ok" and events()[-1]["compared"] is True
    # A judgement against the baseline writes nothing but its event: a refused run finds the state folder as it was.
    assert not list(tmp_path.glob("quality-baseline.json?*"))
    assert (tmp_path / "quality-baseline.json").stat().st_mtime_ns == written
    assert checker.wrong is None

    d.signal(signal.SIGUSR1)  # fluent but wrong, /health stays 200
    assert op.get_health(d.base, timeout=2)["status"] == 200
    checker.judge()
    failed = events()[-1]
    assert failed["event"] == "quality_failed" and failed["mean_logprob"] < -6, failed
    assert checker.wrong and "wrongly" not in checker.wrong  # the reasons, for the restart's reason
    obs = {"probe": "ok", "probe_detail": "", "workers": {}, "floor_tripped": [], "in_grace": False,
           "quality_wrong": checker.wrong}  # fmt: skip
    act = wdm.decide(obs, {"consecutive_failures": 0, "restart_epochs": []}, cfg, 1000)
    assert act["action"] == "restart" and act["reason"].startswith("answers wrong: "), act
    spent = wdm.decide(obs, {"consecutive_failures": 0, "restart_epochs": [990, 995]}, cfg, 1000)
    assert spent["action"] == "give_up"
    # Alert only: the event, no restart asked.
    cfg["quality_action"] = "alert"
    checker.wrong = None
    checker.judge()
    assert events()[-1]["event"] == "quality_failed" and events()[-1]["action"] == "alert" and checker.wrong is None

    d.signal(signal.SIGUSR2)
    running["key"] = "image-b tiny"  # another deployment (an upgrade): its own baseline
    checker.judge()
    assert [e["event"] for e in events()[-2:]] == ["quality_baseline", "quality_ok"]


def test_the_probe_scripts_output_is_read_as_a_verdict_or_an_error_never_a_guess():
    wdm = _watchdog()
    ok = json.dumps({"figures": {"mean_logprob": -1.8}, "verdict": {"ok": True, "reasons": []}})
    bad = json.dumps({"figures": {"mean_logprob": -10.4}, "verdict": {"ok": False, "reasons": ["below the floor"]}})
    assert wdm.quality_outcome(0, "noise\n" + ok)["state"] == "ok"
    assert wdm.quality_outcome(1, bad) == {
        "state": "wrong", "figures": {"mean_logprob": -10.4}, "reasons": ["below the floor"], "error": ""
    }  # fmt: skip
    assert wdm.quality_outcome(2, json.dumps({"error_kind": "refused", "error": "refused"}))["state"] == "error"
    assert wdm.quality_outcome(0, bad)["state"] == "error"  # exit code and verdict disagree: not a verdict
    assert wdm.quality_outcome(1, "Traceback ...")["state"] == "error"
    assert wdm.baseline_for({"key": "a", "figures": {"x": 1}}, "a") == {"x": 1}
    assert wdm.baseline_for({"key": "a", "figures": {"x": 1}}, "b") is None
