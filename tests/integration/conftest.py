"""Integration tests on the simulated two-Spark cluster (sim/simctl.py).

`make test` brings the cluster up first and sets SPARKOPS_REQUIRE_SIM=1, so a
missing cluster is a failure there; run alone without it, these tests skip and
say why.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SIM_STATE = ROOT / ".sim"
NODES = ["spark-sim-1", "spark-sim-2"]
VENV_BIN = ROOT / ".venv" / "bin"


def _cluster_up() -> bool:
    if not (SIM_STATE / "cluster.json").exists() or shutil.which("docker") is None:
        return False
    res = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Running}}", *NODES], capture_output=True, text=True, check=False
    )
    return res.returncode == 0 and res.stdout.split() == ["true", "true"]


@pytest.fixture(scope="session")
def sim_cluster():
    if not _cluster_up():
        if os.environ.get("SPARKOPS_REQUIRE_SIM") == "1":
            pytest.fail("the simulated cluster is not up (make sim-up) but SPARKOPS_REQUIRE_SIM=1")
        pytest.skip("simulated cluster not up: run `make sim-up` (make test does)")
    return json.loads((SIM_STATE / "cluster.json").read_text())


def node_sh(node: str, script: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a shell script on a simulated node (through docker exec, not Ansible)."""
    return subprocess.run(
        ["docker", "exec", node, "bash", "-c", script],
        capture_output=True,
        text=True,
        check=check,
        timeout=timeout,
    )


def stop_worker_ray_unwatched(worker: str = "spark-sim-2", head: str = "spark-sim-1") -> None:
    """Stop a worker's Ray with the head's watchdog stopped first.

    The watchdog would (rightly) restart the group within one interval and heal what the test wants
    the playbooks to see. The repair's site.yml starts it again: assert_watchdog_running checks it.
    """
    node_sh(head, "docker stop -t 2 sparkops-watchdog >/dev/null")
    node_sh(worker, "docker update --restart=no sparkops-ray >/dev/null && docker stop -t 2 sparkops-ray")


def reset_watchdog(head: str = "spark-sim-1") -> None:
    """The head's watchdog running with no restart in its hourly window (its full budget)."""
    node_sh(
        head,
        "docker stop -t 5 sparkops-watchdog >/dev/null && rm -f /var/lib/sparkops/watchdog-state.json"
        " && docker start sparkops-watchdog >/dev/null",
    )


def quiet_watchdog_history(head: str = "spark-sim-1") -> str:
    """A watchdog with no history: its events file set aside (kept, renamed) and its state reset.

    For a test that judges a healthy cluster: doctor rightly warns about group restarts in the last
    hour, and whatever ran before (a user's fault drill, an earlier test) must not decide the verdict.
    Returns the name the old history was kept under."""
    kept = f"/var/lib/sparkops/watchdog.jsonl.before-test-{int(time.time())}"
    node_sh(
        head,
        "docker stop -t 5 sparkops-watchdog >/dev/null"
        f" && {{ [ ! -e /var/lib/sparkops/watchdog.jsonl ] || mv /var/lib/sparkops/watchdog.jsonl {kept}; }}"
        " && rm -f /var/lib/sparkops/watchdog-state.json && docker start sparkops-watchdog >/dev/null",
    )
    return kept


def assert_watchdog_running(head: str = "spark-sim-1") -> None:
    state = node_sh(head, "docker inspect --format '{{.State.Status}}' sparkops-watchdog", check=False)
    assert state.stdout.strip() == "running", state.stdout + state.stderr


def ansible_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(
        {
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_NOCOLOR": "1",
            "SPARKOPS_SIM_STATE": str(SIM_STATE),
            "PATH": f"{VENV_BIN}:{env.get('PATH', '')}",
        }
    )
    if extra:
        env.update(extra)
    return env


def run_playbook(
    playbook: str,
    *,
    inventory: Path | str = ROOT / "inventory" / "sim",
    extra_vars: dict | None = None,
    args: list[str] | None = None,
    timeout: float = 900,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    cmd = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / playbook)]
    if extra_vars:
        cmd += ["-e", json.dumps(extra_vars)]
    cmd += args or []
    t0 = time.monotonic()
    res = subprocess.run(
        cmd, capture_output=True, text=True, cwd=ROOT, env=ansible_env(env), timeout=timeout, check=False
    )
    res.elapsed = time.monotonic() - t0  # type: ignore[attr-defined]
    record_cost(playbook, res.elapsed, res.returncode, res.stdout)
    return res


