"""Every replica checked, scraped and reported (issue 25): the serving plan's `targets` and what reads them.

serving_targets gives one API per replica; the health report, status, verify (through the report),
doctor and monitoring's scrape config read that list, and the benchmark picks one deployment by name.
With the default single deployment the outputs stay as they were before deployments.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.parse
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.filter.cluster import FilterModule
from ansible_collections.sparkops.cluster.plugins.filter.day2 import FilterModule as Day2Filters
from ansible_collections.sparkops.cluster.plugins.filter.gateway import FilterModule as GatewayFilters
from ansible_collections.sparkops.cluster.plugins.plugin_utils import day2_checks as d
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving import (
    deployment_target,
    health_rows,
    serving_targets,
)
from cluster_inventories import switch
from test_serving_plan import plan_of

ROOT = Path(__file__).resolve().parents[4]
TP2 = "qwen3-235b-a22b-gptq-int4-tp2"
GPT_OSS = "gpt-oss-120b-mxfp4"
QWEN30 = "qwen3-30b-a3b"
FILTERS = FilterModule().filters()
DAY2_FILTERS = Day2Filters().filters()
GATEWAY_FILTERS = GatewayFilters().filters()


def _four():
    """A four-node switch: TP=2 under Ray on spark-1/2, two single-node replicas on spark-3 and spark-4."""
    return plan_of(
        switch(4),
        deployments=[
            {"name": "big", "profile": TP2, "hosts": ["spark-1", "spark-2"]},
            {"name": "code", "profile": QWEN30, "hosts": ["spark-3", "spark-4"]},
        ],
    )


def _ip(cluster, host):
    return cluster["nodes"][host]["primary"]["ip"]


# ----------------------------------------------------------------------- the replicas a run judges
def test_the_judged_replicas_are_those_with_a_changed_member_each_by_its_api_member():
    """vllm_serve judges the answers of the replicas its container plan says it starts or replaces: the Ray
    group's API member whichever of its members changed, a changed single-node replica, never an unchanged one."""
    cluster, plan = _four()
    members = plan["vllm_members"]
    first = members[0]
    assert (first["deployment"], first["replica"], first["host"], first["role"]) == ("big", 0, "spark-1", "api")

    def results(*changed_hosts):
        return [{"changed": m["host"] in changed_hosts, "vllm_serve_member": m} for m in members]

    model = {**cluster, "serving": plan}

    def judged(model, container_plan):
        return FILTERS["serving_changed_api_members"](model, container_plan)

    assert judged(model, results()) == []
    code1 = judged(model, results("spark-4"))
    assert [(m["deployment"], m["replica"], m["host"]) for m in code1] == [("code", 1, "spark-4")]
    assert code1[0]["endpoint"]["url"] == f"http://{_ip(cluster, 'spark-4')}:8000"
    assert code1[0]["served_model_name"] == "qwen3-30b-a3b"
    every = judged(model, results("spark-1", "spark-3", "spark-4"))
    assert [(m["deployment"], m["replica"]) for m in every] == [("big", 0), ("code", 0), ("code", 1)]
    # vLLM's own executor: a changed rank on the worker replaces the replica, judged by its API on the head.
    mp_cluster, mp_plan = plan_of(executor="mp")
    ranks = [{"changed": m["role"] != "api", "vllm_serve_member": m} for m in mp_plan["vllm_members"]]
    assert [m["host"] for m in mp_plan["vllm_members"]] == ["spark-1", "spark-2"]
    (head_api,) = judged({**mp_cluster, "serving": mp_plan}, ranks)
    assert (head_api["host"], head_api["role"]) == ("spark-1", "api")
    # Skipped results (a member planned elsewhere) and a missing plan count as unchanged.
    assert judged(model, [{"skipped": True}, *results("spark-3")])[0]["host"] == "spark-3"
    assert judged(model, None) == []


