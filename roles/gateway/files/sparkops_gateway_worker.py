"""gunicorn's worker class for the gateway: uvicorn's (uvicorn/workers.py:24-107 in 0.54.0), without the
`server: uvicorn` header, as `uvicorn --no-server-header` ran it before (server_header, uvicorn/config.py:226),
and with a lame-duck start to its shutdown (LameDuckServer).

Its own small module because gunicorn's master imports the worker class (gunicorn/config.py:115-123) and must
not import LiteLLM: the app (sparkops_gateway_auth:app) is imported by each worker only (no --preload), so each
new worker reads the configuration afresh (docs/gateway.md, "Reloads")."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

import gateway_reload  # plugins/module_utils/gateway_reload.py, installed beside this file (stdlib only)
from gunicorn.arbiter import Arbiter
from uvicorn.server import Server
from uvicorn.workers import UvicornWorker

POLL_S = 0.05


class CloseWhenRetired:
    """Every response that starts once the worker is retired (its server's should_exit, set by the master's
    TERM: uvicorn/server.py:351-356) says `connection: close`, so its client opens the next connection, which
    the new worker accepts. h11 then closes the connection after that response (our side MUST_CLOSE, uvicorn/
    protocols/http/h11_impl.py on_response_complete)."""

    def __init__(self, app):
        self.app = app
        self.server = None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.server is None:
            await self.app(scope, receive, send)
            return

        async def send_(message):
            if message["type"] == "http.response.start" and self.server.should_exit:
                headers = list(message.get("headers") or [])
                if not any(name.lower() == b"connection" for name, _value in headers):
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_)


class LameDuckServer(Server):
    """A retired worker (TERM from gunicorn's master after a reload's TTOU) stops accepting, then lets every
    open connection end by itself before uvicorn's own shutdown (server.py:281-311) runs: each response that
    starts now says `connection: close` (CloseWhenRetired); a stream already under way ends as a kept-alive
    response, and its connection then serves one more request with `connection: close` or closes on its own
    keep-alive timer (h11_impl.py:359-367), as any idle connection does every day.
    uvicorn's shutdown alone closes idle connections at once and closes a stream's connection right after its
    last chunk although the headers said keep-alive: a client that sends its next request on it in that moment
    gets "Server disconnected without sending a response" or "Connection reset by peer" (seen once in each run
    of three reloads with four clients streaming back to back: docs/gateway.md).
    Bounded by gunicorn's --timeout: the master kills a worker that stopped notifying it (arbiter.py:488-507)."""

    async def shutdown(self, sockets=None) -> None:
        # No longer accepting: no longer ready. The reload sees its TTOU was obeyed (gateway_reload.py).
        ready_dir = os.environ.get("SPARKOPS_GATEWAY_READY_DIR")
        if ready_dir:
            with contextlib.suppress(OSError):
                gateway_reload.ready_path(ready_dir, os.getpid()).unlink()
        for server in getattr(self, "servers", []):
            server.close()
        for sock in sockets or []:
            sock.close()
        while self.server_state.connections and not self.force_exit:
            await asyncio.sleep(POLL_S)
        await super().shutdown(sockets=None)


class Worker(UvicornWorker):
    CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS, "server_header": False}

    async def _serve(self) -> None:
        # UvicornWorker._serve (uvicorn/workers.py:95-101) with LameDuckServer and CloseWhenRetired.
        app = CloseWhenRetired(self.wsgi)
        self.config.app = app
        server = LameDuckServer(config=self.config)
        app.server = server
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
