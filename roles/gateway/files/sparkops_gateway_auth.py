"""The gateway's client keys inside the LiteLLM proxy: its custom-auth hook and a usage callback (issue 25).

LiteLLM's own key store needs Prisma, whose engines are downloaded at `prisma generate` / first start; the
gateway runs air-gapped, so the proxy starts without DATABASE_URL and asks this hook instead
(`general_settings.custom_auth: sparkops_gateway_auth.user_api_key_auth`, called for every route that depends on
LiteLLM's user_api_key_auth: litellm/proxy/auth/user_api_key_auth.py:2158-2190 in litellm 1.108.7). The hook
looks the presented key's SHA-256 up in PostgreSQL (plugins/module_utils/gateway_keys.py, installed next to this
file) and caches an answer for at most CACHE_S seconds, so a revoked key is refused within that time without a
restart. It returns a UserAPIKeyAuth whose key_alias is the key's NAME: LiteLLM's Prometheus metrics label by
it (api_key_alias), and the usage callback below adds the name's requests and tokens to the database (status)
and to three counters of our own on the proxy's /metrics.

The paths that do not go through user_api_key_auth (FastAPI routes without the dependency: the UI, /health/*
probes, static files, ...) are closed by RequireKeyEverywhere, an ASGI wrapper the gateway is started through
(see `app` below): it asks the same store for the key on every HTTP and WebSocket request before LiteLLM sees it.
With a key it lets through only the OpenAI routes the gateway is for (CLIENT_PATHS) and, for the keys named in
SPARKOPS_GATEWAY_METRICS_KEYS (Prometheus'), only /metrics; every other path is 404 before LiteLLM sees it. A
client key reaches none of LiteLLM's admin, debug, health, settings or UI routes, and no other client's usage.

Configuration comes from the environment: SPARKOPS_GATEWAY_DB is a libpq connection string without a password
(a peer-authenticated Unix socket on the head, or PGPASSFILE for TCP); no key is ever in it. The two secrets
LiteLLM reads from its environment (LITELLM_MASTER_KEY, and the vLLM key the config names as
os.environ/SPARKOPS_VLLM_API_KEY) are given as files, NAME_FILE=path (root's 0600 files the service's user may
read): load_secret_files() puts them into this process's environment just before LiteLLM is imported, so they
are on no command line and in no service definition.

Reloads (docs/gateway.md, "Reloads"): the gateway runs under gunicorn with uvicorn's worker class, one worker,
no --preload, so each worker imports this module and LiteLLM reads CONFIG_FILE_PATH in its own startup. With
SPARKOPS_GATEWAY_READY_DIR set, ReadyMarker writes `<dir>/<pid>.ready` (the SHA-256 of the config the worker
loaded) once LiteLLM's startup has completed, and removes it at shutdown; the reload (plugins/module_utils/
gateway_reload.py, installed beside this file) retires the old worker only when the new one's file is there.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import os
import threading
import time

import gateway_keys  # plugins/module_utils/gateway_keys.py, installed beside this file
import gateway_reload  # plugins/module_utils/gateway_reload.py, beside this file (the master imported it)

DB_ENV = "SPARKOPS_GATEWAY_DB"
# The names of the keys that may read /metrics (and nothing else): Prometheus' (roles/monitoring). Comma-separated.
METRICS_KEYS_ENV = "SPARKOPS_GATEWAY_METRICS_KEYS"
# What a client key may ask: the OpenAI routes LiteLLM serves for the config's models (chat and text completions,
# the Responses API, the model list), with and without /v1, as LiteLLM 1.108.7 mounts them (litellm/proxy/
# proxy_server.py:11835-11837 models, 12255-12260 chat, 12428-12429 completions; response_api_endpoints/
# endpoints.py:238-244 responses). Exact paths, compared with the ASGI scope's path, which is what Starlette
# routes on (percent-decoded, no query).
CLIENT_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/chat/completions",
        "/v1/completions",
        "/completions",
        "/v1/responses",
        "/responses",
        "/v1/models",
        "/models",
    }
)
# LiteLLM's Prometheus app is mounted at /metrics (litellm/integrations/prometheus.py:4849); Starlette answers /metrics
# with a redirect to /metrics/, which Prometheus' scrape config names (roles/monitoring/templates/prometheus.yml.j2).
METRICS_PATHS = frozenset({"/metrics", "/metrics/"})
READY_DIR_ENV = "SPARKOPS_GATEWAY_READY_DIR"
CONFIG_ENV = "CONFIG_FILE_PATH"  # LiteLLM's (litellm/proxy/proxy_server.py:1442)
# A worker whose LiteLLM startup failed waits this long, then exits 1 (see ReadyMarker): gunicorn's master
# replaces it, and the wait keeps a bad configuration from costing a CPU on imports back to back.
BOOT_RETRY_S = 10.0
# The secrets LiteLLM reads from the environment, each given as a file by NAME_FILE (load_secret_files).
SECRET_ENVS = ("LITELLM_MASTER_KEY", "SPARKOPS_VLLM_API_KEY")
CACHE_S = 2.0  # the longest a revoked key still passes (issue 25: "effective within seconds")
# Unknown keys remembered (each for CACHE_S), at most this many, oldest dropped first: a client repeating a
# wrong key costs no database round trip, and a flood of wrong keys never pushes the active keys' answers out.
NEGATIVE_MAX = 4096
# Retry-After on a 429 for a key at its max_parallel_requests. LiteLLM answers its rate window (60 s: see
# auth_fields), right for requests or tokens per minute, but a concurrency slot frees when one of the key's
# requests ends, seconds away: the OpenAI clients wait what Retry-After says (up to 60 s) before they retry, so
# 60 would idle a batch key's slot for most of a minute after each refusal.
PARALLEL_RETRY_AFTER_S = 2
# Batch keys yield to interactive ones (ClassAdmission): after an interactive request ends, batch requests wait
# this long for the next one (an interactive client's requests come one after another, with its user's reading and
# typing in between). SPARKOPS_GATEWAY_BATCH_QUIET_S sets it (roles/gateway: gateway_batch_quiet_s).
BATCH_QUIET_ENV = "SPARKOPS_GATEWAY_BATCH_QUIET_S"
BATCH_QUIET_S = 5.0
_PENDING: set = set()  # the refusal counts being written (a task nobody references may be collected)
_LOG = logging.getLogger("sparkops_gateway_auth")


class KeyStore:
    """One psycopg connection shared by the proxy's threads, with a short answer cache."""

    def __init__(self, conninfo: str, cache_s: float = CACHE_S):
        self.conninfo = conninfo
        self.cache_s = cache_s
        self._conn = None
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, dict]] = {}  # active keys' answers
        self._unknown: collections.OrderedDict[str, float] = collections.OrderedDict()  # bounded, see NEGATIVE_MAX

    def _run(self, fn, *args):
        import psycopg  # noqa: PLC0415 - the gateway's venv has it (litellm[proxy] pulls psycopg + psycopg-binary)

        with self._lock:
            for attempt in (1, 2):  # one reconnect: PostgreSQL restarted under us
                try:
                    if self._conn is None or self._conn.closed:
                        self._conn = psycopg.connect(self.conninfo, connect_timeout=5)
                        # The columns this file reads (the limits), on a table made before them: a gateway
                        # upgraded before any keys module run would otherwise fail every lookup.
                        gateway_keys.ensure_schema(self._conn)
                    return fn(self._conn, *args)
                except psycopg.OperationalError:
                    self._conn = None
                    if attempt == 2:
                        raise
        return None

    def entry_for(self, key: str) -> dict | None:
        """The active key `key`'s {name, key_class, max_parallel_requests, tpm_limit}, or None; an answer is at
        most cache_s old (a revoked key is refused, and changed limits apply, within cache_s), and a key that is
        no sparkops key at all is refused without a database round trip."""
        if not key or not gateway_keys.KEY_RE.match(key):
            return None
        digest = gateway_keys.digest(key)
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and now - hit[0] < self.cache_s:
            return hit[1]
        seen = self._unknown.get(digest)
        if seen is not None and now - seen < self.cache_s:
            return None
        entry = self._run(gateway_keys.lookup_entry, key)
        with self._lock:
            if entry is None:
                self._cache.pop(digest, None)
                self._unknown[digest] = now
                self._unknown.move_to_end(digest)
                while len(self._unknown) > NEGATIVE_MAX:
                    self._unknown.popitem(last=False)
            else:
                self._unknown.pop(digest, None)
                if len(self._cache) > 10000:  # active keys only: bounded by the table, kept so anyway
                    self._cache.clear()
                self._cache[digest] = (now, entry)
        return entry

    def add_usage(self, name: str, prompt: int, completion: int) -> None:
        self._run(gateway_keys.add_usage, name, prompt, completion)

    def add_refusal(self, name: str) -> None:
        self._run(gateway_keys.add_refusal, name)


