"""The client gateway on the simulated pair (issue 25, roles/gateway, docs/gateway.md).

site.yml with sparkops_gateway_enabled installs LiteLLM's proxy on the head from the test bed's package index (no
wheelhouse on the controller, as at a site that reaches PyPI; an unreachable index is refused before anything
changes), keys.yml makes a client key, the `openai` client
(in the gateway's own venv on the head: the nodes reach the gateway on the head's fast link) talks through it,
every path asks for a key, this machine (named a client network) reaches the gateway on the head's management
address while vLLM's chain lets no client network in, Prometheus scrapes the gateway with its own key and sees
the client's requests and tokens by key name, GatewayDown fires when the gateway stops, status lists every key's
usage (names only), a revoked key is refused within seconds, and a rerun changes nothing. At the end the pair
is put back without the gateway. Needs the simulated pair deployed (make test / make sim).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import HEAD_FAST, NODES, ROOT, SIM_STATE, WORKER_FAST, failure, node_sh, recap, run_playbook
from gateway_routes import ROUTES, SWEEP, client_paths, operations
from test_deployments import CHAT as CHAT_DEPLOYMENT
from test_deployments import CODE, EXTRA, completion, started_at
from test_faults_and_day2 import locked_copy, served_release
from test_monitoring import query, targets_by_job, wait_for

pytestmark = pytest.mark.usefixtures("sim_cluster")

GATEWAY = f"http://{HEAD_FAST}:4000"
HEAD_MGMT = "192.168.213.11"  # sim/simctl.py NODES[0]["mgmt"]
# This machine is 192.168.213.1 on the management bridge (sim/simctl.py NETWORKS; the Hub server listens there):
# named a client network, it reaches the gateway on the head's management address, and vLLM's port stays closed
# to it because the gateway is on.
CONTROLLER = "192.168.213.1"
ON = {"sparkops_gateway_enabled": True, "sparkops_client_networks": [f"{CONTROLLER}/32"]}
KEY_NAME = "itest-client"
BATCH_KEY = "itest-batch"
KEYS_DIR = SIM_STATE / "credentials" / "keys"
VENV_PY = "/opt/sparkops/gateway/bin/python"
# The gateway's venv (its LiteLLM's version) and service, as they are on the head.
GATEWAY_STATE = (
    f"{VENV_PY} -c 'import importlib.metadata as m; print(m.version(\"litellm\"))'; "
    "stat -c '%i %Y' /opt/sparkops/gateway/bin/python; pgrep -f '[/]opt/sparkops/gateway/bin/gunicorn' | sort"
)
UNGUARDED_IN_LITELLM = ["/", "/health/liveliness", "/openapi.json", "/ui/", "/metrics", "/v1/models", "/nope"]

PROBE = r"""
import json, sys, urllib.request, urllib.error
out = {}
for path, key in json.loads(sys.argv[1]):
    req = urllib.request.Request(sys.argv[2] + path)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            out[path + (" key" if key else "")] = r.status
    except urllib.error.HTTPError as e:
        out[path + (" key" if key else "")] = e.code
    except OSError:
        out[path + (" key" if key else "")] = None
print(json.dumps(out))
"""

CHAT = r"""
import sys
import openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key=open(sys.argv[2]).read().strip(), max_retries=0,
                       timeout=60)
