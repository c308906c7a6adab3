"""The reload with the real gunicorn 23.0.0, uvicorn 0.54.0, the gateway's worker class and app wrapper, on
loopback: clients stream back to back while the config changes; each change is applied by gateway_reload
(TTIN, the new worker's ready file, TTOU) and no request fails.

LiteLLM is replaced by a small ASGI app behind the real wrapper (RequireKeyEverywhere + ReadyMarker) that reads
CONFIG_FILE_PATH in its lifespan startup, as LiteLLM does (litellm/proxy/proxy_server.py:1441-1466), after
STARTUP_S, and streams the config's first line. Skipped unless the interpreter has gunicorn, uvicorn and httpx
(the gateway's venv has them: `.venv-gw/bin/pytest tests/unit/sim/test_gateway_reload_gunicorn.py`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT
from double_fixtures import free_port

pytest.importorskip("gunicorn")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))
import gateway_reload as gr  # noqa: E402 - as installed beside the wrapper

APP = r"""
import asyncio, os
import sparkops_gateway_auth as auth

LOADED = {}

class Store:
    def entry_for(self, key):
        return {"name": "alice", "key_class": "interactive"} if key == "sk-good" else None

async def inner(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await asyncio.sleep(float(os.environ["STARTUP_S"]))
                LOADED["line"] = open(os.environ["CONFIG_FILE_PATH"]).readline().strip()
                await send({"type": "lifespan.startup.complete"})
            elif m["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    for i in range(20):
        await send({"type": "http.response.body", "body": f"{LOADED['line']}|{i}\n".encode(), "more_body": True})
        await asyncio.sleep(0.1)
    await send({"type": "http.response.body", "body": b"end\n"})

app = auth.RequireKeyEverywhere(inner, Store(), ready=auth.ready_marker())
"""


@pytest.mark.timeout(240)
def test_clients_streaming_through_config_changes_see_no_failure(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    config = tmp_path / "config.yaml"
    config.write_text("version 0\n")
    (tmp_path / "standin_app.py").write_text(APP)
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), str(ROOT / "roles" / "gateway" / "files"), str(ROOT / "plugins" / "module_utils")]
            + sys.path
        ),
        "CONFIG_FILE_PATH": str(config),
        "SPARKOPS_GATEWAY_READY_DIR": str(run),
        "STARTUP_S": "1.5",
    }
    # The role's argv (roles/gateway/vars/main.yml gateway_argv), on loopback.
    argv = [sys.executable, "-m", "gunicorn", "standin_app:app", "--worker-class", "sparkops_gateway_worker.Worker"]
    argv += ["--workers", "1", "--bind", f"127.0.0.1:{port}", "--pid", str(run / "gunicorn.pid")]
    argv += ["--graceful-timeout", "30", "--timeout", "60", "--keep-alive", "5"]
    log = (tmp_path / "gunicorn.log").open("w")
    master = subprocess.Popen(argv, env=env, stdout=log, stderr=log)  # noqa: S603
    ok, failed, seen, stop = [0], [], set(), threading.Event()
    lock = threading.Lock()

    def client():
        with httpx.Client(headers={"Authorization": "Bearer sk-good"}, timeout=15) as c:
            while not stop.is_set():
                try:
                    with c.stream("GET", f"http://127.0.0.1:{port}/v1/chat/completions") as r:
                        body = r.read().decode()
                    assert r.status_code == 200 and body.endswith("end\n"), (r.status_code, body[-60:])
                    with lock:
                        ok[0] += 1
                        seen.add(body.split("|")[0])
                except Exception as exc:  # noqa: BLE001 - every failure counts
                    with lock:
                        failed.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.05)

    try:
        end = time.monotonic() + 60
        while not list(run.glob("*.ready")):
            assert time.monotonic() < end and master.poll() is None, (tmp_path / "gunicorn.log").read_text()[-3000:]
            time.sleep(0.1)
        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(2.5)
        results = []
        for version in (1, 2, 3):
            config.write_text(f"version {version}\n")
            reloader = gr.Reloader(
                run / "gunicorn.pid",
                run,
                config,
                uid=os.geteuid(),
                app="standin_app:app",
                tail=lambda: gr.log_tail(tmp_path / "gunicorn.log"),
            )
            results.append(reloader.run(timeout=60, wait_old_exit=True, old_exit_timeout=60))
            time.sleep(2.5)
        stop.set()
        for t in threads:
            t.join(30)
        assert failed == [] and ok[0] > 20, (failed, ok)
        # Each configuration was served: the old worker's streams finished on it, then the new one took over.
        assert seen == {f"version {v}" for v in range(4)}
        for res in results:
            assert res["changed"] and res["old_exited"] and len(res["old_pids"]) == 1
            assert 1.5 <= res["switch_s"] < 30  # it waited for the new worker's startup
        assert [pid for pid, _s in gr.children(master.pid)] == [results[-1]["new_pid"]]
        assert (
            gr.Reloader(run / "gunicorn.pid", run, config, uid=os.geteuid(), app="standin_app:app").run(timeout=10)[
                "changed"
            ]
            is False
        )
    finally:
        stop.set()
        master.send_signal(signal.SIGTERM)
        try:
            master.wait(40)
        except subprocess.TimeoutExpired:
            master.kill()