# ------------------------------------------------------------------------------------- targets
def test_the_default_deployment_is_one_target_the_head_s_endpoint():
    cluster, plan = plan_of()
    (target,) = plan["targets"]
    assert target == {
        "deployment": "main",
        "replica": 0,
        "name": "main replica 0",
        "host": cluster["head"],
        "hosts": ["spark-1", "spark-2"],
        "url": cluster["endpoint"]["url"],
        "port": cluster["endpoint"]["port"],
        "served_model_name": plan["deployments"][0]["served_model_name"],
        "profile_name": TP2,
        "executor": "ray",
    }
    assert plan["ray_used"] is True
    assert plan["image"] == plan["deployments"][0]["image"]


def test_every_replica_of_every_deployment_is_a_target_with_its_own_api():
    cluster, plan = _four()
    got = [(t["name"], t["host"], t["url"], t["served_model_name"], t["executor"]) for t in plan["targets"]]
    assert got == [
        ("big replica 0", "spark-1", f"http://{_ip(cluster, 'spark-1')}:8000", "qwen3-235b-a22b", "ray"),
        ("code replica 0", "spark-3", f"http://{_ip(cluster, 'spark-3')}:8000", "qwen3-30b-a3b", "single"),
        ("code replica 1", "spark-4", f"http://{_ip(cluster, 'spark-4')}:8000", "qwen3-30b-a3b", "single"),
    ]
    assert [t["hosts"] for t in plan["targets"]] == [["spark-1", "spark-2"], ["spark-3"], ["spark-4"]]
    assert plan["ray_used"] is True  # one replica of three under Ray is enough
    # The same list from a plan of deployments without `replicas` (their first replica's keys only).
    flat = {"deployments": [{k: v for k, v in dep.items() if k != "replicas"} for dep in plan["deployments"]]}
    assert [t["name"] for t in serving_targets(flat)] == ["big replica 0", "code replica 0"]


def test_ray_is_used_only_when_a_replica_runs_under_it():
    _cluster, plan = plan_of(
        deployments=[
            {"name": "chat", "profile": GPT_OSS, "hosts": ["spark-1"]},
            {"name": "code", "profile": QWEN30, "hosts": ["spark-2"]},
        ]
    )
    assert [t["executor"] for t in plan["targets"]] == ["single", "single"]
    assert plan["ray_used"] is False
    assert plan_of(executor="mp")[1]["ray_used"] is False


# ------------------------------------------------------------------------------------- benchmark
def test_the_benchmark_measures_the_first_deployment_or_the_one_named():
    _cluster, plan = _four()
    assert deployment_target(plan)["name"] == "big replica 0"
    assert deployment_target(plan, "")["name"] == "big replica 0"
    assert deployment_target(plan, "code")["name"] == "code replica 0"
    assert FILTERS["serving_target"]({"serving": plan}, "code")["host"] == "spark-3"


def test_an_unknown_deployment_is_refused_with_the_names_there_are():
    _cluster, plan = _four()
    with pytest.raises(
        ValueError, match=r"sparkops_deployment='chat' is no deployment of this cluster; it serves big, code"
    ):
        deployment_target(plan, "chat")
    with pytest.raises(AnsibleFilterError, match="it serves big, code"):
        FILTERS["serving_target"]({"serving": plan}, "chat")


# ------------------------------------------------------------------------------------- health rows
def _check(target, healthy=True, **more):
    metrics = {"kv_cache_usage": 0.25, "num_requests_running": 1, "num_requests_waiting": 0}
    base = {"item": target, "healthy": healthy, "failure_kind": None if healthy else "refused", "ttft_s": 0.12,
            "tok_s": 20.5, "metrics": metrics}  # fmt: skip
    return {**base, **more}


def test_one_replica_s_line_and_problem_are_today_s():
    cluster, plan = plan_of()
    url = cluster["endpoint"]["url"]
    (row,) = health_rows([_check(plan["targets"][0])])
    assert row["line"] == f"endpoint: {url}/v1 HEALTHY; KV cache 0.25; running 1, waiting 0"
    assert row["healthy"] and row["problem"] is None and row["status"] == "HEALTHY"
    (bad,) = health_rows([_check(plan["targets"][0], healthy=False, metrics={}, msg="connection refused")])
    assert bad["line"] == f"endpoint: {url}/v1 UNHEALTHY (refused); KV cache ?; running ?, waiting ?"
    assert bad["problem"] == f"The endpoint {url} is not healthy: connection refused"


