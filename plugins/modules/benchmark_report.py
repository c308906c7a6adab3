#!/usr/bin/python
"""Ansible module: write a benchmark's JSON, Markdown and PNG report and flag regressions."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_report
short_description: Write a vLLM benchmark report (JSON, Markdown, PNG) and flag regressions
description:
  - Takes the C(levels) list of M(sparkops.cluster.vllm_benchmark) and writes
    C(<output_dir>/<cluster_name>-<timestamp>.json), C(.md) and C(.png).
  - Each level's aggregate tok/s is compared with the previous run of the same cluster and I(source)
    (by default the newest C(<cluster_name>-*.json) in C(output_dir) with that source) or, when there
    is none, with the reference figures; a drop of more than C(regression_threshold) is a regression.
  - With I(source=test-double) (the simulated cluster) every file says that the figures are the vLLM
    test double's, and none is compared with the hardware reference.
  - "Runs on the control node (C(delegate_to: localhost)). The PNG needs matplotlib; without it no
    PNG is written and C(png_skipped) says why."
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  source:
    description:
      - Where the figures come from, written into the JSON, the Markdown and the PNG.
      - C(test-double) is the simulated cluster's vLLM test double; its figures are never compared
        with I(reference), only with earlier test-double runs.
    type: str
    choices: [hardware, test-double]
    default: hardware
  model:
    description: The served model name the benchmark asked for (shown in the reports).
    type: str
    required: false
  results:
    description: The C(levels) list returned by M(sparkops.cluster.vllm_benchmark).
    type: list
    elements: dict
    required: true
  reference:
    description:
      - Concurrency -> aggregate tok/s to compare hardware figures with. The default is the two-Spark
        reference (Qwen3-235B-A22B GPTQ-Int4, TP=2, EP=2); pass C({}) for any other profile. Not compared
        with I(source=test-double) figures; the chart still draws it as the seed figures (the test double is
        calibrated on them).
    type: dict
    default: {"1": 17.0, "2": 24.1, "4": 36.4}
  runs:
    description: The C(runs) list of M(sparkops.cluster.vllm_benchmark) (vLLM bench serve's keys), kept in the JSON.
    type: list
    elements: dict
    required: false
  capacity:
    description: The C(capacity) object of M(sparkops.cluster.vllm_benchmark); kept in the JSON, its SLO and
      users at SLO drawn on the chart and written in the Markdown.
    type: dict
    required: false
  output_dir:
    description: Directory for the report files; created when missing.
    type: path
    required: true
  cluster_name:
    description: Name used in the file names and to find the previous run.
    type: str
    required: true
  previous:
    description: Path of the previous run's JSON; default the newest one of this cluster in C(output_dir).
    type: path
    required: false
  regression_threshold:
    description: Fractional drop in aggregate tok/s that counts as a regression (0.10 = 10%).
    type: float
    default: 0.10
  timestamp:
    description: Timestamp used in the file names (C(YYYYMMDDTHHMMSSZ)); default now, UTC.
    type: str
    required: false
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: Computes the comparison and the paths it would write; writes nothing.
  diff_mode:
    support: none
    details: Writes new report files; there is no earlier version of them to diff.
"""

EXAMPLES = r"""
- name: Report the benchmark and compare with the last run of this cluster
  sparkops.cluster.benchmark_report:
    results: "{{ bench.levels }}"
    output_dir: "{{ sparkops_reports_dir }}/benchmarks"
    cluster_name: two-sparks
  delegate_to: localhost
  register: report

- name: Stop on a regression
  ansible.builtin.assert:
    that: report.regressions | length == 0
    fail_msg: "throughput regressed: {{ report.regressions }}"
"""

