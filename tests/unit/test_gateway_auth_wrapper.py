"""The gateway's ASGI wrapper (roles/gateway/files/sparkops_gateway_auth.py) without LiteLLM: every HTTP and
WebSocket request needs an active key before the inner app sees it (issue 25). The real proxy behind it:
tests/unit/sim/test_gateway_litellm.py."""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import pytest
import yaml
from conftest import ROOT

sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))  # `import gateway_keys`, as installed beside it
_spec = importlib.util.spec_from_file_location(
    "sparkops_gateway_auth_under_test", ROOT / "roles" / "gateway" / "files" / "sparkops_gateway_auth.py"
)
auth = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(auth)
KEYS = {"sk-good": "alice", "sk-prom": "sparkops-prometheus"}


class FakeStore:
    def __init__(self):
        self.asked = []

    def entry_for(self, key):
        self.asked.append(key)
        name = KEYS.get(key)
        return None if name is None else {"name": name, "key_class": "interactive"}


def name_of(store, key):
    """The active key's name the store answers, or None."""
    entry = store.entry_for(key)
    return entry["name"] if entry else None


def run(scope_type, path, headers, metrics_keys=frozenset({"sparkops-prometheus"})):
    seen, sent = [], []

    async def inner(scope, receive, send):
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    store = FakeStore()
    scope = {"type": scope_type, "path": path, "headers": headers}
    asyncio.run(auth.RequireKeyEverywhere(inner, store, metrics_keys=metrics_keys)(scope, receive, send))
    return seen, sent, store


@pytest.mark.parametrize(
    "path", ["/", "/health/liveliness", "/metrics", "/ui/", "/openapi.json", "/nope", "/v1/models"]
)
@pytest.mark.parametrize(
    "headers", [[], [(b"authorization", b"Bearer sk-bad")], [(b"authorization", b"Basic sk-good")]]
)
def test_http_without_an_active_key_gets_401_and_never_reaches_the_app(path, headers):
    seen, sent, _store = run("http", path, headers)
    assert seen == []
    assert sent[0]["status"] == 401 and (b"www-authenticate", b"Bearer") in sent[0]["headers"]
    assert b"sk-" not in sent[1]["body"]  # the answer never echoes a key


def test_websocket_without_a_key_is_closed_as_policy_violation():
    seen, sent, _store = run("websocket", "/v1/realtime", [])
    assert seen == [] and sent == [{"type": "websocket.close", "code": 1008}]


def test_an_active_key_passes_and_is_looked_up_by_the_store():
    seen, sent, store = run("http", "/v1/models", [(b"authorization", b"Bearer sk-good")])
    assert seen == ["/v1/models"] and sent[0]["status"] == 200 and store.asked == ["sk-good"]


CLIENT = [(b"authorization", b"Bearer sk-good")]
PROMETHEUS = [(b"authorization", b"Bearer sk-prom")]
# What a client key reached before (each answered 2xx to a client key on LiteLLM 1.108.7), LiteLLM's other
# surfaces, and spellings that are not the allowed paths (Starlette routes on the exact path).
NOT_FOR_CLIENTS = [
    "/model/info",
    "/v1/model/info",
    "/routes",
    "/settings",
    "/debug/asyncio-tasks",
    "/ui",
    "/ui/",
    "/health",
    "/health/liveliness",
    "/metrics",
    "/metrics/",
    "/openapi.json",
    "/docs",
    "/key/generate",
    "/user/info",
    "/v1/embeddings",
    "/v1/messages",
    "/openai/deployments/tiny/chat/completions",
    "/v1/models/tiny",
    "/v1/chat/completions/",
    "//v1/chat/completions",
    "/V1/chat/completions",
    "/v1/chat/completions/../../routes",
    "/",
    "",
]


@pytest.mark.parametrize("path", sorted(auth.CLIENT_PATHS))
def test_a_client_key_reaches_the_openai_routes(path):
    seen, sent, _store = run("http", path, CLIENT)
    assert seen == [path] and sent[0]["status"] == 200