def test_several_replicas_are_named_each_with_its_own_state():
    _cluster, plan = _four()
    checks = [_check(t) for t in plan["targets"]]
    checks[2] = _check(plan["targets"][2], healthy=False, failure_kind="engine_dead")
    rows = health_rows(checks)
    url2 = plan["targets"][2]["url"]
    assert [r["line"].split(":", 1)[0] for r in rows] == [
        "endpoint big replica 0 (qwen3-235b-a22b)",
        "endpoint code replica 0 (qwen3-30b-a3b)",
        "endpoint code replica 1 (qwen3-30b-a3b)",
    ]
    assert rows[2]["line"].endswith(f"{url2}/v1 UNHEALTHY (engine_dead); KV cache 0.25; running 1, waiting 0")
    assert [r["problem"] for r in rows] == [None, None, f"code replica 1 ({url2}) is not healthy: engine_dead"]
    # Two replicas are several too; a failure that says nothing is said as such.
    two = health_rows([_check(plan["targets"][0]), _check(plan["targets"][2], healthy=False, failure_kind=None)])
    assert two[0]["line"].startswith("endpoint big replica 0 (qwen3-235b-a22b): ")
    assert two[1]["problem"] == f"code replica 1 ({url2}) is not healthy: no answer"
    # A replica whose check did not run at all (its node unreachable) is not healthy either.
    (gone,) = health_rows([{"item": plan["targets"][0], "unreachable": True, "msg": "ssh: no route"}])
    assert not gone["healthy"] and gone["problem"].endswith("is not healthy: ssh: no route")


# ------------------------------------------------------------------------------------- doctor
def test_doctor_gives_one_endpoint_verdict_per_replica():
    _cluster, plan = _four()
    results = [_check(t) for t in plan["targets"]]
    results[1] = _check(plan["targets"][1], healthy=False, failure_kind="refused", msg="connection refused")
    verdicts = d.check_endpoints(results)
    assert [(v["scope"], v["verdict"]) for v in verdicts] == [
        (f"big replica 0 ({plan['targets'][0]['url']})", "PASS"),
        (f"code replica 0 ({plan['targets'][1]['url']})", "CRITICAL"),
        (f"code replica 1 ({plan['targets'][2]['url']})", "PASS"),
    ]
    two = d.check_endpoints(results[:2])
    assert [v["scope"] for v in two] == [
        f"big replica 0 ({plan['targets'][0]['url']})",
        f"code replica 0 ({plan['targets'][1]['url']})",
    ]
    # What a failed check without checks says: its message (an unreachable node's), else that none came.
    assert d.check_endpoint({"healthy": False, "msg": "ssh: no route"})["evidence"] == "ssh: no route"
    assert d.check_endpoint({"healthy": False})["evidence"] == "no completion"
    # One replica: today's one verdict for the cluster.
    (one,) = d.check_endpoints([_check(plan["targets"][0])])
    assert (one["check"], one["scope"], one["verdict"]) == ("endpoint", "cluster", "PASS")
    # doctor.yml's inputs: every replica's result under `endpoints`.
    settings = {"hardware": "simulated", "driver_branch": "580", "memory_floor_gib": 0.25, "disk_headroom_gib": 1,
                "weights_path": "/w", "cable_threshold_gbps": 190, "expected_nodes": 4, "expected_gpus": 4,
                "serve_host": "10.0.0.1", "mgmt_address": "192.168.0.1"}  # fmt: skip
    built = d.build_verdicts({"now_epoch": 0, "settings": settings, "nodes": {}, "endpoints": results})
    assert [v["verdict"] for v in built if v["check"] == "endpoint"] == ["PASS", "CRITICAL", "PASS"]


