"""A stand-in gunicorn master (fake_gunicorn_master.py, real processes) driven for the reload's tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ansible_collections.sparkops.cluster.plugins.module_utils import gateway_reload as gr

FAKE = Path(__file__).resolve().parent / "fake_gunicorn_master.py"


class Master:
    def __init__(self, tmp_path, boot_s=0.3, drain_s=0.5):
        self.pidfile = tmp_path / "gunicorn.pid"
        self.ready = tmp_path / "run"
        self.ready.mkdir()
        self.config = tmp_path / "config.yaml"
        self.config.write_text("model_list: [a]\n")
        self.proc = subprocess.Popen(  # noqa: S603 - our own stand-in
            [sys.executable, str(FAKE), str(self.pidfile), str(self.ready), str(self.config), str(boot_s), str(drain_s)]
        )
        self.signals = []
        self.wait_for(lambda: self.workers() and self.ready_pids(), "the first worker's ready file")

    def workers(self):
        return [pid for pid, _start in gr.children(self.proc.pid)] if self.pidfile.exists() else []

    def ready_pids(self):
        return sorted(int(p.name.split(".")[0]) for p in self.ready.glob("*.ready"))

    def wait_for(self, cond, what, limit=10.0):
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if cond():
                return
            time.sleep(0.05)
        raise AssertionError(f"no {what} within {limit} s")

    def kill(self, pid, sig):
        self.signals.append(signal.Signals(sig).name)
        os.kill(pid, sig)

    def reloader(self, **kw):
        return gr.Reloader(self.pidfile, self.ready, self.config, kill=self.kill, tail=lambda: "LOG TAIL", **kw)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
