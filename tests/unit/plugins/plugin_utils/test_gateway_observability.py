"""The client gateway in monitoring and status (issue 25): Prometheus' scrape job with its key by file, only
while the gateway is on, and status' keys section (names and usage, never a key), only while it is on.

Renders the real templates (roles/monitoring/templates/prometheus.yml.j2, playbooks/templates/status.txt.j2)
with the serving plan's real gateway part (plugins/plugin_utils/serving.py plan_gateway)."""

from __future__ import annotations

import shutil
import subprocess
import urllib.parse

import pytest
from test_serving_plan import plan_of
from test_serving_targets import STATUS, _check, _prometheus_config, _report

KEY_FILE = "/etc/prometheus/sparkops-gateway.key"
SECRET = "sk-sparkops-" + "s" * 43


def _jobs(cluster, plan, **more) -> dict:
    return {j["job_name"]: j for j in _prometheus_config(cluster, plan, **more)["scrape_configs"]}


def _on(plan, key_file=KEY_FILE) -> dict:
    """What Prometheus' host has with the gateway on and installed (tasks/gateway.yml's fact)."""
    return {
        "sparkops_gateway_enabled": True,
        "monitoring_gateway_scraped": True,
        "monitoring_gateway_key_file": key_file,
        "monitoring_gateway_plan": plan["gateway"],
    }


def test_no_gateway_no_job_and_no_key_file_named():
    cluster, plan = plan_of()
    assert plan["gateway"]["enabled"] is False
    jobs = _jobs(cluster, plan)
    assert sorted(jobs) == ["node", "prometheus", "vllm"]
    assert "credentials_file" not in str(jobs) and "authorization" not in str(jobs)
    # Off, even where a fact from an earlier play said it was scraped.
    assert "gateway" not in _jobs(cluster, plan, monitoring_gateway_scraped=True)


def test_a_gateway_on_but_not_installed_yet_is_not_scraped():
    """tasks/gateway.yml sets monitoring_gateway_scraped on Prometheus' host; unset (no venv, no key) is false."""
    cluster, plan = plan_of(gateway_enabled=True)
    assert "gateway" not in _jobs(cluster, plan, sparkops_gateway_enabled=True)
    assert "gateway" not in _jobs(cluster, plan, sparkops_gateway_enabled=True, monitoring_gateway_scraped=False)


def test_the_gateway_job_scrapes_its_plan_address_with_the_key_by_file():
    cluster, plan = plan_of(gateway_enabled=True)
    gw = plan["gateway"]
    jobs = _jobs(cluster, plan, **_on(plan))
    job = jobs["gateway"]
    # Prometheus 2.x: authorization.credentials_file, read at every scrape (the key itself is nowhere here).
    assert job["authorization"] == {"type": "Bearer", "credentials_file": KEY_FILE}
    assert job["metrics_path"] == "/metrics/"  # where LiteLLM's exporter answers (not a redirect)
    [static] = job["static_configs"]
    # Bound to every address: the head's fast link (what the plan's url names), at the gateway's port.
    assert static["targets"] == [urllib.parse.urlsplit(gw["url"]).netloc]
    assert static["targets"] == [f"{cluster['nodes'][cluster['head']]['primary']['ip']}:{gw['port']}"]
    assert static["labels"] == {"node": cluster["head"]}


