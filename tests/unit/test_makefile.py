"""`make help` names every target a user can run (issue 16.6: it omitted sim-destroy and had no
day-2 targets), and the day-2 targets run the playbooks the README names against INVENTORY."""

from __future__ import annotations

import re
import subprocess

from conftest import ROOT

DAY2 = {"status", "verify", "benchmark", "upgrade", "teardown", "doctor"}


def targets() -> set[str]:
    names = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(r"^([a-z][a-z0-9-]*):(?!=)", line)
        if m:
            names.add(m.group(1))
    return names


def make(*args: str) -> str:
    res = subprocess.run(["make", "-s", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_help_lists_every_target():
    help_text = make("help")
    listed = set(re.findall(r"make ([a-z][a-z0-9-]*)", help_text))
    missing = targets() - listed - {"help", "venv"}
    assert not missing, f"targets missing from make help: {sorted(missing)}"
    assert DAY2 | {"sim-destroy", "sim-down", "sim-info"} <= listed
    assert "make" in help_text and "python3-venv" in help_text


def test_day2_targets_run_their_playbook_against_inventory():
    for name in sorted(DAY2):
        line = make("-n", name, "INVENTORY=/x/inv", "ARGS=-e a=b").strip().splitlines()[-1]
        assert line.endswith(f"ansible-playbook playbooks/{name}.yml -i /x/inv -e a=b"), line
