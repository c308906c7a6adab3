"""quality_probe: the requests it sends, its parsing of vLLM 0.19.0's prompt_logprobs answer (and of garbage),
its known-answer checks and its verdict against a baseline. Pure functions; no server.

The answer shapes follow vLLM 0.19.0's wheel: choices[0].prompt_logprobs is a list, None first
(vllm/logprobs.py:162-167), then {token id (a string in JSON): {logprob, rank, decoded_token}}
(vllm/logprobs.py:12-25, :175-205; completion/protocol.py:469), -inf sent as -9999.0
(entrypoints/openai/engine/serving.py:985-997), usage.prompt_tokens counting every prompt token.
"""

from __future__ import annotations

import json
import math

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import quality_probe as qp


def vllm_answer(logprobs: list[float], ranks: list[int] | None = None, extra_choice: dict | None = None) -> bytes:
    """What vLLM 0.19.0 answers a non-streamed completion with prompt_logprobs 0 and max_tokens 1."""
    ranks = ranks or [1] * len(logprobs)
    plp = [None] + [
        {str(1000 + i): {"logprob": lp, "rank": r, "decoded_token": f"w{i}"}}
        for i, (lp, r) in enumerate(zip(logprobs, ranks, strict=True))
    ]
    choice = {
        "index": 0,
        "text": " the",
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,
        "token_ids": None,
        "prompt_logprobs": plp,
        "prompt_token_ids": None,
        **(extra_choice or {}),
    }
    n = len(logprobs) + 1
    return json.dumps(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [choice],
            "usage": {"prompt_tokens": n, "total_tokens": n + 1, "completion_tokens": 1},
        }
    ).encode()


def text_answer(text: str) -> bytes:
    return json.dumps(
        {
            "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 2},
        }
    ).encode()


def healthy_figures(mean: float = -1.8, prompt_tokens: int = 102) -> dict:
    passage = qp.parse_passage(vllm_answer([mean] * (prompt_tokens - 1)))
    answers = {s["name"]: {"ok": True, "got": "x"} for s in qp.KNOWN_ANSWERS}
    return qp.figures_from(passage, answers)


# --- requests --------------------------------------------------------------------------------------


def test_the_passage_request_scores_the_prompt_greedily_and_generates_one_token():
    reqs = qp.build_requests("qwen", seed=7)
    name, body = reqs[0]
    assert name == "passage"
    assert body == {
        "model": "qwen",
        "prompt": qp.REFERENCE_PASSAGE,
        "max_tokens": 1,
        "temperature": 0,
        "seed": 7,
        "prompt_logprobs": 0,
    }
    assert 60 <= len(qp.REFERENCE_PASSAGE.split()) <= 120
    assert "stream" not in body  # vLLM refuses prompt_logprobs > 0 with stream (protocol.py:384-397)


def test_the_known_answer_requests_are_short_greedy_and_stop_at_the_newline():
    reqs = dict(qp.build_requests("qwen"))
    assert set(reqs) == {"passage", "arithmetic", "fact", "json"}
    for name in ("arithmetic", "fact", "json"):
        body = reqs[name]
        assert body["temperature"] == 0 and body["seed"] == qp.SEED and body["stop"] == ["\n"]
        assert body["max_tokens"] <= 12
        assert body["prompt"].startswith(qp.FEW_SHOT) and body["prompt"].endswith("\nA:")
    assert "17 + 25" in reqs["arithmetic"]["prompt"]


# --- the passage answer ----------------------------------------------------------------------------


def test_a_vllm_answer_gives_the_mean_log_likelihood_and_perplexity():
    out = qp.parse_passage(vllm_answer([-1.0, -2.0, -3.0, -9999.0], ranks=[1, 1, 4, 30000]))
    assert out["error"] is None
    assert out["scored_tokens"] == 4 and out["prompt_tokens"] == 5
    assert out["mean_logprob"] == pytest.approx((-1 - 2 - 3 - 9999) / 4)
    assert out["perplexity"] == pytest.approx(math.exp(700), rel=1e-6)  # capped, never inf in JSON
    assert out["top1_fraction"] == 0.5
    assert out["min_logprob"] == -9999.0
    small = qp.parse_passage(vllm_answer([-0.5, -1.5]))
    assert small["perplexity"] == pytest.approx(math.e, rel=1e-4)