def test_doctor_asks_every_api_node_without_the_key():
    keyless = Day2Filters().filters()["doctor_keyless_urls"]
    cluster, plan = plan_of()
    mgmt, url = cluster["nodes"]["spark-1"]["mgmt_address"], cluster["endpoint"]["url"]
    # The default: the head's management address and endpoint, as before deployments.
    assert keyless({**cluster, "serving": plan}) == [
        f"http://{mgmt}:8000/invocations", f"http://{mgmt}:8000/tokenize", f"{url}/invocations", f"{url}/tokenize"
    ]  # fmt: skip
    cluster, plan = _four()
    urls = d.keyless_probe_urls({**cluster, "serving": plan})
    bases = list(dict.fromkeys(u.rsplit("/", 1)[0] for u in urls))
    want = []
    for host in ("spark-1", "spark-3", "spark-4"):
        want += [f"http://{cluster['nodes'][host]['mgmt_address']}:8000", f"http://{_ip(cluster, host)}:8000"]
    assert bases == want and len(urls) == 2 * len(want)
    # The head is asked even when it serves no replica (whatever answers there must ask for the key).
    cluster, plan = plan_of(switch(4), deployments=[{"name": "code", "profile": QWEN30, "hosts": ["spark-3"]}])
    bases = list(dict.fromkeys(u.rsplit("/", 1)[0] for u in d.keyless_probe_urls({**cluster, "serving": plan})))
    assert bases[:2] == [f"http://{cluster['nodes']['spark-1']['mgmt_address']}:8000", cluster["endpoint"]["url"]]
    assert bases[2:] == [
        f"http://{cluster['nodes']['spark-3']['mgmt_address']}:8000",
        f"http://{_ip(cluster, 'spark-3')}:8000",
    ]
    # An IPv6 management address is bracketed in a URL.
    cluster["nodes"]["spark-3"]["mgmt_address"] = "fd00::13"
    assert "http://[fd00::13]:8000/tokenize" in d.keyless_probe_urls({**cluster, "serving": plan})
    with pytest.raises(AnsibleFilterError, match="not a cluster model"):
        keyless({"head": "spark-1"})


# ------------------------------------------------------------------------------------- templates
def _env(folder):
    # Ansible's template defaults: trim_blocks on, lstrip_blocks off.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(ROOT / folder), trim_blocks=True, undefined=jinja2.StrictUndefined
    )
    env.filters["urlsplit"] = lambda url, part: getattr(urllib.parse.urlsplit(url), part)
    env.filters["ansible.utils.ipwrap"] = lambda a: a
    env.filters["sparkops.cluster.serving_health_rows"] = FILTERS["serving_health_rows"]
    env.filters["sparkops.cluster.serving_ray_rows"] = FILTERS["serving_ray_rows"]
    env.filters["sparkops.cluster.serving_allowed_rules"] = lambda *_a: []
    env.filters["realpath"] = os.path.realpath
    env.filters["to_nice_json"] = lambda v: json.dumps(v, indent=4, sort_keys=True)
    env.filters["from_json"] = json.loads
    env.filters["bool"] = lambda v: v if isinstance(v, bool) else str(v).strip().lower() in ("true", "yes", "on", "1")
    env.filters["sparkops.cluster.gateway_usage_lines"] = GATEWAY_FILTERS["gateway_usage_lines"]
    env.filters["b64decode"] = lambda v: base64.b64decode(v).decode()
    env.filters["sparkops.cluster.watchdog_status_line"] = DAY2_FILTERS["watchdog_status_line"]
    env.tests["skipped"] = lambda v: bool(getattr(v, "get", lambda *_: False)("skipped"))
    return env


def _prometheus_config(cluster, plan, **more):
    return yaml.safe_load(
        _env("roles/monitoring/templates")
        .get_template("prometheus.yml.j2")
        .render(
            ansible_managed="managed",
            monitoring_scrape_interval="15s",
            monitoring_evaluation_interval="15s",
            sparkops_cluster_name="c",
            monitoring_listen_address="127.0.0.1",
            monitoring_prometheus_port=9090,
            sparkops_cluster={**cluster, "serving": plan},
            groups={"spark_cluster": ["spark-1"]},
            hostvars={"spark-1": {"monitoring_node_exporter_target": "10.0.0.1:9100"}},
            **{"sparkops_gateway_enabled": False, **more},
        )
    )