RETURN = r"""
source:
  description: Where the figures come from (C(hardware) or C(test-double)), as written in every file.
  returned: always
  type: str
json_path:
  description: The JSON report (source, results, reference, previous, comparison).
  returned: always
  type: str
markdown_path:
  description: The Markdown table.
  returned: always
  type: str
png_path:
  description: The chart; null when matplotlib is missing.
  returned: always
  type: str
png_skipped:
  description: Why no PNG was written; null when one was.
  returned: always
  type: str
previous_path:
  description: The previous run compared with; null when none.
  returned: always
  type: str
regressions:
  description: Levels whose aggregate tok/s fell more than regression_threshold below the baseline.
  returned: always
  type: list
  elements: dict
  sample:
    - concurrency: 4
      aggregate_tok_s: 30.0
      baseline: 36.4
      baseline_kind: previous
      change: -0.176
rows:
  description: One comparison row per level (what the Markdown table shows).
  returned: always
  type: list
  elements: dict
"""

import json
import os
import re
import tempfile
from datetime import datetime, timezone

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.bench import (
    HARDWARE_REFERENCE,
    SOURCE_HARDWARE,
    SOURCE_LABELS,
    SOURCE_TEST_DOUBLE,
    SOURCES,
)

# String keys, as Ansible hands dict keys over (and validate-modules wants them so);
# normalize_reference makes them int.
DEFAULT_REFERENCE = {str(k): v for k, v in HARDWARE_REFERENCE.items()}
TIMESTAMP_RE = r"\d{8}T\d{6}Z"


def _num(value):
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def normalize_reference(reference) -> dict[int, float]:
    """Ansible hands dict keys over as strings; the comparison wants int -> float."""
    out = {}
    for key, value in (reference or {}).items():
        out[int(key)] = float(value)
    return out