_STORE: KeyStore | None = None


def store() -> KeyStore:
    global _STORE  # noqa: PLW0603 - one store per gateway process
    if _STORE is None:
        conninfo = os.environ.get(DB_ENV, "")
        if not conninfo:
            raise RuntimeError(f"{DB_ENV} is not set: the gateway needs the key database's connection string")
        _STORE = KeyStore(conninfo)
    return _STORE


def auth_fields(entry: dict) -> dict:
    """The UserAPIKeyAuth fields for a key's store entry: its name as key_alias, an id derived from the name as
    api_key/token (no key or digest reaches LiteLLM's logs or labels), and its limits.

    LiteLLM 1.108.7's own limiter enforces them (the default `parallel_request_limiter` hook is
    PROXY_MaxParallelRequestsHandler_v3, litellm/proxy/hooks/__init__.py:39, unless the environment sets
    LEGACY_MULTI_INSTANCE_RATE_LIMITING, :51-52, which the gateway does not): its pre-call hook (:4151-4237) makes an
    `api_key` descriptor from user_api_key_dict.api_key with max_parallel_requests and tpm_limit
    (litellm/proxy/hooks/parallel_request_limiter_v3.py:3293-3318), admits a request only while the key's
    in-flight slots + 1 <= max_parallel_requests (a gauge of slot ids, :1847-1938, in memory :1953-2007: a
    refused request takes no slot, nothing waits) and otherwise raises ProxyRateLimitError at once: status 429
    with `retry-after` (the window, LITELLM_RATE_LIMIT_WINDOW_SIZE, 60 s by default: :3663-3713, :895). The
    slot is released when the answer (a stream: its end) is logged or the client goes away (:5448-5585).
    RequireKeyEverywhere.track makes that 429's Retry-After PARALLEL_RETRY_AFTER_S.
    None = no limit (the descriptor is made only when a limit is set). A tpm_limit also makes it reserve the
    request's estimated tokens at admission and, below 4096, cap a request without max_tokens at a quarter of
    it (:4276-4345, :1061-1112, :945-958)."""
    name = entry["name"]
    ident = f"sparkops-key:{name}"
    fields = {"api_key": ident, "token": ident, "key_alias": name, "key_name": name}
    fields["metadata"] = {"sparkops_key_class": entry.get("key_class") or "interactive"}
    for limit in ("max_parallel_requests", "tpm_limit"):
        if entry.get(limit) is not None:
            fields[limit] = int(entry[limit])
    return fields