def _prometheus(cluster, plan):
    (job,) = [j for j in _prometheus_config(cluster, plan)["scrape_configs"] if j["job_name"] == "vllm"]
    return job["static_configs"]


def test_prometheus_scrapes_every_replica_s_api_with_its_labels():
    cluster, plan = _four()
    assert _prometheus(cluster, plan) == [
        {"targets": [f"{_ip(cluster, h)}:8000"], "labels": {"node": h, "deployment": dep, "replica": rep}}
        for h, dep, rep in (("spark-1", "big", "0"), ("spark-3", "code", "0"), ("spark-4", "code", "1"))
    ]
    # The default: the one target it always was, the head's endpoint.
    cluster, plan = plan_of()
    (static,) = _prometheus(cluster, plan)
    assert static["targets"] == [urllib.parse.urlsplit(cluster["endpoint"]["url"]).netloc]
    assert static["labels"]["node"] == cluster["head"]


def _report(template, cluster, plan, checks, **more):
    rows = health_rows(checks)
    values = {
        "sparkops_cluster_name": "c",
        "sparkops_cluster": {**cluster, "serving": plan},
        "serving_report_target": plan["targets"][0],
        "serving_report_health": checks[0],
        "serving_report_rows": rows,
        "serving_report_checks": {"results": checks},
        "serving_report_ray": {"skipped": True},
        "serving_report_image": "vllm-node:x",
        "serving_report_curl": "curl ...",
        "serving_report_startup": None,
        "serving_report_allowed_rules": [],
        "vllm_serve_api_key_file": "/tmp/key",  # noqa: S108 - a name, never read
        "sparkops_api_key": "",
        "sparkops_serving_profile": TP2,
        "sparkops_profile": plan["deployments"][0]["profile"],
        "sparkops_hardware": "simulated",
        "sparkops_state_dir": "/var/lib/sparkops",
        "sparkops_reports_dir": "/r",
        "sparkops_allow_rules": [],
        "deployment_state": {},
        "groups": {"spark_cluster": []},
        "hostvars": {},
        "status_cables": "",
        "sparkops_gateway_enabled": False,
    }
    values.update(more)
    # roles/serving_report/vars/main.yml's serving_report_ray_rows (the role's vars reach its templates).
    values.setdefault(
        "serving_report_ray_rows", FILTERS["serving_ray_rows"](values["serving_report_ray"].get("results"))
    )
    # The same file's gateway values: the plan's gateway, the endpoint clients use, a client key's file.
    gateway = values["sparkops_cluster"]["serving"]["gateway"]
    values.setdefault("serving_report_gateway", gateway)
    values.setdefault("serving_report_client_keys", [])
    values.setdefault("serving_report_client_key_file", "/s/credentials/keys/alice")
    values.setdefault(
        "serving_report_endpoint",
        (gateway["client_url"] if gateway["enabled"] else values["serving_report_target"]["url"]) + "/v1",
    )
    folder, name = template
    return _env(folder).get_template(name).render(**values)


HEALTH_MD = ("roles/serving_report/templates", "health.md.j2")
HEALTH_JSON = ("roles/serving_report/templates", "health.json.j2")
STATUS = ("playbooks/templates", "status.txt.j2")


