"""A stand-in for gunicorn 23.0.0's master with uvicorn's worker class, as real processes, for the reload's tests.

What it reproduces, from gunicorn/arbiter.py (23.0.0):
- the pidfile holds the master's pid (arbiter.py:131-136, Pidfile.create);
- TTIN: one worker more, spawned at once (handle_ttin, :268-274, then manage_workers/spawn_workers);
- TTOU: one worker less, ignored at one worker (handle_ttou, :276-284); manage_workers (:564-576) sorts the
  workers by age and TERMs the OLDEST surplus, again on every pass of the main loop while it has not exited
  (the loop calls manage_workers after each sleep, :206-210), as gunicorn does;
- a worker that died is replaced (manage_workers -> spawn_workers);
- a worker loads the app first, as gunicorn's does in init_process (workers/base.py load_wsgi -> util.import_app,
  util.py:362-417): it imports the app's module (the wrapper, from PYTHONPATH) and runs what the wrapper's `app`
  runs before LiteLLM's import (load_secret_files). If that raises, the worker exits 3, WORKER_BOOT_ERROR, since
  it never booted (arbiter.py:611-621), and the master, reaping an exit 3 or 4, halts: it stops every worker, the
  serving one too, removes its pidfile and exits (arbiter.py:524-532, halt :339-351, stop :372-397).
A worker here: after BOOT_S (LiteLLM's import and startup) it writes `<ready_dir>/<pid>.ready` holding the
SHA-256 of the config as it reads it then, as the app wrapper does, unless the file `<ready_dir>/hang` exists
(a worker that never becomes ready); on SIGTERM it withdraws that file (as sparkops_gateway_worker.py does when
its shutdown starts), finishes its "requests" for DRAIN_S (uvicorn's shutdown waits for open connections:
uvicorn/server.py:281-311) and exits. No kinder than gunicorn: a
second TERM does not hurry it (uvicorn forces only on a second SIGINT, server.py:351-356). The file
`<ready_dir>/lose-ttou` makes it drop the next TTOU once, as a signal coalesced with another would be.

Run it as gunicorn is run (the role's argv: `.../bin/gunicorn sparkops_gateway_auth:app ...`): through a link
named `gunicorn`, the app as the first argument, so its /proc/<pid>/cmdline is what the reload checks for
(gateway_reload.check_master); the helpers start it as a throwaway uid when the tests run as root.

python .../gunicorn APP PIDFILE READY_DIR CONFIG BOOT_S DRAIN_S
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import signal
import sys
import time
from pathlib import Path

APP = sys.argv[1]
PIDFILE, READY, CONFIG = sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])  # argv[1]: the app, as gunicorn's
BOOT_S, DRAIN_S = float(sys.argv[5]), float(sys.argv[6])
LIFETIME_S = 120  # bounded: a master a test forgot still ends


def worker() -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(time.monotonic()))
    signal.signal(signal.SIGTTIN, signal.SIG_DFL)
    signal.signal(signal.SIGTTOU, signal.SIG_DFL)
    me = os.getpid()
    ready = READY / f"{me}.ready"
    end = time.monotonic() + LIFETIME_S
    try:  # gunicorn's load_wsgi: the app's module, then its `app` (up to where LiteLLM would be imported)
        module = importlib.import_module(APP.partition(":")[0])
        getattr(module, "load_secret_files", lambda: None)()
    except Exception as err:  # noqa: BLE001 - as spawn_worker's `except Exception` (arbiter.py:618-620)
        sys.stderr.write(f"Exception in worker process: {err!r}\n")
        os._exit(3)
    time.sleep(BOOT_S)
    if not (READY / "hang").exists():
        digest = hashlib.sha256(CONFIG.read_bytes()).hexdigest()
        tmp = READY / f".{me}.tmp"
        tmp.write_text(digest + "\n")
        os.replace(tmp, ready)
    while not stop and time.monotonic() < end:
        time.sleep(0.02)
    ready.unlink(missing_ok=True)  # shutting down: not accepting, not ready (sparkops_gateway_worker.py)
    time.sleep(DRAIN_S)
    ready.unlink(missing_ok=True)
    os._exit(0)


def main() -> None:
    workers: dict[int, int] = {}  # pid -> age
    state = {"num": 1, "age": 0, "queue": []}

    def spawn():
        state["age"] += 1
        pid = os.fork()
        if pid == 0:
            worker()
        workers[pid] = state["age"]

    def halt(code):
        for pid in workers:  # stop(): TERM, then KILL what is left (its graceful timeout cut short here)
            os.kill(pid, signal.SIGTERM)
        time.sleep(0.5)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        Path(PIDFILE).unlink(missing_ok=True)
        os._exit(code)

    def manage():
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not pid:
                break
            workers.pop(pid, None)
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) in (3, 4):  # WORKER_BOOT_ERROR, APP_LOAD_ERROR
                halt(os.WEXITSTATUS(status))
        while len(workers) < state["num"]:
            spawn()
        by_age = sorted(workers.items(), key=lambda w: w[1])
        while len(by_age) > state["num"]:
            pid, _age = by_age.pop(0)
            os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTTIN, lambda *_: state["queue"].append("ttin"))
    signal.signal(signal.SIGTTOU, lambda *_: state["queue"].append("ttou"))
    signal.signal(signal.SIGTERM, lambda *_: state["queue"].append("term"))
    Path(PIDFILE).write_text(f"{os.getpid()}\n")
    end = time.monotonic() + LIFETIME_S
    manage()
    while time.monotonic() < end:
        while state["queue"]:
            sig = state["queue"].pop(0)
            if sig == "term":
                for pid in workers:
                    os.kill(pid, signal.SIGKILL)
                os._exit(0)
            if sig == "ttou" and (READY / "lose-ttou").exists():
                (READY / "lose-ttou").unlink()  # a signal lost (coalesced with another before the handler ran)
                continue
            if sig == "ttin":
                state["num"] += 1
            elif state["num"] > 1:
                state["num"] -= 1
            manage()
        time.sleep(0.05)
        manage()
    for pid in workers:
        os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
