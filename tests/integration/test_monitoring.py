"""Monitoring on the simulated cluster: the distribution's Prometheus and node exporter run for
real on the nodes (started by the monitoring role without systemd, through their init scripts),
scrape the vLLM TEST DOUBLE and every node, and an alert fires when the double stops.

The sim inventory shortens intervals and every alert's `for:` to 15 s
(inventory/sim/group_vars/all/monitoring.yml); the rules are otherwise the shipped ones.
"""

from __future__ import annotations

import json
import sys
import time
from urllib.parse import quote

import pytest
import yaml
from conftest import NODES, ROOT, SIM_STATE, failure, node_sh, recap, reset_watchdog, run_playbook

HEAD = NODES[0]
HOSTS = yaml.safe_load((ROOT / "inventory" / "sim" / "hosts.yml").read_text())


def host_vars(name: str) -> dict:
    groups = HOSTS["all"]["children"]["spark_cluster"]["children"]
    for group in groups.values():
        if name in group.get("hosts", {}):
            return group["hosts"][name]
    raise KeyError(name)


def fast_ip(name: str) -> str:
    return host_vars(name)["sparkops_fast_links"][0]["address"].split("/")[0]


PROM = f"http://{fast_ip(HEAD)}:9090"


def prom_get(path: str) -> dict:
    """GET from Prometheus' API on the head (it listens on the head's fast link only)."""
    script = (
        f"import json,sys,urllib.request;print(urllib.request.urlopen({PROM + path!r}, timeout=10).read().decode())"
    )
    res = node_sh(HEAD, f"python3 -c {json.dumps(script)}", timeout=30)
    body = json.loads(res.stdout)
    assert body["status"] == "success", body
    return body["data"]


def query(expr: str) -> list[dict]:
    return prom_get(f"/api/v1/query?query={quote(expr)}")["result"]


