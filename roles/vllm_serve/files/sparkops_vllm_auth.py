"""The API key on every path of vLLM's server: an ASGI middleware for `vllm serve --middleware`.

Why: vLLM 0.19.0's own `--api-key` check (AuthenticationMiddleware,
vllm/entrypoints/openai/server_utils.py:80) skips every path that does not start with /v1, and the
server registers such paths unconditionally: POST /invocations runs a chat completion or a
completion for any body that validates (vllm/entrypoints/sagemaker/api_router.py:125-160, mounted by
vllm/entrypoints/openai/api_server.py:192-196), POST /inference/v1/generate generates from token ids
(vllm/entrypoints/serve/disagg/api_router.py:49), /tokenize and /detokenize, /scale_elastic_ep, /load,
/ping and /version answer too. This middleware asks for the key on every HTTP and WebSocket request
except GET-style probes of exactly /health (the liveness check) and /metrics (Prometheus scrapes it
without a key, so its configuration never holds one; what it shows is counts and timings, no text).
Everything else - any method, any other path, unknown paths included - needs
`Authorization: Bearer <key>`; OPTIONS too (vLLM lets OPTIONS through; no client here needs CORS).

How vLLM loads it: api_server.py build_app imports the `--middleware` path and, for a class, calls
`app.add_middleware(cls)` (vllm/entrypoints/openai/api_server.py:295-304), after its own middlewares,
so Starlette runs it outermost, ahead of routing: every route, including those added later by
sagemaker_standards.bootstrap, is behind it. The class is built with the app only, so the key's
location comes from the environment (SPARKOPS_API_KEY_FILE, a path, not the key); the key itself
never is in the environment or on a command line (`docker inspect` and `ps` show neither).

The key file holds one key per line (blank lines ignored). It is read again when it changes (inode,
size or mtime), so a new key takes effect without a restart. A missing, unreadable or empty file
refuses every guarded request (fail closed); at import (vLLM's start-up) it stops the server.
Keys are compared as SHA-256 digests with hmac.compare_digest, all of them every time (constant time,
like vLLM's own check). Standard library only: the same file runs in the real image and in the
simulated cluster's test double.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os

KEY_FILE_ENV = "SPARKOPS_API_KEY_FILE"
OPEN_PATHS = frozenset({"/health", "/metrics"})
OPEN_METHODS = frozenset({"GET", "HEAD"})
_LOG = logging.getLogger("sparkops_vllm_auth")


class KeyFileError(RuntimeError):
    """The key file is missing, unreadable or holds no key."""


def read_key_digests(path: str) -> list[bytes]:
    """SHA-256 digests of the keys in `path`, one per non-blank line."""
    if not path:
        raise KeyFileError(f"{KEY_FILE_ENV} is not set: point it at the API key file mounted into the container")
    try:
        with open(path, encoding="utf-8") as fh:
            keys = [line.strip() for line in fh]
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"cannot read the API key file {path}: {exc}") from exc
    keys = [k for k in keys if k]
    if not keys:
        raise KeyFileError(f"the API key file {path} holds no key")
    return [hashlib.sha256(k.encode("utf-8")).digest() for k in keys]


def bearer_matches(authorization: bytes | None, digests: list[bytes]) -> bool:
    """True when `authorization` is `Bearer <one of the keys>` (scheme case-insensitive, as vLLM)."""
    if not authorization or not digests:
        return False
    scheme, _sep, token = authorization.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer":
        return False
    given = hashlib.sha256(token.encode("latin-1")).digest()
    match = False
    for digest in digests:  # every key every time: the answer's timing does not say which one matched
        match |= hmac.compare_digest(given, digest)
    return match


def route_path(scope: dict) -> str:
    """The path the router matches: scope path without root_path (Starlette's get_route_path)."""
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def is_open(scope: dict) -> bool:
    """Only the liveness probe and the metrics, read with GET or HEAD, go without a key."""
    return scope["type"] == "http" and scope.get("method") in OPEN_METHODS and route_path(scope) in OPEN_PATHS


def authorization_header(scope: dict) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            return value  # the first one, as Starlette's Headers.get
    return None


class RequireApiKey:
    """Pure ASGI middleware: 401 {"error": "Unauthorized"} (vLLM's body) without the right key."""

    def __init__(self, app, key_file: str | None = None) -> None:
        self.app = app
        self.key_file = key_file if key_file is not None else os.environ.get(KEY_FILE_ENV, "")
        self._stamp: tuple | None = None
        self._digests: list[bytes] = []
        self.digests()  # a bad file fails here, at the first request (Starlette builds the stack lazily)

    def digests(self) -> list[bytes]:
        """The current keys' digests, read again when the file changed; KeyFileError when there is none."""
        try:
            st = os.stat(self.key_file)
        except OSError as exc:
            raise KeyFileError(f"cannot read the API key file {self.key_file!r}: {exc}") from exc
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp != self._stamp:
            self._digests = read_key_digests(self.key_file)
            self._stamp = stamp
        return self._digests

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or is_open(scope):
            await self.app(scope, receive, send)
            return
        try:
            digests = self.digests()
        except KeyFileError as exc:
            _LOG.error("refusing %s: %s", route_path(scope), exc)
            digests = []
        if bearer_matches(authorization_header(scope), digests):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: the handshake gets 403
            return
        body = json.dumps({"error": "Unauthorized"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


# vLLM imports this module while it builds the app, before it listens: a missing or empty key file
# stops the server there instead of serving a server that refuses everything. (Tests and tools that
# import the module for its functions set SPARKOPS_VLLM_AUTH_NO_STARTUP_CHECK=1.)
if os.environ.get("SPARKOPS_VLLM_AUTH_NO_STARTUP_CHECK") != "1":
    read_key_digests(os.environ.get(KEY_FILE_ENV, ""))
