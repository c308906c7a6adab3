"""vllm_wait: one round of the vLLM wait, on a fake clock, a scripted server and a scripted container.

The round logic is judged here without time passing; tests/unit/sim/test_vllm_serve_wait.py runs
the role's wait.yml (module, action plugin, until loop) against the vLLM test double on loopback,
and tests/unit/plugins/modules/test_vllm_serve_wait_module.py the module against a loopback server.
"""

from __future__ import annotations

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import vllm_wait as vw
from ansible_collections.sparkops.cluster.plugins.module_utils.openai_probe import KINDS, ProbeError

READY = {"checks": {"completion": {"ok": True, "elapsed_s": 0.4}}, "ttft_s": 0.12, "tok_s": 41.5}


class World:
    """A fake clock, a server that answers from `ready_at` on (or fails with `kind`), and a container."""

    def __init__(self, *, ready_at=None, kind="refused", status="running 0 0", logs=("INFO loading",), ask_s=0.25):
        self.t = 1000.0
        self.ask_s = ask_s
        self.ready_at = ready_at
        self.kind = kind
        self.status = status
        self.logs = list(logs)
        self.sleeps: list[float] = []
        self.probe_timeouts: list[float] = []
        self.reads = 0

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        assert s >= 0
        assert len(self.sleeps) < 1000, "a round that never ends"
        self.sleeps.append(s)
        self.t += s

    def probe(self, timeout: float) -> dict:
        self.probe_timeouts.append(timeout)
        self.t += self.ask_s  # an ask takes time
        if self.ready_at is not None and self.t >= self.ready_at:
            return dict(READY)
        raise ProbeError(self.kind, f"{self.kind} from the server")

    def run(self, argv):
        assert argv[0] == "docker" and argv[-1] == "sparkops-vllm", argv
        if argv[1] == "inspect":
            assert argv[2:4] == ["--format", vw.INSPECT_FORMAT]
            return (0, self.status + "\n", "") if self.status else (1, "", "Error: No such object: sparkops-vllm")
        assert argv[1:4] == ["logs", "--tail", "40"]
        return 0, "", "\n".join(self.logs) + "\n"

    def container(self) -> dict:
        self.reads += 1
        return vw.read_container(self.run, "docker", "sparkops-vllm")

    def round(self, started=None, timeout_s=60.0, round_s=10.0) -> dict:
        return vw.wait_round(
            probe=self.probe,
            container=self.container,
            host="spark-1",
            name="sparkops-vllm",
            started=self.t if started is None else started,
            timeout_s=timeout_s,
            round_s=round_s,
            clock=self.clock,
            sleep=self.sleep,
        )


def test_ready_at_once_reads_no_container_and_says_ready():
    w = World(ready_at=0)
    r = w.round()
    assert r["done"] and r["ready"] and not r["failed"]
    assert r["ttft_s"] == 0.12 and r["tok_s"] == 41.5 and r["checks"]["completion"]["elapsed_s"] == 0.4
    assert r["container"] is None and w.reads == 0
    assert "failure_kind" in r and r["failure_kind"] is None
    assert r["msg"].startswith("vLLM on spark-1: READY after 0 s of waiting; ttft 0.12 s, 41.5 tok/s")


def test_a_round_without_an_answer_returns_progress_at_its_end_and_not_before():
    w = World(status="running 0 0", logs=["INFO a", "INFO Loading safetensors checkpoint shards: 50%"])
    start = w.t
    r = w.round(timeout_s=600, round_s=10)
    assert not r["done"] and not r["failed"] and not r["ready"]
    assert 10 <= w.t - start < 11, "a round lasts round_s, give or take one ask"
    assert r["msg"] == (
        "vLLM on spark-1: starting after 10 s of waiting; container running (exit code 0, 0 restarts); "
        "API: refused; last log: INFO Loading safetensors checkpoint shards: 50%"
    )
    assert r["probes"] > 2 and r["failure_kind"] == "refused"
    assert r["elapsed_s"] == 10.2  # 10.25 s (asks of 0.25 s, sleeps to the round's end), to a tenth


