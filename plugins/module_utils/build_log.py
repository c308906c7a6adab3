# Copyright: sparkops maintainers
# Apache-2.0
"""Where an image build is, read from the end of its log (pure; no Ansible, no I/O).

eugr/spark-vllm-docker@fc08740's build-and-copy.sh builds in three docker builds, announcing each
(build-and-copy.sh:555 `FlashInfer build command: ...`, :621 `vLLM build command: ...`, :664
`Building runner image with command: ...`), after `Rebuilding FlashInfer wheels (...)...` (:512-518) and
`Rebuilding vLLM wheels (...)...` (:579-585). Inside each, BuildKit prints every step with its stage
name from the Dockerfile (base :9, flashinfer-builder :83, vllm-builder :164, runner :266): plainly
`#7 [flashinfer-builder 2/7] RUN ...` when the output is not a terminal (our log), or
` => [vllm-builder 5/9] RUN ...` in the terminal view some users paste (eugr issue 243). A failed step
ends with `#12 ERROR: process "/bin/sh -c ..." did not complete successfully: exit code: 1`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

# build-and-copy.sh@fc08740's own lines that start a phase (the docker build that follows).
_PHASES = (
    (re.compile(r"^Rebuilding FlashInfer wheels\b|^FlashInfer build command: "), "FlashInfer"),
    (re.compile(r"^Rebuilding vLLM wheels\b|^vLLM build command: "), "vLLM"),
    (re.compile(r"^Building runner image with command: "), "runner image"),
)
# A BuildKit step: plain (`#N [stage i/n] INSTR`) or terminal view (` => [CACHED ][stage i/n] INSTR`).
# Unnamed stages are padded (`#4 [ 1/10] FROM ...`); the terminal view ends a line with its time (`  0.6s`).
_STEP = re.compile(
    r"^(?:#\d+ |\s*=> (?:CACHED |ERROR )?)\[(?:(?P<stage>[A-Za-z0-9_.-]+) )?\s*(?P<i>\d+)/(?P<n>\d+)\] (?P<instr>.*?)"
    r"(?:\s+\d+\.\d+s)?$"
)
# Dockerfile@fc08740's stage names to what a user knows them as.
STAGES = {
    "base": "base image (CUDA, NCCL)",
    "flashinfer-builder": "FlashInfer",
    "flashinfer-export": "FlashInfer",
    "vllm-builder": "vLLM",
    "vllm-export": "vLLM",
    "runner": "runner image",
}
_ERROR = re.compile(r"^#\d+ ERROR: |^ERROR: |^\s*=> ERROR ")


def _short(text: str, width: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def build_stage(text: str) -> dict:
    """The build's current phase and step, from the whole log or its end.

    Returns {"phase": "FlashInfer" | "vLLM" | "runner image" | None, "step": "vllm-builder 7/9" | None,
    "instruction": the step's first words | None, "error": the last BuildKit error line | None}.
    The phase is build-and-copy.sh's last phase line (its runner build also runs base's steps,
    eugr issue 243), else the step's stage name (the Dockerfile's stages).
    """
    phase = step = instruction = error = None
    step_phase = None
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        for pattern, name in _PHASES:
            if pattern.search(line):
                phase, step, instruction, step_phase = name, None, None, None
        m = _STEP.match(line)
        if m:
            stage = m.group("stage")
            step = f"{stage} {m.group('i')}/{m.group('n')}" if stage else f"{m.group('i')}/{m.group('n')}"
            instruction = _short(m.group("instr"))
            step_phase = STAGES.get(stage or "")
        if _ERROR.search(line):
            error = _short(line.strip(), 300)
    return {"phase": phase or step_phase, "step": step, "instruction": instruction, "error": error}


def elapsed_text(seconds: float) -> str:
    """`1 h 02 min`, `12 min 05 s`, `40 s`."""
    s = max(0, int(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"


def progress_message(text: str, elapsed_s: float, log_path: str) -> str:
    """One line for each poll: what is building, which step, for how long, and where the log is."""
    st = build_stage(text)
    what = st["phase"] or "starting"
    if st["step"]:
        what += f" (step {st['step']}: {st['instruction']})"
    return f"building {what}, {elapsed_text(elapsed_s)} in; full log {log_path}"


def tail_lines(text: str, count: int = 40) -> list[str]:
    """The log's last `count` non-empty lines (the end of a failed build says why)."""
    lines = [line.rstrip("\r") for line in text.splitlines() if line.strip()]
    return lines[-count:] if count > 0 else []


