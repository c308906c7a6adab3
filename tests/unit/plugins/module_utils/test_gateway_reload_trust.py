"""The reload runs as root (the role's become, the init script's `reload`) but its run folder belongs to the
gateway's user (LiteLLM's, the largest attack surface on the head): what that user plants there must not make root
write through a link or signal a process that is not the gateway's gunicorn master. The master here is the
stand-in (tests/unit/fake_gunicorn_master.py) running as a throwaway uid, as gunicorn runs as sparkops-gateway."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import gateway_reload as gr
from gateway_reload_helpers import PYTHON, THROWAWAY_UID, Master, as_root, world_dir

needs_root = pytest.mark.skipif(not as_root(), reason="needs root to run the stand-in master as another uid")

# Records every signal the reload could send (TTIN, TTOU, TERM, HUP) on its stdout: the victim of a forged pidfile.
RECORDER = r"""
import os, signal, time
for s in (signal.SIGTTIN, signal.SIGTTOU, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, lambda n, f: os.write(1, (signal.Signals(n).name + "\n").encode()))
os.write(1, b"ready\n")
time.sleep(60)
"""


@pytest.fixture
def master(tmp_path):
    m = Master(tmp_path)
    yield m
    m.stop()


@pytest.fixture
def secret():
    """A root-only file in a root-owned folder: what a planted link points at."""
    base = world_dir("gw-secret-")
    path = base / "secret"
    path.write_text("SECRET\n")
    path.chmod(0o600)
    yield path
    shutil.rmtree(base)


def plant(path, uid):
    """As the gateway's user would: the thing it made is its own."""
    if as_root():
        os.lchown(path, uid, uid)


def reload_as_service_user(m, **kw):
    """What the module and the init script run: from root, in a child that became the gateway's user."""
    return gr.reload(m.pidfile, m.ready, m.config, user=str(m.uid), tail=lambda: "LOG TAIL", **kw)


def in_process_as_root(m, **kw):
    """The Reloader itself, in this (root) process: the file and pid checks alone must hold."""
    return m.reloader().run(**kw)


@needs_root
@pytest.mark.parametrize("run", [reload_as_service_user, in_process_as_root])
def test_a_planted_link_does_not_make_root_write_through_it(master, secret, run):
    [old] = master.workers()
    start = dict(gr.children(master.proc.pid))[old]
    # The marker the reload writes for the worker it retires, planted as a link to the root-only file.
    link = master.ready / f"{old}.retired"
    link.symlink_to(secret)
    plant(link, master.uid)
    master.config.write_text("model_list: [new]\n")
    r = run(master, timeout=10, wait_old_exit=True, old_exit_timeout=10)
    assert r["changed"] and r["old_pids"] == [old] and master.workers() == [r["new_pid"]]
    assert secret.read_text() == "SECRET\n" and secret.stat().st_mode & 0o777 == 0o600
    assert secret.stat().st_uid == 0
    # The link was replaced by the reload's own file (rename over it), not written through.
    assert not link.is_symlink() and link.read_text() == f"{start}\n"
    # The reload's own files were written by the gateway's user when it ran as that user.
    if run is reload_as_service_user:
        assert link.stat().st_uid == master.uid


@needs_root
@pytest.mark.parametrize("run", [reload_as_service_user, in_process_as_root])
def test_a_planted_ready_link_or_fifo_counts_for_nothing_and_blocks_nothing(master, secret, run):
    """A link naming a file that holds the wanted digest must not make a worker look ready; a FIFO must not hang
    the reload (O_NONBLOCK, then fstat: not a regular file)."""
    [old] = master.workers()
    (master.ready / "hang").write_text("")  # the next worker never writes its own ready file
    master.config.write_text("model_list: [forged]\n")
    secret.write_text(gr.config_digest(master.config) + "\n")  # "ready with the new config", if followed
    # The next worker's pid is not known in advance: plant for the pids that follow.
    planted = range(old + 1, old + 2001)
    for pid in planted:
        path = master.ready / f"{pid}.ready"
        if pid % 2:
            path.symlink_to(secret)
        else:
            os.mkfifo(path)
        plant(path, master.uid)
    began = time.monotonic()
    with pytest.raises(gr.ReloadError, match="keep serving") as err:
        run(master, timeout=1.5)
    assert err.value.details["new_pid"] in planted  # the booting worker's files were planted ones
    assert time.monotonic() - began < 8  # bounded by the timeout, no read blocked on a FIFO
    assert old in master.workers() and (master.ready / f"{old}.ready").is_file()  # the old one never retired


def start_recorder(uid=None):
    drop = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    proc = subprocess.Popen([PYTHON, "-c", RECORDER], stdout=subprocess.PIPE, **drop)  # noqa: S603
    assert proc.stdout.readline() == b"ready\n"
    return proc


def signals_seen(proc) -> bytes:
    proc.kill()  # SIGKILL: no handler, nothing more on stdout
    out, _err = proc.communicate(timeout=10)
    return out


