# Copyright: sparkops maintainers
# Apache-2.0
"""Reload the gateway's configuration with no moment without a ready worker (docs/gateway.md, "Reloads").

The gateway runs as gunicorn 23.0.0 with uvicorn's worker class and no --preload: each worker imports
LiteLLM's app itself, and LiteLLM reads CONFIG_FILE_PATH only in its startup (litellm/proxy/proxy_server.py:1441-
1466 in 1.108.7). So a new worker serves the file as it is when it starts. gunicorn's own HUP spawns the new
workers and, in the same pass, kills the old ones (arbiter.py:433-486: reload() spawns cfg.workers new ones, then
manage_workers() TERMs the oldest surplus at once, 564-576), without waiting for the new ones to be ready:
for the seconds LiteLLM takes to start no worker accepts. Instead:

1. TTIN: the master wants one worker more and spawns it (arbiter.py:268-274); it loads the new file.
2. The new worker's ready file appears: the app wrapper (roles/gateway/files/sparkops_gateway_auth.py) writes
   `<ready_dir>/<pid>.ready`, holding the SHA-256 of the file it loaded, when LiteLLM's startup has completed
   (write_ready), and removes it at shutdown.
3. TTOU: the master wants one worker less and TERMs the OLDEST (arbiter.py:276-284, 573-576: workers sorted by
   age, popped from the front). uvicorn's worker then stops accepting and finishes its requests
   (uvicorn/server.py:281-311); the listening socket stays open in the master and the new worker.

What is a worker: a child of the master (from /proc), ordered by start time. A worker this module already
TTOU'd is marked `<pid>.retired` (with its start time, so a reused pid is not mistaken), so a second run while
it still drains sends no second TTOU. TTOU is sent only while the youngest worker is ready with the wanted
digest, so the one it keeps is always a ready one (the master never goes below one worker: arbiter.py:281).
If the new worker never becomes ready nothing is TTOU'd: the old one keeps serving, and a later run picks the
booting worker up.

Trust: the run folder belongs to the gateway's user, and so does everything in it (gunicorn writes the pidfile as
that user, the workers their ready files), so LiteLLM's user can plant links, FIFOs or a pidfile naming any process
there. The reload therefore runs as that user (`reload()`: from root it forks and the child drops to the user's
uid/gid before it reads anything; systemd's ExecReload runs as the unit's User= already): what it writes and what
it signals are only what that user could write and signal anyway. And it trusts no file there: each is opened with
O_NOFOLLOW | O_NONBLOCK and must be a regular file (`read_regular`), a marker is written to a fresh O_EXCL name and
renamed over the old one (a planted link is replaced, never written through), and a signal goes only to a pid
whose process is the gateway user's gunicorn master (`check_master`: /proc/<pid>/status's uids and its cmdline
naming gunicorn and the app).

Also runnable as a script (`python gateway_reload.py --pidfile ... --ready-dir ... --config ... --user NAME`): the
service's `reload` action. Pure Python with injected clock, sleep, kill and /proc: tests/unit/plugins/module_utils/
test_gateway_reload.py, with a real process standing in for gunicorn's master.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READY_SUFFIX = ".ready"
RETIRED_SUFFIX = ".retired"
# Written instead of a digest when the file changed while the worker's LiteLLM was reading it: which one it
# loaded is unknown, so no run takes that worker for the wanted configuration.
UNKNOWN_DIGEST = "unknown"
POLL_S = 0.2
TTOU_SPACING_S = 0.3  # signals of one kind do not queue: one at a time, each seen by the master first
SPAWN_SEEN_S = 10.0  # a TTIN that shows no new child within this long is sent again, once
# With workers still draining, gunicorn spawns nothing for a TTIN until its count exceeds theirs too (see
# start_worker): the next TTIN goes when this long after the last one no new child shows (its main loop wakes at
# once on a signal, and at least every second: arbiter.py:353-359).
SPAWN_STEP_S = 1.0
PREFLIGHT_TIMEOUT_S = 60.0
# Run by the master's Python, as the gateway's user, with the master's environment and folder: the app's module
# imported as gunicorn's worker imports it (gunicorn/util.py:370), then what the wrapper does before LiteLLM.
PREFLIGHT = (
    "import importlib, sys\n"
    "importlib.import_module(sys.argv[1].partition(':')[0])\n"
    "import sparkops_gateway_auth\n"
    "print(' '.join(sparkops_gateway_auth.preflight()))\n"
)
# A retired worker withdraws its ready file when its shutdown starts (sparkops_gateway_worker.py, within a
# tick of the master's TERM); one still there after this long got no TERM (a TTOU lost): one more TTOU.
RETIRE_SEEN_S = 3.0
RETIRE_LIMIT_S = 10.0
LOG_TAIL_LINES = 30
# What gunicorn's master runs: the role's argv names the app first (roles/gateway/vars/main.yml gateway_argv);
# gunicorn's own title, where setproctitle is installed, is "gunicorn: master [<app>]" (gunicorn/util.py:50-53,
# arbiter.py:198; the proc name defaults to the app argument: app/wsgiapp.py:34).
APP_SPEC = "sparkops_gateway_auth:app"
READ_LIMIT = 4096  # a pid, a digest, a start time: anything longer is not ours
# Stands for the log's end in an error raised by the unprivileged child; the parent reads the log (reload()).
_LOG_FROM_PARENT = "\0log-from-parent\0"


class ReloadError(Exception):
    """What went wrong and how to fix it; `details` go into the module's result."""

    def __init__(self, msg: str, **details):
        super().__init__(msg)
        self.details = details


