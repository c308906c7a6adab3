"""The deployed endpoint serves nothing without the key, from the fast link or the management LAN (issue 23).

vLLM 0.19.0 asks --api-key only under /v1 and serves POST /invocations, /tokenize, ... without it; the
test double does the same (sim/standin/vllm_test_double.py ROUTES), so these pass only because of
sparkops' middleware and firewall. Needs the simulated pair deployed (make test / make sim).
"""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from conftest import ENDPOINT, HEAD_FAST, ROOT, api_key, node_sh, run_playbook

pytestmark = pytest.mark.usefixtures("sim_cluster")

BODY = {"model": "sim-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
GUARDED = [
    "/invocations",
    "/tokenize",
    "/detokenize",
    "/inference/v1/generate",
    "/scale_elastic_ep",
    "/is_scaling_elastic_ep",
    "/ping",
    "/load",
    "/version",
    "/v1/models",
    "/v1/chat/completions",
    "/pooling",
    "/nope",
]

PROBE = r"""
import json, sys, urllib.request, urllib.error
out = {}
timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 4
for method, url, key in json.loads(sys.argv[1]):
    body = json.dumps(%s).encode() if method == "POST" else None
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out[method + " " + url + (" key" if key else "")] = r.status
    except urllib.error.HTTPError as e:
        out[method + " " + url + (" key" if key else "")] = e.code
    except OSError:
        out[method + " " + url + (" key" if key else "")] = None
print(json.dumps(out))
""" % json.dumps(BODY)  # noqa: UP031 - the body literal goes into the script


def probe(node: str, calls: list[tuple[str, str, str | None]], timeout_s: float = 4) -> dict:
    script = f"python3 -c {shlex.quote(PROBE)} {shlex.quote(json.dumps(calls))} {timeout_s}"
    return json.loads(node_sh(node, script, timeout=200).stdout)


def head_mgmt() -> str:
    hosts = yaml.safe_load((ROOT / "inventory" / "sim" / "hosts.yml").read_text())
    return hosts["all"]["children"]["spark_cluster"]["children"]["spark_head"]["hosts"]["spark-sim-1"]["ansible_host"]


def test_every_path_asks_the_key_from_the_fast_link():
    calls = [(m, ENDPOINT + p, None) for p in GUARDED for m in ("GET", "POST")]
    calls += [("GET", ENDPOINT + "/health", None), ("GET", ENDPOINT + "/metrics", None)]
    calls += [("POST", ENDPOINT + "/invocations", api_key()), ("POST", ENDPOINT + "/tokenize", api_key())]
    got = probe("spark-sim-2", calls)
    for name, status in got.items():
        if name.endswith(" key") or name.endswith(("/health", "/metrics")):
            assert status == 200, (name, status)
        else:
            assert status == 401, (name, status)


def test_the_key_is_in_no_container_config_and_no_command_line():
    key = api_key()
    inspect = node_sh("spark-sim-1", "docker inspect sparkops-vllm").stdout
    assert key not in inspect and "VLLM_API_KEY" not in inspect
    assert "--middleware" in inspect and "/opt/sparkops-auth:ro" in inspect
    assert key not in node_sh("spark-sim-1", "ps -eo args").stdout
    mode = node_sh("spark-sim-1", "stat -c '%a %U' /etc/sparkops/vllm-auth /etc/sparkops/vllm-auth/api_key").stdout
    assert mode.split() == ["700", "root", "600", "root"], mode


def test_the_management_lan_is_dropped_even_with_a_route_to_the_fast_subnet():
    """A LAN host with a static route to the head's fast address via its management address: the packets arrive
    on the head's management interface and SPARKOPS-API / SPARKOPS-MONITORING drop them."""
    mgmt = head_mgmt()
    direct = probe("spark-sim-2", [("POST", f"http://{mgmt}:8000/invocations", None)], timeout_s=3)
    assert list(direct.values()) == [None], direct
    # The route sends everything of sim-2's to the head's fast address through the management LAN (Ray's
    # traffic too): kept to a few seconds (three probes of at most 2 s) so Ray's health checks do not notice.
    calls = [
        ("POST", f"http://{HEAD_FAST}:8000/invocations", None),
        ("GET", f"http://{HEAD_FAST}:9090/-/ready", None),
        ("GET", f"http://{HEAD_FAST}:9100/metrics", None),
    ]
    route = f"{HEAD_FAST}/32 via {mgmt}"
    node_sh("spark-sim-2", f"ip route replace {route}")
    try:
        got = probe("spark-sim-2", calls, timeout_s=2)
    finally:
        node_sh("spark-sim-2", f"ip route del {route}", check=False)
    assert all(status is None for status in got.values()), got  # no answer at all: dropped
    # and through the fast link, the same services answer (the firewall keeps them for the cluster)
    back = probe("spark-sim-2", [("GET", f"http://{HEAD_FAST}:9100/metrics", None)])
    assert list(back.values()) == [200], back


def test_doctor_sees_no_keyless_answer():
    res = run_playbook("playbooks/doctor.yml")
    report = json.loads((ROOT / ".sim" / "reports" / "doctor.json").read_text())
    exposure = [v for v in report["verdicts"] if v["check"] == "API exposure"]
    assert exposure and exposure[0]["verdict"] == "PASS", (exposure, res.stdout[-3000:])