@needs_root
@pytest.mark.parametrize("owner", ["root", "gateway user"])
@pytest.mark.parametrize("run", [reload_as_service_user, in_process_as_root])
def test_a_forged_pidfile_is_refused_and_the_process_it_names_gets_no_signal(master, run, owner):
    victim = start_recorder(None if owner == "root" else master.uid)
    try:
        master.pidfile.write_text(f"{victim.pid}\n")  # the gateway's user rewrote gunicorn's pidfile
        plant(master.pidfile, master.uid)
        master.config.write_text("model_list: [forged]\n")
        with pytest.raises(gr.ReloadError, match=rf"names pid {victim.pid}, which is not the gateway's gunicorn"):
            run(master, timeout=3)
        assert master.signals == []  # the in-process run's kill was never called
    finally:
        seen = signals_seen(victim)
    assert seen == b""  # the process named got no TTIN, TTOU, TERM or HUP


@needs_root
def test_the_reload_child_has_only_the_gateway_users_rights():
    """Even past the checks, what the child does is bounded by the user's rights: it cannot signal root's
    process (the kernel refuses), and it holds no group of root's."""
    ids = gr.call_as(THROWAWAY_UID, THROWAWAY_UID, lambda: [os.getresuid(), os.getresgid(), os.getgroups()])
    assert ids == [[THROWAWAY_UID] * 3, [THROWAWAY_UID] * 3, [THROWAWAY_UID]]
    victim = start_recorder()
    try:
        with pytest.raises(gr.ReloadError, match="PermissionError"):
            gr.call_as(THROWAWAY_UID, THROWAWAY_UID, lambda: os.kill(victim.pid, signal.SIGTTIN))
    finally:
        seen = signals_seen(victim)
    assert seen == b""


def test_a_pidfile_that_is_a_link_or_a_fifo_is_refused_at_once(master, secret):
    secret.write_text(f"{master.proc.pid}\n")  # names the real master: still not gunicorn's own file
    master.pidfile.unlink()
    master.pidfile.symlink_to(secret)
    with pytest.raises(gr.ReloadError, match="is a symbolic link"):
        master.reloader().run(timeout=2)
    master.pidfile.unlink()
    os.mkfifo(master.pidfile)
    began = time.monotonic()
    with pytest.raises(gr.ReloadError, match="is not a regular file"):
        master.reloader().run(timeout=2)
    assert time.monotonic() - began < 1 and master.signals == []


def fake_proc(root, pid, *, uids, argv, state="S"):
    d = root / str(pid)
    d.mkdir()
    (d / "status").write_text(f"Name:\tx\nUid:\t{uids[0]}\t{uids[1]}\t{uids[2]}\t{uids[3]}\nGid:\t1\t1\t1\t1\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "stat").write_text(f"{pid} (x) {state} 1 " + " ".join(["0"] * 30) + "\n")


def test_check_master_reads_uids_and_the_command_line(tmp_path):
    venv = "/opt/sparkops/gateway/venv/bin"
    fake_proc(tmp_path, 10, uids=[999] * 4, argv=[f"{venv}/python3", f"{venv}/gunicorn", gr.APP_SPEC, "--pid", "p"])
    fake_proc(tmp_path, 11, uids=[999] * 4, argv=[f"gunicorn: master [{gr.APP_SPEC}]"])  # setproctitle's title
    fake_proc(tmp_path, 12, uids=[999] * 4, argv=["/usr/bin/python3", "-m", "gunicorn", gr.APP_SPEC])
    fake_proc(tmp_path, 13, uids=[999, 999, 0, 999], argv=[f"{venv}/python3", f"{venv}/gunicorn", gr.APP_SPEC])
    fake_proc(tmp_path, 14, uids=[999] * 4, argv=["sleep", "600"])
    fake_proc(tmp_path, 15, uids=[999] * 4, argv=[f"{venv}/python3", f"{venv}/gunicorn", "other:app"])
    fake_proc(tmp_path, 16, uids=[999] * 4, argv=[f"{venv}/python3", "/tmp/x", f"{venv}/gunicorn", gr.APP_SPEC])
    fake_proc(tmp_path, 17, uids=[999] * 4, argv=["gunicorn: worker [sparkops_gateway_auth:app]"])
    fake_proc(tmp_path, 18, uids=[999] * 4, argv=[f"{venv}/gunicorn", gr.APP_SPEC], state="Z")
    for pid in (10, 11, 12):
        gr.check_master(pid, 999, proc=tmp_path)
    for pid, why in [
        (13, "runs as uid 999"),  # a saved uid of root's: not the user's process alone
        (14, "not gunicorn's"),
        (15, "not gunicorn's"),
        (16, "not gunicorn's"),
        (17, "not gunicorn's"),  # a worker is not the master
        (18, "no such live process"),
        (19, "no such live process"),
    ]:
        with pytest.raises(gr.ReloadError, match=why):
            gr.check_master(pid, 999, proc=tmp_path)
    with pytest.raises(gr.ReloadError, match="not the gateway's user"):
        gr.check_master(10, 1000, proc=tmp_path)


def test_read_regular_and_replace_file(tmp_path):
    (tmp_path / "f").write_text("12\n")
    assert gr.read_regular(tmp_path / "f") == "12\n"
    assert len(gr.read_regular(tmp_path / "f", limit=1)) == 1
    (tmp_path / "l").symlink_to(tmp_path / "f")
    with pytest.raises(gr.NotRegularFile):
        gr.read_regular(tmp_path / "l")
    with pytest.raises(FileNotFoundError):
        gr.read_regular(tmp_path / "none")
    gr.replace_file(tmp_path / "l", "mine\n")
    assert not (tmp_path / "l").is_symlink() and (tmp_path / "l").read_text() == "mine\n"
    assert (tmp_path / "f").read_text() == "12\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "l"]  # no temporary left