async def user_api_key_auth(request, api_key: str):
    """LiteLLM's custom_auth: the key's name as key_alias and its limits (auth_fields), or 401."""
    from litellm.proxy._types import ProxyException, UserAPIKeyAuth  # noqa: PLC0415 - only inside LiteLLM

    token = api_key or ""
    if token.lower().startswith("bearer "):
        token = gateway_keys.bearer_token(token)
    entry = await asyncio.to_thread(store().entry_for, token) if token else None
    if entry is None:
        raise ProxyException(message="invalid or revoked API key", type="auth_error", param="api_key", code=401)
    return UserAPIKeyAuth(**auth_fields(entry))


# The reload's check before it asks gunicorn for a worker (preflight, below) imports this module without LiteLLM:
# importing LiteLLM costs 5-20 s of CPU, and its own failures are the venv's, which restarts the service instead.
PREFLIGHT_ENV = "SPARKOPS_GATEWAY_PREFLIGHT"
try:
    if os.environ.get(PREFLIGHT_ENV):
        raise ImportError(PREFLIGHT_ENV)
    from litellm.integrations.custom_logger import CustomLogger
    from prometheus_client import Counter, Gauge
except ImportError:  # imported by the unit tests without litellm, or by the preflight: the auth wrapper loads
    CustomLogger = object
    Counter = Gauge = None

