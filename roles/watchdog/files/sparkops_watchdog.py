#!/usr/bin/env python3
"""sparkops watchdog: keeps a Ray + vLLM serving group alive, with bounds.

Runs on every node of the cluster, in a container of its own that chroots into
the host (see roles/watchdog/README.md for why), with the Python standard
library only. Two jobs:

* ``watch`` (head only): every ``interval_s`` it sends a short completion
  through the OpenAI API with a ``hang_timeout_s`` deadline for the first
  token, and looks at every worker's Ray container over the fabric SSH. On a
  hang, a dead or stopped worker, or ``failures_before_restart`` failed probes
  in a row it restarts the whole serving group in order (vLLM stopped, Ray
  head, Ray workers, membership, the model's files dropped from every node's
  page cache, vLLM, a completion), at most
  ``max_restarts_per_hour`` times in any hour, then stops restarting and says so
  (status ``gave_up``, event ``gave_up``, the reason and the next try in the
  state). It does not stay down for the rest of the hour: it tries once more
  after ``retry_after_budget_s``, then after twice that, and so on up to
  ``retry_after_budget_max_s`` between tries, until a try or any completion
  answers. It starts nothing while a node of the group lacks one of the group's
  SPARKOPS firewall chains (IPv4 or IPv6) or INPUT's jump to it: it says which
  (``firewall_missing``) and waits, blocked, until the chains are back (site.yml
  or the boot restore). A worker whose node does not answer is not restarted at
  all (a restart cannot bring a node back): the state says which node.
* ``floor`` (every node): every ``memory_check_s`` it reads the memory the
  host has left (MemAvailable, bounded by the host's own cgroup limit where it
  has one); below ``memory_floor_bytes`` it stops the container that holds
  vLLM on this node (``docker stop``: SIGTERM, then the grace period), writes
  a marker, and the watch loop restarts nothing while a marker exists.

Events go to syslog (``/dev/log``: the journal on DGX OS) and, one JSON object
a line with a UTC timestamp, to ``events_file``; the current state to
``state_file``. The API key is read from a file and never written anywhere.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from urllib.parse import urlsplit

IDENT = "sparkops-watchdog"
# Events logged to syslog at info; every other one is a warning.
QUIET_EVENTS = (
    "started",
    "restart_ended",
    "recovered",
    "probe_ok",
    "page_cache_dropped",
    "quality_ok",
    "quality_baseline",
)
LOCK = threading.Lock()
# vLLM 0.19.0's EngineDeadError (v1/engine/exceptions.py:13): a request's 500 or a stream's error chunk. /health
# answers 503 only then (entrypoints/serve/instrumentator/health.py:29-33). A dead engine never comes back.
ENGINE_DEAD = b"EngineCore encountered an issue"


# --------------------------------------------------------------------------- events
def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# What the state says while the watchdog has stopped restarting (cleared when serving answers again).
GAVE_UP_FIELDS = ("gave_up_reason", "gave_up_at", "restarts_in_hour", "retries_after_budget", "next_retry_epoch",
                  "next_retry_at")  # fmt: skip


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Events:
    """Append-only JSON lines plus syslog; never given a secret."""

    def __init__(self, path: str, node: str):
        self.path = path
        self.node = node

    def emit(self, event: str, message: str, **fields) -> dict:
        rec = {"ts": utc_now(), "epoch": round(time.time(), 3), "node": self.node, "event": event, "message": message}
        rec.update(fields)
        line = json.dumps(rec, sort_keys=True)
        with LOCK:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
            print(line, flush=True)
            _syslog(f"{event}: {message}", warning=event not in QUIET_EVENTS)
        return rec


def _syslog(msg: str, warning: bool) -> None:
    # /dev/log is journald's syslog socket on systemd hosts; where there is none
    # (the simulated nodes) the JSON lines and the container log are the record.
    if not os.path.exists("/dev/log"):
        return
    pri = 8 + (4 if warning else 6)  # facility user, severity warning/info
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect("/dev/log")
            s.send(f"<{pri}>{IDENT}: {msg}".encode())
    except OSError:
        pass


def write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- pure decisions
def restarts_in_window(restart_epochs: list[float], now: float, window_s: float = 3600.0) -> list[float]:
    return [t for t in restart_epochs if now - t < window_s]


def retry_delay(retries_done: int, cfg: dict) -> float:
    """Seconds from a spent restart budget (or a failed try after it) to the next try: the base, then twice as
    long each time, never more than the cap."""
    base = float(cfg.get("retry_after_budget_s", 600))
    cap = max(base, float(cfg.get("retry_after_budget_max_s", 3600)))
    return min(cap, base * (2 ** max(0, int(retries_done))))


def decide(observation: dict, state: dict, cfg: dict, now: float) -> dict:
    """What to do after one round of observation. Pure, unit-tested.

    observation: probe ("ok" | "busy" | "hang" | "dead" | "failed"), probe_detail, workers
    ({name: "running" | "stopped" | "missing" | "paused" | "unreachable"}),
    floor_tripped (list of nodes), in_grace (bool: vLLM or Ray was started
    moments ago by someone else, e.g. Ansible).
    Returns {"action": "none" | "restart" | "give_up" | "retry" | "blocked", "reason": str,
    "state": new state fields}. "retry": the restart budget is spent but the back-off since giving up
    (state next_retry_epoch, retry_delay) ran out: one more group restart outside the budget.
    """
    failures = int(state.get("consecutive_failures", 0))
    recent = restarts_in_window(state.get("restart_epochs", []), now)
    new = {"consecutive_failures": failures, "restart_epochs": recent}
    if observation.get("floor_tripped"):
        nodes = ", ".join(observation["floor_tripped"])
        return {"action": "blocked", "reason": f"memory floor tripped on {nodes}", "state": new}
    unreachable = sorted(n for n, s in observation.get("workers", {}).items() if s == "unreachable")
    if unreachable:
        new["consecutive_failures"] = failures + (0 if observation["probe"] == "ok" else 1)
        return {"action": "blocked", "reason": f"worker node unreachable: {', '.join(unreachable)}", "state": new}
    down = sorted(n for n, s in observation.get("workers", {}).items() if s != "running")
    if observation["probe"] in ("ok", "busy") and not down and not observation.get("quality_wrong"):
        new["consecutive_failures"] = 0
        return {"action": "none", "reason": "healthy", "state": new}
    if state.get("status") == "gave_up":
        # Given up: no restart within the budget, whatever the window says; one try each time the back-off
        # runs out, until a try or a completion answers.
        why = state.get("gave_up_reason") or state.get("reason", "")
        due = state.get("next_retry_epoch")
        if due is None:  # a state written before tries existed: the back-off starts now
            new["next_retry_epoch"] = now + retry_delay(int(state.get("retries_after_budget", 0)), cfg)
            return {"action": "none", "reason": f"given up: {why}", "state": new}
        if now < float(due):
            return {"action": "none", "reason": f"given up: {why}", "state": new}
        tries = int(state.get("retries_after_budget", 0)) + 1
        return {"action": "retry", "reason": f"try {tries} after the restart budget was spent: {why}", "state": new}
    if observation.get("in_grace") and not down and observation["probe"] != "hang":
        return {"action": "none", "reason": "starting (grace period)", "state": new}
    if observation.get("quality_wrong") and observation["probe"] in ("ok", "busy") and not down:
        # Answers, but wrongly (the quality thread's verdict, with quality_action "restart"): the group is
        # restarted within the same hourly budget, then judged again.
        reason = f"answers wrong: {observation['quality_wrong']}"
        if len(recent) >= int(cfg["max_restarts_per_hour"]):
            return {"action": "give_up", "reason": reason, "state": new}
        return {"action": "restart", "reason": reason, "state": new}
    if down:
        reason = "worker lost: " + ", ".join(f"{n} {observation['workers'][n]}" for n in down)
    elif observation["probe"] == "hang":
        reason = f"hang: no token within {cfg['hang_timeout_s']} s"
    elif observation["probe"] == "dead":
        # No K probes in a row: the engine does not recover, and its server exits by itself.
        reason = f"engine dead: {observation.get('probe_detail', '')}"
    else:
        failures += 1
        new["consecutive_failures"] = failures
        if failures < int(cfg["failures_before_restart"]):
            return {
                "action": "none",
                "reason": f"probe failed {failures}/{cfg['failures_before_restart']}",
                "state": new,
            }
        reason = f"{failures} failed probes in a row: {observation.get('probe_detail', '')}"
    if len(recent) >= int(cfg["max_restarts_per_hour"]):
        return {"action": "give_up", "reason": reason, "state": new}
    return {"action": "restart", "reason": reason, "state": new}


def available_bytes(meminfo: str, cgroup_limit: int | None, cgroup_used: int | None) -> int:
    """Memory the host has left: MemAvailable, bounded by its own cgroup where it has a limit."""
    avail = None
    total = None
    for line in meminfo.splitlines():
        key, _sep, rest = line.partition(":")
        if key in ("MemAvailable", "MemTotal"):
            val = int(rest.split()[0]) * 1024
            if key == "MemAvailable":
                avail = val
            else:
                total = val
    if avail is None:
        raise ValueError("no MemAvailable in /proc/meminfo")
    if cgroup_limit and cgroup_used is not None and (total is None or cgroup_limit < total):
        avail = min(avail, max(0, cgroup_limit - cgroup_used))
    return avail


# --------------------------------------------------------------------------- host access
def worker_state_script(cfg: dict) -> str:
    """The remote shell line that reads a worker's Ray container state and its memory floor marker.

    ssh hands the remote side one command line, which the user's shell parses: every value in it is
    quoted (shlex.quote), so a container name or path is one argument, never shell code.
    """
    fmt = shlex.quote("{{.State.Status}}")
    return (
        f"docker inspect --format {fmt} {shlex.quote(worker_container(cfg))} 2>/dev/null || echo missing; "
        f"test -e {shlex.quote(cfg['floor_marker'])} && echo floor-tripped || true"
    )


def runs_ray(cfg: dict) -> bool:
    """Whether the watched replica runs Ray: Ray's executor; not vLLM's own multi-node executor (`mp`),
    nor a single-node replica (`single`, vLLM alone: serving.py), whose restart is its vLLM's alone."""
    return cfg.get("executor", "ray") == "ray"