def failure(res) -> str:
    """What a failed playbook run says about why: each failed task's lines and its `msg`, else the run's end.
    CI shows only the end of the output, and a failed task's result (a plan, a long loop item) can push its
    message far from the run's last lines, so an assertion quotes the message itself."""
    lines = res.stdout.splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith(("fatal:", "failed:")) or "FAILED!" in line]
    parts = []
    for i in at[:3]:
        block = lines[max(0, i - 3) : i + 12]
        msgs = [line for line in lines[i + 12 : i + 600] if line.lstrip().startswith(("msg:", '"msg":'))]
        parts.append("\n".join(block + msgs[:1]))
    return "\n".join(parts) or res.stdout[-4000:]


# What each test spends on playbook runs, kept so that the end of the stage can print where the
# integration stage's time goes (converges per file, the slowest task kinds): the budget is seen
# in every CI log instead of found after a run past it.
COSTS_FILE = Path(os.environ.get("SPARKOPS_TEST_COSTS", str(SIM_STATE / "test-costs.jsonl")))
_TASK_TIME = re.compile(r"^(?P<name>.+?) -+ (?P<secs>\d+\.\d+)s$")


def record_cost(playbook: str, elapsed: float, rc: int, output: str) -> None:
    """One line per playbook run: the test that ran it, what it ran, its seconds, and its tasks'
    seconds (profile_tasks' summary at the end of the output)."""
    tasks = []
    for line in output.splitlines()[-40:]:
        m = _TASK_TIME.match(line.strip())
        if m:
            tasks.append([m["name"].strip(), float(m["secs"])])
    entry = {
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0],
        "playbook": playbook,
        "seconds": round(elapsed, 1),
        "rc": rc,
        "tasks": tasks,
    }
    try:
        COSTS_FILE.parent.mkdir(parents=True, exist_ok=True)
        with COSTS_FILE.open("a") as fh:
            fh.write(json.dumps(entry) + "\n")
    except OSError:
        pass  # a report, never a reason for a test to fail


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP lines -> {host: {ok, changed, failed, ...}} (the last recap wins)."""
    out: dict[str, dict[str, int]] = {}
    for line in output.splitlines():
        if ": ok=" in line and "changed=" in line:
            host, _, rest = line.partition(":")
            out[host.strip()] = {k: int(v) for k, v in (kv.split("=") for kv in rest.split())}
    return out


def copy_inventory(tmp_path: Path, mutate=None) -> Path:
    """A copy of inventory/sim whose hosts.yml `mutate(data)` may change."""
    inv = tmp_path / "inventory" / "sim"
    shutil.copytree(ROOT / "inventory" / "sim", inv)
    hosts = inv / "hosts.yml"
    data = yaml.safe_load(hosts.read_text())
    if mutate:
        mutate(data)
    hosts.write_text(yaml.safe_dump(data))
    return inv


def run_adhoc(host: str, module: str, args: dict, timeout: float = 300) -> dict:
    """Run one module on one simulated node with `ansible` and return its result dict."""
    cmd = [
        str(VENV_BIN / "ansible"),
        host,
        "-i",
        str(ROOT / "inventory" / "sim"),
        "-b",
        "-m",
        module,
        "-a",
        json.dumps(args),
    ]
    env = ansible_env(
        {
            "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
            "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
            "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.json",
        }
    )
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout, check=False)
    try:
        data = json.loads(res.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"ansible printed no JSON: {res.stdout[-2000:]} {res.stderr[-2000:]}") from exc
    return data["plays"][0]["tasks"][0]["hosts"][host]


def api_key() -> str:
    key_file = SIM_STATE / "credentials" / "api_key"
    if not key_file.is_file():
        # serve.yml makes the key on the first deployment: without it the pair never got that far.
        raise AssertionError(
            f"{key_file} does not exist: the simulated pair was never deployed as far as serve.yml "
            "(did molecule's converge or `make sim` fail? its output is earlier in this run)"
        )
    return key_file.read_text().strip()


HEAD_FAST = "10.213.0.11"
WORKER_FAST = "10.213.0.12"
ENDPOINT = f"http://{HEAD_FAST}:8000"


def simctl(*args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    """sim/simctl.py with these arguments (its log lines in stdout); check: fail saying what it said."""
    res = subprocess.run(
        ["python3", str(ROOT / "sim" / "simctl.py"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if check and res.returncode != 0:
        pytest.fail(f"simctl {' '.join(args)}: exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    return res


def inventory_hosts(hosts_yml: dict) -> dict:
    """Every host of a hosts.yml (any nesting of groups) -> its variables."""
    found: dict = {}

    def walk(group: dict) -> None:
        for host, hv in (group.get("hosts") or {}).items():
            found[host] = hv or {}
        for child in (group.get("children") or {}).values():
            walk(child or {})

    for group in hosts_yml.values():
        walk(group or {})
    return found


def links_by_host(hosts_yml: dict) -> dict:
    """host -> its fast links as sorted (netdev, rdma_device, address)."""
    return {
        host: sorted((lk["netdev"], lk["rdma_device"], lk["address"]) for lk in hv.get("sparkops_fast_links", []))
        for host, hv in inventory_hosts(hosts_yml).items()
    }


def subnet_ends(hosts_yml: dict) -> set:
    """The cabling an inventory describes, whatever its addresses: each subnet as the set of its ends
    (host, netdev, rdma_device)."""
    ends: dict = {}
    for host, hv in inventory_hosts(hosts_yml).items():
        for lk in hv.get("sparkops_fast_links", []):
            net = ipaddress.ip_interface(lk["address"]).network
            ends.setdefault(net, set()).add((host, lk["netdev"], lk["rdma_device"]))
    return {frozenset(e) for e in ends.values()}


def discover(hosts_only: Path, out: Path | None, pool: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """playbooks/discover.yml on a hosts-only inventory (the pool: the test bed's own subnets, so the
    proposed addresses are the ones Docker gave the links)."""
    extra = {"sparkops_discover_pool": pool}
    if out is not None:
        extra["sparkops_discover_out"] = str(out)
    return run_playbook("playbooks/discover.yml", inventory=hosts_only, extra_vars=extra, timeout=timeout)


# The transition chain: these files run last, in this order, each starting from where the previous one
# left the pair (one converge per step, no way back to the reference in between); every other file needs
# the reference deployment and leaves it serving, so they run first, in their usual order.
CHAIN = ["test_serving_plan.py", "test_deployments.py", "test_gateway.py", "test_transitions.py"]


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: CHAIN.index(item.path.name) + 1 if item.path.name in CHAIN else 0)


_COSTS_START: list[int] = []


def pytest_sessionstart(session):
    _COSTS_START.append(COSTS_FILE.stat().st_size if COSTS_FILE.exists() else 0)


def pytest_terminal_summary(terminalreporter):
    """Where the playbook time went in this run: per test file, the converges (site.yml, upgrade.yml)
    and all playbook runs with their seconds; then the task kinds that waited longest."""
    if not COSTS_FILE.exists() or not _COSTS_START:
        return
    with COSTS_FILE.open() as fh:
        fh.seek(_COSTS_START[0])
        entries = [json.loads(line) for line in fh if line.strip()]
    if not entries:
        return
    per_file: dict = {}
    waits: dict = {}
    for e in entries:
        f = per_file.setdefault(e["test"].split("::")[0] or "?", [0, 0, 0.0])
        f[0] += 1
        f[1] += e["playbook"].endswith(("site.yml", "upgrade.yml"))
        f[2] += e["seconds"]
        for name, secs in e["tasks"]:
            if re.search(r"wait|pause|until|poll|settle|sleep|ready", name, re.I):
                waits[name] = waits.get(name, 0.0) + secs
    tr = terminalreporter
    tr.write_sep("-", "playbook time per test file (runs, converges, seconds)")
    for name, (runs, converges, secs) in sorted(per_file.items(), key=lambda kv: -kv[1][2]):
        tr.write_line(f"{secs:8.0f} s  {runs:3d} runs  {converges:3d} converges  {name}")
    total = sum(v[2] for v in per_file.values())
    tr.write_line(f"{total:8.0f} s  {len(entries):3d} runs in all")
    tr.write_sep("-", "tasks that wait (summed over the runs, the 12 largest)")
    for name, secs in sorted(waits.items(), key=lambda kv: -kv[1])[:12]:
        tr.write_line(f"{secs:8.0f} s  {name[:110]}")