def test_progress_with_no_log_says_none_and_cuts_a_long_last_line_to_200_characters():
    r = World(logs=[]).round(timeout_s=600, round_s=3)
    assert r["msg"].endswith("; API: refused; last log: (none)")
    long_line = "E" * 150 + "F" * 150
    r = World(logs=[long_line]).round(timeout_s=600, round_s=3)
    last = r["msg"].split("; last log: ", 1)[1]
    assert last == "E" * 150 + "F" * 47 + "..." and len(last) == 200
    r = World(logs=["G" * 200]).round(timeout_s=600, round_s=3)
    assert r["msg"].endswith("; last log: " + "G" * 200)
    r = World(logs=["H" * 201]).round(timeout_s=600, round_s=3)
    assert r["msg"].endswith("; last log: " + "H" * 197 + "...")


def test_a_round_that_reaches_its_end_or_the_deadline_exactly_stops_there():
    """Asks that take no time: the round sleeps up to its end exactly; there it returns (no endless loop of
    zero-second sleeps), and at the deadline exactly it fails rather than returning progress."""
    w = World(ask_s=0)
    start = w.t
    r = w.round(timeout_s=600, round_s=5)
    assert not r["done"] and w.t - start == 5 and r["elapsed_s"] == 5
    w = World(ask_s=0)
    start = w.t
    r = w.round(timeout_s=5, round_s=30)
    assert r["done"] and r["failed"] and w.t - start == 5 and "did not answer within 5 s" in r["msg"]


def test_a_stopped_container_without_log_lines_says_so():
    r = World(status="exited 2 0", logs=[]).round()
    assert "Its last log lines:\n  (no log lines)\nFull log: docker logs sparkops-vllm on spark-1." in r["msg"]


def test_every_kind_is_waited_on_or_has_a_fix():
    """A kind openai_probe adds later must be decided here: wait for it, or fail at once saying how to fix it."""
    for kind in KINDS:
        assert (kind in vw.WAITABLE_KINDS) != bool(vw.FIX_HINTS.get(kind)), kind


def test_restarts_above_zero_are_history_then_ready():
    """`running 0 11`: a crash loop that was fixed; the wait goes on and ends ready."""
    w = World(ready_at=1000.0 + 25, status="running 0 11")
    started = w.t
    first = w.round(started=started, timeout_s=120, round_s=10)
    assert not first["done"] and "(exit code 0, 11 restarts)" in first["msg"]
    second = w.round(started=started, timeout_s=120, round_s=10)
    third = w.round(started=started, timeout_s=120, round_s=10)
    assert not second["done"]
    assert third["done"] and third["ready"] and not third["failed"]
    assert third["elapsed_s"] >= 25


@pytest.mark.parametrize("status", ["exited 1 3", "dead 137 0", "created 0 0", "removing 0 0", ""])
def test_a_stopped_container_ends_the_wait_at_once_with_its_last_15_log_lines(status):
    logs = [f"INFO line {i}" for i in range(30)] + ["ValueError: shard 2 of 4 is missing"]
    w = World(status=status, logs=logs)
    start = w.t
    r = w.round(timeout_s=1800, round_s=30)
    assert r["done"] and r["failed"] and w.t - start < 1, "no waiting on a container that stopped"
    word = status.split()[0] if status else "unknown"
    code, restarts = status.split()[1:] if status else ["?", "?"]
    assert r["msg"].startswith(
        f"vLLM on spark-1 stopped without answering: container sparkops-vllm is {word} "
        f"(exit code {code}, {restarts} restarts). Its last log lines:\n"
    )
    quoted = r["msg"].split("Its last log lines:\n", 1)[1].splitlines()
    assert quoted[:-1] == ["  " + line for line in logs[-15:]]
    assert quoted[-1] == "Full log: docker logs sparkops-vllm on spark-1."