def test_a_gateway_bound_to_one_address_is_scraped_there():
    # The head's management address (a bind must be one of the head's addresses).
    cluster, plan = plan_of(gateway_enabled=True, gateway_bind="10.0.0.11", gateway_port=4100)
    jobs = _jobs(cluster, plan, **_on(plan))
    assert jobs["gateway"]["static_configs"][0]["targets"] == ["10.0.0.11:4100"]


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool (Debian's prometheus) not installed")
def test_prometheus_accepts_the_gateway_job(tmp_path):
    """promtool of Debian 12's Prometheus 2.42 (the role validates with --syntax-only); the full check also wants
    the credentials file to exist, which is why the role writes it before the configuration."""
    cluster, plan = plan_of(gateway_enabled=True)
    key = tmp_path / "key"
    cfg = tmp_path / "prometheus.yml"
    text = _prometheus_config(cluster, plan, **_on(plan, str(key)))
    import yaml  # noqa: PLC0415

    text["rule_files"] = []
    cfg.write_text(yaml.safe_dump(text))
    run = ["promtool", "check", "config"]
    assert subprocess.run([*run, "--syntax-only", str(cfg)], capture_output=True, check=False).returncode == 0
    missing = subprocess.run([*run, str(cfg)], capture_output=True, text=True, check=False)
    assert missing.returncode != 0 and "credentials" in missing.stdout + missing.stderr
    key.write_text(SECRET + "\n")
    full = subprocess.run([*run, str(cfg)], capture_output=True, text=True, check=False)
    assert full.returncode == 0, full.stdout + full.stderr


def _status(enabled, usage):
    cluster, plan = plan_of(gateway_enabled=enabled)
    return _report(
        STATUS, cluster, plan, [_check(plan["targets"][0])],
        sparkops_gateway_enabled=enabled, **({"gateway_keys_usage": usage} if usage else {}),
    ).splitlines(), plan  # fmt: skip


USAGE = {
    "changed": False,
    "keys": [
        {"name": "sparkops-prometheus", "state": "active", "created": "2026-11-25T10:00:00+00:00", "revoked": None,
         "requests": 0, "prompt_tokens": 0, "completion_tokens": 0,
         "key_class": "interactive", "max_parallel_requests": None, "tpm_limit": None, "refused": 0},
        {"name": "alice", "state": "active", "created": "2026-11-25T10:00:00+00:00", "revoked": None,
         "requests": 3, "prompt_tokens": 45, "completion_tokens": 120, "key": SECRET,
         "key_class": "interactive", "max_parallel_requests": 2, "tpm_limit": None, "refused": 0},
        {"name": "bob", "state": "revoked", "created": "2026-11-25T10:00:00+00:00",
         "revoked": "2026-11-25T11:00:00+00:00", "requests": 1, "prompt_tokens": 9, "completion_tokens": 2,
         "key_class": "batch", "max_parallel_requests": 1, "tpm_limit": 20000, "refused": 15},
    ],
}  # fmt: skip


def test_status_lists_every_key_s_name_state_and_usage_when_the_gateway_is_on():
    out, plan = _status(True, USAGE)
    start = out.index(
        "keys: 3 (names only; class and limits, then requests, prompt and completion tokens and refusals (429) "
        "since each was made)"
    )
    assert out[start + 1 : start + 4] == [
        "  alice: active, interactive, 2 parallel, 3 requests, 45 prompt and 120 completion tokens, 0 refused (429)",
        "  bob: revoked, batch, 1 parallel, 20000 tokens/min, 1 requests, 9 prompt and 2 completion tokens, "
        "15 refused (429)",
        "  sparkops-prometheus: active, interactive, no parallel limit, 0 requests, 0 prompt and 0 completion tokens, "
        "0 refused (429)",
    ]
    gw = plan["gateway"]
    assert f"gateway: {gw['client_url']}/v1 (clients), {gw['url']}/v1 (nodes)" in out
    assert SECRET not in "\n".join(out)


def test_status_says_when_the_keys_could_not_be_read():
    out, _plan = _status(True, {"failed": True, "msg": "cannot reach the key database (host=/var/run/postgresql)"})
    assert "keys: not read (cannot reach the key database (host=/var/run/postgresql))" in out
    out, _plan = _status(True, None)
    assert [line for line in out if line.startswith("keys: not read (no answer from the key database on ")]


def test_status_has_no_gateway_or_keys_line_when_the_gateway_is_off():
    out, _plan = _status(False, USAGE)
    assert not [line for line in out if line.startswith(("gateway", "keys"))], out