# ------------------------------------------------------------------------------------- files both sides share
def config_digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def ready_path(ready_dir, pid: int) -> Path:
    return Path(ready_dir) / f"{pid}{READY_SUFFIX}"


def write_ready(ready_dir, pid: int, digest: str) -> Path:
    """The worker's side: atomically, so a reader never sees half a digest."""
    path = ready_path(ready_dir, pid)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(digest + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def clear_worker_files(ready_dir, pid: int) -> None:
    """The worker's side, at start and at shutdown: a dead worker's files must not speak for a new one that
    got its pid."""
    for suffix in (READY_SUFFIX, RETIRED_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            (Path(ready_dir) / f"{pid}{suffix}").unlink()


class NotRegularFile(OSError):
    """A path in the gateway user's folder that is a link, FIFO, device or folder: never ours, never followed."""


def read_regular(path, limit: int = READ_LIMIT) -> str:
    """A small regular file's text, never through a link (O_NOFOLLOW: ELOOP) nor blocking on a FIFO the gateway's
    user planted (O_NONBLOCK, then fstat must say regular). FileNotFoundError when absent."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise NotRegularFile(errno.ELOOP, "is a symbolic link", str(path)) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "is not a regular file", str(path))
        return os.read(fd, limit).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def replace_file(path, text: str) -> None:
    """Write `path` without following what is there: a fresh O_CREAT|O_EXCL|O_NOFOLLOW file beside it (mkstemp),
    renamed over it. rename(2) replaces a link planted at `path` with our file; it never writes through it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ------------------------------------------------------------------------------------------ reading the master
def read_master(pidfile) -> int:
    try:
        text = read_regular(pidfile).strip()
    except NotRegularFile as err:
        raise ReloadError(
            f"{pidfile} {err.strerror}: gunicorn writes a plain file there, so something else put this one. Stop "
            "the gateway, remove it, look at who can write to its folder, and start the gateway."
        ) from None
    except FileNotFoundError:
        raise ReloadError(
            f"{pidfile} does not exist: the gateway is not running under gunicorn (or not at all). Start it "
            "(service sparkops-gateway start, or run the gateway role, which restarts it when its argv changed)"
        ) from None
    except OSError as err:
        raise ReloadError(
            f"cannot read {pidfile}: {err.strerror}; the gateway's user, which the reload runs as, must be able to"
        ) from None
    if not text.isdigit():
        raise ReloadError(f"{pidfile} holds {text[:40]!r}, not a pid: stop and start the gateway to rewrite it")
    return int(text)


def proc_stat(pid: int, proc="/proc") -> tuple[int, int] | None:
    """(ppid, start time in clock ticks) of a live, non-zombie process, else None."""
    try:
        text = (Path(proc) / str(pid) / "stat").read_text(encoding="utf-8")
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces and ")"
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def proc_uids(pid: int, proc="/proc") -> tuple[int, ...] | None:
    """The real, effective, saved and filesystem uids of a process (/proc/<pid>/status `Uid:`), None if gone."""
    try:
        text = (Path(proc) / str(pid) / "status").read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    for line in text.splitlines():
        if line.startswith("Uid:"):
            return tuple(int(v) for v in line.split()[1:])
    return None


def proc_argv(pid: int, proc="/proc") -> list[str]:
    try:
        raw = (Path(proc) / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return []
    return [a.decode("utf-8", errors="replace") for a in raw.split(b"\0") if a]


def proc_environ(pid: int, proc="/proc") -> dict[str, str]:
    raw = (Path(proc) / str(pid) / "environ").read_bytes()
    pairs = (item.decode("utf-8", errors="surrogateescape").partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _eq, value in pairs}


def check_master(pid: int, uid: int, *, app: str = APP_SPEC, proc="/proc", pidfile="the pidfile") -> None:
    """Refuse (ReloadError) unless `pid` is the gateway user's gunicorn master: every uid of the process (real,
    effective, saved, filesystem) is the user's, and its command line runs gunicorn (`python .../bin/gunicorn`,
    `python -m gunicorn`, or gunicorn's own title "gunicorn: master [...]") with the app. No rule on
    its parent: a process of the user that passes this could have been started by LiteLLM's user itself, but
    signalling that user's own process gives it nothing it did not have (and reload() signals as that user)."""
    why = None
    uids = proc_uids(pid, proc)
    argv = proc_argv(pid, proc)
    if uids is None or proc_stat(pid, proc) is None:
        why = "no such live process"
    elif any(u != uid for u in uids):
        why = f"it runs as uid {uids[0]}, not the gateway's user (uid {uid})"
    else:
        title = argv[0] if argv else ""
        gunicorn = (
            (len(argv) > 1 and os.path.basename(argv[1]) == "gunicorn")  # python .../bin/gunicorn (its script)
            or os.path.basename(title) == "gunicorn"  # the script exec'd directly
            or argv[1:3] == ["-m", "gunicorn"]
            or title.startswith("gunicorn: master [")
        )
        if not (gunicorn and (app in argv or f"[{app}]" in title)):
            why = f"its command line is not gunicorn's with {app}: {' '.join(argv)[:160]!r}"
    if why:
        raise ReloadError(
            f"{pidfile} names pid {pid}, which is not the gateway's gunicorn master ({why}): nothing was signalled. "
            "If the gateway runs, its pidfile was overwritten: restart the gateway (service sparkops-gateway "
            "restart) and look at who writes in its run folder.",
            master_pid=pid,
        )


def children(master: int, proc="/proc") -> list[tuple[int, int]]:
    """The master's children as (pid, start), oldest first (gunicorn's workers)."""
    out = []
    for entry in Path(proc).iterdir():
        if not entry.name.isdigit():
            continue
        stat = proc_stat(int(entry.name), proc)
        if stat is not None and stat[0] == master:
            out.append((int(entry.name), stat[1]))
    return sorted(out, key=lambda w: (w[1], w[0]))


def read_worker_files(ready_dir, workers) -> tuple[dict[int, str], set[int]]:
    """{pid: digest} of the workers' ready files, and the pids this module marked retired (start matching)."""
    ready, retired = {}, set()
    for pid, start in workers:
        # A link, FIFO or other non-file counts as absent: only a plain file speaks for a worker.
        with contextlib.suppress(FileNotFoundError, NotRegularFile):
            ready[pid] = read_regular(ready_path(ready_dir, pid)).strip()
        with contextlib.suppress(FileNotFoundError, NotRegularFile):
            if read_regular(Path(ready_dir) / f"{pid}{RETIRED_SUFFIX}").strip() == str(start):
                retired.add(pid)
    return ready, retired


def log_tail(log_file=None, unit=None, lines=LOG_TAIL_LINES, run=subprocess.run) -> str:
    """The end of the gateway's log, for a failure's message: its file (init script) or its journal."""
    if log_file:
        try:
            with open(log_file, encoding="utf-8", errors="replace") as handle:
                return "".join(handle.readlines()[-lines:])
        except OSError as err:
            return f"(cannot read {log_file}: {err.strerror})"
    if unit:
        try:
            out = run(
                ["journalctl", "-u", unit, "-n", str(lines), "--no-pager"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"(cannot read the journal of {unit}: {err})"
        return out.stdout
    return ""


# --------------------------------------------------------------------------------------------------- the reload
class Reloader:
    def __init__(
        self,
        pidfile,
        ready_dir,
        config,
        *,
        uid: int,
        app: str = APP_SPEC,
        proc="/proc",
        kill=os.kill,
        clock=time.monotonic,
        sleep=time.sleep,
        tail=lambda: "",
        preflight: bool = True,
        run=subprocess.run,
    ):
        self.pidfile, self.ready_dir, self.config, self.proc = pidfile, Path(ready_dir), config, proc
        self.uid, self.app = uid, app
        self.preflight_on, self.run_cmd = preflight, run
        self.kill, self.clock, self.sleep, self.tail = kill, clock, sleep, tail
        self.ttin_sent = 0

    def signal(self, master: int, sig) -> None:
        """Every signal goes through here: only to the gateway user's gunicorn master, checked right before."""
        check_master(master, self.uid, app=self.app, proc=self.proc, pidfile=self.pidfile)
        self.kill(master, sig)

    def state(self, master: int):
        if proc_stat(master, self.proc) is None:
            raise ReloadError(
                f"the gateway's master (pid {master}, from {self.pidfile}) is not running: it stopped during the "
                "reload or the pidfile is stale. Its log follows; fix what it says and start the gateway.",
                log=self.tail(),
            )
        workers = children(master, self.proc)
        ready, retired = read_worker_files(self.ready_dir, workers)
        return workers, ready, retired

    def mark_retired(self, pid: int, start: int) -> None:
        replace_file(self.ready_dir / f"{pid}{RETIRED_SUFFIX}", f"{start}\n")

    def run(self, *, timeout: float, check_mode: bool = False, force: bool = False, wait_old_exit=False,
            old_exit_timeout: float = 660.0) -> dict:  # fmt: skip
        started = self.clock()
        try:
            want = config_digest(self.config)
        except OSError as err:
            raise ReloadError(f"cannot read the gateway's configuration {self.config}: {err.strerror}") from None
        master = read_master(self.pidfile)
        if proc_stat(master, self.proc) is not None:  # a dead one: state() says to start the gateway
            check_master(master, self.uid, app=self.app, proc=self.proc, pidfile=self.pidfile)
        workers, ready, retired = self.state(master)
        live = [w for w in workers if w[0] not in retired]
        result = {"changed": False, "digest": want, "master_pid": master, "old_pids": [], "new_pid": None,
                  "switch_s": None, "old_exited": None}  # fmt: skip
        current = [pid for pid, _s in live if ready.get(pid) == want]
        if live and live[-1][0] in current and len(live) == 1 and not force:
            result["new_pid"] = live[-1][0]
            result["msg"] = f"worker {live[-1][0]} already serves this configuration (sha256 {want[:12]})"
            if wait_old_exit:
                result.update(self.wait_gone(master, [w for w in workers if w[0] in retired], old_exit_timeout))
            return result
        result["changed"] = True
        result["old_pids"] = [pid for pid, _s in live]
        if check_mode:
            result["msg"] = (
                f"would start a worker with the configuration (sha256 {want[:12]}) and retire worker(s) "
                f"{', '.join(map(str, result['old_pids'])) or 'none'} once it is ready"
            )
            return result

        self.ttin_sent = 0
        if not force and live and ready.get(live[-1][0]) == want:
            new = live[-1]  # an earlier run's worker came up after that run gave up: retire the others now
        else:
            new = self.start_worker(
                master, workers, live, ready, want, force=force, deadline=started + timeout, result=result
            )
        result["new_pid"] = new[0]
        workers, _ready, retired = self.state(master)
        if new not in workers or workers[-1] != new:
            raise ReloadError(
                f"worker {new[0]} was ready but is no longer the youngest live worker (it exited, or the master "
                "started another): nothing was retired; run again.",
                new_pid=new[0],
                old_pids=result["old_pids"],
            )
        older = workers[:-1]  # every worker started before the new one (gunicorn's age order)
        to_retire = [w for w in older if w[0] not in retired]
        for index, (pid, start) in enumerate(to_retire):
            if index:
                self.sleep(TTOU_SPACING_S)
            self.mark_retired(pid, start)
            self.signal(master, signal.SIGTTOU)
        self.confirm_retired(master, to_retire, new)
        # Only awaited a worker that was starting already, and none to retire: nothing was changed by this run.
        result["changed"] = bool(to_retire or self.ttin_sent)
        result["switch_s"] = round(self.clock() - started, 2)
        result["old_pids"] = [pid for pid, _s in older]
        result["msg"] = (
            f"worker {new[0]} serves the configuration (sha256 {want[:12]}) after {result['switch_s']} s; "
            f"retired {', '.join(map(str, result['old_pids'])) or 'none'}"
        )
        if wait_old_exit:
            result.update(self.wait_gone(master, older, old_exit_timeout))
        return result

    def preflight(self, master: int, result) -> None:
        """Refuse (nothing signalled) when a new worker would fail while gunicorn loads the app: that worker exits
        3 before it booted and the master halts with every worker, the serving one too (gunicorn/arbiter.py:524-532,
        611-621). A new worker is a fork of the master that imports the app, so the check runs the master's own
        Python (its argv[0]) with its environment and folder, as this process's user (the gateway's): the wrapper's
        import and its secrets as that worker would read them (sparkops_gateway_auth.preflight)."""
        argv = proc_argv(master, self.proc)
        python = argv[0] if argv and os.path.isabs(argv[0]) else None
        if python is None or not os.path.exists(python):
            return  # gunicorn's title replaced its argv (setproctitle): no interpreter to run it with
        try:
            env = proc_environ(master, self.proc)
        except OSError as err:
            raise ReloadError(f"cannot read the master's environment (pid {master}): {err.strerror}") from None
        try:
            cwd = os.readlink(Path(self.proc) / str(master) / "cwd")
        except OSError:
            cwd = None
        try:
            out = self.run_cmd(
                [python, "-c", PREFLIGHT, self.app],
                env={**env, "SPARKOPS_GATEWAY_PREFLIGHT": "1"},  # the wrapper without LiteLLM's import
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=PREFLIGHT_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise ReloadError(f"could not check that a new worker would load the app: {err}") from None
        if out.returncode != 0:
            lines = (out.stderr or out.stdout or "").strip().splitlines()
            raise ReloadError(
                f"a new worker would fail to load the app ({lines[-1] if lines else f'exit {out.returncode}'}), "
                "and gunicorn's master stops every worker when one fails to boot: nothing was signalled, the old "
                f"worker(s) {', '.join(map(str, result['old_pids'])) or 'none'} keep serving. Fix the gateway's "
                "files (the wrapper, its secret files, the service's environment) and run again.",
                log="\n".join(lines[-20:]),
                old_pids=result["old_pids"],
            )

    def start_worker(self, master, workers, live, ready, want, *, force, deadline, result):
        """TTIN (unless a worker an earlier run asked for is still starting: that one is awaited), then wait,
        bounded, until the youngest worker is one started for this run (or that one) and ready with `want`.

        gunicorn counts a worker it TERMed until it has reaped it, and TERMs it again on every pass while the count
        exceeds num_workers (arbiter.py:564-576). After an earlier reload, num_workers is the workers that are not
        draining, so while `draining` workers still finish their requests one TTIN spawns nothing (len(WORKERS) is
        not below num_workers): up to draining + 1 TTINs go, one at a time, each only when the last one showed no
        new child. As soon as the new child exists, one TTOU per TTIN beyond the one needed brings num_workers back
        to the workers that are not draining, so the master spawns nothing more when the drainers exit; each of
        those TTOUs TERMs the oldest surplus, which are the drainers (older than every other worker)."""
        before = {pid for pid, _s in workers}
        pending = live[-1] if (not force and live and live[-1][0] not in ready) else None
        live0, draining = len(live), len(workers) - len(live)
        budget, resent, balanced = draining + 1, False, False
        sent, sent_at = 0, None
        if pending is None and self.preflight_on:
            self.preflight(master, result)
        while True:
            workers, ready, retired = self.state(master)
            youngest = workers[-1] if workers else None
            fresh = [w for w in workers if w[0] not in before]
            if fresh and sent and not balanced:
                balanced = True
                extra = live0 + sent - len([w for w in workers if w[0] not in retired])
                for index in range(max(extra, 0)):
                    if index:
                        self.sleep(TTOU_SPACING_S)
                    self.signal(master, signal.SIGTTOU)
                continue
            if (
                youngest is not None
                and ready.get(youngest[0]) == want
                and (youngest[0] not in before or youngest == pending)
            ):
                return youngest
            if pending is not None and (pending not in workers or pending[0] in ready):
                pending = None  # it died, or came up with another configuration: start one now
                if self.preflight_on:
                    self.preflight(master, result)
            if fresh and ready.get(fresh[-1][0]) not in (None, want):
                raise ReloadError(
                    f"the new worker {fresh[-1][0]} loaded another configuration (sha256 "
                    f"{ready[fresh[-1][0]][:12]}, wanted {want[:12]}): {self.config} changed during the reload. "
                    "Nothing was retired; run again.",
                    new_pid=fresh[-1][0],
                    old_pids=result["old_pids"],
                )
            if pending is None and not fresh:
                since = self.clock() - sent_at if sent_at is not None else None
                # One TTIN per draining worker more, one at a time; then once more if the master shows no new
                # child for a while (a signal lost in a burst).
                step = sent < budget and (sent == 0 or since > SPAWN_STEP_S)
                lost = sent >= budget and not resent and since > SPAWN_SEEN_S
                if step or lost:
                    resent = resent or lost
                    self.signal(master, signal.SIGTTIN)
                    sent, sent_at = sent + 1, self.clock()
                    self.ttin_sent = sent
            if self.clock() >= deadline:
                booting = fresh[-1] if fresh else pending
                state = f"worker {booting[0]} started but is not ready" if booting else "the master started no worker"
                raise ReloadError(
                    f"the gateway did not get a worker ready with {self.config} (sha256 {want[:12]}) in time: "
                    f"{state}. The old worker(s) {', '.join(map(str, result['old_pids'])) or 'none'} were not "
                    "signalled and keep serving the previous configuration. The end of the gateway's log follows: "
                    "fix what it says (or allow more time) and run again; a worker still starting is picked up then.",
                    log=self.tail(),
                    new_pid=booting[0] if booting else None,
                    old_pids=result["old_pids"],
                )
            self.sleep(POLL_S)

    def confirm_retired(self, master: int, to_retire, new) -> None:
        """Bounded: every worker sent a TTOU for has begun its shutdown (its ready file withdrawn) or exited.
        gunicorn keeps no count of signals (arbiter.py:190-193 queues what its handler saw), so a TTOU lost means
        an old worker goes on serving the previous config: one more TTOU, which retires the oldest again and
        never the new one (the youngest; and the master keeps one worker at least, :281)."""
        started, resent = self.clock(), False
        while True:
            workers, ready, _retired = self.state(master)
            alive = {pid for pid, _s in workers}
            serving = [w for w in to_retire if w[0] in alive and w[0] in ready]
            if not serving:
                return
            waited = self.clock() - started
            if waited >= RETIRE_LIMIT_S:
                raise ReloadError(
                    f"worker(s) {', '.join(str(w[0]) for w in serving)} were retired (SIGTTOU to gunicorn's master "
                    f"{master}) but still serve after {waited:.0f} s; worker {new[0]} serves the new configuration "
                    "too. Run the reload again; if it persists, restart the gateway.",
                    new_pid=new[0],
                    old_pids=[w[0] for w in serving],
                )
            if not resent and waited >= RETIRE_SEEN_S and workers and workers[-1] == new:
                for index, _w in enumerate(serving):
                    if index:
                        self.sleep(TTOU_SPACING_S)
                    self.signal(master, signal.SIGTTOU)
                resent = True
            self.sleep(POLL_S)

    def wait_gone(self, master: int, olds, limit: float) -> dict:
        """Bounded: until every retired worker has exited (its in-flight requests ended)."""
        started = self.clock()
        pids = {pid for pid, _s in olds}
        while True:
            alive = {pid for pid, _s in children(master, self.proc)} & pids
            if not alive:
                return {"old_exited": True, "drain_s": round(self.clock() - started, 2)}
            if self.clock() - started >= limit:
                raise ReloadError(
                    f"worker(s) {', '.join(map(str, sorted(alive)))} still finish their requests after {limit:g} s; "
                    "the new worker serves every new request. Wait longer (old_exit_timeout) before stopping what "
                    "they stream from, or let gunicorn's --timeout end them.",
                    old_pids=sorted(pids),
                )
            self.sleep(POLL_S)


# ------------------------------------------------------------------------------------ as the gateway's user
def service_ids(user) -> tuple[int, int]:
    """(uid, gid) of the gateway's user, by name or number; root is refused (the gateway never runs as root)."""
    import pwd  # noqa: PLC0415 - Unix only, like the rest

    try:
        entry = pwd.getpwuid(int(user)) if str(user).isdigit() else pwd.getpwnam(str(user))
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        if not str(user).isdigit():
            raise ReloadError(
                f"user {user!r} does not exist: give the gateway's service user (sparkops_gateway_user)"
            ) from None
        uid = gid = int(user)  # a uid without a passwd entry (tests): its own group
    if uid == 0:
        raise ReloadError("user is root: the gateway runs as its own user; give that one (sparkops_gateway_user)")
    return uid, gid


def call_as(uid: int, gid: int, fn):
    """fn() with the rights of uid/gid only. As that user already (systemd's ExecReload): called here. As root:
    in a forked child that drops every id (groups, gid, uid: real, effective and saved) before fn runs, whose
    result or ReloadError comes back as JSON over a pipe; nothing of root's reaches what fn touches."""
    euid = os.geteuid()
    if euid == uid:
        return fn()
    if euid != 0:
        raise ReloadError(f"running as uid {euid}: run the reload as root or as the gateway's user (uid {uid})")
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - measured through the parent (coverage does not follow a fork by default)
        code = 0
        try:
            os.close(read_fd)
            os.setgroups([gid])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            try:
                out = {"result": fn()}
            except ReloadError as err:
                out = {"error": str(err), "details": err.details}
            except Exception as err:  # noqa: BLE001 - reported by the parent
                out = {"error": f"the reload failed: {type(err).__name__}: {err}", "details": {}}
            with os.fdopen(write_fd, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(out))
        except BaseException:  # noqa: BLE001 - the child never returns into the caller's code
            code = 70
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, encoding="utf-8") as handle:
        data = handle.read()
    _pid, status = os.waitpid(child, 0)
    try:
        out = json.loads(data)
    except ValueError:
        raise ReloadError(
            f"the reload's child could not become uid {uid}/gid {gid} or died (wait status {status}): nothing was "
            "signalled. Check that the gateway's user exists."
        ) from None
    if "error" in out:
        raise ReloadError(out["error"], **out.get("details") or {})
    return out["result"]


def reload(pidfile, ready_dir, config, *, user, timeout: float, tail=lambda: "", app: str = APP_SPEC, **run_kw) -> dict:
    """The reload as the gateway's user (call_as); the log's end, for a failure, read by the caller's rights."""
    uid, gid = service_ids(user)

    def work():
        reloader = Reloader(pidfile, ready_dir, config, uid=uid, app=app, tail=lambda: _LOG_FROM_PARENT)
        return reloader.run(timeout=timeout, **run_kw)

    try:
        return call_as(uid, gid, work)
    except ReloadError as err:
        if err.details.get("log") == _LOG_FROM_PARENT:
            err.details["log"] = tail()
        raise


def main(argv=None) -> int:
    """The service's `reload` action: the same reload, from the command line, as the gateway's user or root
    (which runs it as --user)."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pidfile", required=True)
    parser.add_argument("--ready-dir", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--user", required=True, help="the gateway's service user (name or uid)")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--log-file")
    parser.add_argument("--unit")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    try:
        result = reload(
            args.pidfile,
            args.ready_dir,
            args.config,
            user=args.user,
            tail=lambda: log_tail(args.log_file, args.unit),
            timeout=args.timeout,
            force=args.force,
        )
    except ReloadError as err:
        sys.stdout.write(f"reload failed: {err}\n")
        if err.details.get("log"):
            sys.stdout.write(f"{err.details['log']}\n")
        return 1
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
