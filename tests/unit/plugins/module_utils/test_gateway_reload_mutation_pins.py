"""The reload's edges (plugins/module_utils/gateway_reload.py): the journal read for a failure's message
(its exact argv and its 20 s bound), a worker pid the kernel reused after a retired worker exited, and the
message of a run that finds the configuration already served.

Equivalent mutants (tests/mutation/equivalents.py lists them; `make mutation` does not run them):
- proc_stat's `text[text.rindex(")") + 2 :]` -> `+ 1`: the slice then starts at the space after ")", which
  split() drops.
- Reloader.__init__'s `self.ttin_sent = 0` -> `-1`: run() sets it to 0 before anything reads it.
- run()'s `result["new_pid"] = live[-1][0]` -> `live[-0][0]`: that branch runs only when len(live) == 1, so
  live[0] is live[-1].
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import gateway_reload as gr
from gateway_reload_helpers import Master


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