@pytest.mark.parametrize("path", NOT_FOR_CLIENTS)
def test_a_client_key_gets_404_anywhere_else_and_litellm_never_sees_it(path):
    seen, sent, store = run("http", path, CLIENT)
    assert seen == [] and sent[0]["status"] == 404 and store.asked == ["sk-good"]
    assert (b"www-authenticate", b"Bearer") not in sent[0]["headers"] and b"sk-" not in sent[1]["body"]


@pytest.mark.parametrize("path", ["/metrics", "/metrics/"])
def test_prometheus_key_reads_metrics_and_nothing_else(path):
    seen, sent, _store = run("http", path, PROMETHEUS)
    assert seen == [path] and sent[0]["status"] == 200
    for other in ("/v1/chat/completions", "/v1/models", "/model/info", "/metrics/x"):
        seen, sent, _store = run("http", other, PROMETHEUS)
        assert seen == [] and sent[0]["status"] == 404, other


def test_an_unknown_key_is_401_on_an_allowed_path_too_and_a_client_websocket_is_closed():
    seen, sent, _store = run("http", "/v1/chat/completions", [(b"authorization", b"Bearer sk-bad")])
    assert seen == [] and sent[0]["status"] == 401
    seen, sent, _store = run("websocket", "/v1/realtime", CLIENT)
    assert seen == [] and sent == [{"type": "websocket.close", "code": 1008}]


def test_the_metrics_keys_come_from_the_environment():
    assert auth.metrics_keys({auth.METRICS_KEYS_ENV: " sparkops-prometheus, other ,"}) == {
        "sparkops-prometheus",
        "other",
    }
    assert auth.metrics_keys({}) == frozenset()
    # Without a metrics key named, /metrics is for nobody (a client key included).
    seen, sent, _store = run("http", "/metrics", PROMETHEUS, metrics_keys=frozenset())
    assert seen == [] and sent[0]["status"] == 404


def test_the_service_names_prometheus_key_as_the_monitoring_role_makes_it():
    env = yaml.safe_load((ROOT / "roles/gateway/vars/main.yml").read_text())["gateway_environment"]
    name = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())["monitoring_gateway_key_name"]
    assert env[auth.METRICS_KEYS_ENV] == f"{{{{ monitoring_gateway_key_name | default('{name}') }}}}"


def test_lifespan_passes_untouched():
    seen, _sent, store = run("lifespan", "", [])
    assert seen == [""] and store.asked == []


def test_the_store_caches_an_answer_for_at_most_its_window(monkeypatch):
    answers = iter([{"name": "alice"}, None])
    store = auth.KeyStore("dbname=none", cache_s=2.0)
    monkeypatch.setattr(store, "_run", lambda fn, key: next(answers))
    clock = [100.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: clock[0])
    key = auth.gateway_keys.new_key()
    assert name_of(store, key) == "alice"
    clock[0] += 1.9
    assert name_of(store, key) == "alice"  # cached
    clock[0] += 0.2
    assert name_of(store, key) is None  # asked again after 2 s: revoked
    assert name_of(store, "") is None


def _counting_store(monkeypatch, active: dict):
    store = auth.KeyStore("dbname=none", cache_s=2.0)
    asked = []

    def run(fn, key):
        asked.append(key)
        return {"name": active[key]} if key in active else None

    monkeypatch.setattr(store, "_run", run)
    clock = [100.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: clock[0])
    return store, asked, clock


def test_a_key_sparkops_never_makes_costs_no_database_round_trip(monkeypatch):
    store, asked, _clock = _counting_store(monkeypatch, {})
    for bad in (
        "sk-x",
        "sk-sparkops-short",
        "Bearer sk-sparkops-" + "a" * 43,
        "sk-sparkops-" + "a" * 43 + "\n",
        "x" * 5000,
    ):
        assert name_of(store, bad) is None
    assert asked == []