def failure_message(text: str, rc: int, elapsed_s: float, log_path: str, count: int = 40) -> str:
    """What a failed build says: where it stopped, its error line, the last lines and the log's path."""
    st = build_stage(text)
    where = st["phase"] or "before the first step"
    if st["step"]:
        where += f", step {st['step']} ({st['instruction']})"
    head = f"The image build failed (exit {rc}) after {elapsed_text(elapsed_s)} in {where}."
    if st["error"]:
        head += f" {st['error']}"
    last = tail_lines(text, count)
    return head + f" Full log: {log_path}. Its last {len(last)} lines:\n" + "\n".join(last)


RC_MARKER = "@@sparkops-build-rc@@"

# image_build_watch's options (the action plugin validates with it; its documentation module declares it).
WATCH_ARGUMENT_SPEC = dict(
    log_path=dict(type="path", required=True),
    started=dict(type="float"),
    run_id=dict(type="str"),
    timeout_s=dict(type="int", default=10800),
    tail_lines=dict(type="int", default=40),
    wait_s=dict(type="int", default=0),
)
# While waiting up to wait_s for the build to end, the log is read again this often: the task returns
# within this of the build's end, not a whole poll later.
WATCH_RECHECK_S = 2


def watch_command(log_path: str, tail_bytes: int = 262144) -> list[str]:
    """argv that prints the log's end, the marker, then the exit status file (empty while running)."""
    script = 'tail -c "$1" -- "$2" 2>/dev/null; printf "\\n%s\\n" "$3"; cat -- "$2.rc" 2>/dev/null; exit 0'
    return ["sh", "-c", script, "sh", str(int(tail_bytes)), log_path, RC_MARKER]


def parse_watch_output(stdout: str, run_id: str | None = None) -> tuple[str, int | None]:
    """(the log's end, the build's exit status or None while it runs) from watch_command's output.

    With a run_id, only a status written by that run counts: an earlier build's status file (the new
    build, started in the background, may not have removed it yet) reads as still running."""
    # Ansible's ssh connection runs a low-level command under a terminal (ssh -tt), which turns
    # every line end into CRLF: read it as LF, or the marker is never found and a finished build looks running.
    stdout = stdout.replace("\r\n", "\n")
    text, sep, rest = stdout.rpartition("\n" + RC_MARKER + "\n")
    if not sep:
        return stdout, None
    words = rest.split()
    if not words or not re.fullmatch(r"-?\d+", words[0]):
        return text, None
    if run_id is not None and words[1:] != [run_id]:
        return text, None
    return text, int(words[0])


# The build runs here, not in the module: a build writes to its own log and is killed with its process
# group at the limit, which run_command cannot do.
def run_logged(argv: list, chdir: str, log_path: str, timeout_s: int) -> tuple[int, float]:
    """Run argv with its output appended to log_path; (exit status, seconds). Kills its process group at the limit."""
    started = time.monotonic()
    with open(log_path, "ab", buffering=0) as log:
        try:
            proc = subprocess.Popen(
                argv, cwd=chdir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as exc:
            log.write(f"sparkops: could not start {argv[0]}: {exc}\n".encode())
            return 127, time.monotonic() - started
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with _suppress():
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with _suppress():
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.write(f"\nsparkops: the build ran longer than {timeout_s} s and was stopped\n".encode())
            rc = 124
    return rc, time.monotonic() - started


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return exc_type is not None and issubclass(exc_type, ProcessLookupError)
