"""A copy of inventory/sim made outside the checkout finds the SSH key and known_hosts (issue 16.6).

sim/simctl.py writes the state directory's absolute path into the inventory; Ansible renders the
connection variables from it. `ansible -m debug` renders them on the controller without connecting.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

VENV_BIN = Path(sys.executable).parent


def load_simctl(monkeypatch, state: Path):
    monkeypatch.setenv("SPARKOPS_SIM_STATE", str(state))
    spec = importlib.util.spec_from_file_location("simctl_under_test", ROOT / "sim" / "simctl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rendered(inventory: Path, var: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SPARKOPS_SIM_STATE"}
    env.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    res = subprocess.run(
        [str(VENV_BIN / "ansible"), "spark-sim-2", "-i", str(inventory), "-o", "-m", "ansible.builtin.debug",
         "-a", f"msg={{{{ {var} }}}}"],
        capture_output=True, text=True, env=env, cwd=inventory.parent, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout.split("=>", 1)[1])["msg"]


def test_copied_inventory_finds_the_key_by_absolute_path(tmp_path, monkeypatch):
    state = tmp_path / "somewhere" / "state"
    (state / "ssh").mkdir(parents=True)
    copy = tmp_path / "elsewhere" / "sim"
    shutil.copytree(ROOT / "inventory" / "sim", copy)
    (copy / "group_vars" / "all" / "sim_state.yml").unlink(missing_ok=True)
    simctl = load_simctl(monkeypatch, state)
    written = simctl.write_inventory_state(state, copy / "group_vars" / "all" / "sim_state.yml")
    assert str(state) in written.read_text()

    key = rendered(copy, "ansible_ssh_private_key_file")
    assert key == str(state / "ssh" / "id_ed25519")
    args = rendered(copy, "ansible_ssh_common_args")
    assert f"UserKnownHostsFile={state / 'ssh' / 'known_hosts'}" in args
    assert ".." not in key and ".." not in args


def test_sim_down_says_what_stays_and_how_to_remove_it(tmp_path, monkeypatch, capsys):
    """Issue 16.6: `make sim-down` left dockerd and ~860 MB of images without a word."""
    simctl = load_simctl(monkeypatch, tmp_path / "state")
    calls = []
    monkeypatch.setattr(simctl, "docker_ok", lambda: True)
    # down() lists the test bed's nodes and networks (whatever topology made them): nothing here.
    monkeypatch.setattr(
        simctl, "run", lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", "")
    )
    # Nor the machine's processes: stop_daemon would stop the registry and Hub of a simulated cluster that is up
    # while this runs (make test runs the unit tests beside the cluster's integration files).
    stopped = []
    monkeypatch.setattr(simctl, "stop_daemon", lambda name, marker, **kw: stopped.append(name) or [])
    simctl.down(simctl.argparse.Namespace(all=False, keep_volumes=False, reset_state=False))
    assert sorted(stopped) == ["hub", "pypi", "registry"]
    said = " ".join(capsys.readouterr().out.split())
    assert "dockerd" in said and "860 MB" in said and "make sim-destroy" in said, said
    assert not any(c[:3] == ["docker", "image", "rm"] for c in calls)


def test_make_test_starts_from_a_cluster_without_history(tmp_path, monkeypatch):
    """Issue 29: `down --reset-state` (run-stages.sh's sim-fresh) forgets what a deployment left on the
    controller - the lock an upgrade moved, the key, the reports, the bigger clusters' inventories - and
    keeps the caches that make the next start warm."""
    state = tmp_path / "state"
    simctl = load_simctl(monkeypatch, state)
    monkeypatch.setattr(simctl, "docker_ok", lambda: False)
    for d in ("reports", "credentials", "inventories/ring-4", "wheels", "git", "apt"):
        (state / d).mkdir(parents=True)
    (state / "sparkops.lock.json").write_text("{}")
    (state / "reports" / "doctor.json").write_text("{}")
    simctl.down(simctl.argparse.Namespace(all=False, keep_volumes=False, reset_state=True))
    assert sorted(p.name for p in state.iterdir()) == ["apt", "git", "wheels"]
    rs = (ROOT / "tests" / "run-stages.sh").read_text()
    assert "fresh_sim && make -s sim-up && molecule test -s default" in rs  # the bring-up starts from nothing
    assert "simctl.py down --reset-state" in rs