def wait_for(what: str, check, timeout_s: float, every_s: float = 2.0):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every_s)
    pytest.fail(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")


def targets_by_job() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for t in prom_get("/api/v1/targets?state=active")["activeTargets"]:
        out.setdefault(t["labels"]["job"], []).append(t)
    return out


def test_prometheus_scrapes_vllm_and_every_node_over_the_fast_link(sim_cluster):
    def all_up():
        jobs = targets_by_job()
        ups = [t["health"] == "up" for ts in jobs.values() for t in ts]
        return jobs if len(ups) == 4 and all(ups) else None

    jobs = wait_for("every target up", all_up, 90)
    assert sorted(jobs) == ["node", "prometheus", "vllm"]
    assert [t["scrapeUrl"] for t in jobs["vllm"]] == [f"http://{fast_ip(HEAD)}:8000/metrics"]
    assert sorted(t["scrapeUrl"] for t in jobs["node"]) == sorted(f"http://{fast_ip(n)}:9100/metrics" for n in NODES)
    # What the double exports under vLLM's names, and sparkops' textfile metrics from every node.
    assert query('vllm:num_requests_running{job="vllm"}'), "the double's vLLM metrics are not in Prometheus"
    gpu = {r["metric"]["node"]: r["value"][1] for r in query("sparkops_gpu_up")}
    assert gpu == dict.fromkeys(NODES, "0"), gpu  # no GPU in the simulation, and it says so
    assert len(query("sparkops_watchdog_restarts_total")) == len(NODES)
    assert len(query("node_memory_MemAvailable_bytes")) == len(NODES)


def test_every_vllm_metric_the_dashboard_and_rules_use_is_scraped_from_the_double(sim_cluster):
    """The unit test checks the names against the recorded 0.19.0 families; here against a live scrape."""
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from test_monitoring_queries import dashboard_exprs, metric_names, rule_exprs

    used = {n for _, e in dashboard_exprs() + rule_exprs() for n in metric_names(e) if n.startswith("vllm:")}
    scraped = {r["metric"]["__name__"] for r in query('count by (__name__) ({job="vllm"})')}
    assert used <= scraped, f"used but not scraped from the double: {sorted(used - scraped)}"


def test_the_daemons_listen_on_the_fast_link_only(sim_cluster):
    for node in NODES:
        listening = node_sh(node, "ss -Hltn").stdout
        ports = {line.split()[3] for line in listening.splitlines()}
        wanted = {f"{fast_ip(node)}:9100"} | ({f"{fast_ip(node)}:9090"} if node == HEAD else set())
        assert wanted <= ports, (node, ports)
        for port in ("9090", "9100"):
            assert not {p for p in ports if p.endswith(f":{port}") and p not in wanted}, (node, port, ports)
    # From the worker, the head's management address does not answer on Prometheus' port.
    mgmt = HOSTS["all"]["children"]["spark_cluster"]["children"]["spark_head"]["hosts"][HEAD]["ansible_host"]
    res = node_sh(NODES[1], f"nc -z -w 3 {mgmt} 9090", check=False)
    assert res.returncode != 0, "Prometheus answers on the management LAN"


def test_the_last_start_is_recorded_phase_by_phase(sim_cluster):
    """vllm_serve records the double's start from the containers' logs and the smoke completion.

    The earlier tests restart the double outside the serve role (the fault tests, Docker's restart
    policy), so the test makes the start it checks: the double removed, playbooks/serve.yml starts it
    (the watchdog stopped meanwhile, so that it does not restart the group under the playbook)."""
    node_sh(HEAD, "docker stop -t 2 sparkops-watchdog >/dev/null; docker rm -f sparkops-vllm >/dev/null")
    try:
        res = run_playbook("playbooks/serve.yml", timeout=600)
        assert res.returncode == 0, failure(res)
    finally:
        reset_watchdog(HEAD)
    state = json.loads(node_sh(HEAD, "cat /var/lib/sparkops/startup-phases.json").stdout)
    started = node_sh(HEAD, "docker inspect --format '{{.State.StartedAt}}' sparkops-vllm").stdout.strip()
    phases = {p["phase"]: p for p in state["phases"]}
    assert state["container_started_at"] == started, (state["container_started_at"], started)
    for measured in ("container_start", "ray_ready", "api_ready", "first_token"):
        assert phases[measured]["at"], (measured, phases[measured])
    assert 0 < phases["api_ready"]["since_start_s"] < 300
    assert phases["first_token"]["since_start_s"] >= phases["api_ready"]["since_start_s"]
    for skipped in ("weights_loading", "weights_loaded", "cuda_graphs", "engine_ready"):
        assert phases[skipped]["note"] == "not applicable (test double)"
    # The double prints vLLM 0.19.0's AOT-on compile lines and keeps its marker where vLLM keeps the AOT
    # artifact (VLLM_CACHE_ROOT, mounted from the host): cold writes it, a later start loads it.
    assert phases["torch_compile"]["at"], phases["torch_compile"]
    assert state["compile_cache"] in ("hit", "miss"), state["compile_cache"]
    node_sh(HEAD, "ls /var/lib/sparkops/cache/vllm/torch_compile_cache/torch_aot_compile/*/rank_0_0/model")
    report = (SIM_STATE / "reports" / "health.md").read_text()
    assert "## Last start, phase by phase" in report and "| api_ready |" in report
    print(
        "\nlast start of the double: " + ", ".join(f"{k} +{v['since_start_s']} s" for k, v in phases.items() if v["at"])
    )


def test_an_alert_fires_when_the_vllm_double_stops(sim_cluster):
    def firing():
        # Only for a target Prometheus scrapes now: a replica an earlier test removed (test_gateway.py's two chat
        # replicas) was last scraped down while site.yml removed it, and Prometheus, restarted rather than
        # reloaded, wrote no staleness marker, so its `up == 0` lasts the 5 min lookback (closing note).
        scraped = {t["labels"].get("instance") for t in prom_get("/api/v1/targets?state=active")["activeTargets"]}
        alerts = prom_get("/api/v1/alerts")["alerts"]
        return [
            a
            for a in alerts
            if a["labels"]["alertname"] == "VllmEndpointDown"
            and a["state"] == "firing"
            and a["labels"].get("instance") in scraped
        ]

    assert not firing(), "VllmEndpointDown fires before the double was stopped"
    rules = prom_get("/api/v1/rules")["groups"]
    durations = {r["name"]: r.get("duration") for g in rules for r in g["rules"] if r["type"] == "alerting"}
    assert len(durations) == 11 and set(durations.values()) == {15}, durations  # VllmAnswersWrong is the 11th

    # The watchdog would restart vLLM within a few probes and the alert (for: 15s) might never fire,
    # depending on how much of its hourly restart budget the earlier tests left: stop it for the test.
    node_sh(HEAD, "docker stop -t 2 sparkops-watchdog >/dev/null")
    t0 = time.monotonic()
    node_sh(HEAD, "docker stop -t 5 sparkops-vllm")
    try:
        alert = wait_for("VllmEndpointDown firing", firing, 120)
        fired_after = time.monotonic() - t0
        assert alert[0]["labels"]["job"] == "vllm"
        print(f"\nVllmEndpointDown fired {fired_after:.1f} s after the double stopped (for: 15s, 5 s intervals)")
    finally:
        node_sh(HEAD, "docker start sparkops-vllm")
        node_sh(HEAD, "docker start sparkops-watchdog >/dev/null")
        wait_for(
            "vLLM double back and scraped",
            lambda: [r for r in query('up{job="vllm"}') if r["value"][1] == "1"],
            240,
            every_s=5,
        )
    wait_for("VllmEndpointDown resolved", lambda: not firing(), 60)


GRAFANA_DIR = "/etc/grafana"
DASHBOARDS_DIR = "/var/lib/grafana/dashboards/sparkops"  # monitoring_grafana_dashboards_dir's default


def test_the_dashboard_is_provisioned_where_grafana_is_installed(sim_cluster):
    """Grafana's provisioning folder on the head only: the dashboard and both provisioning files land
    there, and nowhere else; a rerun changes nothing. sparkops does not install Grafana, so the test
    makes the folder a Grafana package would, and removes what it and the role made."""
    worker = NODES[1]
    made = [f"{GRAFANA_DIR}/provisioning/{kind}/sparkops.yml" for kind in ("dashboards", "datasources")]
    dashboard = f"{DASHBOARDS_DIR}/sparkops-dashboard.json"
    node_sh(HEAD, f"test ! -e {GRAFANA_DIR} && test ! -e /var/lib/grafana && mkdir -p {GRAFANA_DIR}/provisioning")
    try:
        first = run_playbook("playbooks/monitoring.yml", timeout=300)
        assert first.returncode == 0, failure(first)
        assert recap(first.stdout)[HEAD]["changed"] >= 1, first.stdout[-3000:]
        assert recap(first.stdout)[worker]["changed"] == 0, "the worker has no Grafana: nothing to provision"
        # Grafana's files are no other daemon's configuration: nothing else restarts for them (and no
        # grafana-server runs here to restart).
        handlers = [b for b in first.stdout.split("\n\n") if b.startswith("RUNNING HANDLER")]
        assert not [b for b in handlers if "changed:" in b], handlers

        shipped = json.loads(
            (ROOT / "roles" / "monitoring" / "files" / "grafana" / "sparkops-dashboard.json").read_text()
        )
        assert json.loads(node_sh(HEAD, f"cat {dashboard}").stdout) == shipped
        dashboards = yaml.safe_load(node_sh(HEAD, f"cat {made[0]}").stdout)
        assert dashboards["apiVersion"] == 1
        [provider] = dashboards["providers"]
        assert provider["type"] == "file" and provider["options"]["path"] == DASHBOARDS_DIR, provider
        datasources = yaml.safe_load(node_sh(HEAD, f"cat {made[1]}").stdout)
        [source] = datasources["datasources"]
        # Prometheus where it listens (the head's fast link).
        assert source["type"] == "prometheus" and source["url"] == PROM, source
        # The dashboard's panels use its `datasource` variable, which defaults to this data source.
        [variable] = [v for v in shipped["templating"]["list"] if v["type"] == "datasource"]
        assert variable["current"]["value"] == source["uid"] and variable["query"] == source["type"], variable
        modes = node_sh(HEAD, f"stat -c '%a %n' {dashboard} {' '.join(made)}").stdout.split("\n")
        assert all(line.startswith("644 ") for line in modes if line), modes
        assert node_sh(worker, f"test -e {GRAFANA_DIR} || test -e /var/lib/grafana", check=False).returncode != 0

        again = run_playbook("playbooks/monitoring.yml", timeout=300)
        assert again.returncode == 0, failure(again)
        assert {h: r["changed"] for h, r in recap(again.stdout).items()} == dict.fromkeys(NODES, 0), again.stdout[
            -3000:
        ]
    finally:
        node_sh(HEAD, f"rm -rf {GRAFANA_DIR} /var/lib/grafana", check=False)
