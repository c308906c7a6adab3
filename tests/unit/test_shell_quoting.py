"""Every shell line sparkops builds from inventory values keeps each value one argument (issue 23).

The audit ran `enp1s0f1np1 -j ACCEPT; touch /tmp/x #` as a netdev in the firewall script, and found
container names unquoted in upgrade-swap.yml and in the watchdog's remote script. Each test renders
the real task (or calls the real function) with hostile values, runs the result with bash against
stand-ins for iptables/docker that record their argv, and checks that nothing ran but them and that
each value arrived as one argument. (The model refuses such names too: tests/unit/plugins/plugin_utils/
test_cluster_inputs.py; this is the second wall.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins" / "plugin_utils"))
sys.path.insert(0, str(ROOT / "tests" / "unit" / "plugins" / "plugin_utils"))

import cluster_inventories as inv  # noqa: E402
from cluster import FORWARD_CHAIN, _forward_rules, build_cluster  # noqa: E402
from role_templates import find_task  # noqa: E402

_spec = importlib.util.spec_from_file_location("sparkops_watchdog", ROOT / "roles/watchdog/files/sparkops_watchdog.py")
wd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wd)

HOSTILE = [
    "enp1s0f1np1 -j ACCEPT; touch {mark} #",
    "x$(touch {mark})",
    "x`touch {mark}`",
    "x'; touch {mark}; '",
    'x"; touch {mark}; "',
    "x\ntouch {mark}",
]

# Stand-in for iptables and docker: records its argv (one JSON list per call). `iptables -C` and
# `iptables -n -L` answer "not there" so that every rule is added; `docker inspect` says running.
RECORDER = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["ARGV_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
if os.path.basename(sys.argv[0]) in ("iptables", "ip6tables") and sys.argv[1] in ("-C", "-n"):
    sys.exit(1)
if sys.argv[1:2] == ["inspect"]:
    print("true")
"""


def _quote(value):
    # Ansible's `quote` filter (ansible/plugins/filter/core.py quote): shlex.quote of the text.
    return shlex.quote(str(value))


def render_task(path: Path, name: str, **values) -> str:
    """The `cmd` of the named shell task in path, templated the way Ansible does (trim_blocks)."""
    task = find_task(path, name)
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["quote"] = _quote
    task_vars = {
        k: env.from_string(v).render(**values) if isinstance(v, str) else v for k, v in task.get("vars", {}).items()
    }
    return env.from_string(task["ansible.builtin.shell"]["cmd"]).render(**values, **task_vars)