def worker_container(cfg: dict) -> str:
    """What runs the serving group's part on a worker: the Ray container (Ray's executor), or the
    rank's own vLLM container (vLLM's multi-node executor, `executor: mp`)."""
    return cfg["ray_container"] if runs_ray(cfg) else cfg["vllm_container"]


CHAIN_NAME = re.compile(r"^SPARKOPS-[A-Z0-9_-]{1,19}$")


def group_chains(cfg: dict) -> dict:
    """The SPARKOPS chains each node of the watched group needs before anything of it starts: the API's on
    the head, and Ray's (Ray's executor) or the ranks' (vLLM's mp executor) on every node of the group.
    `firewall_chains` in the config ({"head": [...], "workers": [...]}) replaces the default."""
    if cfg.get("firewall_chains") is not None:
        return {
            "head": list(cfg["firewall_chains"].get("head", [])),
            "workers": list(cfg["firewall_chains"].get("workers", [])),
        }
    executor = cfg.get("executor", "ray")
    group = {"ray": ["SPARKOPS-RAY"], "mp": ["SPARKOPS-MP"]}.get(executor, [])
    return {"head": ["SPARKOPS-API", *group], "workers": group}


def firewall_check_script(chains: list[str]) -> str:
    """A shell line (run on the head with sh -c, on a worker over SSH) that prints `TOOL:CHAIN:chain` for each
    chain missing and `TOOL:CHAIN:jump` for each chain INPUT does not jump to, for iptables and ip6tables;
    nothing when all are in place. Chain names are checked (letters, digits, - and _): no shell in them."""
    bad = [c for c in chains if not CHAIN_NAME.match(str(c))]
    if bad:
        raise ValueError(f"not a SPARKOPS chain name: {bad}")
    parts = [
        f"{{ {tool} -w -n -L {c} >/dev/null 2>&1 || echo {tool}:{c}:chain; }}; "
        f"{{ {tool} -w -S INPUT 2>/dev/null | grep -q -- ' -j {c}$' || echo {tool}:{c}:jump; }}"
        for tool in ("iptables", "ip6tables")
        for c in chains
    ]
    return "; ".join(parts) if parts else "true"