def _source_of(path: str) -> str | None:
    """The source a report JSON records (files from before sources existed are hardware's)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh).get("source", SOURCE_HARDWARE)
    except (OSError, ValueError, AttributeError):
        return None


def find_previous(
    output_dir: str, cluster_name: str, exclude: str | None = None, source: str = SOURCE_HARDWARE
) -> str | None:
    """Newest <cluster_name>-<timestamp>.json in output_dir with the same source (the timestamp sorts as text)."""
    if not os.path.isdir(output_dir):
        return None
    pattern = re.compile(rf"^{re.escape(cluster_name)}-({TIMESTAMP_RE})\.json$")
    found = []
    for name in os.listdir(output_dir):
        match = pattern.match(name)
        path = os.path.join(output_dir, name)
        if match and path != exclude and _source_of(path) == source:
            found.append((match.group(1), path))
    return max(found)[1] if found else None


def previous_by_concurrency(previous_doc: dict) -> dict[int, float]:
    out = {}
    for level in previous_doc.get("results") or []:
        try:
            out[int(level["concurrency"])] = float(level["aggregate_tok_s"])
        except (KeyError, TypeError, ValueError):
            continue
    return out


def compare(results, reference, previous, threshold) -> tuple[list[dict], list[dict]]:
    """Rows for the table and the regressions: baseline = previous run, else reference."""
    rows, regressions = [], []
    for level in results:
        c = int(level["concurrency"])
        measured = _num(level.get("aggregate_tok_s"))
        ref = reference.get(c)
        prev = previous.get(c)
        baseline, kind = (prev, "previous") if prev is not None else (ref, "reference")
        change = None
        if measured is not None and baseline:
            change = (measured - baseline) / baseline
        regressed = bool((measured is None and baseline is not None) or (change is not None and change < -threshold))
        row = {
            "concurrency": c,
            "aggregate_tok_s": measured,
            "per_request_tok_s_mean": _num(level.get("per_request_tok_s_mean")),
            "ttft_p50_s": _num(level.get("ttft_p50_s")),
            "ttft_p95_s": _num(level.get("ttft_p95_s")),
            "prefix_cache_hit_rate": _num(level.get("prefix_cache_hit_rate")),
            "spec_decode": level.get("spec_decode") if isinstance(level.get("spec_decode"), dict) else None,
            "errors": int(level.get("errors") or 0),
            "reference": ref,
            "previous": prev,
            "baseline_kind": kind if baseline is not None else None,
            "change": None if change is None else round(change, 4),
            "regression": regressed,
        }
        rows.append(row)
        if regressed:
            regressions.append(
                {
                    "concurrency": c,
                    "aggregate_tok_s": measured,
                    "baseline": baseline,
                    "baseline_kind": kind,
                    "change": row["change"],
                }
            )
    return rows, regressions


def _capacity_lines(capacity) -> list[str]:
    if not capacity or not capacity.get("slo"):
        return []
    slo, fail = capacity["slo"], capacity.get("first_failing")
    line = (
        f"Capacity: **{capacity.get('users_at_slo') or 0} users at SLO** (>= {slo['min_tok_s_per_user']:g} tok/s "
        f"per user, TTFT p95 <= {slo['max_ttft_p95_s']:g} s)"
    )
    if fail:
        line += f"; first miss at {fail['max_concurrency']} ({', '.join(fail['missed'])})"
    return [line + "." + (f" Sweep stopped: {capacity['stopped']}." if capacity.get("stopped") else "")]


def _fmt(value, spec=".1f", suffix=""):
    return "—" if value is None else f"{value:{spec}}{suffix}"


def render_markdown(  # noqa: PLR0913, PLR0917 - one call site, each part of the page named
    cluster_name, timestamp, rows, threshold, previous_path, source=SOURCE_HARDWARE, model=None, capacity=None
) -> str:
    double = source == SOURCE_TEST_DOUBLE
    title = f"# Benchmark: {cluster_name} ({timestamp})"
    lines = [title + (": vLLM TEST DOUBLE" if double else ""), ""]
    lines.append(f"Figures: {SOURCE_LABELS[source]}." + (f" Model: `{model}`." if model else ""))
    if double:
        lines.append(
            "These tok/s are the test double's pace (calibrated on the two-Spark seed figures at 1, 2 and 4 users, "
            "extrapolated beyond; sim/standin/vllm_test_double.py PACING); they exercise the path and say nothing "
            "about real Sparks, so they are not compared with the two-Spark reference."
        )
    lines += [
        f"Previous run: `{os.path.basename(previous_path)}`" if previous_path else "Previous run: none",
        *_capacity_lines(capacity),
        (
            f"Delta: aggregate tok/s against the previous {source} run; "
            f"REGRESSION when it fell more than {threshold:.0%}."
            if double
            else f"Delta: aggregate tok/s against the previous run, or against the reference when there is none; "
            f"REGRESSION when it fell more than {threshold:.0%}."
        ),
        "",
    ]
    ref_head, ref_rule = ("", "") if double else (" reference tok/s |", "---:|")
    lines += [
        "| concurrency | aggregate tok/s | per-request tok/s | TTFT p50 (s) | TTFT p95 (s) | prefix-cache hit rate "
        f"| errors |{ref_head} previous tok/s | delta | flag |",
        f"|---:|---:|---:|---:|---:|---:|---:|{ref_rule}---:|---:|:---|",
    ]
    for r in rows:
        hit = None if r["prefix_cache_hit_rate"] is None else r["prefix_cache_hit_rate"] * 100
        delta = None if r["change"] is None else r["change"] * 100
        ref_cell = "" if double else f" {_fmt(r['reference'])} |"
        lines.append(
            f"| {r['concurrency']} | {_fmt(r['aggregate_tok_s'])} | {_fmt(r['per_request_tok_s_mean'])} "
            f"| {_fmt(r['ttft_p50_s'], '.3f')} | {_fmt(r['ttft_p95_s'], '.3f')} | {_fmt(hit, '.1f', '%')} "
            f"| {r['errors']} |{ref_cell} {_fmt(r['previous'])} | {_fmt(delta, '+.1f', '%')} "
            f"| {'REGRESSION' if r['regression'] else 'ok'} |"
        )
    lines += _spec_decode_lines(rows)
    return "\n".join(lines) + "\n"


def _spec_decode_lines(rows) -> list[str]:
    """The MTP/EAGLE acceptance table, for a profile with speculative decoding (none without)."""
    spec = [r for r in rows if r.get("spec_decode")]
    if not spec:
        return []
    lines = [
        "",
        "Speculative decoding (vLLM's spec_decode counters, deltas over each level): acceptance rate = accepted / "
        "draft tokens; mean acceptance length counts the bonus token; per position = share of drafts accepted there.",
        "",
        "| concurrency | acceptance rate | mean acceptance length | per position | drafts |",
        "|---:|---:|---:|:---|---:|",
    ]
    for r in spec:
        sd = r["spec_decode"]
        rate = _num(sd.get("acceptance_rate"))
        per_pos = ", ".join(f"{float(x) * 100:.0f}%" for x in sd.get("per_position") or []) or "—"
        lines.append(
            f"| {r['concurrency']} | {_fmt(None if rate is None else rate * 100, '.1f', '%')} "
            f"| {_fmt(_num(sd.get('mean_acceptance_length')), '.2f')} | {per_pos} | {sd.get('drafts', '—')} |"
        )
    return lines


def previous_curves(previous_doc: dict) -> dict[int, dict]:
    """Concurrency -> the previous run's aggregate, per-user tok/s and TTFT p95 (what the chart draws)."""
    out = {}
    for level in previous_doc.get("results") or []:
        c = _num(level.get("concurrency") if isinstance(level, dict) else None)
        if c is not None:
            out[int(c)] = {
                "aggregate": _num(level.get("aggregate_tok_s")),
                "user": _num(level.get("per_request_tok_s_mean")),
                "ttft_p95": _num(level.get("ttft_p95_s")),
                "acceptance": _acceptance_pct(level),
            }
    return out


