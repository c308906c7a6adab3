"""plugin_utils/quality.py: the canary's tolerance from the spread of healthy runs, and the baseline run."""

from __future__ import annotations

import pytest
from ansible_collections.sparkops.cluster.plugins.plugin_utils import quality as q


def fig(mean, tokens=102, errors=()):
    return {"mean_logprob": mean, "prompt_tokens": tokens, "errors": list(errors), "known_answers": {}}


def test_the_tolerance_is_the_spread_times_the_factor_between_the_floor_and_the_cap():
    wide = q.propose_tolerance([fig(-1.80), fig(-1.83), fig(-1.77)])
    assert wide["spread"] == pytest.approx(0.06) and wide["center"] == pytest.approx(-1.80)
    assert wide["tolerance"] == 0.24 and wide["basis"] == "spread" and wide["stable"] is True
    tight = q.propose_tolerance([fig(-1.800), fig(-1.801)])
    assert tight["tolerance"] == q.FLOOR_NATS and tight["basis"] == "floor"
    loose = q.propose_tolerance([fig(-1.0), fig(-2.0)])
    assert loose["tolerance"] == q.CAP_NATS and loose["basis"] == "cap" and loose["stable"] is False
    assert "too unsteady" in loose["note"]
    assert q.propose_tolerance([fig(-1.8), fig(-1.8)], factor=2, floor=0.01)["tolerance"] == 0.01


def test_rounding_is_up_so_the_measured_spread_always_fits():
    res = q.propose_tolerance([fig(-1.8), fig(-1.8 - 0.0123456)], factor=5)
    assert res["tolerance"] == 0.062 and res["tolerance"] >= 5 * res["spread"]


def test_module_results_are_accepted_as_runs_and_the_baseline_is_the_median_run():
    runs = [{"figures": fig(m)} for m in (-1.9, -1.7, -1.81, -1.8, -1.6)]
    assert q.propose_tolerance(runs)["center"] == pytest.approx(-1.8)
    assert q.pick_baseline(runs)["mean_logprob"] == -1.8
    assert q.pick_baseline([fig(-1.0), fig(-1.2)])["mean_logprob"] in (-1.0, -1.2)


@pytest.mark.parametrize(
    ("runs", "why"),
    [
        ([fig(-1.8)], "at least 2"),
        ("runs", "at least 2"),
        ([fig(-1.8), fig(None)], "run 1 has no usable mean_logprob"),
        ([fig(-1.8), fig(-1.8, errors=["passage: not JSON"])], "not JSON"),
        ([fig(-1.8), fig(float("nan"))], "run 1"),
        ([fig(-1.8), fig(True)], "run 1"),
        ([fig(-1.8), None], "run 1"),
        ([fig(-1.8), fig(-1.8, tokens=130)], "not one model and tokenizer"),
    ],
)
def test_only_healthy_runs_of_one_model_make_a_tolerance(runs, why):
    with pytest.raises(ValueError, match=why):
        q.propose_tolerance(runs)


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="floor <= cap"):
        q.propose_tolerance([fig(-1.8), fig(-1.8)], floor=2, cap=1)