def parse_firewall_check(node: str, res: subprocess.CompletedProcess) -> list[str]:
    """What firewall_check_script printed, as sentences; a node that could not be asked is one too."""
    if res.returncode not in (0, 1) and not res.stdout.strip():
        return [f"{node}: could not read its firewall ({(res.stderr or '').strip()[:120] or res.returncode})"]
    out = []
    for line in res.stdout.split():
        tool, _colon, rest = line.partition(":")
        chain, _colon, what = rest.partition(":")
        if tool in ("iptables", "ip6tables") and CHAIN_NAME.match(chain) and what in ("chain", "jump"):
            out.append(
                f"{node}: {tool} chain {chain} " + ("is missing" if what == "chain" else "has no jump from INPUT")
            )
    return out


def worker_restart_script(cfg: dict) -> str:
    """The remote shell line that restarts a worker's container (quoted, as worker_state_script)."""
    return f"docker restart -t 10 {shlex.quote(worker_container(cfg))}"


def worker_stop_script(cfg: dict) -> str:
    """The remote shell line that stops a worker's container (quoted, as worker_state_script)."""
    return f"docker stop -t {int(cfg['stop_grace_s'])} {shlex.quote(worker_container(cfg))}"


def worker_start_script(cfg: dict) -> str:
    """The remote shell line that starts a worker's container again (quoted, as worker_state_script)."""
    return f"docker start {shlex.quote(worker_container(cfg))}"


def ssh_argv(cfg: dict, address: str, script: str) -> list[str]:
    """The ssh command line for one look at (or one action on) a worker, over one kept connection.

    The watch loop reaches every worker every interval_s; a new connection each time costs a key exchange on both
    nodes (about 0.3 s of CPU per look, measured on the simulated pair). One master connection per worker is kept
    (ControlMaster), for 4 intervals after its last use (ControlPersist), and given up once the worker stops
    answering its keepalives for 2 intervals (ServerAlive*): a worker that went away is then reached by a new
    connection, exactly as without the master. The sockets live in a 0700 folder beside the state file.
    """
    interval = max(1, int(float(cfg["interval_s"])))
    kept = []
    if ssh_control_path_fits(cfg):
        kept = [
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={ssh_control_dir(cfg)}/%C",
            "-o",
            f"ControlPersist={max(30, 4 * interval)}s",
            "-o",
            f"ServerAliveInterval={interval}",
            "-o",
            "ServerAliveCountMax=2",
        ]
    return ["ssh", *cfg["ssh_args"], *kept, f"{cfg['ssh_user']}@{address}", script]


# A unix socket's path has at most 107 bytes (sun_path); ssh names a master's socket <dir>/<40 hex of %C> and
# binds it first as that name plus ".<16 random characters>" (mux.c muxserver_listen). A longer folder would make
# every look fail ("ControlPath too long") and the worker look unreachable: the watchdog then connects anew
# each time instead.
_SUN_PATH_MAX = 107


def ssh_control_path_fits(cfg: dict) -> bool:
    return len(os.fsencode(ssh_control_dir(cfg))) + 1 + 40 + 17 <= _SUN_PATH_MAX


def ssh_control_dir(cfg: dict) -> str:
    """The folder of ssh_argv's control sockets, beside the state file."""
    return os.path.join(os.path.dirname(cfg["state_file"]) or ".", "ssh")


def make_ssh_control_dir(cfg: dict) -> None:
    """Root's only: a socket there is a logged-in session on a worker."""
    if not ssh_control_path_fits(cfg):
        return
    os.makedirs(ssh_control_dir(cfg), mode=0o700, exist_ok=True)
    os.chmod(ssh_control_dir(cfg), 0o700)


def sh(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout} s")


def container_state(name: str, timeout: float = 10) -> dict:
    res = sh(["docker", "inspect", "--format", "{{json .State}}", name], timeout)
    if res.returncode != 0:
        return {"Status": "missing"}
    return json.loads(res.stdout)