def test_unknown_keys_are_remembered_bounded_and_never_push_the_active_ones_out(monkeypatch):
    good = auth.gateway_keys.new_key()
    store, asked, clock = _counting_store(monkeypatch, {good: "alice"})
    assert name_of(store, good) == "alice"
    wrong = [auth.gateway_keys.new_key() for _key in range(auth.NEGATIVE_MAX + 500)]
    for key in wrong:
        assert name_of(store, key) is None
    assert len(store._unknown) == auth.NEGATIVE_MAX  # the oldest dropped
    asked.clear()
    assert name_of(store, wrong[-1]) is None and name_of(store, good) == "alice"
    assert asked == []  # both answered from memory within the window
    assert name_of(store, wrong[0]) is None and asked == [wrong[0]]  # dropped from the bounded memory: asked again
    clock[0] += 2.1
    assert name_of(store, wrong[-1]) is None and asked[-1] == wrong[-1]  # remembered cache_s only


def test_a_revoked_key_is_refused_within_the_window_and_a_new_key_accepted_within_it(monkeypatch):
    key = auth.gateway_keys.new_key()
    active = {key: "alice"}
    store, _asked, clock = _counting_store(monkeypatch, active)
    assert name_of(store, key) == "alice"
    del active[key]  # revoked
    clock[0] += 2.1
    assert name_of(store, key) is None
    active[key] = "alice"  # made again (keys.yml): accepted once the unknown answer is cache_s old
    clock[0] += 1.0
    assert name_of(store, key) is None
    clock[0] += 1.1
    assert name_of(store, key) == "alice"


def test_secrets_come_from_files_into_the_environment_only(tmp_path):
    master, vllm = tmp_path / "master_key", tmp_path / "vllm_key"
    master.write_text("sk-master\n")
    vllm.write_text("vllm-secret\nignored second line\n")
    env = {"LITELLM_MASTER_KEY_FILE": str(master), "SPARKOPS_VLLM_API_KEY_FILE": str(vllm)}
    assert auth.load_secret_files(env) == ["LITELLM_MASTER_KEY", "SPARKOPS_VLLM_API_KEY"]
    assert env["LITELLM_MASTER_KEY"] == "sk-master"
    assert env["SPARKOPS_VLLM_API_KEY"] == "vllm-secret"


