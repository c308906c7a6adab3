"""A stand-in gunicorn master (fake_gunicorn_master.py, real processes) driven for the reload's tests.

As in production the master runs as its own unprivileged user and owns the run folder: when the tests run as root,
a throwaway uid (THROWAWAY_UID, no passwd entry needed) in a folder under /tmp that uid can reach; otherwise the
current user."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ansible_collections.sparkops.cluster.plugins.module_utils import gateway_reload as gr

FAKE = Path(__file__).resolve().parent / "fake_gunicorn_master.py"
ROOT = Path(__file__).resolve().parents[2]
# What the head installs beside each other in the gateway's lib folder (roles/gateway/tasks/install.yml).
LIB_FILES = [
    ROOT / "roles" / "gateway" / "files" / "sparkops_gateway_auth.py",
    ROOT / "plugins" / "module_utils" / "gateway_keys.py",
    ROOT / "plugins" / "module_utils" / "gateway_reload.py",
]
THROWAWAY_UID = 64123
# The fake needs only the standard library; the system's Python is reachable by any uid (a venv under /root is not).
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def as_root() -> bool:
    return os.geteuid() == 0


def world_dir(prefix="gw-reload-") -> Path:
    """A folder under /tmp that the throwaway uid can traverse (pytest's tmp_path is 0700 root)."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    base.chmod(0o755)
    return base


class Master:
    def __init__(self, tmp_path, boot_s=0.3, drain_s=0.5, app=gr.APP_SPEC):
        self.uid = THROWAWAY_UID if as_root() else os.geteuid()
        self.base = world_dir() if as_root() else Path(tmp_path)
        self.ready = self.base / "run"
        self.ready.mkdir()
        self.pidfile = self.ready / "gunicorn.pid"
        self.config = self.base / "config.yaml"
        self.config.write_text("model_list: [a]\n")
        self.config.chmod(0o644)
        (self.base / "bin").mkdir()
        gunicorn = self.base / "bin" / "gunicorn"
        gunicorn.symlink_to(FAKE)
        self.lib = self.base / "lib"
        self.lib.mkdir()
        for path in LIB_FILES:
            shutil.copy(path, self.lib / path.name)
        # The two secrets as the role writes them: root's, readable by the gateway's group (0640).
        self.secrets = {}
        for name in ("LITELLM_MASTER_KEY", "SPARKOPS_VLLM_API_KEY"):
            path = self.base / name.lower()
            path.write_text(f"sk-{name.lower()}\n")
            path.chmod(0o640)
            if as_root():
                os.chown(path, 0, self.uid)
            self.secrets[name] = path
        if as_root():
            os.chown(self.ready, self.uid, self.uid)
        # The service's environment (roles/gateway/vars/main.yml gateway_environment), the parts a worker reads.
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(self.lib),
            "CONFIG_FILE_PATH": str(self.config),
            "SPARKOPS_GATEWAY_READY_DIR": str(self.ready),
            "LITELLM_MASTER_KEY_FILE": str(self.secrets["LITELLM_MASTER_KEY"]),
            "SPARKOPS_VLLM_API_KEY_FILE": str(self.secrets["SPARKOPS_VLLM_API_KEY"]),
        }
        drop = {"user": self.uid, "group": self.uid, "extra_groups": []} if as_root() else {}
        argv = [PYTHON, str(gunicorn), app, str(self.pidfile), str(self.ready), str(self.config)]
        self.proc = subprocess.Popen(  # noqa: S603 - our own stand-in
            [*argv, str(boot_s), str(drain_s)], env=env, cwd=self.base, **drop
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
        return gr.Reloader(
            self.pidfile, self.ready, self.config, uid=self.uid, kill=self.kill, tail=lambda: "LOG TAIL", **kw
        )

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)
        if as_root():
            shutil.rmtree(self.base, ignore_errors=True)