if Counter is not None:
    REQUESTS = Counter("sparkops_gateway_requests", "Successful requests per client key", ["key"])
    PROMPT = Counter("sparkops_gateway_prompt_tokens", "Prompt tokens per client key", ["key"])
    COMPLETION = Counter("sparkops_gateway_completion_tokens", "Completion tokens per client key", ["key"])
    # The limits at work (RequireKeyEverywhere.track): a key's requests in flight, and those refused with 429.
    IN_FLIGHT = Gauge("sparkops_gateway_in_flight", "Client requests in flight per key", ["key"])
    REFUSED = Counter("sparkops_gateway_refused", "Requests refused with 429 (over the key's limit) per key", ["key"])
else:
    IN_FLIGHT = REFUSED = None


class UsageCallback(CustomLogger):
    """Per key NAME: requests, prompt and completion tokens, to /metrics and to the database (status)."""

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        meta = (kwargs.get("litellm_params") or {}).get("metadata") or {}
        name = meta.get("user_api_key_alias")
        if not name:
            return
        usage = getattr(response_obj, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        REQUESTS.labels(name).inc()
        PROMPT.labels(name).inc(prompt)
        COMPLETION.labels(name).inc(completion)
        try:
            await asyncio.to_thread(store().add_usage, name, prompt, completion)
        except Exception:  # usage bookkeeping must never fail a served request
            _LOG.exception("could not add usage for key %s", name)


usage_callback = UsageCallback()


class ClassAdmission:
    """Batch keys get what interactive keys leave, as they come and go (docs/gateway.md, "Limits per key").

    The seats a deployment holds at the SLO are few (two on the reference pair), and every stream beside another
    slows both (17.0 tok/s alone, 12.1 each at two): a per-key limit alone keeps a batch key from taking every seat,
    not from slowing the interactive user beside it. So, in each gateway worker:
    - a batch request is admitted only while no interactive request is in flight and none ended in the last
      `quiet_s`; otherwise it is refused at once (429, Retry-After: when it may come back), never queued;
    - an interactive request that arrives stops the batch streams in flight: the wrapper tells LiteLLM that their
      client went away (see RequireKeyEverywhere.track), as a closed connection does, so LiteLLM closes its
      request to vLLM, vLLM aborts it, and its seat is free for the interactive one. The batch client's answer
      ends with an error saying so (a 429 if nothing was sent yet), and it retries later.
    Counted per worker (one worker serves; during a reload two do for a moment, each with its own count, as for
    the per-key limits)."""

    # The longest an interactive request waits for the batch streams it stopped to let go of their seats.
    RELEASE_WAIT_S = 1.0

    def __init__(self, quiet_s: float = BATCH_QUIET_S, clock=time.monotonic):
        self.quiet_s = float(quiet_s)
        self._clock = clock
        self.interactive = 0
        self._quiet_until = float("-inf")
        self._batch: dict[asyncio.Event, asyncio.Event] = {}  # a batch request's stop -> set when it has ended

    def batch_wait(self) -> float:
        """0 when a batch request may start now, else the seconds until it may."""
        if self.interactive:
            return self.quiet_s
        return max(0.0, self._quiet_until - self._clock())

    def batch_begins(self) -> asyncio.Event:
        """A batch request admitted: the event is set when an interactive one stops it."""
        stop = asyncio.Event()
        self._batch[stop] = asyncio.Event()
        return stop

    def batch_ends(self, stop: asyncio.Event) -> None:
        ended = self._batch.pop(stop, None)
        if ended is not None:
            ended.set()

    def interactive_begins(self) -> list:
        """An interactive request admitted: every batch request in flight is stopped. Returns the events set when
        each of those has ended (its request to vLLM closed): released() waits for them."""
        self.interactive += 1
        stopped = [(stop, ended) for stop, ended in self._batch.items() if not stop.is_set()]
        for stop, _ended in stopped:
            stop.set()
        return [ended for _stop, ended in stopped]

    async def released(self, ended: list) -> None:
        """Until the stopped batch requests have ended, at most RELEASE_WAIT_S: vLLM then has their aborts before
        the interactive request, and its first steps run without them."""
        if ended:
            waits = [asyncio.ensure_future(e.wait()) for e in ended]
            _done, late = await asyncio.wait(waits, timeout=self.RELEASE_WAIT_S)
            for wait in late:
                wait.cancel()

    def interactive_ends(self) -> None:
        self.interactive = max(0, self.interactive - 1)
        self._quiet_until = self._clock() + self.quiet_s


def batch_quiet_s(environ=None) -> float:
    environ = os.environ if environ is None else environ
    try:
        value = float(environ.get(BATCH_QUIET_ENV, BATCH_QUIET_S))
    except ValueError:
        return BATCH_QUIET_S
    return value if value >= 0 else BATCH_QUIET_S


def metrics_keys(environ=None) -> frozenset:
    environ = os.environ if environ is None else environ
    return frozenset(n.strip() for n in environ.get(METRICS_KEYS_ENV, "").split(",") if n.strip())


def parallel_retry_after(headers: list) -> list:
    """A 429's headers with Retry-After PARALLEL_RETRY_AFTER_S when LiteLLM refused for max_parallel_requests
    (its `rate_limit_type` header, parallel_request_limiter_v3.py:3702-3708); any other 429 as it came."""
    kinds = {bytes(v).strip().lower() for k, v in headers if bytes(k).lower() == b"rate_limit_type"}
    if kinds != {b"max_parallel_requests"}:
        return list(headers)
    kept = [(k, v) for k, v in headers if bytes(k).lower() != b"retry-after"]
    return [*kept, (b"retry-after", str(PARALLEL_RETRY_AFTER_S).encode())]


BATCH_YIELDS = "batch key: interactive requests are being served; retry after the time Retry-After gives"
BATCH_STOPPED = "batch key: stopped for an interactive request; send it again later"


def retry_after(seconds: float) -> tuple[bytes, bytes]:
    """A Retry-After header: whole seconds, rounded up, at least 1."""
    return (b"retry-after", str(max(1, math.ceil(seconds))).encode())


def stoppable(receive, stop: asyncio.Event):
    """`receive` that answers http.disconnect once `stop` is set, as ASGI says when the client went away. Under
    uvicorn 0.54 (ASGI spec_version 2.3: uvicorn/protocols/http/httptools_impl.py:228, h11_impl.py:210) Starlette
    1.10's StreamingResponse waits for that message beside the stream and cancels the stream when it comes
    (starlette/responses.py:247-285, listen_for_disconnect); LiteLLM's stream then closes its request to vLLM."""

    async def receive_():
        if stop.is_set():
            return {"type": "http.disconnect"}
        got = asyncio.ensure_future(receive())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({got, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the stream ended and Starlette stops listening: nothing left waiting
            got.cancel()
            raise
        finally:
            stopped.cancel()
        if got.done():
            return got.result()
        got.cancel()
        return {"type": "http.disconnect"}

    return receive_


class RequireKeyEverywhere:
    """ASGI wrapper: every HTTP and WebSocket request needs an active key, before LiteLLM routes it, and then a
    path that key may ask for.

    LiteLLM's custom_auth runs only where a route depends on user_api_key_auth; this closes the others
    (unknown paths too) with the same key store, answering 401 without touching the inner app. A known key gets
    CLIENT_PATHS only, a metrics key (`metrics_keys`, Prometheus') METRICS_PATHS only: anything else is 404,
    as if the route did not exist, so LiteLLM's admin and debug surface is not there for a client key."""

    def __init__(self, inner, key_store=None, ready=None, metrics_keys=None, admission=None):
        self.inner = inner
        self._store = key_store
        self._ready = ready
        self._metrics_keys = metrics_keys
        self.admission = admission if admission is not None else ClassAdmission(batch_quiet_s())

    def allowed(self, name: str, path: str) -> bool:
        keys = self._metrics_keys if self._metrics_keys is not None else metrics_keys()
        return path in (METRICS_PATHS if name in keys else CLIENT_PATHS)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan" and self._ready is not None:
            receive, send = self._ready.wrap(receive, send)
        if scope["type"] in ("http", "websocket"):
            headers = dict(scope.get("headers") or [])
            token = gateway_keys.bearer_token(headers.get(b"authorization", b"").decode("latin-1"))
            key_store = self._store or store()
            entry = await asyncio.to_thread(key_store.entry_for, token) if token else None
            if entry is None:
                await self._refuse(scope, send, 401, "invalid or revoked API key")
                return
            name = entry["name"]
            if not self.allowed(name, scope.get("path") or ""):
                await self._refuse(scope, send, 404, "not found")
                return
            if scope["type"] == "http" and scope.get("path") in CLIENT_PATHS:
                await self.track(name, key_store, scope, receive, send, key_class=entry.get("key_class"))
                return
        await self.inner(scope, receive, send)

    async def track(self, name, key_store, scope, receive, send, key_class=None):  # noqa: PLR0917 - ASGI's three
        """A client request of key `name` through the app: in flight until the app returns (a stream: its end),
        and a 429 answer (the key over its limit: LiteLLM's limiter, see auth_fields; or a batch key while
        interactive keys are served: ClassAdmission) counted on /metrics and in the store, for status. The store's
        count is written after the answer has gone, never before it."""
        batch = key_class == "batch" and scope.get("path") not in ("/v1/models", "/models")
        if batch and (wait := self.admission.batch_wait()) > 0:
            self._count_refusal(key_store, name)
            await self._refuse(scope, send, 429, BATCH_YIELDS, [retry_after(wait)])
            return
        stop = self.admission.batch_begins() if batch else None
        if not batch:
            await self.admission.released(self.admission.interactive_begins())
        answer = {"started": False, "ended": False}

        async def send_(message):
            if message["type"] == "http.response.start":
                if message.get("status") == 429:
                    self._count_refusal(key_store, name)
                    message = {**message, "headers": parallel_retry_after(message.get("headers") or [])}
                answer["started"] = True
            elif stop is not None and stop.is_set():
                return  # stopped: the app's remaining output is dropped; the end below says why
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                answer["ended"] = True
            await send(message)

        if IN_FLIGHT is not None:
            IN_FLIGHT.labels(name).inc()
        try:
            await self.inner(scope, receive if stop is None else stoppable(receive, stop), send_)
        finally:
            if IN_FLIGHT is not None:
                IN_FLIGHT.labels(name).dec()
            if stop is None:
                self.admission.interactive_ends()
            else:
                self.admission.batch_ends(stop)
        if stop is not None and stop.is_set() and not answer["ended"]:
            self._count_refusal(key_store, name)
            if not answer["started"]:
                await self._refuse(scope, send, 429, BATCH_STOPPED, [retry_after(self.admission.quiet_s)])
            else:
                error = json.dumps({"error": {"message": BATCH_STOPPED, "type": "rate_limit_error", "code": 429}})
                await send({"type": "http.response.body", "body": f"data: {error}\n\n".encode()})

    def _count_refusal(self, key_store, name):
        if REFUSED is not None:
            REFUSED.labels(name).inc()
        self._later(key_store, name)

    def _later(self, key_store, name):
        add = getattr(key_store, "add_refusal", None)
        if add is None:
            return

        async def write():
            try:
                await asyncio.to_thread(add, name)
            except Exception:  # bookkeeping must never fail a request
                _LOG.exception("could not count a refusal for key %s", name)

        task = asyncio.get_running_loop().create_task(write())
        _PENDING.add(task)
        task.add_done_callback(_PENDING.discard)

    @staticmethod
    async def _refuse(scope, send, status: int, message: str, extra_headers=()) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": {"message": message, "code": status}}).encode()
        headers = [(b"content-type", b"application/json"), *extra_headers]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class ReadyMarker:
    """The worker's ready file around the ASGI lifespan (uvicorn runs it before it accepts: server.py:115-118,
    then create_server on gunicorn's sockets). LiteLLM's app is FastAPI with `lifespan=proxy_startup_event`
    (litellm/proxy/proxy_server.py:1927), which reads the config at :1441-1466, before it yields: so
    `lifespan.startup.complete` comes after the file was read. The digest is taken before and after the
    startup; if the file changed in between, which one LiteLLM read is unknown and the file says so.

    A failed startup, under gunicorn, does not exit with uvicorn's code 3: gunicorn's master takes 3 for
    WORKER_BOOT_ERROR and halts, stopping the old worker too (gunicorn/arbiter.py:524-532; uvicorn's
    server.py:116-118 and workers.py:100-101 exit 3). This worker waits `retry_s` and exits 1 instead, so the
    old one keeps serving while the master starts another."""

    def __init__(self, ready_dir, config, pid=None, retry_s=BOOT_RETRY_S, exit=os._exit):  # noqa: A002
        self.ready_dir, self.config = ready_dir, config
        self.pid = pid or os.getpid()
        self.retry_s, self._exit = retry_s, exit
        self.before = None

    def _digest(self):
        try:
            return gateway_reload.config_digest(self.config)
        except OSError:
            return None

    def wrap(self, receive, send):
        async def receive_():
            message = await receive()
            if message["type"] == "lifespan.startup":
                gateway_reload.clear_worker_files(self.ready_dir, self.pid)  # a dead worker's, same pid
                self.before = self._digest()
            elif message["type"] == "lifespan.shutdown":
                gateway_reload.clear_worker_files(self.ready_dir, self.pid)
            return message

        async def send_(message):
            if message["type"] == "lifespan.startup.failed":
                _LOG.error("LiteLLM's startup failed; exiting in %.0f s: %s", self.retry_s, message.get("message"))
                for handler in logging.getLogger().handlers + _LOG.handlers:
                    handler.flush()
                await asyncio.sleep(self.retry_s)
                self._exit(1)  # os._exit: the worker ends here (a test's stand-in returns, and nothing is sent)
            else:
                await send(message)
            if message["type"] == "lifespan.startup.complete":
                after = self._digest()
                digest = after if after is not None and after == self.before else gateway_reload.UNKNOWN_DIGEST
                try:
                    gateway_reload.write_ready(self.ready_dir, self.pid, digest)
                except OSError as err:  # the worker serves; a reload waiting for it says why it never saw it
                    _LOG.error("cannot write the ready file in %s: %s", self.ready_dir, err.strerror)

        return receive_, send_


def ready_marker(environ=None) -> ReadyMarker | None:
    environ = os.environ if environ is None else environ
    ready_dir, config = environ.get(READY_DIR_ENV), environ.get(CONFIG_ENV)
    if not ready_dir:
        return None
    if not config:
        raise RuntimeError(f"{READY_DIR_ENV} is set but {CONFIG_ENV} is not: there is no config to vouch for")
    return ReadyMarker(ready_dir, config)


def load_secret_files(environ=None) -> list[str]:
    """For each of SECRET_ENVS given as NAME_FILE, NAME = the file's first line; the names set. A named file
    that is missing or empty stops the start (the gateway must not run without its master key, nor send an
    empty key to vLLM)."""
    environ = os.environ if environ is None else environ
    loaded = []
    for name in SECRET_ENVS:
        path = environ.get(f"{name}_FILE")
        if not path:
            continue
        try:
            with open(path, encoding="utf-8") as handle:
                value = handle.readline().strip()
        except OSError as err:
            raise RuntimeError(f"{name}_FILE={path}: cannot read it ({err.strerror})") from None
        if not value:
            raise RuntimeError(f"{name}_FILE={path} is empty")
        environ[name] = value
        loaded.append(name)
    return loaded


def preflight(environ=None) -> list[str]:
    """What a new worker does before it imports LiteLLM, without importing it: its secrets readable and not empty,
    the ready folder's settings whole. The reload runs this (with this module's import: an ImportError or a
    SyntaxError here counts too), as the gateway's user with the master's environment, BEFORE it asks gunicorn
    for a worker: a worker that fails while gunicorn loads the app exits 3 before it booted and gunicorn's master
    halts, stopping the old worker too (gunicorn/arbiter.py:524-532, 611-621). Returns the secrets it read."""
    environ = dict(os.environ if environ is None else environ)
    loaded = load_secret_files(environ)
    ready_marker(environ)
    return loaded


def __getattr__(attr: str):
    """`gunicorn -k sparkops_gateway_worker.Worker sparkops_gateway_auth:app`: LiteLLM's app (configured by
    CONFIG_FILE_PATH), wrapped; each worker imports it (no --preload), so each reads the files afresh."""
    if attr == "app":
        load_secret_files()  # before LiteLLM's import reads LITELLM_MASTER_KEY and the config
        from litellm.proxy.proxy_server import app as litellm_app  # noqa: PLC0415 - loads the whole proxy

        return RequireKeyEverywhere(litellm_app, ready=ready_marker())
    raise AttributeError(attr)
