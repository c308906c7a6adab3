"""The API key on every path: vLLM 0.19.0's gaps, reproduced by the test double, closed by the middleware.

vLLM 0.19.0 checks --api-key only on /v1 paths (vllm/entrypoints/openai/server_utils.py:80) and serves
POST /invocations, /tokenize, /inference/v1/generate, ... without it; the double registers the same
routes (ROUTES, cited there) with the same lack of a check. sparkops mounts
roles/vllm_serve/files/sparkops_vllm_auth.py and passes `--middleware sparkops_vllm_auth.RequireApiKey`,
which the double applies the way vLLM's build_app does. Everything runs on 127.0.0.1, one node, no Ray.
"""

from __future__ import annotations

import asyncio
import http.client
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from double_fixtures import MODEL, free_port, tiny_hf_home

DOUBLE = ROOT / "sim" / "standin" / "vllm_test_double.py"
AUTH_DIR = ROOT / "roles" / "vllm_serve" / "files"
MIDDLEWARE = "sparkops_vllm_auth.RequireApiKey"
KEY = "sk-file-key-0123456789"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3}
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    return tiny_hf_home(tmp_path_factory.mktemp("hf"))


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


os.environ["SPARKOPS_VLLM_AUTH_NO_STARTUP_CHECK"] = "1"  # imported here for its functions only
try:
    auth = _load("sparkops_vllm_auth_under_test", AUTH_DIR / "sparkops_vllm_auth.py")
finally:
    del os.environ["SPARKOPS_VLLM_AUTH_NO_STARTUP_CHECK"]
ROUTES = _load("vllm_test_double_routes", DOUBLE).ROUTES
# Paths that exist in vLLM only for pooling models or behind flags, and paths that exist nowhere:
# with the middleware they must be refused before routing as well.
OTHER_PATHS = ["/pooling", "/classify", "/score", "/rerank", "/v1/responses", "/nope", "/metrics/x", "/health/"]