def parse_docker_time(stamp: str) -> float:
    # Docker prints nanoseconds; datetime takes microseconds.
    if not stamp or stamp.startswith("0001-"):
        return 0.0
    main, _sep, frac = stamp.rstrip("Z").partition(".")
    frac = (frac + "000000")[:6]
    return datetime.strptime(f"{main}.{frac}", "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def cgroup_memory() -> tuple[int | None, int | None]:
    """The limit and use of the cgroup that PID 1 (this host's init) lives in, v1 or v2."""
    try:
        lines = _read("/proc/1/cgroup").splitlines()
    except OSError:
        return None, None
    for line in lines:
        _hierarchy, ctrls, path = line.split(":", 2)
        if ctrls == "" and os.path.exists(f"/sys/fs/cgroup{path}/memory.max"):
            base = f"/sys/fs/cgroup{path}"
            limit = _read(f"{base}/memory.max").strip()
            if limit == "max":
                return None, None
            used = int(_read(f"{base}/memory.current"))
            inactive = _stat_value(f"{base}/memory.stat", "inactive_file")
            return int(limit), used - inactive
        if "memory" in ctrls.split(","):
            base = f"/sys/fs/cgroup/memory{path}"
            if not os.path.exists(f"{base}/memory.limit_in_bytes"):
                return None, None
            limit = int(_read(f"{base}/memory.limit_in_bytes"))
            used = int(_read(f"{base}/memory.usage_in_bytes"))
            inactive = _stat_value(f"{base}/memory.stat", "total_inactive_file")
            # cgroup v1 reports "no limit" as a huge page-aligned number.
            return (limit if limit < (1 << 60) else None), used - inactive
    return None, None


def _stat_value(path: str, key: str) -> int:
    try:
        for line in _read(path).splitlines():
            k, _sep, v = line.partition(" ")
            if k == key:
                return int(v)
    except OSError:
        pass
    return 0


# --------------------------------------------------------------------------- probe
GENERATION_TOKENS = "vllm:generation_tokens_total"


def generation_tokens(metrics_text: str) -> float | None:
    """The tokens vLLM has generated so far (vllm:generation_tokens_total, summed over its label sets, as
    vLLM 0.19.0 exports it from v1/metrics/loggers.py), or None when /metrics does not have it."""
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name == GENERATION_TOKENS:
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            seen = True
    return total if seen else None


# vLLM's /metrics is served by its API server, which answers within milliseconds while the engine is
# busy (a full batch): after a probe that got no token, a /metrics that does not answer within this is
# frozen with the engine, and the round says "hang" without waiting longer.
METRICS_AFTER_HANG_S = 1.0


def read_generation_tokens(cfg: dict, timeout: float = 3.0) -> float | None:
    """vLLM's /metrics (no key: the API middleware leaves it open for Prometheus); None when unreadable."""
    url = urlsplit(cfg["endpoint"])
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        return generation_tokens(resp.read(8 << 20).decode("utf-8", "replace")) if resp.status == 200 else None
    except (ConnectionError, OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def busy_not_hung(before: float | None, after: float | None) -> bool:
    """A probe that waited out the hang timeout on an engine that generated tokens meanwhile queued behind
    other requests (a full batch, a benchmark): the engine is busy, not hung. A hung engine (a TP member
    stuck in NCCL, a wedged pair) generates nothing for anyone."""
    return before is not None and after is not None and after > before


def probe(cfg: dict, api_key: str, timeout: float) -> tuple[str, str, float]:
    """A short streamed completion. Returns (ok|hang|dead|failed, detail, seconds to first token)."""
    url = urlsplit(cfg["endpoint"])
    body = json.dumps(
        {
            "model": cfg["model"],
            "prompt": cfg.get("probe_prompt", "ping"),
            "max_tokens": int(cfg.get("probe_max_tokens", 4)),
            "stream": True,
            "temperature": 0,
        }
    )
    start = time.monotonic()
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout)
    try:
        conn.request(
            "POST",
            "/v1/completions",
            body=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
        )
        resp = conn.getresponse()
        if resp.status != 200:
            if resp.status == 503 or ENGINE_DEAD in resp.read(4096):
                return "dead", f"HTTP {resp.status}: engine dead", time.monotonic() - start
            return "failed", f"HTTP {resp.status}", time.monotonic() - start
        while time.monotonic() - start < timeout:
            line = resp.fp.readline()
            if not line:
                return "failed", "stream ended before a token", time.monotonic() - start
            if line.startswith(b"data:") and ENGINE_DEAD in line:  # the error chunk of a stream (server_utils.py)
                return "dead", "stream error: engine dead", time.monotonic() - start
            if line.startswith(b"data:") and b'"text"' in line:
                return "ok", "", time.monotonic() - start
        return "hang", f"no token within {timeout} s", time.monotonic() - start
    except TimeoutError:
        return "hang", f"no token within {timeout} s", time.monotonic() - start
    except (ConnectionError, OSError, http.client.HTTPException) as exc:
        # An error can quote what the server sent (BadStatusLine quotes the status line), and a broken
        # server or proxy can echo the request's Authorization header: the key never reaches an event.
        detail = f"{type(exc).__name__}: {exc}"
        if api_key:
            detail = detail.replace(api_key, "<api key>")
        return "failed", detail[:200], time.monotonic() - start
    finally:
        conn.close()


# --------------------------------------------------------------------------- answer quality
def quality_outcome(returncode: int, stdout: str) -> dict:
    """What quality_probe.py said (its last JSON line; exit 0 right, 1 wrong, 2 not asked): {"state": "ok" |
    "wrong" | "error", "figures", "reasons", "error"}. Anything unreadable is an error, never a verdict."""
    data: dict = {}
    for line in reversed((stdout or "").strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            break
        data = {}
    verdict = data.get("verdict") if isinstance(data.get("verdict"), dict) else {}
    figures = data.get("figures") if isinstance(data.get("figures"), dict) else {}
    reasons = [str(r)[:300] for r in (verdict.get("reasons") or [])][:5]
    if returncode == 0 and verdict.get("ok") is True:
        return {"state": "ok", "figures": figures, "reasons": [], "error": ""}
    if returncode == 1 and verdict.get("ok") is False:
        return {"state": "wrong", "figures": figures, "reasons": reasons or ["wrong answers"], "error": ""}
    error = str(data.get("error") or f"quality probe exited {returncode} with no verdict")[:300]
    return {"state": "error", "figures": figures, "reasons": [], "error": error}


def baseline_for(stored: dict | None, key: str) -> dict | None:
    """The recorded figures when they were recorded for this deployment (`key`: model, image, command line)."""
    if isinstance(stored, dict) and stored.get("key") == key and isinstance(stored.get("figures"), dict):
        return stored["figures"]
    return None


class QualityChecker:
    """Every quality_interval_s, while serving is healthy, asks whether the engine answers RIGHT
    (quality_probe.py, installed next to this script: a reference passage's likelihood and known answers).
    Runs beside the watch loop so a slow probe never delays a hang's detection. The first right answer of a
    deployment is its baseline (kept in quality_baseline_file under the deployment's key); later ones are
    judged against it. A wrong verdict is an event (and a metric); with quality_action "restart" the watch loop
    restarts the group through its usual budget and the next probe judges it again."""

    def __init__(self, wd: Watchdog):
        self.wd = wd
        self.cfg = wd.cfg
        self.wrong: str | None = None  # the reasons while the last verdict is wrong and restart is asked
        self.soon = threading.Event()  # set after a restart: judge again at once
        self.last_state: str | None = None

    def deployment_key(self) -> str:
        """What runs, as Docker has it: the vLLM container's image and command line, and the served model name.
        A new image, profile or model is a new deployment with a baseline of its own. Read at each judgement, so
        an upgrade that leaves this watchdog's configuration alone still gets a new baseline. "" when unread."""
        fmt = "{{.Config.Image}} {{json .Config.Cmd}}"
        argv = ["docker", "inspect", "--format", fmt, self.cfg["vllm_container"]]
        res = sh(argv, self.cfg.get("docker_timeout_s", 60))
        if res.returncode != 0 or not res.stdout.strip():
            return ""
        return hashlib.sha256(f"{res.stdout.strip()} {self.cfg['model']}".encode()).hexdigest()[:20]

    def baseline(self, key: str) -> dict | None:
        if not key:
            return None
        try:
            with open(self.cfg["quality_baseline_file"], encoding="utf-8") as fh:
                return baseline_for(json.load(fh), key)
        except (OSError, ValueError):
            return None

    def probe_once(self, key: str) -> dict:
        c = self.cfg
        base = str(c["endpoint"]).rstrip("/")
        argv = ["python3", c["quality_script"], "--base-url", base, "--model", c["model"],
                "--api-key-file", c["api_key_file"], "--tolerance", str(c.get("quality_tolerance", 0.25)),
                "--timeout", str(c.get("quality_timeout_s", 30))]  # fmt: skip
        baseline = self.baseline(key)
        if baseline is not None:
            # The probe reads the stored record's figures itself: a judgement writes no file.
            argv += ["--baseline", c["quality_baseline_file"]]
        res = sh(argv, float(c.get("quality_timeout_s", 30)) * 5 + 10)
        out = quality_outcome(res.returncode, res.stdout)
        out["compared"] = baseline is not None
        return out

    def judge(self) -> None:
        key = self.deployment_key()
        out = self.probe_once(key)
        fig = out["figures"]
        figures = {k: fig.get(k) for k in ("mean_logprob", "perplexity", "prompt_tokens")}
        if out["state"] == "ok":
            self.wrong = None
            if not out["compared"] and key:
                write_json_atomic(
                    self.cfg["quality_baseline_file"], {"key": key, "recorded": utc_now(), "figures": fig}
                )
                self.wd.events.emit("quality_baseline", "first right answers of this deployment: the baseline",
                                    **figures)  # fmt: skip
            self.wd.events.emit("quality_ok", "answers right", compared=out["compared"], **figures)
        elif out["state"] == "wrong":
            reasons = "; ".join(out["reasons"])
            self.wd.events.emit("quality_failed", f"the engine answers, but wrongly: {reasons}",
                                reasons=out["reasons"], action=self.cfg.get("quality_action", "alert"),
                                **figures)  # fmt: skip
            if self.cfg.get("quality_action") == "restart":
                self.wrong = reasons
        elif self.last_state != "error":
            self.wd.events.emit("quality_error", f"answer quality not judged: {out['error']}")
        self.last_state = out["state"]

    def run(self) -> None:
        interval = float(self.cfg.get("quality_interval_s", 0))
        while True:
            self.soon.wait(interval)
            self.soon.clear()
            if self.wd.state.get("status") not in ("watching", "degraded"):
                continue
            try:
                self.judge()
            except Exception as exc:  # noqa: BLE001 - the quality thread must outlive any surprise
                self.wd.events.emit("watchdog_error", f"quality: {type(exc).__name__}: {exc}"[:300])


# --------------------------------------------------------------------------- the watch loop
class Watchdog:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.events = Events(cfg["events_file"], cfg["node"])
        self.last_tokens: float | None = None  # vLLM's generated-token count after the last round's probe
        self.state_path = cfg["state_file"]
        make_ssh_control_dir(cfg)
        try:
            with open(self.state_path, encoding="utf-8") as fh:
                self.state = json.load(fh)
        except (OSError, ValueError):
            self.state = {}
        self.state.setdefault("restart_epochs", [])
        self.state.setdefault("consecutive_failures", 0)
        self.state.setdefault("own_start_epoch", 0)
        with open(cfg["api_key_file"], encoding="utf-8") as fh:
            self.api_key = fh.read().strip()
        self.quality: QualityChecker | None = None
        if float(cfg.get("quality_interval_s", 0) or 0) > 0 and cfg.get("quality_script"):
            self.quality = QualityChecker(self)

    def save(self, **fields) -> None:
        self.state.update(fields)
        self.state["updated"] = utc_now()
        self.state["config"] = {
            k: self.cfg[k]
            for k in (
                "interval_s",
                "hang_timeout_s",
                "failures_before_restart",
                "max_restarts_per_hour",
                "retry_after_budget_s",
                "retry_after_budget_max_s",
            )  # fmt: skip
            if k in self.cfg
        }
        write_json_atomic(self.state_path, self.state)

    def ssh(self, address: str, script: str, timeout: float) -> subprocess.CompletedProcess:
        return sh(ssh_argv(self.cfg, address, script), timeout)

    def worker_states(self) -> tuple[dict, list[str]]:
        states, tripped = {}, []
        script = worker_state_script(self.cfg)
        for w in self.cfg["workers"]:
            res = self.ssh(w["address"], script, timeout=float(self.cfg["ssh_timeout_s"]))
            if res.returncode != 0:
                states[w["name"]] = "unreachable"
                continue
            out = res.stdout.split()
            states[w["name"]] = out[0] if out else "missing"
            if "floor-tripped" in out:
                tripped.append(w["name"])
        if os.path.exists(self.cfg["floor_marker"]):
            tripped.append(self.cfg["node"])
        return states, tripped

    def in_grace(self, now: float) -> bool:
        grace = float(self.cfg["startup_grace_s"])
        names = [self.cfg["vllm_container"]] + ([self.cfg["ray_container"]] if runs_ray(self.cfg) else [])
        for name in names:
            st = container_state(name)
            started = parse_docker_time(st.get("StartedAt", ""))
            if st.get("Status") == "running" and now - started < grace and started > self.state["own_start_epoch"] + 5:
                return True
        return False

    def observe(self) -> dict:
        """One look at the engine. A hang is seen within interval_s + hang_timeout_s + METRICS_AFTER_HANG_S of
        the engine freezing: the count of generated tokens the busy test compares against is the one read
        after the previous round's answer, not a fresh read at the start of this round, which on a frozen
        server (SIGSTOP: /metrics freezes with it) waited out its own timeout before the probe even began."""
        now = time.time()
        tokens_before = self.last_tokens if self.last_tokens is not None else read_generation_tokens(self.cfg)
        result, detail, took = probe(self.cfg, self.api_key, float(self.cfg["hang_timeout_s"]))
        if result == "hang":
            tokens_after = read_generation_tokens(self.cfg, timeout=METRICS_AFTER_HANG_S)
            self.last_tokens = tokens_after
            if busy_not_hung(tokens_before, tokens_after):
                result = "busy"
                detail = (
                    f"no token for the probe within {self.cfg['hang_timeout_s']} s, but the engine generated "
                    f"{tokens_after - tokens_before:.0f} tokens for other requests meanwhile"
                )
        else:
            self.last_tokens = read_generation_tokens(self.cfg) if result == "ok" else None
        workers, tripped = self.worker_states()
        return {
            "probe": result,
            "probe_detail": detail,
            "probe_s": round(took, 3),
            "workers": workers,
            "floor_tripped": tripped,
            "in_grace": self.in_grace(now) if result != "ok" else False,
            "quality_wrong": self.quality.wrong if getattr(self, "quality", None) else None,
        }

    def run(self) -> None:
        self.events.emit("started", "watchdog started", config=self.state.get("config") or {})
        if self.quality:
            threading.Thread(target=self.quality.run, daemon=True, name="quality").start()
        last_status = None
        while True:
            t0 = time.monotonic()
            try:
                last_status = self.round(last_status)
            except Exception as exc:  # noqa: BLE001 - one bad round must not end the watchdog
                self.events.emit("watchdog_error", f"{type(exc).__name__}: {exc}"[:300])
            time.sleep(max(0.0, float(self.cfg["interval_s"]) - (time.monotonic() - t0)))

    def round(self, last_status: str | None) -> str | None:
        """One observation, decision and action; returns the status it ends in."""
        obs = self.observe()
        now = time.time()
        verdict = decide(obs, self.state, self.cfg, now)
        self.state.update(verdict["state"])
        action, reason = verdict["action"], verdict["reason"]
        # Once given up or blocked, repeat nothing every N s: the state says it.
        quiet = self.state.get("status") in ("gave_up", "blocked")
        if obs["probe"] == "hang" and not quiet:
            self.events.emit(
                "hang_seen", reason if action != "blocked" else obs["probe_detail"], probe_s=obs["probe_s"]
            )
        elif obs["probe"] == "busy" and self.state.get("last_probe") != "busy":
            self.events.emit("busy_seen", obs["probe_detail"], probe_s=obs["probe_s"])
        elif obs["probe"] in ("failed", "dead") and not obs["in_grace"] and not quiet:
            self.events.emit("probe_failed", obs["probe_detail"], consecutive=self.state["consecutive_failures"])
        for name, st in obs["workers"].items():
            if st != "running" and self.state.get("workers", {}).get(name) != st:
                self.events.emit("worker_lost", f"{name}: Ray container {st}", worker=name, worker_state=st)
        self.state["workers"] = obs["workers"]
        status = {"none": "watching" if reason == "healthy" else "degraded", "blocked": "blocked"}.get(action, action)
        if action == "retry":
            status = self.retry_after_budget(reason, now)
        elif self.state.get("status") == "gave_up" and reason != "healthy":
            status = "gave_up"  # stays given up, restarting nothing, until the next try or a completion answers
        elif action == "give_up":
            self.give_up(reason, now)
            status = "gave_up"
        elif action == "restart":
            self.restart_group(reason)
            status = self.state["status"]
        if status != last_status:
            if status == "blocked" and not self.state.get("firewall_missing"):  # that one said so itself
                self.events.emit(
                    "blocked", f"{reason}; restarting the group cannot help, not restarting", reason=reason
                )
            if status == "watching" and last_status in ("gave_up", "blocked", "degraded", "restarting"):
                self.events.emit("recovered", "completions answer again")
            last_status = status
        if status != "gave_up":
            for key in GAVE_UP_FIELDS:
                self.state.pop(key, None)
        self.save(
            status=status,
            reason=reason,
            last_probe=obs["probe"],
            last_probe_s=obs["probe_s"],
            last_probe_at=utc_now(),
        )
        return last_status

    # ---- a spent budget: stop, say why, try again after a growing back-off
    def give_up(self, reason: str, now: float) -> None:
        delay = retry_delay(0, self.cfg)
        n = len(self.state["restart_epochs"])
        self.state.update(
            gave_up_reason=reason,
            gave_up_at=utc_now(),
            restarts_in_hour=n,
            retries_after_budget=0,
            next_retry_epoch=now + delay,
            next_retry_at=_utc(now + delay),
        )
        self.events.emit(
            "gave_up",
            f"{reason}; already restarted {n} times in the last hour "
            f"(max_restarts_per_hour={self.cfg['max_restarts_per_hour']}); not restarting again until "
            f"{_utc(now + delay)} ({delay:.0f} s), or until a completion answers",
            reason=reason,
            restarts_in_hour=n,
            next_retry_epoch=now + delay,
        )

    def retry_after_budget(self, reason: str, now: float) -> str:
        """One group restart outside the spent budget; on failure the next try waits twice as long."""
        tries = int(self.state.get("retries_after_budget", 0)) + 1
        self.events.emit("retry_after_budget", reason, attempt=tries)
        self.restart_group(reason, backoff=False)
        if self.state.get("status") == "watching":
            return "watching"
        delay = retry_delay(tries, self.cfg)
        at = time.time() + delay
        self.state.update(retries_after_budget=tries, next_retry_epoch=at, next_retry_at=_utc(at))
        self.events.emit(
            "retry_scheduled",
            f"try {tries} after the restart budget did not bring serving back; next try at {_utc(at)} ({delay:.0f} s)",
            attempt=tries,
            next_retry_epoch=at,
        )
        return "gave_up"

    # ---- the ordered group restart
    def missing_firewall(self) -> list[str]:
        """Every SPARKOPS chain (or INPUT jump) the group needs and a node of it lacks, in sentences."""
        if not self.cfg.get("firewall_check", True):
            return []
        chains = group_chains(self.cfg)
        timeout = float(self.cfg.get("ssh_timeout_s", 10))
        missing = parse_firewall_check(
            self.cfg["node"], sh(["sh", "-c", firewall_check_script(chains["head"])], timeout)
        )
        if chains["workers"]:
            script = firewall_check_script(chains["workers"])
            for w in self.cfg["workers"]:
                missing += parse_firewall_check(w["name"], self.ssh(w["address"], script, timeout))
        return missing

    def restart_group(self, reason: str, backoff: bool = True) -> None:
        c = self.cfg
        # Started without its chains, a group answers the management LAN: refuse, say what is missing, once.
        missing = self.missing_firewall()
        if missing:
            if missing != self.state.get("firewall_missing"):
                self.events.emit(
                    "firewall_missing",
                    f"not restarting the serving group ({reason}): {'; '.join(missing)}. Run site.yml again, or "
                    "the boot restore (systemctl start sparkops-firewall)",
                    missing=missing,
                    reason=reason,
                )
            self.state["firewall_missing"] = missing
            self.state["status"] = "blocked"
            return
        self.state.pop("firewall_missing", None)
        n = len(self.state["restart_epochs"]) + 1
        # Back-off between restarts in the same hour: base, 2x, 4x ... (a try after a spent budget has waited
        # its own back-off already).
        if n > 1 and backoff:
            delay = float(c["restart_backoff_s"]) * (2 ** (n - 2))
            self.events.emit("restart_backoff", f"waiting {delay:.0f} s before restart {n}", delay_s=delay)
            time.sleep(delay)
        started = time.time()
        self.state["restart_epochs"].append(started)
        self.save(status="restarting", reason=reason)
        self.events.emit("restart_begun", f"restart {n} of the serving group: {reason}", attempt=n, reason=reason)
        ok, detail = self._restart_steps()
        if getattr(self, "quality", None):  # a new engine: judged again at once, not after the interval
            self.quality.wrong = None
            self.quality.soon.set()
        self.state["own_start_epoch"] = time.time()
        self.state["consecutive_failures"] = 0
        took = round(time.time() - started, 1)
        if ok:
            self.events.emit("restart_ended", f"serving again after {took} s", attempt=n, ok=True, seconds=took)
            self.state["status"] = "watching"
        else:
            self.events.emit(
                "restart_ended",
                f"restart {n} failed after {took} s: {detail}",
                attempt=n,
                ok=False,
                seconds=took,
                detail=detail,
            )
            self.state["status"] = "degraded"
        self.state["last_restart"] = {"at": utc_now(), "ok": ok, "seconds": took, "reason": reason, "detail": detail}

    def _restart_steps(self) -> tuple[bool, str]:
        c = self.cfg
        step = float(c["docker_timeout_s"])
        sh(["docker", "stop", "-t", str(int(c["stop_grace_s"])), c["vllm_container"]], step + c["stop_grace_s"])
        if not runs_ray(c):
            return self._restart_ranks(step)
        res = sh(["docker", "restart", "-t", "10", c["ray_container"]], step + 10)
        if res.returncode != 0:
            return False, f"Ray head container did not restart: {res.stderr.strip()[:200]}"
        for w in c["workers"]:
            res = self.ssh(w["address"], worker_restart_script(c), step + 10)
            if res.returncode != 0:
                return (
                    False,
                    f"Ray container on {w['name']} did not restart: {(res.stderr or res.stdout).strip()[:200]}",
                )
        want = len(c["workers"]) + 1
        deadline = time.monotonic() + float(c["ray_join_timeout_s"])
        alive = 0
        code = (
            "import ray; ray.init(address='auto', logging_level='ERROR'); "
            "print(sum(1 for n in ray.nodes() if n['Alive']))"
        )
        while time.monotonic() < deadline:
            res = sh(["docker", "exec", c["ray_container"], "python3", "-c", code], 60)
            lines = res.stdout.strip().splitlines()
            alive = int(lines[-1]) if res.returncode == 0 and lines and lines[-1].isdigit() else 0
            if alive >= want:
                break
            time.sleep(2)
        if alive < want:
            return False, f"only {alive} of {want} Ray nodes joined within {c['ray_join_timeout_s']} s"
        self.drop_model_page_cache()
        res = sh(["docker", "start", c["vllm_container"]], step)
        if res.returncode != 0:
            return False, f"vLLM container did not start: {res.stderr.strip()[:200]}"
        return self._wait_ready()

    def _wait_ready(self) -> tuple[bool, str]:
        """Until the API completes a probe, the engine is reported dead, vLLM exits, or the deadline."""
        c = self.cfg
        deadline = time.monotonic() + float(c["ready_timeout_s"])
        detail = ""
        while time.monotonic() < deadline:
            result, detail, _elapsed = probe(c, self.api_key, float(c["hang_timeout_s"]))
            if result == "ok":
                return True, ""
            if result == "dead":
                return False, f"vLLM's engine died while starting ({detail})"
            st = container_state(c["vllm_container"])
            if st.get("Status") == "exited" and not st.get("Restarting"):
                return False, f"vLLM exited with code {st.get('ExitCode')} while starting"
            time.sleep(min(5.0, float(c["interval_s"])))
        return False, f"no completion within {c['ready_timeout_s']} s ({detail})"

    def _restart_ranks(self, step: float) -> tuple[bool, str]:
        """vLLM's own multi-node executor: the ranks are one engine. Every headless rank is stopped (a
        rank whose head is gone cannot rejoin a new one), the head starts first, so its rendezvous
        listens, then the ranks join it; the API answers once all have."""
        c = self.cfg
        for w in c["workers"]:
            self.ssh(w["address"], worker_stop_script(c), step + float(c["stop_grace_s"]))
        self.drop_model_page_cache()
        res = sh(["docker", "start", c["vllm_container"]], step)
        if res.returncode != 0:
            return False, f"vLLM container (rank 0) did not start: {res.stderr.strip()[:200]}"
        for w in c["workers"]:
            res = self.ssh(w["address"], worker_start_script(c), step)
            if res.returncode != 0:
                return False, f"vLLM rank on {w['name']} did not start: {(res.stderr or res.stdout).strip()[:200]}"
        return self._wait_ready()

    def drop_model_page_cache(self) -> None:
        """Memory is unified on a Spark: the weight pages the previous load left cached count as used
        when the new vLLM measures free memory, which costs KV cache or fails its start. Drop them on
        every node (page_cache.py, installed next to this script, the code the serve role runs too).
        A node where that fails is reported and vLLM starts anyway: a smaller KV cache beats no restart."""
        c = self.cfg
        if not c.get("drop_model_page_cache") or not c.get("model_cache_dir"):
            return
        argv = ["python3", c["page_cache_script"], c["model_cache_dir"]]
        timeout = float(c["docker_timeout_s"])
        nodes = [(c["node"], None)] + [(w["name"], w["address"]) for w in c["workers"]]
        for name, address in nodes:
            res = sh(argv, timeout) if address is None else self.ssh(address, shlex.join(argv), timeout)
            try:
                out = json.loads(res.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                out = None
            if res.returncode == 0 and isinstance(out, dict):
                dropped = out["resident_before"] - out["resident_after"]
                self.events.emit(
                    "page_cache_dropped",
                    f"{name}: {dropped / 2**30:.2f} GiB of the model's cached pages dropped "
                    f"({out['resident_after'] / 2**30:.2f} GiB still cached) in {out['seconds']} s",
                    on=name,
                    resident_before=out["resident_before"],
                    resident_after=out["resident_after"],
                    files=out["files"],
                    seconds=out["seconds"],
                )
            else:
                detail = " ".join(((out or {}).get("errors") or [res.stderr or res.stdout or ""])[:3]).strip()[:200]
                self.events.emit(
                    "page_cache_error",
                    f"{name}: could not drop the model's cached pages (rc={res.returncode}: {detail}); "
                    "starting vLLM anyway",
                    on=name,
                )


# --------------------------------------------------------------------------- the floor loop
def floor_loop(cfg: dict) -> None:
    events = Events(cfg["floor_events_file"], cfg["node"])
    floor = int(cfg["memory_floor_bytes"])
    events.emit(
        "floor_armed",
        f"memory floor {floor // 2**20} MiB; stops {cfg['floor_stop_container']} below it",
        floor_bytes=floor,
    )
    while True:
        try:
            limit, used = cgroup_memory()
            avail = available_bytes(_read("/proc/meminfo"), limit, used)
        except Exception as exc:  # noqa: BLE001 - the floor must outlive any surprise
            events.emit("floor_error", f"cannot read memory: {type(exc).__name__}: {exc}")
            time.sleep(30)
            continue
        if avail < floor and not os.path.exists(cfg["floor_marker"]):
            st = container_state(cfg["floor_stop_container"])
            rec = {
                "at": utc_now(),
                "node": cfg["node"],
                "available_bytes": avail,
                "floor_bytes": floor,
                "stopped": cfg["floor_stop_container"],
                "container_was": st.get("Status"),
            }
            write_json_atomic(cfg["floor_marker"], rec)
            events.emit(
                "floor_crossed",
                f"{avail // 2**20} MiB free < floor {floor // 2**20} MiB: stopping {cfg['floor_stop_container']}",
                available_bytes=avail,
                floor_bytes=floor,
            )
            res = sh(
                ["docker", "stop", "-t", str(int(cfg["stop_grace_s"])), cfg["floor_stop_container"]],
                cfg["stop_grace_s"] + 30,
            )
            events.emit(
                "floor_acted",
                f"{cfg['floor_stop_container']} stopped (rc {res.returncode}); "
                "restart it with site.yml once memory is back",
                rc=res.returncode,
            )
        time.sleep(float(cfg["memory_check_s"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    args = ap.parse_args(argv)
    with open(args.config, encoding="utf-8") as fh:
        cfg = json.load(fh)
    # Ansible may hand numbers and booleans over as strings; settle them once.
    cfg["watch"] = str(cfg.get("watch", False)).lower() == "true"
    for key, val in list(cfg.items()):
        if key.endswith(("_s", "_bytes", "_hour", "_restart")) and isinstance(val, str):
            cfg[key] = float(val)
    if cfg.get("memory_floor_bytes", 0) > 0:
        threading.Thread(target=floor_loop, args=(cfg,), daemon=True, name="floor").start()
    if cfg.get("watch"):
        Watchdog(cfg).run()
    else:
        while True:
            time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