models = [m.id for m in client.models.list().data]
reply = client.chat.completions.create(model=models[0], messages=[{"role": "user", "content": "hi"}], max_tokens=4)
print(models, reply.choices[0].message.content is not None, reply.usage.completion_tokens)
"""


def probe(node: str, calls: list[tuple[str, str | None]]) -> dict:
    script = f"python3 -c {shlex.quote(PROBE)} {shlex.quote(json.dumps(calls))} {GATEWAY}"
    return json.loads(node_sh(node, script, timeout=120).stdout)


def key_on_head(key: str) -> str:
    """The key in a root-only file on the head (never on a command line), its path returned."""
    path = "/root/.itest-gateway-key"
    node_sh(NODES[0], f"umask 077; cat > {path} <<'EOF'\n{key}\nEOF")
    return path


# ------------------------------------------------------------------ several deployments behind the gateway
# The profiles of test_deployments.py (the stand-in model for one GPU under its own served model names), and
# a new version of sim-chat for the upgrade: the same served model name, fewer sequences (a new command line).
TWO = {**ON, **EXTRA, "sparkops_deployments": [CHAT_DEPLOYMENT, CODE]}
V2 = {"sparkops_serving_profiles_extra": {**EXTRA["sparkops_serving_profiles_extra"], "sim-chat-v2": {
    **EXTRA["sparkops_serving_profiles_extra"]["sim-chat"], "max_num_seqs": 8}}}  # fmt: skip
REPLICAS = {**ON, **V2, "sparkops_deployments": [{**CHAT_DEPLOYMENT, "hosts": list(NODES)}]}
REPLICAS_V2 = {
    **REPLICAS,
    "sparkops_deployments": [{**CHAT_DEPLOYMENT, "profile": "sim-chat-v2", "hosts": list(NODES)}],
}
# An upgrade to a profile whose engine answers 200 OK but wrongly (the double's SPARKOPS_TEST_DOUBLE_ANSWERS=wrong,
# as a broken kernel would): the quality gate stops its first half before that half returns to the gateway.
REPLICAS_WRONG = {
    **REPLICAS,
    "sparkops_serving_profiles_extra": {
        **V2["sparkops_serving_profiles_extra"],
        "sim-chat-wrong": {
            **EXTRA["sparkops_serving_profiles_extra"]["sim-chat"], "max_num_seqs": 4,
            "env": {"SPARKOPS_TEST_DOUBLE_ANSWERS": "wrong"},
        },
    },
    "sparkops_deployments": [{**CHAT_DEPLOYMENT, "profile": "sim-chat-wrong", "hosts": list(NODES)}],
}  # fmt: skip


@pytest.fixture(scope="module")
def gateway():
    """The gateway's step of the transition chain (conftest.CHAIN): from the previous step's end (chat on the head,
    code on the worker) to the same two deployments behind the gateway in one site.yml. The chain's last step
    (test_transitions.py) takes the pair back to the reference and checks the gateway is gone."""
    index_log = SIM_STATE / "pypi" / "pypi.log"
    if not (SIM_STATE / "pypi" / "simple" / "litellm" / "index.html").exists() or not index_log.exists():
        pytest.fail(f"no test bed package index under {SIM_STATE / 'pypi'}: run `make sim-up` (it serves it)")
    assert not (SIM_STATE / "wheelhouse").exists(), "the test bed installs from its index, not a wheelhouse"
    # The install from the index is what this step proves: a venv left by an earlier run on a kept cluster goes
    # first (make test starts with none).
    node_sh(NODES[0], f"rm -rf {shlex.quote(str(Path(VENV_PY).parents[1]))}", check=False)
    logged = index_log.stat().st_size
    t0 = time.monotonic()
    first = run_playbook("site.yml", extra_vars=TWO, timeout=1800)
    assert first.returncode == 0, failure(first)
    print(f"\n[chain] chat + code -> chat + code behind the gateway: {time.monotonic() - t0:.0f} s")
    with index_log.open() as f:
        f.seek(logged)
        fetched = [line for line in f if line.startswith(f"{HEAD_MGMT} ") and '"GET ' in line]
    assert any("GET /simple/litellm/ " in line and '" 200 ' in line for line in fetched), fetched
    wheel = re.compile(r"GET /files/\S+/litellm-1\.108\.7-\S+\.whl HTTP/1\.1\" 200 ")
    assert any(wheel.search(line) for line in fetched), fetched
    yield first
    gone = {**TWO, "sparkops_key_name": KEY_NAME, "sparkops_key_state": "absent"}
    run_playbook("playbooks/keys.yml", extra_vars=gone)
    node_sh(NODES[0], "rm -f /root/.itest-gateway-key", check=False)


def test_a_key_is_made_once_kept_0600_and_printed_nowhere(gateway):
    made = run_playbook("playbooks/keys.yml", extra_vars={**TWO, "sparkops_key_name": KEY_NAME})
    assert made.returncode == 0, failure(made)
    key_file = KEYS_DIR / KEY_NAME
    key = key_file.read_text().strip()
    assert key.startswith("sk-sparkops-")
    assert (key_file.stat().st_mode & 0o777) == 0o600
    assert key not in made.stdout and key not in made.stderr
    again = run_playbook("playbooks/keys.yml", extra_vars={**TWO, "sparkops_key_name": KEY_NAME})
    assert again.returncode == 0 and recap(again.stdout)[NODES[0]]["changed"] == 0, again.stdout[-3000:]
    assert key_file.read_text().strip() == key
    listed = run_playbook("playbooks/keys.yml", extra_vars=TWO)
    # Ansible folds a long message: the listing is read with its whitespace joined.
    assert listed.returncode == 0 and f"{KEY_NAME}: active" in " ".join(listed.stdout.split()), listed.stdout[-3000:]
    assert key not in listed.stdout


def chat_stream(key: str, max_tokens: int, out: dict) -> None:
    """A streaming chat completion to the gateway on the head's management address (this machine is a client
    network): into `out`, the status, Retry-After, and the stream's data lines."""
    req = urllib.request.Request(
        f"http://{HEAD_MGMT}:4000/v1/chat/completions",
        data=json.dumps({"model": "sim-chat", "messages": [{"role": "user", "content": "count"}],
                         "max_tokens": max_tokens, "stream": True}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )  # fmt: skip
    out["lines"] = []
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            out["status"] = resp.status
            out["lines"] = [line.strip() for line in resp if line.startswith(b"data: ")]
    except urllib.error.HTTPError as err:
        out["status"], out["retry_after"] = err.code, err.headers.get("Retry-After")


def test_a_batch_stream_is_stopped_for_an_interactive_request_and_batch_waits_while_interactive_is_served(gateway):
    """Batch keys yield to interactive ones (docs/gateway.md, "Limits per key"), through the real LiteLLM."""
    made = run_playbook("playbooks/keys.yml", extra_vars={**TWO, "sparkops_key_name": BATCH_KEY,
                                                          "sparkops_key_class": "batch"})  # fmt: skip
    assert made.returncode == 0, failure(made)
    # Removed whatever happens: the health report's request names the first client key's file (a batch key would
    # be held back while interactive keys are served).
    try:
        batch_key = (KEYS_DIR / BATCH_KEY).read_text().strip()
        inter_key = (KEYS_DIR / KEY_NAME).read_text().strip()
        time.sleep(6)  # past the quiet time after this module's earlier interactive requests
        batch, inter, late = {}, {}, {}
        runner = threading.Thread(target=chat_stream, args=(batch_key, 200, batch))
        runner.start()
        time.sleep(1.5)  # the batch stream is sending
        chat_stream(inter_key, 8, inter)
        chat_stream(batch_key, 8, late)  # right after an interactive request: the quiet time
        runner.join(60)
        assert inter["status"] == 200 and inter["lines"][-1] == b"data: [DONE]", inter
        assert batch["status"] == 200 and len(batch["lines"]) > 3, batch
        stopped = json.loads(batch["lines"][-1].removeprefix(b"data: "))
        assert stopped["error"]["code"] == 429 and "stopped for an interactive request" in stopped["error"]["message"]
        assert len(batch["lines"]) < 100, "the batch stream ended long before its 200 tokens"
        assert late["status"] == 429 and late["retry_after"] in {"4", "5"}, late
    finally:
        run_playbook(
            "playbooks/keys.yml", extra_vars={**TWO, "sparkops_key_name": BATCH_KEY, "sparkops_key_state": "absent"}
        )


def test_an_install_the_head_cannot_fetch_is_refused_before_anything_changes(gateway):
    """A new LiteLLM pin (the venv must be installed again), no wheelhouse, and an index nobody answers at."""
    before = node_sh(NODES[0], GATEWAY_STATE).stdout
    res = run_playbook(
        "playbooks/gateway.yml",
        extra_vars={**TWO, "sparkops_gateway_litellm_version": "1.108.6",
                    "sparkops_gateway_index_url": f"http://nobody:s3cret@{CONTROLLER}:9/simple"},
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode != 0, failure(res)
    assert f"could not read http://{CONTROLLER}:9/simple/litellm/" in out and "Nothing was changed" in out, failure(res)
    assert "s3cret" not in out, "the index's credentials reached the output"
    assert recap(res.stdout)["spark-sim-1"]["changed"] == 0, failure(res)
    assert node_sh(NODES[0], GATEWAY_STATE).stdout == before


def test_a_bad_key_name_is_refused_and_changes_nothing(gateway):
    bad = run_playbook("playbooks/keys.yml", extra_vars={**TWO, "sparkops_key_name": "../evil"})
    assert bad.returncode != 0 and "sparkops_key_name must be" in bad.stdout, bad.stdout[-3000:]
    assert not (KEYS_DIR.parent / "evil").exists()


def test_the_openai_client_talks_through_the_gateway_from_the_head(gateway):
    key = (KEYS_DIR / KEY_NAME).read_text().strip()
    path = key_on_head(key)
    res = node_sh(NODES[0], f"{VENV_PY} -c {shlex.quote(CHAT)} {GATEWAY} {path}", check=False, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "sim-chat" in res.stdout and "sim-code" in res.stdout and "True" in res.stdout, res.stdout


PROM_KEY_FILE = "/etc/prometheus/sparkops-gateway.key"  # roles/monitoring monitoring_gateway_key_file


def counter(name: str, key: str) -> float:
    rows = query(f'{name}{{job="gateway",key="{key}"}}')
    return sum(float(r["value"][1]) for r in rows)


def gateway_targets_up() -> list[dict]:
    return [t for t in targets_by_job().get("gateway", []) if t["health"] == "up"]


def test_prometheus_scrapes_the_gateway_with_its_own_key_per_client_key(gateway):
    """After the completion above with KEY_NAME's key: the gateway job is up (Prometheus' key is accepted) and
    its per-key counters for KEY_NAME are above 0; the key is a file only Prometheus reads, named by path."""
    job = wait_for("the gateway's target up", gateway_targets_up, 60)
    assert [t["scrapeUrl"] for t in job] == [f"{GATEWAY}/metrics/"], job
    assert job[0]["labels"]["node"] == NODES[0]
    wait_for("KEY_NAME's requests in Prometheus", lambda: counter("sparkops_gateway_requests_total", KEY_NAME) > 0, 60)
    assert counter("sparkops_gateway_prompt_tokens_total", KEY_NAME) > 0
    assert counter("sparkops_gateway_completion_tokens_total", KEY_NAME) > 0
    # Prometheus' key: 0640 root:prometheus on the head, named in prometheus.yml by path, its value in no
    # configuration and in no playbook output.
    assert node_sh(NODES[0], f"stat -c '%a %U %G' {PROM_KEY_FILE}").stdout.split() == ["640", "root", "prometheus"]
    config = node_sh(NODES[0], "cat /etc/prometheus/prometheus.yml").stdout
    assert f"credentials_file: {PROM_KEY_FILE}" in config
    prom_key = node_sh(NODES[0], f"cat {PROM_KEY_FILE}").stdout.strip()
    assert prom_key.startswith("sk-sparkops-")
    assert prom_key not in config and prom_key not in gateway.stdout and prom_key not in gateway.stderr
    # grep reads the key from its file (-f): never on a command line, here either.
    leaked = node_sh(
        NODES[0],
        f"grep -rqF -f {PROM_KEY_FILE} /etc/prometheus/prometheus.yml /etc/default/prometheus /var/log/prometheus",
        check=False,
    )
    assert leaked.returncode == 1, "Prometheus' gateway key is in its configuration or log"
    assert not query('ALERTS{alertname="GatewayDown"}')


def test_gateway_down_fires_critical_and_clears(gateway):
    """The sim shortens every `for:` to 15 s (inventory/sim/group_vars/all/monitoring.yml)."""
    node_sh(NODES[0], "/etc/init.d/sparkops-gateway stop")
    try:
        firing = wait_for(
            "GatewayDown firing",
            lambda: query('ALERTS{alertname="GatewayDown",alertstate="firing"}'),
            90,
        )
        assert firing[0]["metric"]["severity"] == "critical" and firing[0]["metric"]["node"] == NODES[0], firing
    finally:
        node_sh(NODES[0], "/etc/init.d/sparkops-gateway start")
    wait_for("the gateway's target up again", gateway_targets_up, 120)
    wait_for("GatewayDown cleared", lambda: not query('ALERTS{alertname="GatewayDown",alertstate="firing"}'), 60)


def test_status_lists_every_key_s_name_and_usage_never_a_key(gateway):
    """status.yml's screen (its last task's debug, one string per line; the YAML callback may wrap them) has a keys
    section with KEY_NAME's usage from the database: at least the completion made above."""
    res = run_playbook("playbooks/status.yml", extra_vars=TWO, timeout=300)
    assert res.returncode == 0, failure(res)
    screen = " ".join(res.stdout.split("TASK [Show the status]")[-1].split())
    assert re.search(r"keys: \d+ \(names only; class and limits, then requests, prompt and completion", screen), screen
    # Its class and limit (no capacity sweep of chat yet: an interactive key has none), its usage, its refusals.
    mine = re.search(
        rf"{KEY_NAME}: active, interactive, no parallel limit, (\d+) requests, (\d+) prompt and (\d+) completion "
        r"tokens, 0 refused \(429\)",
        screen,
    )
    assert mine and all(int(n) >= 1 for n in mine.groups()), screen[-3000:]
    assert "sparkops-prometheus: active, " in screen
    assert f"gateway: http://{HEAD_MGMT}:4000/v1 (clients), {GATEWAY}/v1 (nodes)" in screen
    key = (KEYS_DIR / KEY_NAME).read_text().strip()
    assert key not in res.stdout and "sk-sparkops-" not in res.stdout


def test_every_path_asks_for_a_key_from_the_fast_link(gateway):
    key = (KEYS_DIR / KEY_NAME).read_text().strip()
    calls = [(p, None) for p in UNGUARDED_IN_LITELLM] + [(p, "sk-sparkops-wrong") for p in UNGUARDED_IN_LITELLM]
    got = probe(NODES[1], calls)
    assert got and all(status == 401 for status in got.values()), got
    assert probe(NODES[1], [("/v1/models", key)]) == {"/v1/models key": 200}


def test_every_route_of_the_installed_litellm_asks_a_key_and_a_client_key_gets_the_openai_routes_only(gateway):
    """The route sweep against the gateway site.yml installed on the head (the real LiteLLM 1.108.7, as users run
    it). The route list is the installed app's own, read by the gateway venv's Python; without a key every
    operation answers 401; with a client key every one answers 404 except the OpenAI routes the gateway is for,
    which neither refuse the key nor are missing."""
    role_env = yaml.safe_load((ROOT / "roles" / "gateway" / "vars" / "main.yml").read_text())["gateway_environment"]
    env = {
        k: str(role_env[k]) for k in ("DISABLE_ADMIN_UI", "LITELLM_TELEMETRY_DISABLED", "LITELLM_LOCAL_MODEL_COST_MAP")
    }
    env_words = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    routes = node_sh(
        NODES[0],
        # A master key nobody is given (LiteLLM will not import its app without one); nothing else of the service's.
        "master=sk-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n'); "
        f"env -i PATH=/usr/bin:/bin {env_words} LITELLM_MASTER_KEY=$master {VENV_PY} -c {shlex.quote(ROUTES)}",
        timeout=300,
    )
    ops = operations(json.loads(routes.stdout.strip().splitlines()[-1]))
    assert len(ops) > 500, len(ops)  # 966 operations in litellm 1.108.7
    node_sh(NODES[0], f"cat > /root/.itest-routes.json <<'EOF'\n{json.dumps(ops)}\nEOF")
    key_file = key_on_head((KEYS_DIR / KEY_NAME).read_text().strip())

    def sweep(key_path: str) -> dict:
        cmd = f"python3 -c {shlex.quote(SWEEP)} {GATEWAY} /root/.itest-routes.json {shlex.quote(key_path)}"
        return json.loads(node_sh(NODES[0], cmd, timeout=600).stdout.strip().splitlines()[-1])

    keyless = sweep("")
    assert len(keyless) == len(ops)
    assert {op: status for op, status in keyless.items() if status != 401} == {}
    allowed = client_paths()
    client = sweep(key_file)
    leaked = {op: status for op, status in client.items() if status != 404 and op.split(" ", 1)[1] not in allowed}
    assert leaked == {}
    served = {op: status for op, status in client.items() if op.split(" ", 1)[1] in allowed}
    assert served and all(status not in (401, 404) for status in served.values()), served
    print(
        f"\ngateway route sweep: {len(ops)} operations, 401 without a key; a client key: {len(served)} served, "
        f"{sum(s == 404 for s in client.values())} answered 404"
    )


def get(url: str, key: str | None) -> int | None:
    """GET from this machine, never through a proxy the environment names."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with opener.open(req, timeout=5) as res:
            return res.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


def test_a_client_network_reaches_the_gateway_on_the_management_address(gateway):
    key = (KEYS_DIR / KEY_NAME).read_text().strip()
    assert get(f"http://{HEAD_MGMT}:4000/v1/models", key) == 200
    assert get(f"http://{HEAD_MGMT}:4000/v1/models", None) == 401


def test_vllm_is_kept_from_the_client_networks_while_the_gateway_is_on(gateway):
    gateway_rules = node_sh(NODES[0], "iptables -S SPARKOPS-GATEWAY").stdout
    assert f"-s {CONTROLLER}/32" in gateway_rules, gateway_rules
    vllm_rules = node_sh(NODES[0], "iptables -S SPARKOPS-API").stdout
    assert "-s " not in vllm_rules, vllm_rules  # loopback and the fast links only


def test_a_rerun_changes_nothing(gateway):
    again = run_playbook("site.yml", extra_vars=TWO, timeout=1800)
    assert again.returncode == 0, failure(again)
    counts = recap(again.stdout)
    assert set(counts) == set(NODES) and all(c["changed"] == 0 for c in counts.values()), counts


def test_the_health_report_and_sim_info_name_the_gateway_and_their_curl_works_with_a_client_key(gateway):
    """With the gateway on, the report (written by the rerun above, once a client key exists) and `make sim-info`
    name the gateway's endpoint on the management address and a ready request with a client key's file, which
    answers from this machine (in sparkops_client_networks); vLLM's own endpoint is named as behind it."""
    from test_day2_playbooks import make  # noqa: PLC0415 - the Makefile helper, where that file has it

    report = (SIM_STATE / "reports" / "health.md").read_text()
    assert f"| endpoint | `http://{HEAD_MGMT}:4000/v1` (the gateway" in report, report[:1500]
    assert f"| vLLM (behind the gateway) | `http://{HEAD_FAST}:8000/v1`" in report
    info = make("sim-info")
    assert info.returncode == 0, info.stdout + info.stderr
    assert f"endpoint: `http://{HEAD_MGMT}:4000/v1`" in info.stdout, info.stdout
    curls = [line.strip() for line in info.stdout.splitlines() if line.strip().startswith("curl -sS ")]
    assert len(curls) == 1 and f"http://{HEAD_MGMT}:4000/v1/" in curls[0] and "/keys/" in curls[0], info.stdout
    key_file = re.search(r"\$\(cat (\S+)\)", curls[0]).group(1)
    assert Path(key_file).parent == KEYS_DIR.resolve()
    assert Path(key_file).read_text().strip() not in info.stdout + report  # the file is named, never the key
    out = subprocess.run(["bash", "-c", curls[0]], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["choices"][0]["message"]["content"], out.stdout


def test_a_revoked_key_is_refused_within_seconds(gateway):
    key = (KEYS_DIR / KEY_NAME).read_text().strip()
    assert probe(NODES[1], [("/v1/models", key)]) == {"/v1/models key": 200}
    revoked = run_playbook(
        "playbooks/keys.yml", extra_vars={**TWO, "sparkops_key_name": KEY_NAME, "sparkops_key_state": "absent"}
    )
    assert revoked.returncode == 0, failure(revoked)
    done = time.monotonic()
    assert not (KEYS_DIR / KEY_NAME).exists()
    status = None
    for _ in range(10):  # the gateway's cache holds an answer 2 s (files/sparkops_gateway_auth.py CACHE_S)
        status = probe(NODES[1], [("/v1/models", key)])["/v1/models key"]
        if status == 401:
            break
        time.sleep(0.5)
    assert status == 401, status
    assert time.monotonic() - done < 10


STREAMER = r"""
import json, os, sys, threading, time
import openai
url, key_path, seconds, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
stop = out + ".stop"
client = openai.OpenAI(base_url=url + "/v1", api_key=open(key_path).read().strip(), max_retries=0, timeout=60)
model = client.models.list().data[0].id
done, failed, lock = [0], [], threading.Lock()
end = time.monotonic() + seconds
def loop():
    while time.monotonic() < end and not os.path.exists(stop):
        try:
            chunks = list(client.chat.completions.create(model=model, stream=True, max_tokens=32,
                                                         messages=[{"role": "user", "content": "count"}]))
            assert chunks, "an empty stream"
            with lock:
                done[0] += 1
        except Exception as exc:
            with lock:
                failed.append(f"{time.strftime('%H:%M:%S')} {type(exc).__name__}: {exc}"[:300])
threads = [threading.Thread(target=loop) for _ in range(4)]
[t.start() for t in threads]
[t.join(seconds + 120) for t in threads]
json.dump({"done": done[0], "failed": failed}, open(out, "w"))
"""


def workers_on_head() -> list[str]:
    """gunicorn's workers: the children of the pid in its pidfile (read as the reload reads them)."""
    script = (
        "import gateway_reload as g; "
        "print(*[p for p, _s in g.children(int(open('/run/sparkops-gateway/gunicorn.pid').read()))])"
    )
    res = node_sh(NODES[0], f"PYTHONPATH=/opt/sparkops/gateway/lib/sparkops python3 -c {shlex.quote(script)}")
    return res.stdout.split()


def test_a_config_change_is_applied_with_no_failed_client_request(gateway):
    """Clients stream through the gateway while its configuration changes twice, once by the init script's
    `reload` and once by the role (gateway_reload): a new worker, the old one retired, no request fails."""
    if not (KEYS_DIR / KEY_NAME).exists():
        made = run_playbook("playbooks/keys.yml", extra_vars={**TWO, "sparkops_key_name": KEY_NAME})
        assert made.returncode == 0, failure(made)
    path = key_on_head((KEYS_DIR / KEY_NAME).read_text().strip())
    [first] = workers_on_head()
    out = "/root/.itest-streams.json"
    # The clients stream until told to stop (at most 300 s), from before the first reload until after the second.
    node_sh(NODES[0], f"rm -f {out} {out}.stop; nohup {VENV_PY} -c {shlex.quote(STREAMER)} {GATEWAY} {path} 300 {out} "
            ">/root/.itest-streams.log 2>&1 &")  # fmt: skip
    time.sleep(5)
    # Any byte changes the digest: the service's reload starts a worker with it and retires the old one.
    node_sh(NODES[0], "echo '# itest reload' >> /etc/sparkops/gateway/config.yaml")
    reload = node_sh(NODES[0], "/etc/init.d/sparkops-gateway reload", check=False, timeout=240)
    assert reload.returncode == 0, reload.stdout + reload.stderr
    switched = json.loads(reload.stdout.strip().splitlines()[-1])
    assert switched["changed"] and switched["old_pids"] == [int(first)], switched
    time.sleep(5)
    # The role writes its config back (the comment goes): a changed file, so the module reloads again.
    again = run_playbook("playbooks/gateway.yml", extra_vars=TWO, timeout=900)
    assert again.returncode == 0, failure(again)
    time.sleep(5)  # requests after the second switch, on the worker left
    node_sh(NODES[0], f"touch {out}.stop")
    for _ in range(150):  # each client ends its request in flight (a stream of 32 tokens), then writes the result
        if node_sh(NODES[0], f"test -s {out}", check=False).returncode == 0:
            break
        time.sleep(1)
    result = json.loads(node_sh(NODES[0], f"cat {out}").stdout)
    assert result["done"] > 20 and result["failed"] == [], result
    [last] = workers_on_head()
    assert last != first and int(last) != switched["new_pid"]  # two reloads, two new workers, one left


CLIENT = "itest-two"

BOTH = r"""
import json, sys
import openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key=open(sys.argv[2]).read().strip(), max_retries=0,
                       timeout=60)
out = {"models": sorted(m.id for m in client.models.list().data)}
for model in out["models"]:
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    out[model] = reply.model
print(json.dumps(out))
"""

# A client streaming chat completions through the gateway, one after another, until the stop file appears
# (bounded: 900 s, 20000 requests); every failure is counted with its error. No retry in the client: what
# the gateway lets through is what a client sees.
STREAM = r"""
import json, os, sys, time
import openai
url, key_file, stop, out = sys.argv[1:5]
client = openai.OpenAI(base_url=url + "/v1", api_key=open(key_file).read().strip(), max_retries=0, timeout=60)
ok, failed, errors, t0 = 0, 0, [], time.monotonic()
while not os.path.exists(stop) and time.monotonic() - t0 < 900 and ok + failed < 20000:
    try:
        stream = client.chat.completions.create(model="sim-chat", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=8, stream=True)
        chunks = sum(1 for c in stream if c.choices and c.choices[0].delta.content)
        if chunks:
            ok += 1
        else:
            failed += 1
            errors.append("a stream without content")
    except Exception as e:
        failed += 1
        errors.append(f"{time.monotonic() - t0:.1f}s {type(e).__name__}: {str(e)[:200]}")
    with open(out + ".tmp", "w") as f:
        json.dump({"ok": ok, "failed": failed, "errors": errors[-20:], "s": time.monotonic() - t0}, f)
    os.replace(out + ".tmp", out)
"""


def client_key() -> str:
    made = run_playbook("playbooks/keys.yml", extra_vars={**ON, "sparkops_key_name": CLIENT})
    assert made.returncode == 0, failure(made)
    return key_on_head((KEYS_DIR / CLIENT).read_text().strip())


def vllm_cmd(node: str) -> list[str]:
    res = node_sh(node, "docker inspect --format '{{json .Config.Cmd}}' sparkops-vllm", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else []


def test_two_deployments_answer_through_one_endpoint_with_a_client_key(gateway):
    path = client_key()
    both = node_sh(NODES[0], f"{VENV_PY} -c {shlex.quote(BOTH)} {GATEWAY} {path}", check=False, timeout=180)
    assert both.returncode == 0, both.stdout + both.stderr
    got = json.loads(both.stdout)
    assert got["models"] == ["sim-chat", "sim-code"], got
    assert got["sim-chat"] and got["sim-code"], got
    # Without a key, no path serves a completion (the gateway asks on every path; vLLM's port is closed to clients).
    for path_ in ("/v1/chat/completions", "/v1/completions", "/chat/completions", "/v1/responses"):
        assert probe(NODES[1], [(path_, None)])[path_] == 401, path_


def test_a_killed_replica_is_ejected_and_the_other_serves(gateway):
    """chat on both nodes: two replicas behind the gateway (the chain's step from two deployments to two
    replicas of one model, one site.yml). The code deployment it removes leaves chat's replica on the head serving,
    not restarted. The worker's vLLM killed, every request of a client that never retries still gets its answer:
    the gateway cools the dead replica down and sends to the other."""
    chat_started = started_at(NODES[0])
    t0 = time.monotonic()
    res = run_playbook("site.yml", extra_vars=REPLICAS, timeout=1800)
    assert res.returncode == 0, failure(res)
    print(f"\n[chain] chat + code -> two replicas of chat: {time.monotonic() - t0:.0f} s")
    assert vllm_cmd(NODES[1]) and vllm_cmd(NODES[0]), "chat should run on both nodes"
    labels = json.loads(node_sh(NODES[1], "docker inspect --format '{{json .Config.Labels}}' sparkops-vllm").stdout)
    assert labels["io.sparkops.deployment"] == "chat", "the removed code deployment's vLLM is still on the worker"
    assert started_at(NODES[0]) == chat_started, "removing code restarted chat's replica on the head"
    assert completion(HEAD_FAST, "sim-chat") == 200
    path = client_key()
    node_sh(NODES[1], "docker stop -t 1 sparkops-watchdog; docker kill sparkops-vllm")
    try:
        script = STREAM.replace("time.monotonic() - t0 < 900", "time.monotonic() - t0 < 20")
        res = node_sh(
            NODES[0],
            f"rm -f /root/eject.json; {VENV_PY} -c {shlex.quote(script)} {GATEWAY} {path} /nonexistent /root/eject.json"
            " && cat /root/eject.json",
            check=False,
            timeout=120,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        got = json.loads(res.stdout)
        print(f"\n[gateway] worker's replica killed: {got['ok']} answers, {got['failed']} failed in {got['s']:.0f} s")
        assert got["ok"] >= 10 and got["failed"] == 0, got
    finally:
        node_sh(NODES[1], "docker start sparkops-vllm sparkops-watchdog", check=False)


def test_a_blue_green_upgrade_of_one_deployment_fails_no_request_of_a_streaming_client(gateway, tmp_path):
    """Two upgrades of chat's two replicas while a client streams through the gateway: one whose engine answers
    wrongly (refused, rolled back), then a new profile that also moves the stack to vLLM 0.33.0 (blue-green, half
    by half, under a copy of the lock: the chain's way back in test_transitions.py moves it back to the inventory's
    stack). The client sees no failed request in either."""
    # The worker's replica, started again by the previous test, answers before the upgrade begins.
    deadline = time.monotonic() + 120
    while completion(WORKER_FAST, "sim-chat") != 200:
        assert time.monotonic() < deadline, "the worker's chat replica did not answer again within 120 s"
        time.sleep(1)
    path = client_key()
    node_sh(NODES[0], "rm -f /root/stream.stop /root/stream.json")
    node_sh(
        NODES[0],
        f"nohup {VENV_PY} -c {shlex.quote(STREAM)} {GATEWAY} {path} /root/stream.stop /root/stream.json"
        " >/root/stream.log 2>&1 &",
    )
    before = {node: vllm_cmd(node) for node in NODES}
    lock = locked_copy(tmp_path)
    moved = {**REPLICAS_V2, "sparkops_stack": "vllm-0.33.0", "sparkops_lock_file": str(lock)}
    try:
        # First an upgrade whose new engine answers wrongly: refused by the quality gate on its first half,
        # which never returns to the gateway, and rolled back; the client keeps streaming through it all.
        t0 = time.monotonic()
        wrong = run_playbook(
            "playbooks/upgrade.yml", extra_vars={**REPLICAS_WRONG, "sparkops_deployment": "chat"}, timeout=1800
        )
        refused_in = time.monotonic() - t0
        after_wrong = {node: vllm_cmd(node) for node in NODES}
        t0 = time.monotonic()
        up = run_playbook("playbooks/upgrade.yml", extra_vars={**moved, "sparkops_deployment": "chat"}, timeout=1800)
        took = time.monotonic() - t0
    finally:
        node_sh(NODES[0], "touch /root/stream.stop; sleep 3; cat /root/stream.log", check=False)
    got = json.loads(node_sh(NODES[0], "cat /root/stream.json").stdout)
    wrong_out = " ".join(wrong.stdout.split())
    assert wrong.returncode != 0, wrong_out[-4000:]
    assert "answers wrongly" in wrong_out and "was rolled back" in wrong_out, wrong_out[-4000:]
    assert after_wrong == before  # the previous vLLM serves again on both nodes
    print(f"\n[gateway] an upgrade answering wrongly: refused by the quality gate, rolled back in {refused_in:.0f} s")
    out = " ".join(up.stdout.split())
    assert up.returncode == 0, failure(up)
    switches = re.search(r"gateway switches took ([0-9., s]+) s", out)
    print(
        f"\n[gateway] blue-green upgrade of chat (2 replicas) to vllm-0.33.0: {took:.0f} s; the client: "
        f"{got['ok']} streams, {got['failed']} failed; switches: {switches.group(1) if switches else '?'} s (2 cores)"
    )
    assert "blue-green" in out, out[-3000:]
    assert "stack vllm-0.19.0 -> vllm-0.33.0" in out.replace('\\"', '"'), out[-3000:]
    assert got["failed"] == 0, got
    assert got["ok"] >= 20, got
    for node in NODES:
        cmd = vllm_cmd(node)
        assert cmd[cmd.index("--max-num-seqs") + 1] == "8", (node, cmd)
        assert served_release(node) == "0.33.0", node
    locked = json.loads(lock.read_text())
    assert locked["model"]["profile"] == "sim-chat-v2" and locked["model"]["deployment"] == "chat", locked["model"]
    assert locked["stack"] == "vllm-0.33.0", locked
    again = run_playbook("site.yml", extra_vars=moved, timeout=1800)
    assert again.returncode == 0, failure(again)
    counts = recap(again.stdout)
    assert all(c["changed"] == 0 for c in counts.values()), counts
