"""vllm_quality against a real HTTP server on 127.0.0.1 that answers /v1/completions the way vLLM 0.19.0 does
(prompt_logprobs: None first, then {token id: {logprob, rank, decoded_token}}; vllm/logprobs.py:162-205), honest
or broken: what the module returns, when it fails, and that the API key never leaves it. The script entry point
(the watchdog's way to run it on a node) is exercised against the same server."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import quality_probe as qp
from ansible_collections.sparkops.cluster.plugins.modules import vllm_quality as mod
from conftest import ROOT
from module_runner import run_module

KEY = "sk-quality-secret-123"
RIGHT = {"17 + 25": " 42", "France": " Paris", '"answer"': ' {"answer": 42}'}


class _Vllm(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        srv = self.server
        srv.seen.append((self.path, self.headers.get("Authorization"), body))
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            return self.answer(401, {"error": {"message": "Unauthorized", "code": 401}})
        if srv.mode == "500":
            return self.answer(500, {"error": {"message": f"boom, your key was {KEY}"}})
        if body.get("model") != "tiny":
            return self.answer(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
        words = body["prompt"].split()
        if "prompt_logprobs" in body:
            lp = -10.4 if srv.mode == "wrong" else srv.mean
            if srv.mode == "ignores":
                plp = None
            else:
                plp = [None] + [
                    {str(i): {"logprob": lp, "rank": 1, "decoded_token": w}} for i, w in enumerate(words[1:])
                ]
            choice = {"index": 0, "text": " the", "finish_reason": "length", "prompt_logprobs": plp}
            return self.answer(
                200, {"choices": [choice], "usage": {"prompt_tokens": len(words), "completion_tokens": 1}}
            )
        text = next((a for q, a in RIGHT.items() if q in body["prompt"].rsplit("Q:", 1)[1]), " ?")
        if srv.mode == "wrong":
            text = " " + " ".join(reversed(words[:5]))
        if srv.mode == "echo_key":
            text = f" {KEY}"
        choice = {"index": 0, "text": text, "finish_reason": "stop"}
        return self.answer(200, {"choices": [choice], "usage": {"prompt_tokens": len(words), "completion_tokens": 2}})

    def answer(self, status: int, doc: dict) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def vllm():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Vllm)
    srv.seen, srv.mode, srv.mean = [], "honest", -1.8
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.base = f"http://127.0.0.1:{srv.server_port}"
    yield srv
    srv.shutdown()
    srv.server_close()


def args(srv, **extra) -> dict:
    return {"base_url": srv.base, "api_key": KEY, "model": "tiny", **extra}


def test_a_healthy_server_gives_figures_a_verdict_and_the_cost(vllm):
    res = run_module(mod, args(vllm), check_mode=True)  # read-only: check mode runs it in full
    assert not res.get("failed") and res["changed"] is False and res["ok"] is True
    fig = res["figures"]
    assert fig["mean_logprob"] == pytest.approx(-1.8) and fig["perplexity"] == pytest.approx(6.0496, rel=1e-3)
    assert fig["prompt_tokens"] == len(qp.REFERENCE_PASSAGE.split())
    assert {k: v["ok"] for k, v in fig["known_answers"].items()} == {"arithmetic": True, "fact": True, "json": True}
    assert res["verdict"] == {
        "ok": True,
        "reasons": [],
        "compared": False,
        "delta_mean_logprob": None,
        "tolerance": 0.25,
    }
    assert res["cost"]["requests"] == 4 and res["cost"]["completion_tokens"] == 7 and res["cost"]["seconds"] < 5
    assert res["failure_kind"] is None
    paths = {p for p, _auth, _b in vllm.seen}
    assert paths == {"/v1/completions"}
    assert vllm.seen[0][2]["prompt_logprobs"] == 0 and vllm.seen[0][2]["max_tokens"] == 1


def test_against_a_baseline_a_drift_fails_and_says_what_to_fix(vllm):
    baseline = run_module(mod, args(vllm))["figures"]
    vllm.mean = -2.3
    res = run_module(mod, args(vllm, baseline=baseline))
    assert res["failed"] and res["ok"] is False and res["failure_kind"] == "wrong_answers"
    assert res["verdict"]["compared"] and res["verdict"]["delta_mean_logprob"] == pytest.approx(-0.5)
    assert "0.5000 lower than the baseline's -1.8000 (tolerance 0.25" in res["msg"]
    assert "roll" in res["msg"] and "weights" in res["msg"]
    # The same, reported rather than failed, and a wider tolerance passes.
    assert run_module(mod, args(vllm, baseline=baseline, fail_on_wrong=False))["ok"] is False
    assert not run_module(mod, args(vllm, baseline=baseline, fail_on_wrong=False)).get("failed")
    assert run_module(mod, args(vllm, baseline=baseline, tolerance=0.6))["ok"] is True


def test_wrong_answers_with_a_green_server_fail(vllm):
    vllm.mode = "wrong"
    res = run_module(mod, args(vllm))
    assert res["failed"] and res["failure_kind"] == "wrong_answers"
    assert res["figures"]["mean_logprob"] == pytest.approx(-10.4)
    assert "the model is guessing" in res["msg"] and "known answer 'arithmetic' is wrong" in res["msg"]


def test_a_server_without_prompt_logprobs_is_reported_not_crashed_on(vllm):
    vllm.mode = "ignores"
    res = run_module(mod, args(vllm, fail_on_wrong=False))
    assert not res.get("failed") and res["ok"] is False
    assert "ignored prompt_logprobs" in res["verdict"]["reasons"][0]


@pytest.mark.parametrize(
    ("change", "kind", "hint"),
    [
        ({"api_key": "sk-wrong"}, "unauthorized", "give the key vLLM was started with"),
        ({"model": "other"}, "wrong_model", "served model name"),
    ],
)
def test_transport_failures_say_what_to_fix(vllm, change, kind, hint):
    res = run_module(mod, args(vllm, **change))
    assert res["failed"] and res["failure_kind"] == kind and hint in res["msg"], res["msg"]
    assert "figures" not in res


def test_a_refused_port_fails_with_its_kind():
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run_module(mod, {"base_url": f"http://127.0.0.1:{port}", "model": "tiny", "timeout_s": 2})
    assert res["failed"] and res["failure_kind"] == "refused" and "is vLLM running" in res["msg"]


def test_the_api_key_never_appears_in_results_or_messages(vllm):
    vllm.mode = "500"
    res = run_module(mod, args(vllm))
    assert res["failed"] and res["failure_kind"] == "server_error"
    assert KEY not in json.dumps(res)
    vllm.mode = "echo_key"
    res = run_module(mod, args(vllm))
    assert res["failed"] and KEY not in json.dumps(res) and "********" in json.dumps(res["figures"])


def test_bad_arguments_are_all_named_at_once(vllm):
    res = run_module(mod, args(vllm, base_url=vllm.base + "/v1", tolerance=0, timeout_s=-1, baseline={"perplexity": 3}))
    assert res["failed"] and res["failure_kind"] == "usage"
    for text in ("ends in /v1", "tolerance must be more than 0", "timeout_s must be more than 0", "baseline has no"):
        assert text in res["msg"]
    assert vllm.seen == []  # nothing was asked
    res = run_module(mod, args(vllm, base_url="ftp://x", baseline={}))  # an empty baseline is no baseline
    assert res["failed"] and "must start with http://" in res["msg"] and "baseline" not in res["msg"]


def test_the_script_reads_the_key_from_a_file_and_judges_against_a_baseline_file(vllm, tmp_path):
    keyf = tmp_path / "key"
    keyf.write_text(KEY + "\n")
    script = ROOT / "plugins" / "module_utils" / "quality_probe.py"
    cmd = [sys.executable, str(script), "--base-url", vllm.base, "--model", "tiny", "--api-key-file", str(keyf)]
    first = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=30)
    assert first.returncode == 0, first.stdout + first.stderr
    out = json.loads(first.stdout)
    assert out["verdict"]["ok"] and KEY not in first.stdout
    basef = tmp_path / "baseline.json"
    basef.write_text(json.dumps(out["figures"]))
    vllm.mean = -3.0
    second = subprocess.run([*cmd, "--baseline", str(basef)], capture_output=True, text=True, check=False, timeout=30)
    assert second.returncode == 1 and json.loads(second.stdout)["verdict"]["compared"] is True
    keyf.write_text("wrong")
    third = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=30)
    assert third.returncode == 2 and json.loads(third.stdout)["error_kind"] == "unauthorized"
