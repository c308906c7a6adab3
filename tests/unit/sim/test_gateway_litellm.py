"""The real LiteLLM proxy as the gateway, on loopback, against a real PostgreSQL and three vLLM test doubles.

Skipped unless the interpreter running pytest has litellm[proxy] (the pinned 1.108.7), openai and psycopg, and
PostgreSQL's server binaries are installed (Debian's postgresql-15): run it from the gateway venv
(docs/gateway.md: `.venv-gw/bin/pytest tests/unit/sim/test_gateway_litellm.py`). What it proves (issue 25): a key
from the store is served; without a key every path of the app is refused (the route list is the app's own); a
revoked key is refused within seconds with no restart; /v1/models lists both served models; with one of two
replicas killed requests still succeed; per-key requests and tokens are on /metrics (behind the key). And the
per-key limits: a key at its max_parallel_requests is answered 429 with Retry-After at once, never queued, while
another key is served.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from double_fixtures import MODEL, free_port, tiny_hf_home
from gateway_routes import ROUTES, client_paths, operations

openai = pytest.importorskip("openai")
psycopg = pytest.importorskip("psycopg")
if importlib.util.find_spec("litellm") is None:  # not imported here: its import alone fetches a cost map
    pytest.skip("litellm[proxy] is not installed here (docs/gateway.md: the gateway venv)", allow_module_level=True)
PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)), None)
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(PG_BIN is None, reason="PostgreSQL's server (Debian postgresql) is not installed"),
]

sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))
import gateway_keys  # noqa: E402 - the same file the gateway imports
from ansible_collections.sparkops.cluster.plugins.plugin_utils import gateway  # noqa: E402

DOUBLE = ROOT / "sim" / "standin" / "vllm_test_double.py"
VLLM_AUTH = ROOT / "roles" / "vllm_serve" / "files"
GW_FILES = ROOT / "roles" / "gateway" / "files"
VLLM_KEY = "sk-vllm-backend-0123456789"
FIGURES = {}


def _wait_port(proc, port: int, seconds: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if proc.poll() is not None:
            return -1.0
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return time.monotonic() - start
        except OSError:
            time.sleep(0.1)
    return -1.0


def _start(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    # Output to a file, not a pipe: nobody reads a pipe while the tests run, and a full one blocks the server.
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc, log: Path) -> str:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
    return log.read_text(errors="replace")[-4000:]


def _as_pg(argv: list[str]) -> list[str]:
    # initdb refuses root: as root (CI containers), run PostgreSQL as Debian's postgres user.
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture(scope="module")
def pg():
    # Not under pytest's tmp folder: that is 0700 root's, which the postgres user cannot traverse.
    folder = Path(tempfile.mkdtemp(prefix="sparkops-gw-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    data, port = folder / "data", free_port()
    bindir = PG_BIN.parent
    subprocess.run(
        _as_pg([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "gw"]), check=True, capture_output=True
    )
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {folder}"
    subprocess.run(
        _as_pg([str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(folder / "log"), "-w", "start"]),
        check=True,
        capture_output=True,
        timeout=60,
    )
    conninfo = f"host=127.0.0.1 port={port} user=gw dbname=postgres"
    with psycopg.connect(conninfo) as conn:
        gateway_keys.ensure_schema(conn)
    yield conninfo
    subprocess.run(
        _as_pg([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"]), check=False, capture_output=True
    )
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def db(pg):
    with psycopg.connect(pg) as conn:
        yield conn


@pytest.fixture(scope="module")
def doubles(tmp_path_factory):
    """Model `tiny` on two replicas, `tiny-b` on one: each a double with sparkops' vLLM key middleware."""
    hf_home = tiny_hf_home(tmp_path_factory.mktemp("hf"))
    key_file = tmp_path_factory.mktemp("vllm-auth") / "api_key"
    key_file.write_text(VLLM_KEY + "\n")
    procs = {}
    for ident, served in (("a-0", "tiny"), ("a-1", "tiny"), ("b-0", "tiny-b")):
        port = free_port()
        env = dict(os.environ, HF_HOME=str(hf_home), SPARKOPS_TEST_DOUBLE_TOK_S="500", PYTHONUNBUFFERED="1")
        env.update(PYTHONPATH=str(VLLM_AUTH), SPARKOPS_API_KEY_FILE=str(key_file))
        argv = ["serve", MODEL, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", served]
        argv += ["--middleware", "sparkops_vllm_auth.RequireApiKey"]
        log = key_file.parent / f"double-{ident}.log"
        procs[ident] = (_start([sys.executable, str(DOUBLE), *argv], env, log), port, log)
    for ident, (proc, port, log) in procs.items():
        assert _wait_port(proc, port, 60) >= 0, f"double {ident} did not listen: {_stop(proc, log)}"
    yield procs
    for proc, _port, log in procs.values():
        _stop(proc, log)


def _plan(doubles) -> dict:
    """A serving plan's shape (plugins/plugin_utils/serving.py) with `replicas` for deployment `a`."""

    def url(ident):
        return f"http://127.0.0.1:{doubles[ident][1]}"

    return {
        "deployments": [
            {
                "name": "a",
                "served_model_name": "tiny",
                "api_host": "h0",
                "endpoint": {"url": url("a-0")},
                "replicas": [
                    {"head": "h0", "endpoint": {"url": url("a-0")}},
                    {"head": "h1", "endpoint": {"url": url("a-1")}},
                ],
            },
            {"name": "b", "served_model_name": "tiny-b", "api_host": "h2", "endpoint": {"url": url("b-0")}},
        ]
    }


# The service's environment as the role writes it, where it is not a path of the head's (roles/gateway/vars/main.yml
# gateway_environment): the admin UI's and telemetry's switches, and Prometheus' key name for /metrics.
_ROLE_ENV = yaml.safe_load((ROOT / "roles" / "gateway" / "vars" / "main.yml").read_text())["gateway_environment"]
ROLE_ENV = {k: _ROLE_ENV[k] for k in ("DISABLE_ADMIN_UI", "LITELLM_TELEMETRY_DISABLED")}
ROLE_ENV["SPARKOPS_GATEWAY_METRICS_KEYS"] = PROMETHEUS = "sparkops-prometheus"


@pytest.fixture(scope="module")
def app_routes(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LITELLM", "DATABASE_URL", "OPENAI"))}
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_MASTER_KEY="sk-" + os.urandom(16).hex(), **ROLE_ENV)
    out = subprocess.run(
        [sys.executable, "-c", ROUTES], env=env, capture_output=True, text=True, timeout=240, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def gw(pg, doubles, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gw")
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(gateway.litellm_config(_plan(doubles), router={"cooldown_time": 60})))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LITELLM", "DATABASE_URL", "OPENAI"))}
    env.update(
        CONFIG_FILE_PATH=str(config),
        SPARKOPS_GATEWAY_DB=pg,
        SPARKOPS_VLLM_API_KEY=VLLM_KEY,
        # A master key nobody is given: LiteLLM refuses to start without one
        # (litellm/proxy/auth/master_key_boot_check.py:120-132); the custom auth runs first and refuses it.
        LITELLM_MASTER_KEY="sk-" + os.urandom(32).hex(),
        LITELLM_LOCAL_MODEL_COST_MAP="True",  # no fetch from GitHub at start (get_model_cost_map.py:392)
        PYTHONPATH=f"{GW_FILES}{os.pathsep}{ROOT / 'plugins' / 'module_utils'}",
        PYTHONUNBUFFERED="1",
    )
    env.update(ROLE_ENV)
    argv = [sys.executable, "-m", "uvicorn", "sparkops_gateway_auth:app", "--host", "127.0.0.1", "--port", str(port)]
    log = folder / "gateway.log"
    proc = _start(argv, env, log)
    started = _wait_port(proc, port, 240)
    assert started >= 0, _stop(proc, log)
    FIGURES["start_s"] = round(started, 1)
    FIGURES["rss_mib"] = int(Path(f"/proc/{proc.pid}/status").read_text().split("VmRSS:")[1].split()[0]) // 1024
    print(f"\ngateway figures: {FIGURES}")
    yield port, proc
    text = _stop(proc, log)
    assert "sk-sparkops-" not in text  # no client key in the gateway's log


def _key(db, name: str) -> str:
    key = gateway_keys.create(db, name)
    assert key is not None
    return key


def _metrics_key(db) -> str:
    """Prometheus' key (one per run of the module: made again after a revoke)."""
    gateway_keys.revoke(db, PROMETHEUS)
    return _key(db, PROMETHEUS)


def _client(port: int, key: str):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=30)


def _status(port: int, method: str, path: str, key: str | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request(method, path, body=b"{}" if method != "GET" else None, headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


def test_a_key_from_the_store_is_served_on_both_models(gw, db):
    port, _proc = gw
    client = _client(port, _key(db, "alice"))
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi there"}], max_tokens=3
    )
    assert len(chat.choices[0].message.content.split()) == 3 and chat.usage.completion_tokens == 3
    text = client.completions.create(model="tiny-b", prompt="one two", max_tokens=2)
    assert text.usage.completion_tokens == 2 and text.usage.prompt_tokens == 2


def test_models_lists_both_served_models(gw, db):
    port, _proc = gw
    key = gateway_keys.create(db, "lister") or pytest.fail("key not made")
    assert sorted(m.id for m in _client(port, key).models.list()) == ["tiny", "tiny-b"]


def test_without_a_key_every_path_of_the_app_is_refused(gw, db, app_routes):
    """Every route the app has (its own OpenAPI and route table) plus the hidden and unknown ones: 401."""
    port, _proc = gw
    key = gateway_keys.create(db, "prober") or pytest.fail("key not made")
    tried = operations(app_routes)
    assert len(tried) > 500  # the proxy's many routes (966 operations in litellm 1.108.7)
    for bad_key in (None, "sk-sparkops-not-a-key", gateway_keys.digest(key)):
        answered = {(m, p): _status(port, m, p, bad_key) for m, p in tried[:: 1 if bad_key is None else 25]}
        assert {k: v for k, v in answered.items() if v != 401} == {}
    FIGURES["paths_refused"] = len(tried)


def test_a_client_key_reaches_the_openai_routes_only(gw, db, app_routes):
    """The route sweep with an active client key: every operation of the app, and the hidden paths, answer 404
    except the OpenAI routes the gateway is for (before, 100 of 966 answered 2xx: /model/info, /routes,
    /settings, /debug/asyncio-tasks, /ui/, /health, /metrics, ...). /metrics is Prometheus' key's alone."""
    port, _proc = gw
    key = _key(db, "sweeper")
    prometheus = _metrics_key(db)
    allowed = client_paths()
    assert allowed <= set(app_routes)  # each allowed path is one of the app's real routes
    assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models"} <= allowed
    tried = operations(app_routes)
    answered = {(m, p): _status(port, m, p, key) for m, p in tried}
    leaked = {k: v for k, v in answered.items() if v != 404 and k[1] not in allowed}
    assert leaked == {}
    served = {k: v for k, v in answered.items() if k[1] in allowed}
    assert served and all(v not in (401, 404) for v in served.values()), served
    FIGURES["paths_404_to_a_client"] = sum(v == 404 for v in answered.values())
    # /metrics: Prometheus' key only, and that key nothing else.
    assert _status(port, "GET", "/metrics/", key) == 404
    assert _status(port, "GET", "/metrics/", prometheus) == 200
    for m, p in [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/model/info"), ("GET", "/ui/")]:
        assert _status(port, m, p, prometheus) == 404, p


def test_a_revoked_key_is_refused_within_seconds_without_a_restart(gw, db):
    port, proc = gw
    key = _key(db, "bob")
    client = _client(port, key)
    assert [m.id for m in client.models.list()]
    assert gateway_keys.revoke(db, "bob") is True
    revoked_at = time.monotonic()
    while time.monotonic() - revoked_at < 10:
        try:
            client.models.list()
        except openai.AuthenticationError:
            break
        time.sleep(0.1)
    waited = time.monotonic() - revoked_at
    assert waited < 3.0, f"revoked key still served after {waited:.1f} s"
    FIGURES["revocation_s"] = round(waited, 2)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    assert proc.poll() is None
    assert gateway_keys.key_state(db, "bob") == "revoked" and gateway_keys.revoke(db, "bob") is False
    # A new key under the same name works; the old one stays refused.
    new = gateway_keys.create(db, "bob")
    assert new and new != key and gateway_keys.create(db, "bob") is None
    assert [m.id for m in _client(port, new).models.list()]
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_per_key_usage_is_on_metrics_behind_the_key_and_in_the_store(gw, db):
    port, _proc = gw
    key = _key(db, "carol")
    client = _client(port, key)
    for _ in range(3):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a b c"}], max_tokens=4)
    assert _status(port, "GET", "/metrics/") == 401
    assert _status(port, "GET", "/metrics/", key) == 404  # a client key sees no other client's usage
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics/", headers={"Authorization": f"Bearer {_metrics_key(db)}"})
    text = conn.getresponse().read().decode()
    conn.close()
    assert 'sparkops_gateway_requests_total{key="carol"} 3.0' in text
    assert 'sparkops_gateway_completion_tokens_total{key="carol"} 12.0' in text
    assert 'sparkops_gateway_prompt_tokens_total{key="carol"} 9.0' in text
    # LiteLLM's own metrics carry the name too (api_key_alias), never the key or its digest.
    assert 'api_key_alias="carol"' in text and key not in text and gateway_keys.digest(key) not in text
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the callback writes after the answer
        row = {u["name"]: u for u in gateway_keys.usage(db)}["carol"]
        if row["requests"] == 3:
            break
        time.sleep(0.2)
    assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (3, 9, 12)
    assert all("digest" not in u and "key" not in u for u in gateway_keys.usage(db))


def _post(port: int, key: str, body: dict) -> tuple[int, dict, bytes, float]:
    """One POST /v1/chat/completions, read to the end: status, headers (lower-case), body, seconds."""
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data, time.monotonic() - start


def test_a_key_at_its_parallel_limit_gets_429_with_retry_after_at_once_while_another_key_is_served(gw, db):
    """max_parallel_requests=1 stored with the key (gateway_keys.set_limits, what keys.yml writes): while one of its
    streams is running, its second request is refused at once with 429 and Retry-After (LiteLLM's limiter, fed
    by the hook's UserAPIKeyAuth), another key is served meanwhile, and once the stream ends the key is served
    again (its slot released)."""
    port, _proc = gw
    limited, other = _key(db, "batchy"), _key(db, "inter")
    assert gateway_keys.set_limits(db, "batchy", {"key_class": "batch", "max_parallel_requests": 1}) is True
    assert gateway_keys.set_limits(db, "inter", {"key_class": "interactive", "max_parallel_requests": 2}) is True
    assert gateway_keys.set_limits(db, "batchy", {"key_class": "batch", "max_parallel_requests": 1}) is False
    # ~4 s at the double's 500 tok/s: the slow stream the key holds.
    slow = {"model": "tiny-b", "messages": [{"role": "user", "content": "go"}], "max_tokens": 2000, "stream": True}
    quick = {"model": "tiny-b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    first_chunk, done = threading.Event(), {}

    def hold():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(slow).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {limited}"},
        )
        resp = conn.getresponse()
        done["status"] = resp.status
        resp.readline()
        first_chunk.set()
        done["body"] = resp.read()
        done["ended"] = time.monotonic()
        conn.close()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert first_chunk.wait(30), "the slow stream never started"
    status, headers, body, took = _post(port, limited, quick)
    refused_at = time.monotonic()
    assert status == 429, (status, body[:300])
    # LiteLLM's 60 s window, made the gateway's shorter wait for a concurrency slot (sparkops_gateway_auth.py).
    assert headers["retry-after"] == "2" and headers["rate_limit_type"] == "max_parallel_requests"
    assert b"max_parallel_requests" in body and b"sparkops-key:batchy" in body and limited.encode() not in body
    assert took < 1.5, f"the refusal took {took:.2f} s: queued, not refused"
    assert "ended" not in done  # refused while the first stream was still running
    status, _headers, body, _took = _post(port, other, quick)
    assert status == 200, body[:300]
    # The limits at work on /metrics (Prometheus' key) while the stream runs: one in flight, one refused.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics/", headers={"Authorization": f"Bearer {_metrics_key(db)}"})
    text = conn.getresponse().read().decode()
    conn.close()
    assert "ended" not in done
    assert 'sparkops_gateway_in_flight{key="batchy"} 1.0' in text
    assert 'sparkops_gateway_refused_total{key="batchy"} 1.0' in text
    assert 'sparkops_gateway_refused_total{key="inter"}' not in text
    holder.join(60)
    assert done["status"] == 200 and b"[DONE]" in done["body"] and done["ended"] > refused_at
    status, _headers, body, _took = _post(port, limited, quick)  # the slot came back with the stream's end
    assert status == 200, body[:300]
    rows = {u["name"]: u for u in gateway_keys.usage(db)}  # what status lists
    assert (rows["batchy"]["refused"], rows["inter"]["refused"]) == (1, 0)
    assert rows["batchy"]["key_class"] == "batch" and rows["batchy"]["max_parallel_requests"] == 1
    FIGURES["refusal_s"] = round(took, 3)


def test_with_one_replica_killed_requests_still_succeed(gw, db, doubles):
    port, _proc = gw
    client = _client(port, _key(db, "dave"))
    dead, dead_port, _log = doubles["a-1"]
    os.killpg(dead.pid, signal.SIGKILL)
    dead.wait(timeout=10)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", dead_port), timeout=1).close()
    times = []
    for _ in range(12):
        start = time.monotonic()
        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)
        times.append(time.monotonic() - start)
        assert chat.usage.completion_tokens == 2
    FIGURES["failover_worst_s"] = round(max(times), 2)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics/", headers={"Authorization": "Bearer " + _metrics_key(db)})
    text = conn.getresponse().read().decode()
    conn.close()
    # LiteLLM cooled the dead replica down: later requests are not even tried there.
    assert "litellm_deployment_cooled_down_total{" in text and 'model_id="a-1"' in text
    print(f"\ngateway figures: {FIGURES}")


def test_the_module_makes_and_revokes_keys_the_gateway_honours(gw, pg):
    """plugins/modules/gateway_key.py against the same database (needs ansible-core in this venv too)."""
    pytest.importorskip("ansible")
    from ansible_collections.sparkops.cluster.plugins.modules import gateway_key  # noqa: PLC0415
    from module_runner import run_module  # noqa: PLC0415

    port, _proc = gw
    args = {"name": "frank", "conninfo": pg}
    checked = run_module(gateway_key, args, check_mode=True)
    assert checked["changed"] and "key" not in checked and checked["state_after"] == "active"
    assert "frank" not in [k["name"] for k in checked["keys"]]
    made = run_module(gateway_key, args)
    assert made["changed"] and made["key"].startswith("sk-sparkops-") and made["state_before"] == "absent"
    assert [m.id for m in _client(port, made["key"]).models.list()]
    again = run_module(gateway_key, args)
    assert not again["changed"] and "key" not in again
    gone = run_module(gateway_key, {**args, "state": "absent"})
    assert gone["changed"] and gone["state_after"] == "revoked"
    assert {k["name"]: k["state"] for k in gone["keys"]}["frank"] == "revoked"
    assert all(
        set(k)
        == {"name", "state", "created", "revoked", "requests", "prompt_tokens", "completion_tokens"}
        | {"key_class", "max_parallel_requests", "tpm_limit", "refused"}
        for k in gone["keys"]
    )
    time.sleep(2.1)  # the hook caches an answer 2 s
    with pytest.raises(openai.AuthenticationError):
        _client(port, made["key"]).models.list()


def test_the_module_stores_a_key_s_class_and_limits_and_changes_them_in_place(gw, pg):
    """plugins/modules/gateway_key.py with `limits` (what keys.yml passes): stored with the key, what the hook
    reads; check mode predicts; a second run changes nothing; new limits change the row, not the key."""
    pytest.importorskip("ansible")
    from ansible_collections.sparkops.cluster.plugins.modules import gateway_key  # noqa: PLC0415
    from module_runner import run_module  # noqa: PLC0415

    port, _proc = gw
    batch = {"key_class": "batch", "max_parallel_requests": 1}
    args = {"name": "grace", "conninfo": pg, "limits": batch}
    checked = run_module(gateway_key, args, check_mode=True)
    assert checked["changed"] and checked["limits_before"] is None
    assert checked["limits_after"] == {**batch, "tpm_limit": None}
    made = run_module(gateway_key, args)
    assert made["changed"] and made["limits_after"] == {**batch, "tpm_limit": None}
    with psycopg.connect(pg) as conn:
        entry = gateway_keys.lookup_entry(conn, made["key"])
    assert entry == {"name": "grace", **batch, "tpm_limit": None}
    again = run_module(gateway_key, args)
    assert not again["changed"] and "key" not in again and again["msg"] == "grace: active, nothing to do"
    wider = {**args, "limits": {"key_class": "interactive", "max_parallel_requests": 3, "tpm_limit": 9000}}
    predicted = run_module(gateway_key, wider, check_mode=True)
    assert predicted["changed"] and predicted["msg"] == "would set the limits of grace"
    assert run_module(gateway_key, args)["changed"] is False  # check mode stored nothing
    widened = run_module(gateway_key, wider)
    assert widened["changed"] and "key" not in widened and widened["msg"] == "set the limits of grace"
    row = {k["name"]: k for k in widened["keys"]}["grace"]
    assert (row["key_class"], row["max_parallel_requests"], row["tpm_limit"]) == ("interactive", 3, 9000)
    assert [m.id for m in _client(port, made["key"]).models.list()]  # the same key still works
    bad = run_module(gateway_key, {**args, "limits": {"max_parallel_requests": 0}})
    assert bad.get("failed") and "key grace: max_parallel_requests must be a whole number >= 1" in bad["msg"]
    unknown = run_module(gateway_key, {**args, "limits": {"key_class": "gold"}})
    assert unknown.get("failed") and "gold" in unknown["msg"]
