"""A first deployment as a new user makes it, on the controller only: playbooks/plan.yml (which contacts no
host) and ansible-inventory on copies of inventory/two-sparks and inventory/examples/ring-4.

The controller's state stays out of the folder Ansible reads as inventory (an older layout is moved out),
warnings and refusals are printed once, a misspelt variable is named with the closest known one, and
profile overrides change one key of a shipped profile.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[4]
PLAYBOOK = ROOT / "playbooks" / "plan.yml"
TP2 = "qwen3-235b-a22b-gptq-int4-tp2"


def _env() -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}"
    return env


def _run(*argv: str) -> tuple[int, str]:
    res = subprocess.run(argv, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120, check=False)
    return res.returncode, res.stdout + res.stderr


def _plan(inv: Path, *extra: str) -> tuple[int, str]:
    return _run("ansible-playbook", "-i", str(inv), str(PLAYBOOK), *extra)


def _copy(tmp_path: Path, source: str = "inventory/two-sparks", name: str = "sparks") -> Path:
    inv = tmp_path / name
    shutil.copytree(ROOT / source, inv)
    return inv


def _settings(inv: Path, **values) -> None:
    path = inv / "group_vars" / "all" / "cluster.yml"
    data = yaml.safe_load(path.read_text()) or {}
    data.update(values)
    path.write_text(yaml.safe_dump(data))


def _graph(inv: Path) -> str:
    rc, out = _run("ansible-inventory", "-i", str(inv), "--graph")
    assert rc == 0, out
    return out


def test_the_inventory_graph_lists_only_the_sparks_after_plan_a_key_and_a_lock(tmp_path):
    inv = _copy(tmp_path)
    rc, out = _plan(inv)
    assert rc == 0, out[-3000:]
    state = tmp_path / "sparks-state"
    plan = json.loads((state / "sparkops-plan.json").read_text())
    assert plan["paths"]["state_dir"] == str(state)
    (state / "credentials" / "keys").mkdir(parents=True)
    (state / "credentials" / "api_key").write_text("sk-not-a-host\n")
    (state / "credentials" / "keys" / "alice").write_text("sk-alice\n")
    # the lock of a first deployment (what deployment_state writes: the plan's wanted record)
    (state / "sparkops.lock.json").write_text(json.dumps({"lock_version": 1, **plan["serving"]["lock"]["wanted"]}))
    (state / "reports").mkdir(exist_ok=True)
    (state / "reports" / "health.json").write_text("{}\n")
    assert sorted(p.name for p in inv.iterdir()) == ["group_vars", "hosts.yml"]
    graph = _graph(inv)
    assert [re.sub(r"^[\s|]*(--)?", "", line) for line in graph.splitlines() if line.strip()] == [
        "@all:", "@ungrouped:", "@spark_cluster:", "@spark_head:", "spark-1", "@spark_workers:", "spark-2",
    ]  # fmt: skip
    assert "WARNING" not in graph
    # and a second plan reads its inventory without a warning about its own files
    rc, out = _plan(inv)
    assert rc == 0 and "not a valid group definition" not in out and "[WARNING]" not in out, out[-3000:]


def test_an_older_layout_inside_the_inventory_is_moved_out_and_said_once(tmp_path):
    inv = _copy(tmp_path)
    (inv / "credentials" / "keys").mkdir(parents=True)
    (inv / "credentials" / "api_key").write_text("sk-not-a-host\n")
    (inv / "credentials" / "keys" / "alice").write_text("sk-alice\n")
    (inv / "reports").mkdir()
    (inv / "reports" / "health.json").write_text("{}\n")
    (inv / "wheelhouse" / "gateway").mkdir(parents=True)
    (inv / "sparkops-plan.json").write_text('{"cables": [], "endpoint": {}}\n')
    assert "sk-not-a-host" in _graph(inv)  # what the older layout did: the key is a host
    rc, out = _plan(inv)
    assert rc == 0, out[-3000:]
    state = tmp_path / "sparks-state"
    for name in ("credentials", "reports", "wheelhouse", "sparkops-plan.json"):
        assert out.count(f"moved {inv / name} to {state / name}") == 1, out[-3000:]
    assert (state / "credentials" / "keys" / "alice").read_text() == "sk-alice\n"
    assert sorted(p.name for p in inv.iterdir()) == ["group_vars", "hosts.yml"]
    assert "sk-not-a-host" not in _graph(inv)
    rc, out = _plan(inv)
    assert rc == 0 and "moved " not in out, out[-3000:]


def test_a_broken_four_node_ring_is_refused_once_in_one_block(tmp_path):
    inv = _copy(tmp_path, "inventory/examples/ring-4", "ring")
    hosts = inv / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("192.168.22.2/24", "192.168.23.2/24"))
    rc, out = _plan(inv)
    assert rc != 0
    flat = " ".join(out.split())
    assert flat.count("no other node has an address in 192.168.22.0/24") == 1, out
    assert flat.count("no other node has an address in 192.168.23.0/24") == 1, out
    assert flat.count("The inventory describes no valid sparkops cluster (2 problems)") == 1, out
    assert out.count("fatal: ") == 1 and "UNREACHABLE" not in out


def test_a_misspelt_variable_and_a_profile_key_are_named_once(tmp_path):
    inv = _copy(tmp_path)
    _settings(inv, sparkops_serving_profle="qwen3-30b-a3b", gpu_memory_utilization=0.95)
    rc, out = _plan(inv)
    assert rc == 0, out[-3000:]
    flat = " ".join(out.split())
    assert flat.count("sparkops_serving_profle (in group_vars/all/cluster.yml) is no sparkops variable") == 1
    assert "did you mean sparkops_serving_profile?" in flat
    assert flat.count("gpu_memory_utilization (in group_vars/all/cluster.yml) is a key of a serving profile") == 1


def test_an_override_changes_one_key_of_the_shipped_profile(tmp_path):
    inv = _copy(tmp_path)
    _settings(inv, sparkops_serving_overrides={TP2: {"gpu_memory_utilization": 0.8}})
    rc, out = _plan(inv)
    assert rc == 0, out[-3000:]
    plan = json.loads((tmp_path / "sparks-state" / "sparkops-plan.json").read_text())
    (dep,) = plan["serving"]["deployments"]
    assert dep["profile"]["gpu_memory_utilization"] == 0.8
    assert dep["profile"]["model"] == "Qwen/Qwen3-235B-A22B-GPTQ-Int4"
    assert "--gpu-memory-utilization 0.8 " in " ".join(dep["members"][0]["vllm"]["argv"]) + " "
    _settings(inv, sparkops_serving_overrides={"qwen3-235b-a22b-gptq-int4-tp3": {"max_model_len": 1024}})
    rc, out = _plan(inv)
    assert rc != 0
    assert "names the profile 'qwen3-235b-a22b-gptq-int4-tp3', which is none: did you mean" in " ".join(out.split())


def test_sparks_that_serve_nothing_are_warned(tmp_path):
    inv = _copy(tmp_path, "inventory/examples/ring-4", "ring")
    path = inv / "group_vars" / "all" / "cluster.yml"
    data = yaml.safe_load(path.read_text())
    data.pop("sparkops_deployments")
    data.update(sparkops_serving_profile=TP2, sparkops_executor="mp")
    path.write_text(yaml.safe_dump(data))
    rc, out = _plan(inv)
    assert rc == 0, out[-3000:]
    assert " ".join(out.split()).count("spark-3, spark-4 serve nothing") == 1, out[-3000:]


def test_wrong_types_and_choices_are_listed_once_without_the_spec(tmp_path):
    inv = _copy(tmp_path)
    _settings(inv, sparkops_fast_mtu="abc", sparkops_executor="rya")
    rc, out = _plan(inv)
    assert rc != 0
    flat = " ".join(out.split())
    assert flat.count("argument 'sparkops_fast_mtu' is of type str and we were unable to convert to int") == 1, out
    assert flat.count("value of sparkops_executor must be one of: ray, mp, got: rya") == 1, out
    assert "The inventory describes no valid sparkops cluster (2 problems)" in flat
    # Ansible's own check would print the whole spec with the error (about 830 lines).
    assert "argument_spec_data" not in out and len(out.splitlines()) < 120, len(out.splitlines())


def test_the_state_folders_are_made_private_once_and_a_stage_that_needs_the_image_is_refused_before_it(tmp_path):
    inv = _copy(tmp_path)
    state = tmp_path / "sparks-state"
    # A stage that runs the image without building it (serve, weights, watchdog), on a branch no lock has pinned:
    # refused, once, before anything is made.
    rc, out = _plan(inv, "-e", "spark_vllm_image_ref=main", "-e", "cluster_facts_require_image=true")
    assert rc != 0
    flat = " ".join(out.split())
    assert flat.count("spark_vllm_image_ref (main) is a branch or tag, and no lock file records the commit") == 1, out
    assert "run site.yml (or playbooks/image.yml) first" in flat and out.count("fatal: ") == 1, out[-3000:]
    assert not state.exists()
    # The role's option is checked by its action (no argument spec task in every play): a wrong value is named.
    rc, out = _plan(inv, "-e", "cluster_facts_require_image=maybe")
    assert rc != 0
    assert "require_image is 'maybe', not a boolean; give true or false (cluster_facts_require_image)" in " ".join(
        out.split()
    ), out[-3000:]
    assert not state.exists()
    rc, out = _plan(inv, "-e", "spark_vllm_image_ref=main")
    assert rc == 0, out[-3000:]
    assert (state.stat().st_mode & 0o777, (state / "reports").stat().st_mode & 0o777) == (0o700, 0o700)
    assert "changed: [spark-1]" in _task_output(out, "Build the cluster model"), out[-3000:]
    rc, out = _plan(inv, "-e", "spark_vllm_image_ref=main")
    assert rc == 0 and "changed: " not in _task_output(out, "Build the cluster model"), out[-3000:]


def _task_output(out: str, task: str) -> str:
    """What a run printed for one task: from its TASK line to the next one."""
    start = out.index(f"{task}")
    end = out.find("\nTASK [", start)
    return out[start : end if end != -1 else len(out)]
