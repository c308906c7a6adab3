"""image_build_watch in a real ansible-playbook run on localhost: one poll waits inside the task for up to
wait_s, reading the log again every 2 s, and returns as soon as the build has ended; the until loop's delay
no longer decides when the end is seen (a 30 s delay made every build at least 30 s long)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[4]


def playbook(tmp_path: Path, log: Path, wait_s: int) -> Path:
    task = {
        "name": "Wait for the build",
        "sparkops.cluster.image_build_watch": {"log_path": str(log), "run_id": "r1", "wait_s": wait_s},
        "register": "watch",
        "until": "watch.finished",
        "retries": 3,
        "delay": 1,
    }
    show = {"name": "Show", "ansible.builtin.debug": {"msg": "finished={{ watch.finished }} rc={{ watch.rc }}"}}
    play = [{"name": "Watch", "hosts": "localhost", "connection": "local", "gather_facts": False}]
    play[0]["tasks"] = [task, show]
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump(play))
    return book


def run(book: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}"
    t0 = time.monotonic()
    argv = ["ansible-playbook", "-i", "localhost,", str(book)]
    res = subprocess.run(argv, check=False, capture_output=True, text=True, env=env, timeout=120)
    return res, time.monotonic() - t0


def test_the_end_of_a_running_build_is_seen_within_seconds_not_a_whole_poll(tmp_path):
    log = tmp_path / "image-build.log"
    log.write_text("#5 [builder 1/9] FROM docker.io/nvidia/cuda\n")
    ended = []

    def finish_later():
        time.sleep(4)
        (tmp_path / "image-build.log.rc").write_text("0 r1\n")
        ended.append(time.monotonic())

    threading.Thread(target=finish_later, daemon=True).start()
    res, _took = run(playbook(tmp_path, log, wait_s=60))
    returned = time.monotonic()
    assert res.returncode == 0, res.stdout[-3000:]
    assert "finished=True rc=0" in res.stdout
    # One poll of up to 60 s saw the end within its 2 s recheck (and ansible-playbook's exit), not at 60 s.
    assert ended and returned - ended[0] < 15, returned - ended[0]


def test_a_failed_build_fails_the_poll_at_once_with_its_log(tmp_path):
    log = tmp_path / "image-build.log"
    log.write_text("#9 ERROR: process did not complete successfully: exit code: 1\n")
    (tmp_path / "image-build.log.rc").write_text("1 r1\n")
    res, took = run(playbook(tmp_path, log, wait_s=60))
    assert res.returncode != 0
    assert str(log) in res.stdout
    assert took < 30, took  # an ended build is not waited on