def start(hf_home: Path, extra: list[str], key_file: Path | None):
    port = free_port()
    env = dict(os.environ, HF_HOME=str(hf_home), SPARKOPS_TEST_DOUBLE_TOK_S="200", PYTHONUNBUFFERED="1")
    env.pop("SPARKOPS_VLLM_AUTH_NO_STARTUP_CHECK", None)
    env.pop("VLLM_API_KEY", None)
    env["PYTHONPATH"] = str(AUTH_DIR)  # as the role's PYTHONPATH to the mounted folder
    if key_file is not None:
        env["SPARKOPS_API_KEY_FILE"] = str(key_file)
    argv = ["serve", MODEL, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny", *extra]
    proc = subprocess.Popen(
        [sys.executable, str(DOUBLE), *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc, None
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, port
        except OSError:
            time.sleep(0.1)
    stop(proc)
    pytest.fail("the double did not listen within 30 s")
    return None


def stop(proc) -> str:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=5)
    return out or ""


def call(port: int, method: str, path: str, body: dict | None = None, key: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


@pytest.fixture(scope="module")
def plain(hf_home):
    """The double as vLLM 0.19.0 runs with --api-key and no middleware (before this fix)."""
    proc, port = start(hf_home, ["--api-key", KEY], None)
    assert port, proc.stdout.read()
    yield port
    stop(proc)


@pytest.fixture(scope="module")
def guarded(hf_home, tmp_path_factory):
    """The double as sparkops runs it: no --api-key, the middleware, the key in a file."""
    folder = tmp_path_factory.mktemp("auth")
    key_file = folder / "api_key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    proc, port = start(hf_home, ["--middleware", MIDDLEWARE], key_file)
    assert port, proc.stdout.read()
    yield port, key_file
    stop(proc)


def test_without_the_middleware_vllm_serves_invocations_tokenize_and_generate_without_a_key(plain):
    """What vLLM 0.19.0 does (the finding): the double must not be kinder."""
    status, data = call(plain, "POST", "/invocations", CHAT)
    assert status == 200, data
    doc = json.loads(data)
    assert doc["object"] == "chat.completion" and len(doc["choices"][0]["message"]["content"].split()) == 3
    status, data = call(plain, "POST", "/invocations", {"prompt": "a b", "max_tokens": 2})  # no model: the served one
    assert status == 200 and json.loads(data)["object"] == "text_completion"
    assert call(plain, "POST", "/invocations", {"nothing": 1})[0] == 400
    status, data = call(plain, "POST", "/tokenize", {"prompt": "one two three"})
    assert status == 200 and json.loads(data)["count"] == 3
    assert call(plain, "POST", "/detokenize", {"tokens": [1, 2]})[0] == 200
    gen = {"token_ids": [1, 2], "sampling_params": {"max_tokens": 2}}
    status, data = call(plain, "POST", "/inference/v1/generate", gen)
    assert status == 200 and len(json.loads(data)["choices"][0]["token_ids"]) == 2
    for path in ("/version", "/load", "/ping", "/health", "/metrics"):
        assert call(plain, "GET", path)[0] == 200, path
    assert call(plain, "POST", "/scale_elastic_ep", {})[0] == 400  # reached the handler, no key asked
    # vLLM's own check, /v1 only, before routing: an unknown /v1 path is 401 too
    assert call(plain, "GET", "/v1/models")[0] == 401
    assert call(plain, "POST", "/v1/nope", {})[0] == 401
    assert call(plain, "GET", "/v1/models", key=KEY)[0] == 200


@pytest.mark.parametrize("key", [None, "wrong", KEY + "x", ""])
def test_with_the_middleware_every_path_and_method_refuses_without_the_key(guarded, key):
    port, _ = guarded
    checked = 0
    for path, methods in sorted(ROUTES.items()):
        for method in sorted(methods | {"GET", "POST", "PUT", "DELETE", "OPTIONS"}):
            status, data = call(port, method, path, CHAT if method == "POST" else None, key=key)
            if path in ("/health", "/metrics") and method == "GET":
                assert status == 200, (method, path)
            else:
                assert (status, json.loads(data)) == (401, {"error": "Unauthorized"}), (method, path, status)
            checked += 1
    for path in OTHER_PATHS:
        for method in ("GET", "POST"):
            assert call(port, method, path, {}, key=key)[0] == 401, (method, path)
    assert checked > 40


def test_with_the_middleware_the_key_serves_every_path(guarded):
    port, _ = guarded
    status, data = call(port, "POST", "/invocations", CHAT, key=KEY)
    assert status == 200 and json.loads(data)["choices"], data
    assert call(port, "POST", "/tokenize", {"prompt": "a b"}, key=KEY)[0] == 200
    assert call(port, "POST", "/v1/chat/completions", CHAT, key=KEY)[0] == 200
    assert call(port, "GET", "/v1/models", key=KEY)[0] == 200
    assert call(port, "GET", "/version", key=f"{KEY}")[0] == 200
    assert call(port, "GET", "/nope", key=KEY)[0] == 404  # past the middleware, the router answers


def test_a_new_key_in_the_file_takes_effect_without_a_restart(guarded):
    port, key_file = guarded
    new = KEY + "-rotated"
    tmp = key_file.with_name("api_key.new")
    tmp.write_text(new + "\n")
    tmp.replace(key_file)  # an atomic rename, as Ansible's copy does: a new inode
    try:
        assert call(port, "POST", "/invocations", CHAT, key=KEY)[0] == 401
        assert call(port, "POST", "/invocations", CHAT, key=new)[0] == 200
    finally:
        key_file.write_text(KEY + "\n")
    assert call(port, "POST", "/invocations", CHAT, key=KEY)[0] == 200


@pytest.mark.parametrize("content", [None, "", "\n\n"])
def test_no_key_file_or_an_empty_one_stops_the_start(hf_home, tmp_path, content):
    key_file = tmp_path / "api_key"
    if content is not None:
        key_file.write_text(content)
    proc, port = start(hf_home, ["--middleware", MIDDLEWARE], key_file)
    out = stop(proc)
    assert port is None and proc.returncode == 1, out
    assert "KeyFileError" in out and "Starting vLLM API server" not in out


def test_a_middleware_that_does_not_import_stops_the_start(hf_home, tmp_path):
    proc, port = start(hf_home, ["--middleware", "sparkops_vllm_auth.NoSuchClass"], tmp_path / "k")
    out = stop(proc)
    assert port is None and proc.returncode == 1, out


# --- the middleware's parts, in process ----------------------------------------------------------------


REACHED: list = []


async def inner(scope, receive, send):
    REACHED.append(True)


def run_asgi(app, scope: dict) -> tuple[bool, list]:
    """Run one request through `app` (built around `inner` once): (reached the inner app, messages sent)."""
    REACHED.clear()
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return bool(REACHED), sent


def scope_for(path: str, method: str = "GET", auth_header: bytes | None = None, **extra) -> dict:
    headers = [(b"authorization", auth_header)] if auth_header is not None else []
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": headers, **extra}


def test_bearer_matches_only_the_exact_key_with_any_case_of_the_scheme(tmp_path):
    f = tmp_path / "k"
    f.write_text(f"{KEY}\n\nsecond-key\n")
    digests = auth.read_key_digests(str(f))
    assert len(digests) == 2
    assert auth.bearer_matches(f"Bearer {KEY}".encode(), digests)
    assert auth.bearer_matches(b"bearer second-key", digests)
    for bad in (KEY.encode(), f"Basic {KEY}".encode(), f"Bearer {KEY} ".encode(), b"Bearer ", b"", None):
        assert not auth.bearer_matches(bad, digests), bad
    assert not auth.bearer_matches(f"Bearer {KEY}".encode(), [])


def test_only_get_or_head_of_exactly_health_and_metrics_is_open():
    assert auth.is_open(scope_for("/health")) and auth.is_open(scope_for("/metrics", "HEAD"))
    assert auth.is_open(scope_for("/api/health", root_path="/api"))
    for scope in (
        scope_for("/health", "POST"),
        scope_for("/metrics/"),
        scope_for("/metricsx"),
        scope_for("/health/"),
        scope_for("//health"),
        scope_for("/v1/models"),
        scope_for("/health", type="websocket"),
    ):
        assert not auth.is_open(scope), scope


def test_the_middleware_passes_the_key_refuses_the_rest_and_closes_websockets(tmp_path):
    f = tmp_path / "k"
    f.write_text(KEY)

    app = auth.RequireApiKey(inner, key_file=str(f))
    reached, sent = run_asgi(app, scope_for("/invocations", "POST", f"Bearer {KEY}".encode()))
    assert reached and not sent
    reached, sent = run_asgi(app, scope_for("/invocations", "POST"))
    assert not reached and sent[0]["status"] == 401 and json.loads(sent[1]["body"]) == {"error": "Unauthorized"}
    reached, sent = run_asgi(app, {**scope_for("/v1/realtime"), "type": "websocket"})
    assert not reached and sent == [{"type": "websocket.close", "code": 1008}]
    reached, _ = run_asgi(app, {"type": "lifespan"})
    assert reached  # start-up and shutdown events pass
    f.unlink()  # the file gone: fail closed, even with the right key
    reached, sent = run_asgi(app, scope_for("/invocations", "POST", f"Bearer {KEY}".encode()))
    assert not reached and sent[0]["status"] == 401


# --- the role passes the key as a file and the middleware on the command line ---------------------------


def test_the_role_mounts_the_key_and_the_middleware_and_keeps_the_key_out_of_env_and_argv():
    import sys  # noqa: PLC0415

    import yaml  # noqa: PLC0415
    from ansible_collections.sparkops.cluster.plugins.plugin_utils import serving  # noqa: PLC0415

    sys.path.insert(0, str(ROOT / "tests" / "unit" / "plugins" / "plugin_utils"))
    from test_serving_plan import plan_of  # noqa: PLC0415

    role = ROOT / "roles" / "vllm_serve"
    container = yaml.safe_load((role / "tasks" / "container.yml").read_text())
    plan = container[0]
    # The container runs the serving plan's API member: its env and argv, nothing added by the role.
    assert plan["loop_control"]["loop_var"] == "vllm_serve_member"
    assert plan["community.docker.docker_container"]["env"] == "{{ vllm_serve_member.vllm.env }}"
    assert plan["community.docker.docker_container"]["command"] == "{{ vllm_serve_member.vllm.argv }}"
    assert (
        "[vllm_serve_auth_dir ~ ':' ~ vllm_serve_auth_mount ~ ':ro'] if vllm_serve_member.vllm.auth"
        in plan["community.docker.docker_container"]["volumes"]
    )
    rolevars = yaml.safe_load((role / "vars" / "main.yml").read_text())
    # The role mounts the folder where the plan's env and argv say the key file and the module are.
    assert rolevars["vllm_serve_auth_mount"] == serving.AUTH_MOUNT
    assert rolevars["vllm_serve_auth_module"] == serving.AUTH_MODULE
    assert (AUTH_DIR / f"{rolevars['vllm_serve_auth_module']}.py").is_file()
    _cluster, built = plan_of()
    api = built["deployments"][0]["members"][0]["vllm"]
    assert api["env"]["SPARKOPS_API_KEY_FILE"] == f"{rolevars['vllm_serve_auth_mount']}/api_key"
    assert api["env"]["PYTHONPATH"] == rolevars["vllm_serve_auth_mount"]
    assert api["argv"][api["argv"].index("--middleware") + 1] == MIDDLEWARE and hasattr(auth, "RequireApiKey")
    assert f"{rolevars['vllm_serve_auth_module']}.RequireApiKey" == MIDDLEWARE
    assert "VLLM_API_KEY" not in api["env"] and "--api-key" not in api["argv"]
    key_task = next(t for t in yaml.safe_load((role / "tasks" / "auth.yml").read_text()) if "api_key" in str(t))
    assert key_task["no_log"] is True and key_task["ansible.builtin.copy"]["mode"] == "0600"