def test_the_health_report_has_a_row_per_replica_and_the_default_none():
    cluster, plan = _four()
    checks = [_check(t) for t in plan["targets"]]
    checks[1] = _check(plan["targets"][1], healthy=False, failure_kind="refused")
    md = _report(HEALTH_MD, cluster, plan, checks)
    rows = [line for line in md.splitlines() if line.startswith(("| big |", "| code |"))]
    assert [r.split(" | ")[:3] for r in rows] == [
        ["| big", "0", "spark-1"],
        ["| code", "0", "spark-3"],
        ["| code", "1", "spark-4"],
    ]
    assert "| NO: refused |" in rows[1] and "| yes |" in rows[2]
    assert f"| endpoint | `{plan['targets'][0]['url']}/v1` (OpenAI-compatible) |" in md
    doc = json.loads(_report(HEALTH_JSON, cluster, plan, checks, sparkops_hardware="hardware"))
    assert doc["healthy"] is False  # one replica down: not healthy
    assert [(r["name"], r["healthy"]) for r in doc["replicas"]] == [
        ("big replica 0", True), ("code replica 0", False), ("code replica 1", True)
    ]  # fmt: skip
    # The default single deployment: no replica table, its one endpoint the head's.
    cluster, plan = plan_of()
    md = _report(HEALTH_MD, cluster, plan, [_check(plan["targets"][0])])
    assert "## Every replica" not in md
    assert f"| endpoint | `{cluster['endpoint']['url']}/v1` (OpenAI-compatible) |" in md
    doc = json.loads(_report(HEALTH_JSON, cluster, plan, [_check(plan["targets"][0])], sparkops_hardware="hardware"))
    assert doc["healthy"] is True and doc["endpoint"] == cluster["endpoint"]["url"] + "/v1"


def test_status_prints_a_line_per_replica_and_today_s_line_for_one():
    cluster, plan = _four()
    out = _report(STATUS, cluster, plan, [_check(t) for t in plan["targets"]]).splitlines()
    assert [line.split(":")[0] for line in out if line.startswith("endpoint")] == [
        "endpoint big replica 0 (qwen3-235b-a22b)",
        "endpoint code replica 0 (qwen3-30b-a3b)",
        "endpoint code replica 1 (qwen3-30b-a3b)",
    ]
    assert "ray: not used (no replica runs under Ray)" in out
    cluster, plan = plan_of()
    (group,) = plan["ray_groups"]
    reading = {"item": group, "ready": True, "summary": "2/2 nodes alive, 2.0/2.0 GPUs (2.0 used)"}
    out = _report(STATUS, cluster, plan, [_check(plan["targets"][0])], serving_report_ray={"results": [reading]})
    out = out.splitlines()
    assert f"endpoint: {cluster['endpoint']['url']}/v1 HEALTHY; KV cache 0.25; running 1, waiting 0" in out
    assert "ray: ok: 2/2 nodes alive, 2.0/2.0 GPUs (2.0 used)" in out


def _ray_reading(group, alive):
    gpus = float(alive)
    return {"item": group, "ready": alive == group["expected_nodes"], "nodes_alive": alive, "gpus_total": gpus,
            "summary": f"{alive}/{group['expected_nodes']} nodes alive, {gpus}/{float(group['expected_gpus'])} GPUs",
            "msg": f"Ray cluster after 0 s: {alive}/{group['expected_nodes']} nodes alive"}  # fmt: skip


def test_with_the_gateway_on_the_health_report_names_it_and_a_client_key_file():
    cluster, plan = _four()
    checks = [_check(t) for t in plan["targets"]]
    gateway = {**plan["gateway"], "enabled": True, "client_url": "http://192.168.1.11:4000"}
    on = {**plan, "gateway": gateway}
    md = _report(HEALTH_MD, cluster, on, checks)
    assert "| endpoint | `http://192.168.1.11:4000/v1` (the gateway: OpenAI-compatible, one client key each) |" in md
    assert f"| vLLM (behind the gateway) | `{plan['targets'][0]['url']}/v1`" in md
    assert "none yet: `ansible-playbook playbooks/keys.yml -e sparkops_key_name=alice`" in md
    assert "| API key |" not in md
    made = _report(HEALTH_MD, cluster, on, checks, serving_report_client_keys=["alice"])
    assert "| client key | `/s/credentials/keys/alice` |" in made and "Make the client key first" not in made
    doc = json.loads(_report(HEALTH_JSON, cluster, on, checks, serving_report_client_keys=["alice"]))
    assert doc["endpoint"] == "http://192.168.1.11:4000/v1" and doc["gateway"] is True
    assert doc["client_key_file"] == "/s/credentials/keys/alice"
    assert doc["vllm_endpoint"] == plan["targets"][0]["url"] + "/v1"


