"""The reload under load, against the stand-in master (tests/unit/fake_gunicorn_master.py), which does what gunicorn
23.0.0's arbiter does in the two cases: it counts a TERMed worker until it has reaped it and TERMs it again on every
pass (arbiter.py:564-576), and it halts with every worker when a new one fails while loading the app (exit 3 before
`booted`: arbiter.py:524-532, 611-621)."""

from __future__ import annotations

import os
import time

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import gateway_reload as gr
from gateway_reload_helpers import Master, as_root


def settle(m, limit):
    """Until the master has one worker left (every drain over), or `limit`; its workers then."""
    end = time.monotonic() + limit
    while time.monotonic() < end and len(m.workers()) > 1:
        time.sleep(0.1)
    time.sleep(1.5)  # a pass or two of the master's loop: would it spawn another once the drainers are gone?
    return m.workers()


def test_the_stand_in_halts_like_gunicorn_when_a_new_worker_fails_to_boot(tmp_path):
    """What the preflight prevents, shown on the stand-in: TTIN with a secret file gone takes the gateway down."""
    m = Master(tmp_path)
    try:
        [old] = m.workers()
        m.secrets["LITELLM_MASTER_KEY"].unlink()
        m.kill(m.proc.pid, gr.signal.SIGTTIN)
        assert m.proc.wait(timeout=10) == 3  # WORKER_BOOT_ERROR: the master halted
        assert not m.pidfile.exists() and gr.proc_stat(old) is None  # and the serving worker went with it
    finally:
        m.stop()


BREAKS = {
    "a secret file gone": lambda m: m.secrets["LITELLM_MASTER_KEY"].unlink(),
    "an empty secret file": lambda m: m.secrets["SPARKOPS_VLLM_API_KEY"].write_text("\n"),
    "an ImportError in the wrapper": lambda m: (m.lib / "sparkops_gateway_auth.py").write_text(
        "import no_such_module_anywhere\n" + (m.lib / "sparkops_gateway_auth.py").read_text()
    ),
    "a SyntaxError in the wrapper": lambda m: (m.lib / "sparkops_gateway_auth.py").write_text("def (:\n"),
}


@pytest.mark.parametrize("why", sorted(BREAKS))
def test_a_new_worker_that_would_fail_to_boot_is_refused_before_any_signal(tmp_path, why):
    m = Master(tmp_path)
    try:
        [old] = m.workers()
        saved = {p: p.read_bytes() for p in [*m.secrets.values(), m.lib / "sparkops_gateway_auth.py"]}
        BREAKS[why](m)
        m.config.write_text("model_list: [new]\n")
        with pytest.raises(gr.ReloadError, match="would fail to load the app") as err:
            m.reloader().run(timeout=10)
        assert m.signals == [] and err.value.details["old_pids"] == [old] and err.value.details["log"]
        time.sleep(0.5)
        assert m.proc.poll() is None and m.workers() == [old] and (m.ready / f"{old}.ready").exists()
        # force (the role's reload when the secrets or the wrapper changed) is refused the same way.
        with pytest.raises(gr.ReloadError, match="would fail to load the app"):
            m.reloader().run(timeout=10, force=True)
        assert m.signals == []
        for path, data in saved.items():  # fixed: the next run switches
            path.write_bytes(data)
        r = m.reloader().run(timeout=10, wait_old_exit=True, old_exit_timeout=10)
        assert r["changed"] and m.workers() == [r["new_pid"]] and m.proc.poll() is None
    finally:
        m.stop()


@pytest.mark.skipif(not as_root(), reason="needs root to drop to the gateway's user")
def test_a_secret_the_gateway_user_cannot_read_is_refused_when_run_as_that_user(tmp_path):
    """The check runs as the user the new worker runs as: root could read a 0600 root file, the worker cannot."""
    m = Master(tmp_path)
    try:
        [old] = m.workers()
        m.secrets["LITELLM_MASTER_KEY"].chmod(0o600)
        m.config.write_text("model_list: [new]\n")
        with pytest.raises(gr.ReloadError, match="would fail to load the app.*Permission denied"):
            gr.reload(m.pidfile, m.ready, m.config, user=str(m.uid), timeout=10)
        assert m.proc.poll() is None and m.workers() == [old]
    finally:
        m.stop()


