"""Every PromQL expression of the alert rules and the Grafana dashboard queries only metrics
that the exporters really produce:

- vLLM 0.19.0: the metric families recorded from the release's own code
  (plugins/plugin_utils/vllm_contracts/vllm-0.19.0.json, key `metrics`; names as exposed);
- the node exporter: a real scrape of Debian 12's prometheus-node-exporter 1.5.0-1+b6
  (tests/fixtures/prometheus/, see its README);
- sparkops' textfile metrics: what roles/monitoring/files/sparkops-textfile-metrics.py writes;
- the client gateway's per-key counters: the prometheus_client Counters that
  roles/gateway/files/sparkops_gateway_auth.py registers (a Counter `X` is exposed as `X_total`);
- Prometheus itself: `up`.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "monitoring"
RULES = ROLE / "files" / "sparkops-alerts.yml"
DASHBOARD = ROLE / "files" / "grafana" / "sparkops-dashboard.json"
VLLM_CONTRACT = ROOT / "plugins" / "plugin_utils" / "vllm_contracts" / "vllm-0.19.0.json"
NODE_EXPORTER_SCRAPE = ROOT / "tests" / "fixtures" / "prometheus" / "node_exporter_1.5.0-1+b6_debian12.txt"
TEXTFILE_SCRIPT = ROLE / "files" / "sparkops-textfile-metrics.py"
GATEWAY_AUTH = ROOT / "roles" / "gateway" / "files" / "sparkops_gateway_auth.py"

PROMQL_WORDS = {
    # aggregations, functions and keywords used in PromQL
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "group",
    "rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets", "absent",
    "absent_over_time", "histogram_quantile", "avg_over_time", "max_over_time", "min_over_time",
    "sum_over_time", "count_over_time", "last_over_time", "clamp_min", "clamp_max", "abs", "vector",
    "scalar", "time", "timestamp", "label_replace", "label_join", "predict_linear", "sort", "sort_desc",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
    "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (selectors' names, not labels or functions)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # Grafana variables
    names = set()
    for m in re.finditer(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", text):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in PROMQL_WORDS or re.fullmatch(r"\d+\w*", word):
            continue
        names.add(word)
    return names


def rule_exprs() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return [(r.get("alert") or r.get("record"), r["expr"]) for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


def vllm_series() -> set[str]:
    if not VLLM_CONTRACT.exists():
        pytest.fail(f"{VLLM_CONTRACT.relative_to(ROOT)} is missing: it is recorded from the vLLM 0.19.0 wheel (h-vllm)")
    families = json.loads(VLLM_CONTRACT.read_text())["metrics"]
    series = set()
    for fam in families:
        name, typ = fam["name"], fam.get("type")
        if typ == "histogram":
            series |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        elif typ == "summary":
            series |= {name, f"{name}_sum", f"{name}_count"}
        else:
            series.add(name)
    return series


def scrape_series(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"(?m)^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{|\s)", text)}


def textfile_module():
    spec = importlib.util.spec_from_file_location("sparkops_textfile_metrics", TEXTFILE_SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sparkops_series(tmp_path: Path) -> set[str]:
    mod = textfile_module()
    # A row in the format of `nvidia-smi --query-gpu=<GPU_QUERY> --format=csv,noheader,nounits`.
    gpu = mod.gpu_lines("0, NVIDIA GB10, 2418, 3003, 0x0000000000000004, 55, 40.12, 93\n")
    # A restart and a judgement of the answers: every series the log can give (the quality gauges appear with
    # the first judgement).
    (tmp_path / "w.jsonl").write_text(
        '{"epoch": 1, "event": "restart_begun"}\n{"epoch": 2, "event": "quality_ok", "mean_logprob": -1.8}\n'
    )
    lines = gpu + mod.watchdog_lines(tmp_path / "w.jsonl") + mod.threshold_lines(tmp_path, 1, 2)
    return scrape_series("\n".join(lines))


def gateway_series() -> dict[str, list[str]]:
    """The gateway's counters as exposed (`X_total`) and gauges (`X`), each with its label names, read from the
    Counter(...) and Gauge(...) calls of the auth hook's source (it imports LiteLLM, which the unit tests do not
    have)."""
    series = {}
    for node in ast.walk(ast.parse(GATEWAY_AUTH.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("Counter", "Gauge"):
            name = ast.literal_eval(node.args[0])
            labels = ast.literal_eval(node.args[2]) if len(node.args) > 2 else []
            counter = node.func.id == "Counter"
            series[name.removesuffix("_total") + "_total" if counter else name] = labels
    return series


@pytest.fixture(scope="module")
def known(tmp_path_factory) -> dict[str, set[str]]:
    return {
        "vllm": vllm_series(),
        "node": scrape_series(NODE_EXPORTER_SCRAPE.read_text()),
        "sparkops": sparkops_series(tmp_path_factory.mktemp("textfile")),
        "gateway": set(gateway_series()),
        "prometheus": {"up"},
    }


def test_the_extractor_finds_selectors_and_skips_labels_functions_and_variables():
    expr = (
        "histogram_quantile(0.95, sum by (le, model_name) "
        '(rate(vllm:x_bucket{job="vllm",le!="+Inf"}[$__rate_interval])))'
        " / on (instance) group_left (node) max by (instance) (node_memory_MemAvailable_bytes offset 5m) > 1e9"
    )
    assert metric_names(expr) == {"vllm:x_bucket", "node_memory_MemAvailable_bytes"}


def test_a_metric_vllm_0_19_does_not_export_is_caught(known):
    # vLLM 0.19.0 dropped these V0 names; a dashboard using them shows nothing.
    for gone in ("vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds_bucket"):
        assert gone not in set().union(*known.values())


@pytest.mark.parametrize(("where", "exprs"), [("alert rules", rule_exprs), ("dashboard", dashboard_exprs)])
def test_every_query_uses_only_metrics_the_exporters_produce(known, where, exprs):
    everything = set().union(*known.values())
    unknown = {f"{title}: {name}" for title, expr in exprs() for name in metric_names(expr) if name not in everything}
    assert not unknown, f"{where} query metrics no exporter produces: {sorted(unknown)}"


def test_the_dashboard_covers_what_operators_watch():
    used = set().union(*(metric_names(e) for _where, e in dashboard_exprs()))
    for needed in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "sparkops_gpu_sm_clock_hertz",
        "node_memory_MemAvailable_bytes",
    ):
        assert needed in used, needed
    for needed in gateway_series():  # per key, each of the gateway's counters
        assert needed in used, needed
    quantiles = {e.split(",")[0] for _where, e in dashboard_exprs() if e.startswith("histogram_quantile(")}
    assert quantiles == {"histogram_quantile(0.5", "histogram_quantile(0.95"}


def test_every_alert_has_a_for_clause_and_a_test():
    doc = yaml.safe_load(RULES.read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) == 11
    assert all(r.get("for") for r in alerts), [r["alert"] for r in alerts if not r.get("for")]
    tests = yaml.safe_load((ROOT / "tests" / "promtool" / "sparkops-alerts.test.yml").read_text())["tests"]
    for alert in (r["alert"] for r in alerts):
        cases = [c for t in tests for c in t["alert_rule_test"] if c["alertname"] == alert]
        assert any(c["exp_alerts"] for c in cases), f"{alert}: no case where it fires"
        assert any(not c["exp_alerts"] for c in cases), f"{alert}: no healthy case where it stays quiet"


def test_the_gateway_panels_read_its_counters_by_key_and_its_up_state():
    """Per key NAME (the counters' only label), the gateway's scrape job (prometheus.yml.j2's `gateway`), and
    its alert on the same job."""
    series = gateway_series()
    assert set(series) == {
        "sparkops_gateway_requests_total",
        "sparkops_gateway_prompt_tokens_total",
        "sparkops_gateway_completion_tokens_total",
        "sparkops_gateway_refused_total",
        "sparkops_gateway_in_flight",
    }
    assert all(labels == ["key"] for labels in series.values()), series
    gateway_exprs = [e for _t, e in dashboard_exprs() if metric_names(e) & set(series)]
    assert len(gateway_exprs) == 5, gateway_exprs
    for expr in gateway_exprs:
        rated = re.search(r"sum by \(key\) \(rate\(", expr)
        gauge = expr == 'sum by (key) (sparkops_gateway_in_flight{job="gateway"})'
        assert (rated or gauge) and 'job="gateway"' in expr, expr
    assert 'up{job="gateway"}' in [e for _t, e in dashboard_exprs()]
    template = (ROLE / "templates" / "prometheus.yml.j2").read_text()
    job = re.search(r"job_name: (\w+)\n    metrics_path: /metrics/", template)
    assert job and job.group(1) == "gateway"
    groups = yaml.safe_load(RULES.read_text())["groups"]
    [down] = [r for g in groups for r in g["rules"] if r.get("alert") == "GatewayDown"]
    assert down["expr"] == 'up{job="gateway"} == 0' and down["labels"]["severity"] == "critical"