def run_with_recorder(tmp_path: Path, script: str, shell: str = "/bin/bash", env: dict | None = None) -> list:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("iptables", "ip6tables", "docker"):
        (bin_dir / tool).write_text(RECORDER)
        (bin_dir / tool).chmod(0o755)
    log = tmp_path / "argv.jsonl"
    log.write_text("")
    full_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "ARGV_LOG": str(log), "CHECK_ONLY": "False"}
    full_env.update(env or {})
    res = subprocess.run([shell, "-c", script], env=full_env, capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def _ring_node(netdevs):
    return {"netdevs": netdevs, "forward_rules": _forward_rules(netdevs)}


# ----------------------------------------------------------------------- ring forwarding rules
@pytest.mark.parametrize("hostile", HOSTILE)
def test_the_forwarding_script_passes_every_rule_as_argv(tmp_path, hostile):
    mark = tmp_path / "pwned"
    node = _ring_node(["enp1s0f0np0", hostile.format(mark=mark)])
    script = render_task(ROOT / "roles/roce_network/tasks/forwarding.yml",
                         "Forward only between the fast links on a ring node (iptables chain SPARKOPS-FWD)",
                         sparkops_node=node, ansible_check_mode=False)  # fmt: skip
    calls = run_with_recorder(tmp_path, script)
    assert not mark.exists()
    for tool in ("iptables", "ip6tables"):  # the same rules for IPv6: they name interfaces only
        added = [c[1:] for c in calls if c[0] == tool and c[1] in ("-I", "-A")]
        assert added == [r["where"] + r["rule"] for r in node["forward_rules"]]
        assert [tool, "-N", FORWARD_CHAIN] in calls


def test_the_forwarding_script_changes_nothing_in_check_mode(tmp_path):
    node = _ring_node(["enp1s0f0np0", "enp1s0f1np1"])
    script = render_task(ROOT / "roles/roce_network/tasks/forwarding.yml",
                         "Forward only between the fast links on a ring node (iptables chain SPARKOPS-FWD)",
                         sparkops_node=node, ansible_check_mode=True)  # fmt: skip
    calls = run_with_recorder(tmp_path, script, env={"CHECK_ONLY": "True"})
    assert calls and all(c[1] in ("-C", "-n") for c in calls)


# --------------------------------------------------------------------- the upgrade's watchdog pause
@pytest.mark.parametrize("hostile", HOSTILE)
def test_the_upgrade_pauses_the_watchdog_by_its_quoted_name(tmp_path, hostile):
    mark = tmp_path / "pwned"
    name = hostile.format(mark=mark)
    script = render_task(ROOT / "playbooks/tasks/upgrade-swap.yml", "Pause the watchdog on every node for the swap",
                         sparkops_container_names={"watchdog": name})  # fmt: skip
    calls = run_with_recorder(tmp_path, script, shell="/bin/sh")  # Ansible's shell module runs /bin/sh
    assert not mark.exists()
    assert calls == [
        ["docker", "inspect", "--format", "{{.State.Running}}", name],
        ["docker", "stop", "-t", "5", name],
    ]


# ------------------------------------------------------------------ the watchdog's remote scripts
@pytest.mark.parametrize("hostile", HOSTILE)
def test_the_watchdogs_remote_lines_keep_names_one_argument(tmp_path, hostile):
    mark = tmp_path / "pwned"
    cfg = {"ray_container": hostile.format(mark=mark), "floor_marker": f"{tmp_path}/floor; touch {mark}"}
    # ssh gives the remote user's shell one command line (as `sh -c`): run it the same way.
    calls = run_with_recorder(tmp_path, wd.worker_state_script(cfg), shell="/bin/sh")
    calls += run_with_recorder(tmp_path, wd.worker_restart_script(cfg), shell="/bin/sh")
    assert not mark.exists()
    assert calls == [
        ["docker", "inspect", "--format", "{{.State.Status}}", cfg["ray_container"]],
        ["docker", "restart", "-t", "10", cfg["ray_container"]],
    ]


def test_the_watchdog_reads_the_floor_marker_by_its_quoted_path(tmp_path):
    marker = tmp_path / "a b; echo floor-tripped"
    cfg = {"ray_container": "sparkops-ray", "floor_marker": str(marker)}
    out = subprocess.run(["/bin/sh", "-c", wd.worker_state_script(cfg)], capture_output=True, text=True,
                         env={"PATH": "/nonexistent"}, timeout=30, check=False).stdout.split()  # fmt: skip
    assert "floor-tripped" not in out  # the marker does not exist: nothing else may print the word
    marker.write_text("")
    out = subprocess.run(["/bin/sh", "-c", wd.worker_state_script(cfg)], capture_output=True, text=True,
                         env={"PATH": "/nonexistent"}, timeout=30, check=False).stdout.split()  # fmt: skip
    assert out == ["missing", "floor-tripped"]


def test_a_real_model_renders_the_same_rules_it_holds(tmp_path):
    node = build_cluster(inv.ring(4))["nodes"]["spark-2"]
    script = render_task(ROOT / "roles/roce_network/tasks/forwarding.yml",
                         "Forward only between the fast links on a ring node (iptables chain SPARKOPS-FWD)",
                         sparkops_node=node, ansible_check_mode=False)  # fmt: skip
    calls = run_with_recorder(tmp_path, script)
    for tool in ("iptables", "ip6tables"):
        got = [c[1:] for c in calls if c[0] == tool and c[1] in ("-I", "-A")]
        assert got == [r["where"] + r["rule"] for r in node["forward_rules"]]