def test_a_reload_while_the_previous_reloads_worker_drains_gets_its_worker_at_once(tmp_path):
    """gunicorn still counts the draining worker: one TTIN alone spawns nothing until it exits (the reload ended
    a drain late). Two TTINs, then one TTOU as soon as the new worker exists, so that nothing more is spawned when
    the drainer exits; then the usual TTOU."""
    drain = 6.0
    m = Master(tmp_path, drain_s=drain)
    try:
        [first] = m.workers()
        m.config.write_text("model_list: [one]\n")
        r1 = m.reloader().run(timeout=10)
        assert first in m.workers()  # still draining
        m.signals.clear()
        m.config.write_text("model_list: [two]\n")
        began = time.monotonic()
        r2 = m.reloader().run(timeout=20)
        assert time.monotonic() - began < drain - 2, r2  # not held up by the drain
        assert m.signals == ["SIGTTIN", "SIGTTIN", "SIGTTOU", "SIGTTOU"]
        assert r2["old_pids"] == [first, r1["new_pid"]] and first in m.workers()  # the first still drains
        want = gr.config_digest(m.config)
        assert (m.ready / f"{r2['new_pid']}.ready").read_text().strip() == want
        # Once both drains are over: the new worker alone, no spare spawned when the drainers went.
        assert settle(m, 2 * drain + 5) == [r2["new_pid"]]
        assert m.reloader().run(timeout=10)["changed"] is False
    finally:
        m.stop()


def test_a_reload_while_two_workers_drain_neither_fails_nor_leaves_spare_workers(tmp_path):
    """With two workers draining, one TTIN and its resend spawned nothing: "the master started no worker", and the
    count left behind spawned two spare workers once the drains ended."""
    drain = 8.0
    m = Master(tmp_path, drain_s=drain)
    try:
        pids = []
        for n in range(3):
            m.config.write_text(f"model_list: [v{n}]\n")
            m.signals.clear()
            began = time.monotonic()
            r = m.reloader().run(timeout=20)
            assert time.monotonic() - began < drain - 3, (n, r)
            pids.append(r["new_pid"])
        assert m.signals == ["SIGTTIN"] * 3 + ["SIGTTOU"] * 3  # the last run: two drainers
        assert set(pids) & set(m.workers()) == set(pids)  # the first two still drain, the last serves
        assert settle(m, 3 * drain + 5) == [pids[-1]]
    finally:
        m.stop()


def test_the_preflight_runs_the_masters_python_with_its_environment_and_folder(tmp_path):
    m = Master(tmp_path)
    try:
        seen = []

        def run(argv, **kw):
            seen.append((argv, kw))
            return gr.subprocess.CompletedProcess(argv, 0, stdout="LITELLM_MASTER_KEY\n", stderr="")

        reloader = m.reloader(run=run)
        reloader.preflight(m.proc.pid, {"old_pids": []})
        [(argv, kw)] = seen
        assert argv[0] == gr.proc_argv(m.proc.pid)[0] and argv[-1] == gr.APP_SPEC
        assert kw["env"]["PYTHONPATH"] == str(m.lib) and kw["env"]["CONFIG_FILE_PATH"] == str(m.config)
        assert kw["cwd"] == str(m.base) and kw["timeout"] == gr.PREFLIGHT_TIMEOUT_S
        assert kw["env"]["SPARKOPS_GATEWAY_PREFLIGHT"] == "1"  # the wrapper without importing LiteLLM
        assert os.environ.get("PYTHONPATH") != str(m.lib)  # the master's, not this process's
    finally:
        m.stop()
