"""Bad inventories and settings are refused in preflight, before any host changes.

Each case runs site.yml against the simulated cluster with one thing wrong and
asserts (1) the run fails, (2) the output carries the message that says what
to fix, and (3) no file under the paths sparkops writes changed on either node.

The inventory checks themselves (groups, links, addresses, subnets, cables against the topology,
MTU, driver branch, hardware kind) are unit tests of the cluster model
(tests/unit/plugins/plugin_utils/test_cluster.py), and the serving profile's rules are unit tests of the
serving plan (tests/unit/plugins/plugin_utils/test_serving_plan.py). The few kept here prove that a refusal by
the model or the plan changes nothing on a host; the missing interface needs a host to find out.
"""

from __future__ import annotations

import pytest
import yaml
from conftest import NODES, ROOT, copy_inventory, node_sh, run_playbook

WATCHED = "/etc/sparkops /etc/apt/preferences.d /etc/netplan /var/lib/sparkops /root/.ssh /etc/iptables"
# The state folder itself: its mtime moves whenever the watchdog replaces a file in it.
STATE_DIR = "/var/lib/sparkops"
# Live files of services that keep running during the test: Ray's session logs, and what the
# watchdog and the memory floor write every few seconds (their events and state; the answer-quality
# baseline, which the watchdog records at its first judgement of a new deployment).
LIVE = [
    "/var/lib/sparkops/private/ray",
    "/var/lib/sparkops/watchdog.jsonl",
    "/var/lib/sparkops/watchdog-state.json",
    "/var/lib/sparkops/quality-baseline.json",
    "/var/lib/sparkops/memory-floor.jsonl",
]
IGNORED = " ".join(f"-path {p} -prune -o" for p in LIVE)


@pytest.fixture
def unchanged_hosts(sim_cluster):
    """Marks a moment on both nodes; afterwards asserts nothing sparkops manages was written since."""
    for node in NODES:
        node_sh(node, "touch /tmp/sparkops-bad-input-marker; docker ps -aq --no-trunc | sort > /tmp/containers.before")
    yield
    for node in NODES:
        res = node_sh(
            node,
            f"find {WATCHED} {IGNORED} -newer /tmp/sparkops-bad-input-marker ! -path {STATE_DIR} -print 2>/dev/null"
            " | head -20; "
            "docker ps -aq --no-trunc | sort | diff - /tmp/containers.before",
            check=False,
        )
        assert res.stdout.strip() == "", f"{node} changed during a refused run:\n{res.stdout}"


def _heads(data):
    return data["all"]["children"]["spark_cluster"]["children"]


def missing_interface(data):
    _heads(data)["spark_workers"]["hosts"]["spark-sim-2"]["sparkops_fast_links"][0]["netdev"] = "enp1s0f9np9"


def hostile_netdev(data):
    # The audit's injection: it ran `touch /tmp/x` as root in the firewall script.
    link = _heads(data)["spark_workers"]["hosts"]["spark-sim-2"]["sparkops_fast_links"][0]
    link["netdev"] = "enp1s0f1np1 -j ACCEPT; touch /tmp/x #"


def _profile(name="bad", **changes):
    """The simulated cluster's shipped profile under `name`, with `changes`. Under another name the lock
    (the profile the pair was deployed with) refuses it too, in the same message as the profile's own
    problems; under the deployed name only what `changes` breaks is refused."""
    shipped = yaml.safe_load((ROOT / "roles/sparkops_defaults/defaults/main/serving_profiles.yml").read_text())
    base = {**shipped["sparkops_serving_profiles"]["sim-tiny-tp2"], **changes}
    return {"sparkops_serving_profiles_extra": {name: base}, "sparkops_serving_profile": name}


INVENTORY_CASES = {
    "netdev carrying shell": (hostile_netdev, "which the kernel refuses in a device name"),
    "interface that does not exist": (missing_interface, "has no interface enp1s0f9np9"),
}

VARS_CASES = {
    "enforce-eager": (_profile(extra_args=["--enforce-eager"]), "enforce-eager"),
    "not enough disk for the weights": (
        # The deployed profile's name: a node's disk is judged on the node, after the plan (and the lock) passed.
        {**_profile("sim-tiny-tp2", weights_gib=100000), "sparkops_node_memory_gib": 10000000},
        "GiB free",
    ),
}


# One run per kind of refusal proves that kind changes no host: the cluster model's (on the controller), the
# serving plan's (on the controller), and the two a node decides (its interfaces, its disk). The other cases'
# messages are unit tests of the model and the plan, which need no host: ring on two nodes and two heads
# (tests/unit/plugins/plugin_utils/test_cluster.py), a duplicate address, an unknown weights host, the API on a
# worker, a newline in the env (test_plan_playbook.py, test_cluster_inputs.py), the management interface
# (test_cluster_inputs.py), an unknown profile and a gated model without a token (test_serving_plan.py).
@pytest.mark.parametrize("case", sorted(INVENTORY_CASES))
def test_bad_inventory_refused_before_changes(case, tmp_path, unchanged_hosts):
    mutate, message = INVENTORY_CASES[case]
    inv = copy_inventory(tmp_path, mutate)
    res = run_playbook("site.yml", inventory=inv, env={"HF_TOKEN": ""}, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode != 0, f"{case}: site.yml succeeded\n{out[-3000:]}"
    assert message in " ".join(out.split()), f"{case}: expected {message!r} in output\n{out[-4000:]}"
    assert "Preflight" in out


@pytest.mark.parametrize("case", sorted(VARS_CASES))
def test_bad_setting_refused_before_changes(case, unchanged_hosts):
    extra, message = VARS_CASES[case]
    res = run_playbook("site.yml", extra_vars=extra, env={"HF_TOKEN": ""}, timeout=300)
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode != 0, f"{case}: site.yml succeeded\n{out[-3000:]}"
    if message:
        assert message in out, f"{case}: expected {message!r} in output\n{out[-4000:]}"
    assert "preflight" in out.lower()