def test_restarting_is_not_stopped():
    w = World(status="restarting 1 4")
    r = w.round(timeout_s=600, round_s=5)
    assert not r["done"] and "container restarting (exit code 1, 4 restarts)" in r["msg"]


def test_the_deadline_ends_the_wait_with_the_last_failure_and_log_lines():
    w = World(kind="timeout", logs=["INFO still loading"])
    started = w.t
    rounds = [w.round(started=started, timeout_s=25, round_s=10) for _n in range(3)]
    assert [r["done"] for r in rounds] == [False, False, True]
    last = rounds[-1]
    assert last["failed"] and 25 <= w.t - started < 27
    assert last["msg"] == (
        "vLLM on spark-1 did not answer within 25 s (timeout: timeout from the server); container running "
        "(0 restarts). Its last log lines:\n  INFO still loading\nFull log: docker logs sparkops-vllm on spark-1."
    )


def test_retries_cannot_extend_the_deadline():
    """Called again and again with the same start, the wait ends at started + timeout_s: a round never
    sleeps past it, asks are capped by what is left, and a round begun after it asks once and fails."""
    w = World(kind="refused")
    started = w.t
    results = []
    for _n in range(20):
        results.append(w.round(started=started, timeout_s=30, round_s=7))
        if results[-1]["done"]:
            break
    assert results[-1]["failed"] and "did not answer within 30 s" in results[-1]["msg"]
    assert w.t - started < 30 + 1.5
    assert all(t <= 20 for t in w.probe_timeouts)
    # Once more, well after the deadline: one ask of at most a second, no sleep, the same verdict.
    w.t = started + 500
    sleeps = len(w.sleeps)
    late = w.round(started=started, timeout_s=30, round_s=7)
    assert late["done"] and late["failed"] and late["probes"] == 1
    assert w.probe_timeouts[-1] == 1.0 and len(w.sleeps) == sleeps
    assert "did not answer within 30 s" in late["msg"]


@pytest.mark.parametrize("kind", ["unauthorized", "wrong_model", "malformed", "client_error"])
def test_what_waiting_cannot_cure_fails_at_once_with_a_fix(kind):
    w = World(kind=kind)
    r = w.round(timeout_s=1800, round_s=30)
    assert r["done"] and r["failed"] and r["probes"] == 1 and w.reads == 0
    assert f"({kind}: {kind} from the server)" in r["msg"]
    assert vw.FIX_HINTS[kind] in r["msg"]


@pytest.mark.parametrize("kind", ["refused", "unreachable", "timeout", "engine_dead", "server_error"])
def test_what_waiting_may_cure_is_waited_on(kind):
    """engine_dead included: vLLM 0.19.0's API server exits after it, and the container then reads exited."""
    w = World(kind=kind)
    r = w.round(timeout_s=600, round_s=5)
    assert not r["done"] and f"API: {kind}" in r["msg"]


def test_backoff_grows_and_stays_within_the_round():
    w = World()
    w.round(timeout_s=600, round_s=40)
    assert w.sleeps[:4] == [2.0, 4.0, 8.0, 10.0]
    assert max(w.sleeps) <= 10.0


@pytest.mark.parametrize(
    ("rc", "out", "want"),
    [
        (0, "running 0 11\n", {"status": "running", "exit_code": 0, "restarts": 11}),
        (0, "exited 137 2", {"status": "exited", "exit_code": 137, "restarts": 2}),
        (1, "", {"status": "unknown", "exit_code": None, "restarts": None}),
        (0, "running", {"status": "running", "exit_code": None, "restarts": None}),
        (0, "running ? 2", {"status": "running", "exit_code": None, "restarts": 2}),
    ],
)
def test_parse_inspect(rc, out, want):
    assert vw.parse_inspect(rc, out) == want


def test_log_lines_keep_stdout_then_stderr_without_blank_lines():
    def run(argv):
        if argv[1] == "inspect":
            return 0, "running 0 0", ""
        return 0, "out one\n\n", "err one\n   \nerr two\n"

    assert vw.read_container(run, "docker", "c")["log_tail"] == ["out one", "err one", "err two"]
