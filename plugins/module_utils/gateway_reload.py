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

Also runnable as a script (`python gateway_reload.py --pidfile ... --ready-dir ... --config ...`): the service's
`reload` action. Pure Python with injected clock, sleep, kill and /proc: tests/unit/plugins/module_utils/
test_gateway_reload.py, with a real process standing in for gunicorn's master.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
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
# A retired worker withdraws its ready file when its shutdown starts (sparkops_gateway_worker.py, within a
# tick of the master's TERM); one still there after this long got no TERM (a TTOU lost): one more TTOU.
RETIRE_SEEN_S = 3.0
RETIRE_LIMIT_S = 10.0
LOG_TAIL_LINES = 30


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


# ------------------------------------------------------------------------------------------ reading the master
def read_master(pidfile) -> int:
    try:
        text = Path(pidfile).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise ReloadError(
            f"{pidfile} does not exist: the gateway is not running under gunicorn (or not at all). Start it "
            "(service sparkops-gateway start, or run the gateway role, which restarts it when its argv changed)"
        ) from None
    except OSError as err:
        raise ReloadError(f"cannot read {pidfile}: {err.strerror}; run as root or as the gateway's user") from None
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
        with contextlib.suppress(FileNotFoundError):
            ready[pid] = ready_path(ready_dir, pid).read_text(encoding="utf-8").strip()
        try:
            if (Path(ready_dir) / f"{pid}{RETIRED_SUFFIX}").read_text(encoding="utf-8").strip() == str(start):
                retired.add(pid)
        except FileNotFoundError:
            pass
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
        proc="/proc",
        kill=os.kill,
        clock=time.monotonic,
        sleep=time.sleep,
        tail=lambda: "",
    ):
        self.pidfile, self.ready_dir, self.config, self.proc = pidfile, Path(ready_dir), config, proc
        self.kill, self.clock, self.sleep, self.tail = kill, clock, sleep, tail
        self.ttin_sent = 0

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
        (self.ready_dir / f"{pid}{RETIRED_SUFFIX}").write_text(f"{start}\n", encoding="utf-8")

    def run(self, *, timeout: float, check_mode: bool = False, force: bool = False, wait_old_exit=False,
            old_exit_timeout: float = 660.0) -> dict:  # fmt: skip
        started = self.clock()
        try:
            want = config_digest(self.config)
        except OSError as err:
            raise ReloadError(f"cannot read the gateway's configuration {self.config}: {err.strerror}") from None
        master = read_master(self.pidfile)
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
            self.kill(master, signal.SIGTTOU)
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

    def start_worker(self, master, workers, live, ready, want, *, force, deadline, result):
        """TTIN (unless a worker an earlier run asked for is still starting: that one is awaited), then wait,
        bounded, until the youngest worker is one started for this run (or that one) and ready with `want`."""
        before = {pid for pid, _s in workers}
        pending = live[-1] if (not force and live and live[-1][0] not in ready) else None
        sent, sent_at = 0, None
        while True:
            workers, ready, _retired = self.state(master)
            youngest = workers[-1] if workers else None
            if (
                youngest is not None
                and ready.get(youngest[0]) == want
                and (youngest[0] not in before or youngest == pending)
            ):
                return youngest
            if pending is not None and (pending not in workers or pending[0] in ready):
                pending = None  # it died, or came up with another configuration: start one now
            fresh = [w for w in workers if w[0] not in before]
            if fresh and ready.get(fresh[-1][0]) not in (None, want):
                raise ReloadError(
                    f"the new worker {fresh[-1][0]} loaded another configuration (sha256 "
                    f"{ready[fresh[-1][0]][:12]}, wanted {want[:12]}): {self.config} changed during the reload. "
                    "Nothing was retired; run again.",
                    new_pid=fresh[-1][0],
                    old_pids=result["old_pids"],
                )
            # One TTIN; once more if the master shows no new child for a while (a signal lost in a burst).
            if pending is None and not fresh and (sent == 0 or (sent == 1 and self.clock() - sent_at > SPAWN_SEEN_S)):
                self.kill(master, signal.SIGTTIN)
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
                    self.kill(master, signal.SIGTTOU)
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


def main(argv=None) -> int:
    """The service's `reload` action: the same reload, from the command line, as the gateway's user or root."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pidfile", required=True)
    parser.add_argument("--ready-dir", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--log-file")
    parser.add_argument("--unit")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    reloader = Reloader(args.pidfile, args.ready_dir, args.config, tail=lambda: log_tail(args.log_file, args.unit))
    try:
        result = reloader.run(timeout=args.timeout, force=args.force)
    except ReloadError as err:
        sys.stdout.write(f"reload failed: {err}\n")
        if err.details.get("log"):
            sys.stdout.write(f"{err.details['log']}\n")
        return 1
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
