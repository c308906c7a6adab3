"""The reload's edges (plugins/module_utils/gateway_reload.py): the journal read for a failure's message
(its exact argv and its 20 s bound), a worker pid the kernel reused after a retired worker exited, and the
message of a run that finds the configuration already served.

Equivalent mutants (tests/mutation/equivalents.py lists them; `make mutation` does not run them):
- proc_stat's `text[text.rindex(")") + 2 :]` -> `+ 1`: the slice then starts at the space after ")", which
  split() drops.
- Reloader.__init__'s `self.ttin_sent = 0` -> `-1`: run() sets it to 0 before anything reads it.
- Reloader.__init__'s `self.ttin_sent = 0` -> `1`: the same (run() sets it before anything reads it).
- run()'s `result["new_pid"] = live[-1][0]` -> `live[-0][0]`: that branch runs only when len(live) == 1, so
  live[0] is live[-1].
- proc_stat's and proc_argv's `except (FileNotFoundError, ProcessLookupError, NotADirectoryError)` without
  NotADirectoryError: on Linux's /proc a pid's entry is always a folder; a pid that is gone gives ENOENT (or
  ESRCH while it is reaped), never ENOTDIR.
- children()'s `key=lambda w: (w[1], w[0])` -> `(w[1], w[-1])` (the start twice): /proc lists pids in ascending
  order (fs/proc/base.c, proc_pid_readdir walks the tgids upward) and sorted() is stable, so workers started in
  the same clock tick still come out by pid.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import gateway_reload as gr
from conftest import ROOT
from gateway_reload_helpers import Master, as_root


def test_the_journal_is_read_without_a_pager_bounded_to_20_s_for_the_last_30_lines():
    seen = []

    def run(argv, **kw):
        seen.append((argv, kw))
        return subprocess.CompletedProcess(argv, 0, stdout="journal\n")

    assert gr.log_tail(unit="sparkops-gateway", run=run) == "journal\n"
    assert seen == [
        (
            ["journalctl", "-u", "sparkops-gateway", "-n", "30", "--no-pager"],
            {"capture_output": True, "text": True, "timeout": 20, "check": False},
        )
    ]


def test_a_journal_that_does_not_answer_is_said_in_the_message(tmp_path):
    def slow(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    assert gr.log_tail(unit="sparkops-gateway", run=slow).startswith("(cannot read the journal of sparkops-gateway:")
    log = tmp_path / "g.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert gr.log_tail(log) == "".join(f"line {i}\n" for i in range(70, 100))  # the last 30 by default
    assert gr.log_tail() == ""  # neither a file nor a unit: nothing to add


def test_a_reused_pid_is_not_taken_for_the_retired_worker(tmp_path):
    (tmp_path / "7.ready").write_text("abc\n")
    (tmp_path / "7.retired").write_text("100\n")  # retired when pid 7 had started at tick 100
    assert gr.read_worker_files(tmp_path, [(7, 100)]) == ({7: "abc"}, {7})
    assert gr.read_worker_files(tmp_path, [(7, 250)]) == ({7: "abc"}, set())  # a new process with pid 7
    assert gr.read_worker_files(tmp_path, [(8, 1)]) == ({}, set())


def test_a_dead_or_zombie_process_is_no_worker_of_the_master(tmp_path):
    """proc(5): state Z (zombie, not yet reaped) and X (dead) are processes that serve nothing."""

    def stat(pid, state, start):
        (tmp_path / str(pid)).mkdir()
        fields = [state, "7"] + ["0"] * 17 + [str(start)] + ["0"] * 10
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (gunicorn) " + " ".join(fields) + "\n")

    stat(20, "S", 300)
    stat(21, "Z", 100)
    stat(22, "X", 200)
    stat(23, "R", 50)
    assert gr.children(7, tmp_path) == [(23, 50), (20, 300)]
    assert gr.proc_stat(22, tmp_path) is None and gr.proc_stat(21, tmp_path) is None


def test_a_preflight_that_fails_saying_why_on_stdout_only_is_quoted(tmp_path):
    """The check's last line is the message's reason whichever stream it came on: a preflight that fails with
    nothing on stderr but its reason on stdout still names it, not only its exit status."""
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "cmdline").write_bytes(f"{sys.executable}\0{ROOT}/bin/gunicorn\0{gr.APP_SPEC}\0".encode())
    (tmp_path / "5" / "environ").write_bytes(b"PYTHONPATH=/opt/gw/lib\0")

    def run(argv, **kw):
        return subprocess.CompletedProcess(
            argv, 1, stdout="loading the app\nLITELLM_MASTER_KEY_FILE is empty\n", stderr=""
        )

    reloader = gr.Reloader(
        tmp_path / "pid", tmp_path, tmp_path / "config.yaml", uid=os.geteuid(), proc=tmp_path, run=run
    )
    with pytest.raises(gr.ReloadError) as err:
        reloader.preflight(5, {"old_pids": [9]})
    assert str(err.value).startswith("a new worker would fail to load the app (LITELLM_MASTER_KEY_FILE is empty), ")
    assert err.value.details == {"log": "loading the app\nLITELLM_MASTER_KEY_FILE is empty", "old_pids": [9]}


def test_a_worker_gunicorn_replaced_is_awaited_and_nothing_is_signalled_or_changed(tmp_path):
    """The only worker died and gunicorn's master started another, which still loads the configuration: a reload
    then waits for that worker, sends no signal, and reports no change (the new worker reads the same file)."""
    # A boot long enough that the replacement is still booting when the run starts, on a loaded machine too.
    m = Master(tmp_path, boot_s=6)
    try:
        [old] = m.workers()
        os.kill(old, signal.SIGKILL)
        seen = []

        def replaced():  # one reading of the master's children, kept: the next one may be taken mid-change
            seen[:] = m.workers()
            return len(seen) == 1 and seen != [old]

        m.wait_for(replaced, "the replacement worker")
        [new] = seen
        assert new not in m.ready_pids()  # still booting
        r = m.reloader().run(timeout=30)
        assert m.signals == []
        assert r["changed"] is False and r["new_pid"] == new and r["old_pids"] == []
    finally:
        m.stop()


def test_the_reload_script_run_as_root_prints_its_result_from_its_own_process(tmp_path):
    """The service's reload action as the init script runs it: the file as a script, in its own process. As root
    it drops to the gateway's user in a child and the parent prints the child's result (a parent that ran the
    child's part would exit with nothing printed). Keep it before the first in-process call_as as root (main() in
    test_a_reload_action_that_succeeds_prints_its_result_as_json): a parent that ran the child's part in-process
    would end pytest itself with exit status 0, which a mutation run reads as a pass."""
    m = Master(tmp_path)
    try:
        args = ["--pidfile", str(m.pidfile), "--ready-dir", str(m.ready), "--config", str(m.config)]
        script = ROOT / "plugins" / "module_utils" / "gateway_reload.py"
        res = subprocess.run(  # noqa: S603 - our own script
            [sys.executable, str(script), *args, "--user", str(m.uid)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        out = json.loads(res.stdout)
        assert out["changed"] is False and out["new_pid"] == m.workers()[0] and out["master_pid"] == m.proc.pid
        assert as_root() or m.uid == os.geteuid()  # as root, the child dropped to the throwaway uid (the helpers')
    finally:
        m.stop()


@pytest.fixture
def master(tmp_path):
    m = Master(tmp_path)
    yield m
    m.stop()


def test_a_run_that_finds_the_configuration_served_says_which_worker_serves_it(master):
    [pid] = master.workers()
    digest = hashlib.sha256(master.config.read_bytes()).hexdigest()
    r = master.reloader().run(timeout=10)
    assert r == {
        "changed": False,
        "digest": digest,
        "master_pid": master.proc.pid,
        "old_pids": [],
        "new_pid": pid,
        "switch_s": None,
        "old_exited": None,
        "msg": f"worker {pid} already serves this configuration (sha256 {digest[:12]})",
    }


def test_a_run_that_finds_the_configuration_served_still_waits_for_the_retired_worker(tmp_path):
    m = Master(tmp_path, drain_s=3.0)
    try:
        [old] = m.workers()
        m.config.write_text("model_list: [b]\n")
        first = m.reloader().run(timeout=10)
        assert old in m.workers()  # still draining
        second = m.reloader().run(timeout=10, wait_old_exit=True, old_exit_timeout=10)
        assert second["changed"] is False and second["old_exited"] is True and second["drain_s"] >= 1.0
        assert m.workers() == [first["new_pid"]]
    finally:
        m.stop()


def test_a_worker_ready_after_its_run_gave_up_is_taken_without_a_new_one(tmp_path):
    m = Master(tmp_path, boot_s=1.5)
    try:
        [old] = m.workers()
        m.config.write_text("model_list: [slow]\n")
        with pytest.raises(gr.ReloadError, match="not ready") as err:
            m.reloader().run(timeout=0.6)
        booting = err.value.details["new_pid"]
        m.wait_for(lambda: booting in m.ready_pids(), "the late worker's ready file")
        m.signals.clear()
        r = m.reloader().run(timeout=10)
        assert m.signals == ["SIGTTOU"]  # no TTIN: the worker that came up late serves the new file already
        assert r["changed"] is True and r["new_pid"] == booting and r["old_pids"] == [old]
    finally:
        m.stop()


def test_a_configuration_changed_during_the_reload_is_refused_and_nothing_retired(master):
    [old] = master.workers()
    master.config.write_text("model_list: [b]\n")
    want = hashlib.sha256(master.config.read_bytes()).hexdigest()
    edits = []

    def sleep(seconds):
        if not edits:  # the TTIN is out and the new worker boots: someone writes the file again
            master.config.write_text("model_list: [c]\n")
            edits.append(seconds)
        time.sleep(seconds)

    with pytest.raises(gr.ReloadError, match="changed during the reload. Nothing was retired; run again.") as err:
        master.reloader(sleep=sleep).run(timeout=8)
    assert f"wanted {want[:12]}" in str(err.value)
    assert master.signals == ["SIGTTIN"] and old in master.workers()
    new = master.workers()[-1]  # the worker that read the edited file
    assert err.value.details == {"new_pid": new, "old_pids": [old]}
    assert str(err.value).startswith(f"the new worker {new} loaded another configuration (sha256 ")


def test_a_run_gives_up_at_its_deadline_exactly(master):
    # The deadline is inclusive: with a clock that stands still at started + timeout (timeout 0), the run gives
    # up at its first look, after its TTIN, without one more poll.
    master.config.write_text("model_list: [late]\n")
    sleeps = []
    reloader = master.reloader(clock=lambda: 100.0, sleep=sleeps.append)
    with pytest.raises(gr.ReloadError, match="in time"):
        reloader.run(timeout=0)
    assert sleeps == [] and master.signals == ["SIGTTIN"]


def test_a_lost_ttin_is_sent_again_once_no_new_worker_showed_for_10_s(master):
    [old] = master.workers()
    master.config.write_text("model_list: [lost-ttin]\n")
    lost = []

    def kill(pid, sig):
        if sig == gr.signal.SIGTTIN and not lost:  # the first TTIN never reaches the master
            lost.append(sig)
            master.signals.append("SIGTTIN (lost)")
            return
        master.kill(pid, sig)

    now = [1000.0]

    def clock():
        now[0] += 0.25  # each look at the clock: a quarter second more (10 s pass in 20-40 polls)
        return now[0]

    r = gr.Reloader(
        master.pidfile, master.ready, master.config, uid=master.uid, kill=kill, clock=clock, tail=lambda: ""
    )
    result = r.run(timeout=120)
    # Both TTINs count as sent, so one TTOU takes back the spare worker the lost one would have made and one
    # retires the old worker; gunicorn ignores a TTOU at one worker (arbiter.py handle_ttou: num_workers <= 1).
    assert master.signals == ["SIGTTIN (lost)", "SIGTTIN", "SIGTTOU", "SIGTTOU"]
    assert result["old_pids"] == [old] and result["new_pid"] != old


def test_an_awaited_worker_that_comes_up_with_another_configuration_is_replaced(tmp_path):
    # A run awaits the worker an earlier run asked for; it comes up with another file than the one wanted
    # now (the file was changed back meanwhile): the run asks for a new worker instead of waiting for nothing.
    m = Master(tmp_path, boot_s=3)
    try:
        m.config.write_text("model_list: [b]\n")
        now = [0.0]

        def sleep(seconds):
            # The first run's 0.3 s start to pass once the master has forked the worker it asked for (on a loaded
            # machine the fork alone can take longer): what it gives up on is a worker still booting.
            m.wait_for(lambda: len(m.workers()) > 1, "the worker the first run asked for", limit=60)
            now[0] += seconds

        with pytest.raises(gr.ReloadError, match="not ready"):
            # its worker still boots (it reads the file at the end of its boot)
            m.reloader(clock=lambda: now[0], sleep=sleep).run(timeout=0.3)
        m.config.write_text("model_list: [c]\n")
        flips = []

        def sleep(seconds):
            if not flips:
                m.config.write_text("model_list: [b]\n")  # written back before the booting worker reads it
                flips.append(seconds)
            time.sleep(seconds)

        with pytest.raises(gr.ReloadError, match="changed during the reload"):
            m.reloader(sleep=sleep).run(timeout=10)
        assert m.signals == ["SIGTTIN", "SIGTTIN"]  # the second run asked for a worker of its own
    finally:
        m.stop()


def test_a_retired_worker_still_serving_gets_one_more_ttou_after_3_s_and_is_reported_after_10_s(master):
    [old] = master.workers()
    master.config.write_text("model_list: [deaf]\n")
    now = [0.0]

    def clock():
        now[0] += 0.5
        return now[0]

    sent = []

    def kill(pid, sig):
        if sig == gr.signal.SIGTTOU:  # every TTOU lost: the old worker keeps serving
            sent.append(now[0])
            return
        master.kill(pid, sig)

    reloader = gr.Reloader(
        master.pidfile, master.ready, master.config, uid=master.uid, kill=kill, clock=clock, tail=lambda: ""
    )
    with pytest.raises(
        gr.ReloadError, match=r"were retired \(SIGTTOU to gunicorn's master \d+\) but still serve"
    ) as err:
        reloader.run(timeout=120)
    new = master.workers()[-1]
    assert err.value.details == {"new_pid": new, "old_pids": [old]}
    assert len(sent) == 2 and sent[1] - sent[0] >= 3.0  # the one TTOU sent again only once 3 s passed


def test_the_service_s_reload_action_exits_1_and_says_why_when_it_fails(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("model_list: []\n")
    args = ["--pidfile", str(tmp_path / "none.pid"), "--ready-dir", str(tmp_path), "--config", str(config)]
    # Asked to run as root, it refuses before it reads anything: the gateway runs as its own user.
    assert gr.main([*args, "--user", "root"]) == 1
    assert capsys.readouterr().out.startswith("reload failed: user is root: the gateway runs as its own user")


def test_the_reload_action_s_help_says_what_it_does(capsys):
    with pytest.raises(SystemExit) as done:
        gr.main(["--help"])
    assert done.value.code == 0
    assert "Reload the gateway's configuration with no moment without a ready worker" in capsys.readouterr().out


def test_a_reload_action_that_succeeds_prints_its_result_as_json(master, capsys):
    args = ["--pidfile", str(master.pidfile), "--ready-dir", str(master.ready), "--config", str(master.config)]
    assert gr.main([*args, "--user", str(master.uid)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["changed"] is False and out["new_pid"] == master.workers()[0]


def test_the_drain_time_is_reported_to_the_hundredth_of_a_second(master):
    now = [0.0]

    def clock():
        now[0] += 0.25
        return now[0]

    r = master.reloader(clock=clock).run(timeout=10, wait_old_exit=True, old_exit_timeout=10)
    assert r["changed"] is False and r["old_exited"] is True and r["drain_s"] == 0.25