def test_status_and_the_health_report_show_each_ray_group():
    cluster, plan = plan_of(switch(4), deployments=[{"name": "big", "profile": TP2}])
    first, second = plan["ray_groups"]
    ray = {"results": [_ray_reading(first, 2), _ray_reading(second, 1)]}
    checks = [_check(t) for t in plan["targets"]]
    out = _report(STATUS, cluster, plan, checks, serving_report_ray=ray).splitlines()
    assert [line for line in out if line.startswith(("ray", "  (Ray"))] == [
        "ray big replica 0 (spark-1, spark-2): ok: 2/2 nodes alive, 2.0/2.0 GPUs",
        "ray big replica 1 (spark-3, spark-4): DEGRADED: 1/2 nodes alive, 1.0/2.0 GPUs",
        "  (Ray cluster after 0 s: 1/2 nodes alive)",
    ]
    md = _report(HEALTH_MD, cluster, plan, checks, serving_report_ray=ray).splitlines()
    assert [line for line in md if line.startswith("| Ray")] == [
        "| Ray big replica 0 (spark-1, spark-2) | ok: 2/2 nodes alive, 2.0/2.0 GPUs |",
        "| Ray big replica 1 (spark-3, spark-4) | DEGRADED: 1/2 nodes alive, 1.0/2.0 GPUs |",
    ]
    doc = json.loads(_report(HEALTH_JSON, cluster, plan, checks, serving_report_ray=ray, sparkops_hardware="x"))
    assert [(g["name"], g["ready"], g["gcs_address"]) for g in doc["ray_groups"]] == [
        ("big replica 0", True, first["gcs_address"]), ("big replica 1", False, second["gcs_address"])
    ]  # fmt: skip
    assert doc["ray"]["name"] == "big replica 0" and doc["ray"]["nodes_alive"] == 2
    # One group (the default): the report's row and JSON as before groups; no Ray: none.
    cluster, plan = plan_of()
    (group,) = plan["ray_groups"]
    one = {"results": [_ray_reading(group, 2)]}
    md = _report(HEALTH_MD, cluster, plan, [_check(plan["targets"][0])], serving_report_ray=one).splitlines()
    assert [line for line in md if line.startswith("| Ray")] == ["| Ray | ok: 2/2 nodes alive, 2.0/2.0 GPUs |"]
    doc = json.loads(_report(HEALTH_JSON, cluster, plan, [_check(plan["targets"][0])], serving_report_ray=one))
    assert (doc["ray"]["ready"], doc["ray"]["summary"]) == (True, "2/2 nodes alive, 2.0/2.0 GPUs")
    skipped = {"skipped": True, "results": []}  # a loop over no group
    doc = json.loads(_report(HEALTH_JSON, cluster, plan, [_check(plan["targets"][0])], serving_report_ray=skipped))
    assert doc["ray"] is None and doc["ray_groups"] == []
    md = _report(HEALTH_MD, cluster, plan, [_check(plan["targets"][0])], serving_report_ray=skipped)
    assert "| Ray | not used: vLLM's own executor (ray) |" in md.splitlines()


def test_status_says_when_the_watchdog_stopped_restarting():
    """issue 43: a spent restart budget is a line of its own in the status (why, and when it tries next)."""
    cluster, plan = plan_of()
    state = {"status": "gave_up", "gave_up_reason": "engine dead: HTTP 500", "restarts_in_hour": 3,
             "next_retry_at": "2026-11-27T10:30:00Z", "config": {"max_restarts_per_hour": 3}}  # fmt: skip
    read = {"content": base64.b64encode(json.dumps(state).encode()).decode()}
    out = _report(STATUS, cluster, plan, [_check(plan["targets"][0])], status_watchdog=read).splitlines()
    assert (
        "watchdog: STOPPED RESTARTING - engine dead: HTTP 500 (restarted 3 times in the last hour, "
        "max_restarts_per_hour=3); next try at 2026-11-27T10:30:00Z"
    ) in out
    # no state file (slurp failed): said, not a crash
    out = _report(STATUS, cluster, plan, [_check(plan["targets"][0])], status_watchdog={"failed": True}).splitlines()
    assert "watchdog: no watchdog state on the head (not installed, or never started)" in out