def _acceptance_pct(level) -> float | None:
    """The level's draft acceptance rate in percent (speculative decoding), None without counters."""
    spec = level.get("spec_decode") if isinstance(level, dict) else None
    rate = _num(spec.get("acceptance_rate")) if isinstance(spec, dict) else None
    return None if rate is None else round(100 * rate, 2)


def _panel(ax, xs, series, ylabel, title):  # noqa: PLR0913, PLR0917 - one panel's parts
    """One chart panel: each series (label, values, style) against concurrency on a doubling axis."""
    for label, values, style in series:
        points = [(x, v) for x, v in zip(xs, values, strict=True) if v is not None]
        if points:
            ax.plot(*zip(*points, strict=True), label=label, **style)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.minorticks_off()
    ax.set_xlabel("concurrent users")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)


def render_png(  # noqa: PLR0913, PLR0917 - one call site, each part of the chart named
    path, cluster_name, timestamp, rows, source=SOURCE_HARDWARE, previous=None, seed=None, capacity=None
) -> str | None:
    """Three panels against concurrency: aggregate tok/s, per-user tok/s and TTFT p95, this run next to
    the previous one and the seed figures, with the SLO's lines and the users at SLO, and a fourth with the
    draft acceptance rate when the levels carry speculative-decoding counters; returns why not when it
    can't draw."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        return f"matplotlib is not importable on the control node ({exc}); install it to get the chart"
    previous, seed, capacity = previous or {}, seed or {}, capacity or {}
    xs = sorted({int(r["concurrency"]) for r in rows} | set(previous) | set(seed))
    by_c = {int(r["concurrency"]): r for r in rows}
    now = {"color": "tab:blue", "marker": "o", "linewidth": 2.2, "zorder": 3}  # over the others
    before = {"color": "grey", "marker": "s", "linestyle": "--", "linewidth": 1.2, "markersize": 4}
    seeds = {"color": "black", "marker": "x", "linestyle": ":", "markersize": 8, "linewidth": 1}
    seed_label = "seed figures (2 Sparks, hardware)"

    def line(key, prev_key, seed_of):
        return [
            ("this run", [(by_c.get(x) or {}).get(key) for x in xs], now),
            ("previous run", [(previous.get(x) or {}).get(prev_key) for x in xs], before),
            (seed_label, [seed_of(x) if x in seed else None for x in xs], seeds),
        ]

    slo = capacity.get("slo") or {}
    # A speculative-decoding profile gets a fourth panel: the draft acceptance rate by level.
    spec = any(_acceptance_pct(r) is not None for r in rows)
    fig, axes = plt.subplots(1, 4 if spec else 3, figsize=(18.5 if spec else 14, 4.6), dpi=100)
    try:
        _panel(axes[0], xs, line("aggregate_tok_s", "aggregate", seed.get), "tok/s, all users", "Aggregate output")
        _panel(
            axes[1],
            xs,
            line("per_request_tok_s_mean", "user", lambda x: seed[x] / x),
            "tok/s per user",
            "Each user's speed",
        )
        _panel(axes[2], xs, line("ttft_p95_s", "ttft_p95", lambda x: None), "seconds", "Time to first token, p95")
        if spec:
            rates = [("this run", [_acceptance_pct(by_c.get(x) or {}) for x in xs], now)]
            rates.append(("previous run", [(previous.get(x) or {}).get("acceptance") for x in xs], before))
            _panel(axes[3], xs, rates, "% of draft tokens accepted", "Draft acceptance (speculative decoding)")
            axes[3].set_ylim(0, 100)
            axes[3].legend(fontsize=8, loc="lower left")
        for ax, bound, below in ((axes[1], "min_tok_s_per_user", True), (axes[2], "max_ttft_p95_s", False)):
            if slo.get(bound):
                ax.axhline(slo[bound], color="tab:red", linewidth=1.5, label="SLO")
                ymax = max(ax.get_ylim()[1], slo[bound] * 1.3)
                ax.set_ylim(0, ymax)
                ax.axhspan(*((0, slo[bound]) if below else (slo[bound], ymax)), color="tab:red", alpha=0.07)
                ax.annotate(
                    f"SLO {'>=' if below else '<='} {slo[bound]:g}",
                    (0.99, slo[bound]),
                    xycoords=("axes fraction", "data"),
                    ha="right",
                    va="bottom",
                    color="tab:red",
                    fontsize=9,
                )
        users = capacity.get("users_at_slo")
        if users:
            for ax in axes:
                ax.axvline(users, color="tab:green", linewidth=1.2, linestyle="-.", label="users at SLO")
            axes[0].annotate(
                f"{users} users at SLO",
                (users, 0.04),
                xycoords=("data", "axes fraction"),
                color="tab:green",
                fontsize=9,
                xytext=(4, 0),
                textcoords="offset points",
            )
        axes[0].legend(fontsize=8, loc="upper left")
        double = source == SOURCE_TEST_DOUBLE
        head = f"{cluster_name} {timestamp}: " + (
            f"{users} users at SLO" if users else ("no level met the SLO" if slo else "benchmark")
        )
        if slo:
            head += f" (>= {slo['min_tok_s_per_user']:g} tok/s per user, TTFT p95 <= {slo['max_ttft_p95_s']:g} s)"
        fig.suptitle(head, fontsize=12, x=0.01, ha="left")
        fig.text(0.01, 0.905, SOURCE_LABELS[source], fontsize=9, color="tab:red" if double else "black")
        axes[0].set_title(f"Aggregate output ({SOURCE_LABELS[source].split(' (')[0]})", fontsize=10, loc="left")
        if double:
            axes[0].text(0.98, 0.97, "TEST DOUBLE", transform=axes[0].transAxes, ha="right", va="top", color="tab:red")
        fig.tight_layout(rect=(0, 0, 1, 0.93))
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return None


def _atomic_write(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main():
    module = AnsibleModule(
        argument_spec={
            "source": {"type": "str", "choices": list(SOURCES), "default": SOURCE_HARDWARE},
            "model": {"type": "str", "required": False},
            "results": {"type": "list", "elements": "dict", "required": True},
            "reference": {"type": "dict", "default": dict(DEFAULT_REFERENCE)},
            "output_dir": {"type": "path", "required": True},
            "cluster_name": {"type": "str", "required": True},
            "previous": {"type": "path", "required": False},
            "regression_threshold": {"type": "float", "default": 0.10},
            "timestamp": {"type": "str", "required": False},
            "runs": {"type": "list", "elements": "dict", "required": False},
            "capacity": {"type": "dict", "required": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    cluster = p["cluster_name"]
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", cluster):
        module.fail_json(msg=f"cluster_name {cluster!r} must be letters, digits, '.', '_' or '-' (it names files)")
    if not 0 <= p["regression_threshold"] < 1:
        module.fail_json(msg=f"regression_threshold is a fraction in [0, 1), got {p['regression_threshold']}")
    try:
        reference = normalize_reference(p["reference"])
    except (TypeError, ValueError):
        module.fail_json(msg=f"reference must map concurrency (int) to tok/s (number), got {p['reference']!r}")
    for i, level in enumerate(p["results"]):
        if "concurrency" not in level or _num(level.get("concurrency")) is None:
            module.fail_json(msg=f"results[{i}] has no numeric concurrency; pass the levels list of vllm_benchmark")
    timestamp = p["timestamp"] or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    if not re.match(rf"^{TIMESTAMP_RE}$", timestamp):
        module.fail_json(msg=f"timestamp must look like 20261123T070200Z, got {timestamp!r}")

    source = p["source"]
    seed = dict(reference)  # the chart's seed figures, for either source
    if source == SOURCE_TEST_DOUBLE:
        reference = {}  # the double's pace is a setting: comparing it with hardware means nothing
    # Printed paths without `..` (an inventory's reports dir can be given relative to it).
    out_dir = os.path.realpath(p["output_dir"])
    stem = os.path.join(out_dir, f"{cluster}-{timestamp}")
    json_path, md_path, png_path = stem + ".json", stem + ".md", stem + ".png"

    previous_path = p["previous"] or find_previous(out_dir, cluster, exclude=json_path, source=source)
    previous, curves = {}, {}
    if previous_path:
        try:
            with open(previous_path, encoding="utf-8") as fh:
                previous_doc = json.load(fh)
            previous, curves = previous_by_concurrency(previous_doc), previous_curves(previous_doc)
        except (OSError, ValueError) as exc:
            module.fail_json(
                msg=f"cannot read the previous run {previous_path}: {exc}; fix or remove it, or set previous"
            )

    rows, regressions = compare(p["results"], reference, previous, p["regression_threshold"])
    result = {
        "source": source,
        "json_path": json_path,
        "markdown_path": md_path,
        "png_path": None,
        "png_skipped": None,
        "previous_path": previous_path,
        "regressions": regressions,
        "rows": rows,
    }
    if module.check_mode:
        result["png_path"] = png_path
        module.exit_json(changed=True, **result)

    try:
        os.makedirs(out_dir, exist_ok=True)
        document = {
            "cluster_name": cluster,
            "timestamp": timestamp,
            "source": source,
            "source_label": SOURCE_LABELS[source],
            "model": p["model"],
            "results": p["results"],
            "runs": p["runs"],
            "capacity": p["capacity"],
            "reference": {str(k): v for k, v in sorted(reference.items())} if reference else None,
            "previous_path": previous_path,
            "regression_threshold": p["regression_threshold"],
            "rows": rows,
            "regressions": regressions,
        }
        _atomic_write(json_path, json.dumps(document, indent=2, sort_keys=True) + "\n")
        _atomic_write(
            md_path,
            render_markdown(
                cluster, timestamp, rows, p["regression_threshold"], previous_path, source, p["model"], p["capacity"]
            ),
        )
        skipped = render_png(png_path, cluster, timestamp, rows, source, curves, seed, p["capacity"])
    except OSError as exc:
        module.fail_json(msg=f"cannot write the report under {out_dir}: {exc}; check the path and its permissions")
    result["png_path"] = None if skipped else png_path
    result["png_skipped"] = skipped
    module.exit_json(changed=True, **result)


if __name__ == "__main__":
    main()