def test_with_top_tokens_the_prompt_token_is_picked_by_prompt_token_ids():
    """prompt_logprobs 1 adds the rank-1 token to a position where the prompt token ranks lower
    (vllm/logprobs.py:186-205): only prompt_token_ids (return_token_ids) tell which is the prompt's."""
    data = json.loads(vllm_answer([-1.0, -2.0]))
    plp = data["choices"][0]["prompt_logprobs"]
    plp[2]["77"] = {"logprob": -0.1, "rank": 1, "decoded_token": "x"}
    ambiguous = qp.parse_passage(json.dumps(data).encode())
    assert ambiguous["mean_logprob"] is None and "no prompt_token_ids" in ambiguous["error"]
    data["choices"][0]["prompt_token_ids"] = [1, 1000, 1001]
    picked = qp.parse_passage(json.dumps(data).encode())
    assert picked["error"] is None and picked["mean_logprob"] == pytest.approx(-1.5)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"<html>502 Bad Gateway</html>", "not JSON"),
        (b"[1, 2]", "not an object"),
        (b'{"choices": []}', "no choices[0]"),
        (b'{"choices": ["x"]}', "no choices[0]"),
        (json.dumps({"choices": [{"text": "the"}]}).encode(), "ignored prompt_logprobs"),
        (json.dumps({"choices": [{"prompt_logprobs": "lots"}]}).encode(), "not a list"),
        (json.dumps({"choices": [{"prompt_logprobs": [None]}]}).encode(), "scores no token"),
        (json.dumps({"choices": [{"prompt_logprobs": [None, None]}]}).encode(), "position 1 has no logprob"),
        (json.dumps({"choices": [{"prompt_logprobs": [None, [1]]}]}).encode(), "position 1 is not"),
        (json.dumps({"choices": [{"prompt_logprobs": [None, {}]}]}).encode(), "position 1 is not"),
        (json.dumps({"choices": [{"prompt_logprobs": [None, {"1": -0.5}]}]}).encode(), "no logprob between"),
        (json.dumps({"choices": [{"prompt_logprobs": [None, {"1": {"logprob": "-0.5"}}]}]}).encode(), "between"),
        (json.dumps({"choices": [{"prompt_logprobs": [None, {"1": {"logprob": True}}]}]}).encode(), "between"),
        (json.dumps({"choices": [{"prompt_logprobs": [None, {"1": {"logprob": 0.7}}]}]}).encode(), "between"),
        (json.dumps({"choices": [{"prompt_logprobs": [None, {"1": {"logprob": -1e9}}]}]}).encode(), "between"),
        (b'{"choices": [{"prompt_logprobs": [null, {"1": {"logprob": NaN}}]}]}', "between"),
        (b'{"choices": [{"prompt_logprobs": [null, {"1": {"logprob": -Infinity}}]}]}', "between"),
        (json.dumps({"choices": [{"prompt_logprobs": [None] + [{"1": {"logprob": -1}}] * 5000}]}).encode(), "5001"),
        (b"[" * 100000 + b"]" * 100000, "not JSON"),
        (b"x" * (qp.MAX_RESPONSE_BYTES + 1), "larger than"),
    ],
)
def test_garbage_is_reported_never_raised(data, why):
    out = qp.parse_passage(data)
    assert out["mean_logprob"] is None and out["perplexity"] is None
    assert why in out["error"], out["error"]
    assert len(out["error"]) < 700  # an excerpt, not the whole answer


def test_a_malformed_position_among_many_is_named_with_a_count_of_the_rest():
    plp = [None] + [{"1": {"logprob": "bad"}}] * 6
    out = qp.parse_passage(json.dumps({"choices": [{"prompt_logprobs": plp}]}).encode())
    assert "position 1 " in out["error"] and "(and 3 more)" in out["error"]


# --- known answers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "ok"),
    [
        ("arithmetic", " 42", True),
        ("arithmetic", "42.\nQ: What", True),
        ("arithmetic", " 41", False),
        ("arithmetic", " 420", False),
        ("arithmetic", "", False),
        ("fact", " Paris", True),
        ("fact", "paris.", True),
        ("fact", " Lyon", False),
        ("json", ' {"answer": 42}', True),
        ("json", '{"answer":42} ', True),
        ("json", ' {"answer": "42"}', False),
        ("json", ' {"answer": 42', False),
        ("json", " answer 42", False),
        ("json", "sure:\n" + '{"answer": 42}', False),  # only the first line counts
    ],
)
def test_known_answers_are_checked_on_their_first_line(name, text, ok):
    spec = {s["name"]: s for s in qp.KNOWN_ANSWERS}[name]
    assert qp.check_answer(spec, text) is ok


def test_a_completion_answer_is_read_with_bounds():
    text, err, used = qp.parse_completion(text_answer("x" * 5000))
    assert err is None and len(text) == 400 and used == 2
    assert qp.parse_completion(b"nope")[1].startswith("the answer is not JSON")
    assert "not a string" in qp.parse_completion(b'{"choices": [{"text": 5}]}')[1]


# --- the verdict ------------------------------------------------------------------------------------


def test_healthy_figures_pass_with_and_without_a_baseline():
    base = healthy_figures(-1.80)
    now = healthy_figures(-1.83)
    assert qp.judge(now) == {
        "ok": True,
        "reasons": [],
        "compared": False,
        "delta_mean_logprob": None,
        "tolerance": qp.DEFAULT_TOLERANCE_NATS,
    }
    v = qp.judge(now, base)
    assert v["ok"] and v["compared"] and v["delta_mean_logprob"] == pytest.approx(-0.03)