def test_a_missing_or_empty_secret_file_stops_the_start(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(RuntimeError, match="is empty"):
        auth.load_secret_files({"LITELLM_MASTER_KEY_FILE": str(empty)})
    with pytest.raises(RuntimeError, match="cannot read it"):
        auth.load_secret_files({"SPARKOPS_VLLM_API_KEY_FILE": str(tmp_path / "absent")})
    env = {}
    assert auth.load_secret_files(env) == [] and env == {}


def lifespan(marker, inner_steps, messages):
    """Run the wrapper's lifespan with `inner_steps(receive, send)` as LiteLLM's lifespan; `messages` are what
    uvicorn sends in. Returns what reached uvicorn."""
    incoming, sent = list(messages), []

    async def inner(scope, receive, send):
        await inner_steps(receive, send)

    async def receive():
        return incoming.pop(0)

    async def send(message):
        sent.append(message)

    asyncio.run(auth.RequireKeyEverywhere(inner, FakeStore(), ready=marker)({"type": "lifespan"}, receive, send))
    return sent


def test_the_ready_file_holds_the_loaded_configs_digest_from_startup_complete_to_shutdown(tmp_path):
    import hashlib  # noqa: PLC0415

    config = tmp_path / "config.yaml"
    config.write_text("model_list: []\n")
    marker = auth.ReadyMarker(tmp_path, config, pid=4242)
    ready = tmp_path / "4242.ready"
    ready.write_text("stale digest of a dead worker with this pid\n")
    (tmp_path / "4242.retired").write_text("1\n")
    seen = {}

    async def litellm(receive, send):
        await receive()  # lifespan.startup
        seen["at_startup"] = ready.exists()  # the stale one is gone before LiteLLM reads the config
        await send({"type": "lifespan.startup.complete"})
        seen["after_complete"] = ready.read_text().strip()
        await receive()  # lifespan.shutdown
        seen["at_shutdown"] = ready.exists()
        await send({"type": "lifespan.shutdown.complete"})

    sent = lifespan(marker, litellm, [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    assert seen == {
        "at_startup": False,
        "after_complete": hashlib.sha256(config.read_bytes()).hexdigest(),
        "at_shutdown": False,
    }
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert not (tmp_path / "4242.retired").exists()


def test_a_config_changed_during_startup_is_not_vouched_for(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("a\n")

    async def litellm(receive, send):
        await receive()
        config.write_text("b\n")  # rewritten while LiteLLM read it: which one it got is unknown
        await send({"type": "lifespan.startup.complete"})

    lifespan(auth.ReadyMarker(tmp_path, config, pid=7), litellm, [{"type": "lifespan.startup"}])
    assert (tmp_path / "7.ready").read_text().strip() == "unknown"


def test_a_failed_startup_exits_1_not_gunicorns_boot_error_and_writes_no_ready_file(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("a\n")
    exits = []

    async def litellm(receive, send):
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "bad config"})

    marker = auth.ReadyMarker(tmp_path, config, pid=8, retry_s=0, exit=exits.append)
    sent = lifespan(marker, litellm, [{"type": "lifespan.startup"}])
    # 1, not 3: gunicorn's master halts on 3 (WORKER_BOOT_ERROR) and would stop the old worker too.
    assert exits == [1] and sent == [] and not (tmp_path / "8.ready").exists()


def test_the_ready_marker_comes_from_the_environment(tmp_path):
    assert auth.ready_marker({}) is None  # plain uvicorn: no ready files
    marker = auth.ready_marker({"SPARKOPS_GATEWAY_READY_DIR": str(tmp_path), "CONFIG_FILE_PATH": "/c.yaml"})
    assert marker.ready_dir == str(tmp_path) and marker.config == "/c.yaml"
    with pytest.raises(RuntimeError, match="CONFIG_FILE_PATH"):
        auth.ready_marker({"SPARKOPS_GATEWAY_READY_DIR": str(tmp_path)})


def test_a_ready_folder_it_cannot_write_is_logged_and_the_worker_serves(tmp_path, caplog):
    config = tmp_path / "config.yaml"
    config.write_text("a\n")

    async def litellm(receive, send):
        await receive()
        await send({"type": "lifespan.startup.complete"})

    sent = lifespan(auth.ReadyMarker(tmp_path / "missing", config, pid=9), litellm, [{"type": "lifespan.startup"}])
    assert [m["type"] for m in sent] == ["lifespan.startup.complete"]
    assert "cannot write the ready file" in caplog.text


class RefusalStore(FakeStore):
    def __init__(self):
        super().__init__()
        self.refused = []

    def add_refusal(self, name):
        self.refused.append(name)


@pytest.mark.parametrize(("status", "counted"), [(429, ["alice"]), (200, []), (401, [])])
def test_a_429_from_the_app_is_counted_for_the_key_after_it_was_sent(status, counted):
    sent, order = [], []
    store = RefusalStore()
    store.add_refusal = lambda name: (order.append("counted"), store.refused.append(name))

    async def inner(scope, receive, send):
        await send({"type": "http.response.start", "status": status, "headers": [(b"retry-after", b"60")]})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        order.append(message["type"])
        sent.append(message)

    async def main():
        scope = {"type": "http", "path": "/v1/chat/completions", "headers": [(b"authorization", b"Bearer sk-good")]}
        await auth.RequireKeyEverywhere(inner, store, metrics_keys=frozenset())(scope, receive, send)
        await asyncio.gather(*auth._PENDING)

    asyncio.run(main())
    assert sent[0]["status"] == status and sent[0]["headers"] == [(b"retry-after", b"60")]  # not a parallel limit
    assert store.refused == counted
    if counted:
        assert order.index("counted") > order.index("http.response.start")


def test_a_refusal_the_store_cannot_write_fails_no_request(caplog):
    class Broken(FakeStore):
        def add_refusal(self, name):
            raise OSError("database gone")

    async def inner(scope, receive, send):
        await send({"type": "http.response.start", "status": 429, "headers": []})

    async def main():
        scope = {"type": "http", "path": "/v1/completions", "headers": [(b"authorization", b"Bearer sk-good")]}
        sent = []

        async def send(message):
            sent.append(message)

        await auth.RequireKeyEverywhere(inner, Broken(), metrics_keys=frozenset())(scope, None, send)
        await asyncio.gather(*auth._PENDING)
        return sent

    assert asyncio.run(main())[0]["status"] == 429
    assert "could not count a refusal for key alice" in caplog.text


def test_the_hook_hands_the_key_s_limits_to_litellm_and_no_key():
    entry = {"name": "nightly", "key_class": "batch", "max_parallel_requests": 1, "tpm_limit": 6000}
    assert auth.auth_fields(entry) == {
        "api_key": "sparkops-key:nightly",
        "token": "sparkops-key:nightly",
        "key_alias": "nightly",
        "key_name": "nightly",
        "metadata": {"sparkops_key_class": "batch"},
        "max_parallel_requests": 1,
        "tpm_limit": 6000,
    }
    # No limit stored: no field, so LiteLLM makes no descriptor for the key (it limits nothing).
    free = auth.auth_fields({"name": "alice", "key_class": "interactive", "max_parallel_requests": None})
    assert "max_parallel_requests" not in free and "tpm_limit" not in free


def test_the_store_hands_on_the_whole_entry(monkeypatch):
    entry = {"name": "alice", "key_class": "batch", "max_parallel_requests": 2, "tpm_limit": None}
    store = auth.KeyStore("dbname=none")
    monkeypatch.setattr(store, "_run", lambda fn, key: entry if fn is auth.gateway_keys.lookup_entry else None)
    key = auth.gateway_keys.new_key()
    assert store.entry_for(key) == entry and name_of(store, key) == "alice"


def test_a_refusal_for_the_parallel_limit_says_retry_after_a_slot_s_time_not_the_rate_window():
    litellm = [(b"retry-after", b"60"), (b"rate_limit_type", b"max_parallel_requests"), (b"reset_at", b"x")]
    assert auth.parallel_retry_after(litellm) == [
        (b"rate_limit_type", b"max_parallel_requests"),
        (b"reset_at", b"x"),
        (b"retry-after", str(auth.PARALLEL_RETRY_AFTER_S).encode()),
    ]
    assert 1 <= auth.PARALLEL_RETRY_AFTER_S < 60
    tokens = [(b"retry-after", b"60"), (b"rate_limit_type", b"tokens")]
    assert auth.parallel_retry_after(tokens) == tokens  # a tokens-per-minute refusal keeps LiteLLM's window
    assert auth.parallel_retry_after([(b"retry-after", b"60")]) == [(b"retry-after", b"60")]


def test_a_new_connection_brings_the_table_up_to_date_before_the_first_lookup(monkeypatch):
    """The hook reads the limit columns: on a table made before them (the gateway upgraded before any keys
    module run), each new connection adds them first (gateway_keys.ensure_schema), then looks up."""
    import types  # noqa: PLC0415

    sql = []

    class Cursor:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def execute(self, text, params=None):
            sql.append(" ".join(text.split()))

        def fetchone(self):
            return ("alice", "batch", 1, None)

    class Conn:
        closed = False

        def cursor(self):
            return Cursor()

        def commit(self):
            pass

    fake = types.SimpleNamespace(connect=lambda *a, **k: Conn(), OperationalError=OSError)
    monkeypatch.setitem(sys.modules, "psycopg", fake)
    store = auth.KeyStore("dbname=none")
    key = auth.gateway_keys.new_key()
    assert store.entry_for(key) == {
        "name": "alice",
        "key_class": "batch",
        "max_parallel_requests": 1,
        "tpm_limit": None,
    }
    assert sql[0].startswith("CREATE TABLE IF NOT EXISTS sparkops_gateway_keys")
    assert sql[1].startswith("ALTER TABLE sparkops_gateway_keys ADD COLUMN IF NOT EXISTS key_class")
    assert sql[2].startswith("SELECT name, key_class, max_parallel_requests, tpm_limit FROM sparkops_gateway_keys")
    store.add_refusal("alice")  # the same connection: no second schema check
    assert len(sql) == 4 and sql[3].startswith("UPDATE sparkops_gateway_keys SET refused = refused + 1")
