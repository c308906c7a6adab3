# Copyright: sparkops maintainers
# Apache-2.0
"""The quality canary's tolerance and baseline, from the figures of healthy runs (controller side, pure).

The probe (plugins/module_utils/quality_probe.py, the module vllm_quality) measures a model's mean
log-likelihood of a fixed passage. A healthy model gives nearly the same figure every time; how nearly
depends on the stack (kernels that are not batch-invariant move the last digits from one batch to the next).
propose_tolerance turns the spread of N healthy runs (probes and restarts of one verified deployment) into the
tolerance later probes are judged with: the spread times FACTOR, never under FLOOR_NATS (N runs under-sample
the spread, and a later probe meets other batches than the runs did), never over CAP_NATS (a model that
spreads that much between healthy runs cannot be guarded this way: said, not hidden). pick_baseline keeps
the run nearest the runs' median as the baseline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

FACTOR = 4.0
FLOOR_NATS = 0.05  # perplexity x1.05
CAP_NATS = 1.0  # perplexity x2.7: beyond that the canary cannot tell a broken model from a healthy one


def _figures(run: object) -> Mapping:
    """A run may be the figures themselves or what vllm_quality returned ({"figures": ...})."""
    if isinstance(run, Mapping) and isinstance(run.get("figures"), Mapping):
        return run["figures"]
    return run if isinstance(run, Mapping) else {}


def _means(runs: Sequence) -> list[float]:
    if not isinstance(runs, Sequence) or isinstance(runs, (str, bytes)) or len(runs) < 2:
        raise ValueError("give the figures of at least 2 healthy runs (20 probes and a few restarts are better)")
    means, problems, tokens = [], [], set()
    for i, run in enumerate(runs):
        fig = _figures(run)
        mean = fig.get("mean_logprob")
        if fig.get("errors") or not isinstance(mean, (int, float)) or isinstance(mean, bool) or not math.isfinite(mean):
            problems.append(f"run {i} has no usable mean_logprob ({'; '.join(fig.get('errors') or []) or mean!r})")
            continue
        means.append(float(mean))
        tokens.add(fig.get("prompt_tokens"))
    if problems:
        raise ValueError("; ".join(problems[:5]) + ": only healthy runs make a tolerance")
    if len(tokens) > 1:
        raise ValueError(
            f"the runs scored the passage as {sorted(tokens, key=str)} tokens: not one model and tokenizer"
        )
    return means


def propose_tolerance(runs: Sequence, factor: float = FACTOR, floor: float = FLOOR_NATS, cap: float = CAP_NATS) -> dict:
    """Figures of N >= 2 healthy runs -> {"tolerance": nats, "spread": max - min, "center": median,
    "runs": N, "basis": "spread" | "floor" | "cap", "stable": bool, "note": str}.

    tolerance = clamp(factor * spread, floor, cap), rounded up to 0.001; stable is False when the cap
    bit (the runs themselves spread too much for the canary to guard this model).
    Raises ValueError when a run is not healthy or the runs disagree on the passage's token count."""
    if not (factor > 0 and 0 < floor <= cap):
        raise ValueError(f"need factor > 0 and 0 < floor <= cap, got factor={factor}, floor={floor}, cap={cap}")
    means = sorted(_means(runs))
    spread = means[-1] - means[0]
    mid = len(means) // 2
    center = means[mid] if len(means) % 2 else (means[mid - 1] + means[mid]) / 2
    raw = factor * spread
    basis = "floor" if raw < floor else "cap" if raw > cap else "spread"
    tolerance = math.ceil(min(max(raw, floor), cap) * 1000 - 1e-9) / 1000
    note = {
        "floor": f"{len(means)} runs spread {spread:.4f} nats; {factor:g} x that is under the floor {floor:g}",
        "spread": f"{len(means)} runs spread {spread:.4f} nats; tolerance {factor:g} x that",
        "cap": (
            f"{len(means)} healthy runs spread {spread:.4f} nats, {factor:g} x that is over the cap {cap:g}: this "
            f"model and stack are too unsteady for the canary's passage score; the known answers still count"
        ),
    }[basis]
    return {
        "tolerance": tolerance,
        "spread": round(spread, 6),
        "center": round(center, 6),
        "runs": len(means),
        "basis": basis,
        "stable": basis != "cap",
        "note": note,
    }


def pick_baseline(runs: Sequence) -> dict:
    """The healthy run whose mean_logprob is nearest the runs' median: the figures to keep as the baseline."""
    means = _means(runs)
    ordered = sorted(means)
    mid = len(ordered) // 2
    center = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    best = min(range(len(means)), key=lambda i: abs(means[i] - center))
    return dict(_figures(runs[best]))
