"""gateway_reload as Ansible runs it, against the stand-in gunicorn master (tests/unit/fake_gunicorn_master.py).
The reload's cases in depth: tests/unit/plugins/module_utils/test_gateway_reload.py."""

from __future__ import annotations

import os
import shutil

import pytest
from ansible_collections.sparkops.cluster.plugins.modules import gateway_reload as mod
from gateway_reload_helpers import THROWAWAY_UID, Master, as_root, world_dir
from module_runner import run_module


@pytest.fixture
def master(tmp_path):
    m = Master(tmp_path)
    yield m
    m.stop()


def args(m, **kw):
    return {"config": str(m.config), "pidfile": str(m.pidfile), "ready_dir": str(m.ready), "user": str(m.uid), **kw}


def test_check_mode_then_a_real_switch_then_nothing(master):
    [old] = master.workers()
    master.config.write_text("model_list: [new]\n")
    r = run_module(mod, args(master), check_mode=True)
    assert r["changed"] and r["old_pids"] == [old] and "would" in r["msg"] and master.workers() == [old]
    r = run_module(mod, args(master, wait_old_exit=True, old_exit_timeout=10))
    assert r["changed"] and r["old_exited"] and r["new_pid"] != old and master.workers() == [r["new_pid"]]
    r = run_module(mod, args(master))
    assert not r["changed"] and r["new_pid"] == master.workers()[0]


def test_a_worker_never_ready_fails_with_the_log_and_keeps_the_old_one(master, tmp_path):
    [old] = master.workers()
    (master.ready / "hang").write_text("")
    master.config.write_text("model_list: [x]\n")
    log = tmp_path / "gateway.log"
    log.write_text("Traceback: LiteLLM could not parse the config\n")
    r = run_module(mod, args(master, timeout=1, log_file=str(log)))
    assert r["failed"] and "keep serving" in r["msg"] and "could not parse" in r["log"]
    assert old in master.workers() and (master.ready / f"{old}.ready").exists()


def test_bad_timeouts_a_missing_pidfile_and_a_root_or_unknown_user_are_refused(tmp_path):
    base = world_dir() if as_root() else tmp_path
    try:
        config = base / "c.yaml"
        config.write_text("x")
        config.chmod(0o644)
        user = str(THROWAWAY_UID if as_root() else os.geteuid())
        common = {"config": str(config), "pidfile": str(base / "none"), "ready_dir": str(base), "user": user}
        r = run_module(mod, {**common, "timeout": 0})
        assert r["failed"] and "timeout=0" in r["msg"]
        r = run_module(mod, common)
        assert r["failed"] and "start it" in r["msg"].lower()
        r = run_module(mod, {**common, "user": "root"})
        assert r["failed"] and "user is root" in r["msg"]
        r = run_module(mod, {**common, "user": "no-such-user-here"})
        assert r["failed"] and "does not exist" in r["msg"]
    finally:
        if as_root():
            shutil.rmtree(base)
