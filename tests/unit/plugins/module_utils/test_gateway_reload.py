"""The gateway's zero-downtime reload (plugins/module_utils/gateway_reload.py) against real processes: a stand-in
for gunicorn's master that handles TTIN/TTOU as gunicorn 23.0.0's arbiter does (tests/unit/fake_gunicorn_master.py),
whose workers write the ready file the app wrapper writes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import gateway_reload as gr
from gateway_reload_helpers import Master


@pytest.fixture
def master(tmp_path):
    m = Master(tmp_path)
    yield m
    m.stop()


def test_an_unchanged_config_sends_nothing(master):
    [pid] = master.workers()
    r = master.reloader().run(timeout=10)
    assert r["changed"] is False and r["new_pid"] == pid and master.signals == []


def test_a_changed_config_gets_a_ready_worker_before_the_old_one_is_retired(master):
    [old] = master.workers()
    master.config.write_text("model_list: [a, b]\n")
    want = hashlib.sha256(master.config.read_bytes()).hexdigest()
    r = master.reloader().run(timeout=10, wait_old_exit=True, old_exit_timeout=10)
    assert r["changed"] is True and r["old_pids"] == [old] and r["new_pid"] not in (None, old)
    assert master.signals == ["SIGTTIN", "SIGTTOU"]
    # The new worker loaded the new file, and was ready (its file written) before TTOU went out.
    assert (master.ready / f"{r['new_pid']}.ready").read_text().strip() == want
    assert 0.3 <= r["switch_s"] < 5  # at least the stand-in's boot time: it waited for the ready file
    # The old worker finished its "requests" (the stand-in's 0.3 s) first; the reloader's clock starts a little
    # after the stand-in's, so a loaded machine reads a bit less than 0.3 s, never ~0 as without the wait.
    assert r["old_exited"] is True and r["drain_s"] >= 0.2
    assert master.workers() == [r["new_pid"]]
    # A second run: nothing to do, no signal.
    master.signals.clear()
    assert master.reloader().run(timeout=10)["changed"] is False and master.signals == []


def test_a_run_while_the_old_worker_drains_sends_no_second_ttou(master):
    [old] = master.workers()
    master.config.write_text("model_list: [c]\n")
    first = master.reloader().run(timeout=10)
    assert old in master.workers()  # still draining (0.5 s)
    second = master.reloader().run(timeout=10, wait_old_exit=True, old_exit_timeout=10)
    assert second["changed"] is False and master.signals == ["SIGTTIN", "SIGTTOU"]
    assert second["old_exited"] is True and master.workers() == [first["new_pid"]]


def test_check_mode_says_what_would_happen_and_signals_nothing(master):
    before = master.workers()
    master.config.write_text("model_list: [d]\n")
    r = master.reloader().run(timeout=10, check_mode=True)
    assert r["changed"] is True and r["old_pids"] == before and "would start" in r["msg"]
    time.sleep(0.3)
    assert master.signals == [] and master.workers() == before


def test_force_replaces_the_worker_even_when_the_digest_matches(master):
    """The secrets and the wrapper are read by each new worker: changed, they need a new worker, same config."""
    [old] = master.workers()
    r = master.reloader().run(timeout=10, force=True, wait_old_exit=True, old_exit_timeout=10)
    assert r["changed"] and r["new_pid"] != old and master.workers() == [r["new_pid"]]


def test_a_worker_that_never_gets_ready_leaves_the_old_one_serving_untouched(master):
    [old] = master.workers()
    (master.ready / "hang").write_text("")
    master.config.write_text("model_list: [broken]\n")
    with pytest.raises(gr.ReloadError, match="keep serving") as err:
        master.reloader().run(timeout=1.5)
    assert master.signals == ["SIGTTIN"]  # no TTOU: the oldest (the serving one) was never asked to go
    assert err.value.details["log"] == "LOG TAIL" and err.value.details["old_pids"] == [old]
    booting = err.value.details["new_pid"]
    time.sleep(0.5)
    assert master.workers() == [old, booting] and (master.ready / f"{old}.ready").exists()
    # A later run awaits the worker still starting (no second TTIN); it stays stuck, so that run fails too,
    # again without TTOU: the serving worker is never the one let go.
    master.signals.clear()
    with pytest.raises(gr.ReloadError):
        master.reloader().run(timeout=1.0)
    assert "SIGTTOU" not in master.signals and old in master.workers()


def test_a_worker_that_gets_ready_after_a_run_gave_up_is_taken_by_the_next_run(tmp_path):
    m = Master(tmp_path, boot_s=1.5)
    try:
        [old] = m.workers()
        m.config.write_text("model_list: [slow]\n")
        with pytest.raises(gr.ReloadError, match="not ready"):
            m.reloader().run(timeout=0.6)
        m.signals.clear()
        r = m.reloader().run(timeout=10, wait_old_exit=True, old_exit_timeout=10)
        # No second TTIN: the booting worker of the earlier run was awaited, then the old one retired.
        assert m.signals == ["SIGTTOU"] and r["old_pids"] == [old] and m.workers() == [r["new_pid"]]
    finally:
        m.stop()


def test_an_old_worker_that_drains_too_long_is_reported_and_left_alone(tmp_path):
    m = Master(tmp_path, drain_s=3.0)
    try:
        [old] = m.workers()
        m.config.write_text("model_list: [long stream]\n")
        with pytest.raises(gr.ReloadError, match=rf"{old} still finish") as err:
            m.reloader().run(timeout=10, wait_old_exit=True, old_exit_timeout=0.8)
        assert err.value.details["old_pids"] == [old] and old in m.workers()
    finally:
        m.stop()


def test_no_pidfile_or_a_dead_master_says_to_start_the_gateway(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("x")
    with pytest.raises(gr.ReloadError, match="not running under gunicorn"):
        gr.Reloader(tmp_path / "none.pid", tmp_path, config, uid=os.geteuid()).run(timeout=1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])  # noqa: S603
    dead.wait()
    (tmp_path / "g.pid").write_text(f"{dead.pid}\n")
    with pytest.raises(gr.ReloadError, match="is not running") as err:
        gr.Reloader(tmp_path / "g.pid", tmp_path, config, uid=os.geteuid(), tail=lambda: "why").run(timeout=1)
    assert err.value.details["log"] == "why"
    (tmp_path / "g.pid").write_text("garbage")
    with pytest.raises(gr.ReloadError, match="not a pid"):
        gr.Reloader(tmp_path / "g.pid", tmp_path, config, uid=os.geteuid()).run(timeout=1)


def test_proc_stat_reads_a_command_name_with_spaces_and_parentheses(tmp_path):
    (tmp_path / "42").mkdir()
    fields = ["S", "7"] + ["0"] * 17 + ["12345"] + ["0"] * 10
    (tmp_path / "42" / "stat").write_text("42 (we ird) (x) " + " ".join(fields) + "\n")
    assert gr.proc_stat(42, tmp_path) == (7, 12345)
    (tmp_path / "42" / "stat").write_text("42 (z) Z 7 " + " ".join(["0"] * 30))
    assert gr.proc_stat(42, tmp_path) is None  # a zombie is no worker
    assert gr.proc_stat(43, tmp_path) is None


def test_the_worker_side_files(tmp_path):
    path = gr.write_ready(tmp_path, 7, "abc")
    assert path.read_text() == "abc\n" and not list(tmp_path.glob(".*tmp"))
    (tmp_path / "7.retired").write_text("1\n")
    gr.clear_worker_files(tmp_path, 7)
    assert list(tmp_path.iterdir()) == []
    gr.clear_worker_files(tmp_path, 7)  # nothing there: no error


def test_log_tail_reads_a_file_or_the_journal(tmp_path):
    log = tmp_path / "g.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert gr.log_tail(log, lines=2) == "line 98\nline 99\n"
    assert "cannot read" in gr.log_tail(tmp_path / "none.log")
    seen = []

    def run(argv, **kw):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout="journal\n")

    assert gr.log_tail(unit="sparkops-gateway", run=run) == "journal\n"
    assert seen[0][:3] == ["journalctl", "-u", "sparkops-gateway"]


def test_a_lost_ttou_is_sent_again_and_the_old_worker_retired(master):
    [old] = master.workers()
    (master.ready / "lose-ttou").write_text("")
    master.config.write_text("model_list: [lost]\n")
    r = master.reloader().run(timeout=20, wait_old_exit=True, old_exit_timeout=10)
    assert master.signals == ["SIGTTIN", "SIGTTOU", "SIGTTOU"] and not (master.ready / "lose-ttou").exists()
    assert r["old_pids"] == [old] and master.workers() == [r["new_pid"]]