def test_a_drift_beyond_the_tolerance_fails_either_way():
    base = healthy_figures(-1.80)
    lower = qp.judge(healthy_figures(-2.2), base)
    assert not lower["ok"] and "0.4000 lower than the baseline's -1.8000 (tolerance 0.25" in lower["reasons"][0]
    higher = qp.judge(healthy_figures(-1.2), base, tolerance=0.5)
    assert not higher["ok"] and "higher" in higher["reasons"][0]
    assert qp.judge(healthy_figures(-2.2), base, tolerance=0.5)["ok"]


def test_near_uniform_logprobs_fail_even_without_a_baseline():
    v = qp.judge(healthy_figures(-10.37))
    assert not v["ok"] and "the model is guessing" in v["reasons"][0]


def test_another_tokenizer_fails_against_the_baseline():
    v = qp.judge(healthy_figures(-1.8, prompt_tokens=130), healthy_figures(-1.8, prompt_tokens=102))
    assert not v["ok"] and "130 tokens now and was 102" in v["reasons"][0]


def test_a_known_answer_that_turned_wrong_fails_one_that_never_was_right_is_only_noted():
    base = healthy_figures()
    base["known_answers"]["json"] = {"ok": False, "got": "answer: 42"}
    now = healthy_figures()
    now["known_answers"]["json"] = {"ok": False, "got": "answer: 42"}
    v = qp.judge(now, base)
    assert v["ok"] and "as it was in the baseline" in v["reasons"][0]
    now["known_answers"]["fact"] = {"ok": False, "got": "Lyon"}
    v = qp.judge(now, base)
    assert not v["ok"] and "known answer 'fact' is wrong: got 'Lyon' (right in the baseline)" in v["reasons"]
    alone = qp.judge(now)  # without a baseline every wrong answer counts
    assert not alone["ok"] and len([r for r in alone["reasons"] if "known answer" in r]) == 2


def test_a_baseline_from_another_probe_is_not_compared_and_says_so():
    base = healthy_figures(-5.0)
    base["passage_sha256"] = "0000"
    v = qp.judge(healthy_figures(-1.8), base)
    assert v["ok"] and not v["compared"] and "record a new baseline" in v["reasons"][0]
    v = qp.judge(healthy_figures(-1.8), {"mean_logprob": "x"})
    assert v["ok"] and not v["compared"] and "has no mean_logprob" in v["reasons"][0]


@pytest.mark.parametrize("figures", [None, [], {}, {"mean_logprob": float("nan")}, {"mean_logprob": True}])
def test_missing_or_garbage_figures_fail_without_a_crash(figures):
    v = qp.judge(figures, healthy_figures())
    assert not v["ok"] and v["reasons"]


def test_unusable_answers_fail_the_verdict_and_say_why():
    fig = qp.figures_from(qp.parse_passage(b'{"choices": [{"text": "x"}]}'), {})
    v = qp.judge(fig, healthy_figures())
    assert not v["ok"] and "ignored prompt_logprobs" in v["reasons"][0]


# --- the whole probe with a stand-in transport -------------------------------------------------------


def test_probe_sums_its_cost_and_reports_garbage_answers_in_the_figures():
    sent = []

    def post(base_url, body, api_key, timeout):
        sent.append(body)
        if "prompt_logprobs" in body:
            return vllm_answer([-1.0] * 9)
        return {"arithmetic": text_answer(" 42"), "fact": text_answer(" Lyon")}.get(
            "arithmetic" if "17 + 25" in body["prompt"] else "fact" if "France" in body["prompt"] else "json",
            b"\x00garbage",
        )

    out = qp.probe("http://h:1", "m", api_key="k", post=post)
    fig = out["figures"]
    assert [b.get("prompt_logprobs") for b in sent] == [0, None, None, None]
    assert fig["mean_logprob"] == -1.0 and fig["prompt_tokens"] == 10
    assert fig["known_answers"]["arithmetic"] == {"ok": True, "got": "42"}
    assert fig["known_answers"]["fact"] == {"ok": False, "got": "Lyon"}
    assert fig["known_answers"]["json"]["ok"] is False and "not JSON" in fig["known_answers"]["json"]["error"]
    assert out["cost"]["requests"] == 4
    assert out["cost"]["prompt_tokens"] == 10 + 50 + 50 and out["cost"]["completion_tokens"] == 1 + 2 + 2
    assert not qp.judge(fig)["ok"]


def test_a_transport_failure_raises_with_its_kind():
    def post(base_url, body, api_key, timeout):
        raise qp.QualityError("unauthorized", "401 from http://h:1/v1/completions: the API key is wrong", 401)

    with pytest.raises(qp.QualityError) as err:
        qp.probe("http://h:1", "m", post=post)
    assert err.value.kind == "unauthorized"


def test_a_baseline_file_is_read_bare_or_as_the_watchdogs_record():
    figures = {"mean_logprob": -1.8, "perplexity": 6.0}
    assert qp.baseline_figures(figures) is figures
    assert qp.baseline_figures({"key": "k", "recorded": "t", "figures": figures}) is figures
    assert qp.baseline_figures({"key": "k"}) == {"key": "k"}  # no figures: judge() says it is not compared
