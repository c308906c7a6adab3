"""Which running watchdogs a new serving plan outdates (plugins/plugin_utils/watchdog_scope.py).

The running config is what roles/watchdog really writes for the old plan: its watchdog_config
(vars/main.yml) templated by ansible-core's own Templar with the role's defaults and the plan
cluster_facts would set, and dumped as the role's config_files task writes watchdog.json. The new plan
is judged from the node's part alone, as playbooks/serve.yml does before Ray and vLLM move.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkops.cluster.plugins.filter.serving import FilterModule
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving import node_part
from ansible_collections.sparkops.cluster.plugins.plugin_utils.watchdog_scope import outdated_reasons, planned_group
from cluster_inventories import switch
from role_templates import render_role
from test_serving_plan import CLUSTER_DEFAULTS, plan_of

ROOT = Path(__file__).resolve().parents[4]
TP2 = "qwen3-235b-a22b-gptq-int4-tp2"
GPT_OSS = "gpt-oss-120b-mxfp4"
QWEN30 = "qwen3-30b-a3b"
NAMES = CLUSTER_DEFAULTS["sparkops_container_names"]
IMAGE = "vllm-node:74c02c37c280-1a2b3c4d"  # sparkops_image as the image role names a build


def written_config(cluster: dict, plan: dict, host: str, image: str = IMAGE) -> str:
    """watchdog.json as roles/watchdog writes it on `host` for `plan` (to_nice_json of watchdog_config)."""
    config = render_role("watchdog", "{{ watchdog_config }}", cluster, plan, host, sparkops_image=image)
    return json.dumps(config, indent=4, sort_keys=True) + "\n"


def reasons(old: tuple, new: tuple, host: str) -> list:
    """Why `host`'s watchdog, configured by the role for the old plan, watches what the new plan changes."""
    (old_cluster, old_plan), (cluster, plan) = old, new
    running = written_config(old_cluster, old_plan, host)
    return outdated_reasons(running, node_part(plan, host), host, cluster["nodes"], NAMES, image=IMAGE)


REFERENCE = {}  # the reference: Ray TP=2 over the pair
MP = {"executor": "mp"}
TWO_SINGLES = {
    "deployments": [
        {"name": "chat", "profile": GPT_OSS, "hosts": ["spark-1"]},
        {"name": "code", "profile": QWEN30, "hosts": ["spark-2"]},
    ]
}
TWO_REPLICAS = {"deployments": [{"name": "code", "profile": QWEN30, "hosts": ["spark-1", "spark-2"]}]}
SWAPPED = {
    "deployments": [
        {"name": "chat", "profile": GPT_OSS, "hosts": ["spark-2"]},
        {"name": "code", "profile": QWEN30, "hosts": ["spark-1"]},
    ]
}


# ----------------------------------------------------------------------- the written config is understood
@pytest.mark.parametrize("shape", [REFERENCE, MP, TWO_SINGLES, TWO_REPLICAS], ids=["ray", "mp", "singles", "replicas"])
def test_an_unchanged_plan_keeps_every_watchdog(shape):
    """Every field the role writes is read back as the plan says it: a no-op run stops nothing."""
    planned = plan_of(**shape)
    for host in ("spark-1", "spark-2"):
        assert reasons(planned, planned, host) == [], host


def test_the_role_writes_the_group_the_function_expects():
    """planned_group names watchdog.json's own fields and values (the comparison is not vacuous)."""
    cluster, plan = plan_of()
    written = json.loads(written_config(cluster, plan, "spark-1"))
    group = planned_group(node_part(plan, "spark-1"), "spark-1", cluster["nodes"], NAMES, image=IMAGE)
    assert written["watch"] is True
    assert {k: written[k] for k in group} == group
    assert group["executor"] == "ray" and [w["name"] for w in group["workers"]] == ["spark-2"]
    assert planned_group(node_part(plan, "spark-2"), "spark-2", cluster["nodes"], NAMES, image=IMAGE) is None
    assert json.loads(written_config(cluster, plan, "spark-2"))["watch"] is False


# ----------------------------------------------------------------------------------------- transitions
def test_ray_to_mp_stops_the_head_s_watchdog_and_keeps_the_worker_s():
    old, new = plan_of(), plan_of(**MP)
    assert reasons(old, new, "spark-1") == ["executor: ray -> mp"]
    # The worker's watchdog watched nothing (memory floor only): it restarts nothing, so it keeps running.
    assert reasons(old, new, "spark-2") == []
    assert reasons(new, old, "spark-1") == ["executor: mp -> ray"]


def test_two_single_node_deployments_back_to_tp2_over_ray():
    """The measured failure: spark-2's watchdog watched its own single-node deployment and kept restarting
    the vLLM container the converge had removed; under the new plan spark-2 is a Ray worker (watch false)."""
    old, new = plan_of(**TWO_SINGLES), plan_of()
    (worker,) = reasons(old, new, "spark-2")
    assert "single group serving qwen3-30b-a3b" in worker and "no API on spark-2" in worker
    head = reasons(old, new, "spark-1")
    assert [r.split(":")[0] for r in head] == ["executor", "model", "workers"]
    assert head[0] == "executor: single -> ray"
    spark2_ip = new[0]["nodes"]["spark-2"]["primary"]["ip"]
    assert head[2] == f'workers: [] -> [{{"address": "{spark2_ip}", "name": "spark-2"}}]'
    # And the way there: the head changes group, the worker had nothing to watch.
    assert reasons(new, old, "spark-1")[0] == "executor: ray -> single"
    assert reasons(new, old, "spark-2") == []


def test_a_deployment_moved_to_the_other_node_stops_both_watchdogs():
    old, new = plan_of(**TWO_SINGLES), plan_of(**SWAPPED)
    for host in ("spark-1", "spark-2"):
        found = reasons(old, new, host)
        assert [r.split(":")[0] for r in found] == ["model"], (host, found)


def test_a_replica_moved_on_a_switch_stops_only_the_watchdog_that_watched_it():
    """Two replicas of one model on spark-3 and spark-4; replica 0 moves to spark-2."""
    old = plan_of(switch(4), deployments=[{"name": "code", "profile": QWEN30, "hosts": ["spark-3", "spark-4"]}])
    new = plan_of(switch(4), deployments=[{"name": "code", "profile": QWEN30, "hosts": ["spark-2", "spark-4"]}])
    (gone,) = reasons(old, new, "spark-3")
    assert "no API on spark-3" in gone
    assert reasons(old, new, "spark-4") == []  # replica 1 stays where it was
    assert reasons(old, new, "spark-2") == []  # watched nothing before
    assert reasons(old, new, "spark-1") == []


def test_a_replica_whose_endpoint_moves_is_outdated():
    cluster, plan = plan_of()
    running = json.loads(written_config(cluster, plan, "spark-1"))
    part = node_part(plan, "spark-1")
    assert outdated_reasons(
        {**running, "endpoint": "http://10.9.9.9:8000"}, part, "spark-1", cluster["nodes"], NAMES, image=IMAGE
    )
    moved_worker = [{"name": "spark-2", "address": "10.9.9.9"}]
    (why,) = outdated_reasons(
        {**running, "workers": moved_worker}, part, "spark-1", cluster["nodes"], NAMES, image=IMAGE
    )
    assert why.startswith("workers: ")
    renamed = {**running, "vllm_container": "old-vllm"}
    assert outdated_reasons(renamed, part, "spark-1", cluster["nodes"], NAMES, image=IMAGE) == [
        "vllm_container: old-vllm -> sparkops-vllm"
    ]


# ----------------------------------------------------------------------------------- what is kept
@pytest.mark.parametrize("running", [None, "", "  \n", b""], ids=["none", "empty", "blank", "bytes"])
def test_no_config_on_the_node_keeps_it(running):
    """No watchdog.json: no watchdog was ever installed there, nothing runs to stop."""
    cluster, plan = plan_of()
    assert outdated_reasons(running, node_part(plan, "spark-1"), "spark-1", cluster["nodes"], NAMES, image=IMAGE) == []


def test_tunables_do_not_stop_the_watchdog():
    """Intervals, budgets and the quality probe: the watchdog role's own restart takes them."""
    cluster, plan = plan_of()
    running = json.loads(written_config(cluster, plan, "spark-1"))
    tuned = {**running, "interval_s": 5, "max_restarts_per_hour": 10, "quality_action": "restart", "node": "x"}
    assert outdated_reasons(tuned, node_part(plan, "spark-1"), "spark-1", cluster["nodes"], NAMES, image=IMAGE) == []


def test_an_older_config_is_read_as_the_watchdog_reads_it():
    """`watch` as a string and no `executor` (the watchdog's default: ray), as sparkops_watchdog.py main reads."""
    cluster, plan = plan_of()
    running = json.loads(written_config(cluster, plan, "spark-1"))
    del running["executor"]
    old = {**running, "watch": "True"}
    assert outdated_reasons(old, node_part(plan, "spark-1"), "spark-1", cluster["nodes"], NAMES, image=IMAGE) == []
    mp_cluster, mp_plan = plan_of(**MP)
    assert outdated_reasons(old, node_part(mp_plan, "spark-1"), "spark-1", mp_cluster["nodes"], NAMES, image=IMAGE) == [
        "executor: ray -> mp"
    ]
    assert (
        outdated_reasons(
            {**old, "watch": "false"}, node_part(mp_plan, "spark-1"), "spark-1", cluster["nodes"], NAMES, image=IMAGE
        )
        == []
    )


def test_another_image_stops_the_watchdog_of_the_replica_and_keeps_the_worker_s():
    """A new image (an upgrade, a move to another stack, the way back) replaces Ray's and vLLM's containers on
    every node under the run: the head's watchdog, which would see the worker's Ray container gone for a moment
    and restart its group, stops; the worker's watches nothing and stays."""
    cluster, plan = plan_of()
    stack = "vllm/vllm-openai:registry-4b6bdec4e0a1"
    running = written_config(cluster, plan, "spark-1")
    assert json.loads(running)["image"] == IMAGE
    (why,) = outdated_reasons(running, node_part(plan, "spark-1"), "spark-1", cluster["nodes"], NAMES, image=stack)
    assert why == f"image: {IMAGE} -> {stack}"
    worker = written_config(cluster, plan, "spark-2")
    assert outdated_reasons(worker, node_part(plan, "spark-2"), "spark-2", cluster["nodes"], NAMES, image=stack) == []


def test_a_config_that_names_no_image_stops_the_watchdog():
    """Written before the watchdog recorded its image: what it runs cannot be told from the file."""
    cluster, plan = plan_of()
    running = json.loads(written_config(cluster, plan, "spark-1"))
    del running["image"]
    (why,) = outdated_reasons(running, node_part(plan, "spark-1"), "spark-1", cluster["nodes"], NAMES, image=IMAGE)
    assert why == f"image: null -> {IMAGE}"


def test_an_image_still_to_be_resolved_stops_the_watchdog():
    """A branch or tag the image role still clones: the plan's image is empty, and cannot be told the same."""
    cluster, plan = plan_of()
    running = written_config(cluster, plan, "spark-1")
    (why,) = outdated_reasons(running, node_part(plan, "spark-1"), "spark-1", cluster["nodes"], NAMES, image="")
    assert why.startswith(f"image: {IMAGE} -> the image this run resolves")


@pytest.mark.parametrize(
    ("text", "needle"),
    [("{not json", "not JSON"), ("[1, 2]", "not an object (list)"), ('"x"', "not an object (str)")],
)
def test_an_unreadable_config_stops_the_watchdog(text, needle):
    """What runs under a garbled config cannot be told: stopped (watchdog.yml writes and starts it again)."""
    cluster, plan = plan_of()
    (why,) = outdated_reasons(text, node_part(plan, "spark-1"), "spark-1", cluster["nodes"], NAMES, image=IMAGE)
    assert needle in why


def test_a_value_from_the_node_is_shown_short():
    cluster, plan = plan_of()
    running = json.loads(written_config(cluster, plan, "spark-1"))
    (why,) = outdated_reasons(
        {**running, "model": "m" * 5000}, node_part(plan, "spark-1"), "spark-1", cluster["nodes"], NAMES, image=IMAGE
    )
    assert len(why) < 300 and why.startswith("model: mmm") and "..." in why


# ------------------------------------------------------------------------------------------ the filter
def test_the_filter_takes_the_decoded_file_and_fails_saying_what_is_missing():
    from ansible.errors import AnsibleFilterError  # noqa: PLC0415

    flt = FilterModule().filters()["watchdog_outdated"]
    old, (cluster, plan) = plan_of(), plan_of(**MP)
    text = written_config(*old, "spark-1")
    assert flt(text, node_part(plan, "spark-1"), "spark-1", cluster["nodes"], NAMES, image=IMAGE) == [
        "executor: ray -> mp"
    ]
    assert flt("", [], "spark-1", cluster["nodes"], NAMES, image=IMAGE) == []
    with pytest.raises(AnsibleFilterError, match="sparkops_cluster.nodes"):
        flt(text, node_part(plan, "spark-1"), "spark-1", {}, NAMES, image=IMAGE)


# ------------------------------------------------------------------------------------- where it runs
def _serve_first_play():
    return yaml.safe_load((ROOT / "playbooks/serve.yml").read_text())[0]


def test_serve_stops_outdated_watchdogs_on_every_node_before_ray_moves():
    tasks = _serve_first_play()["tasks"]
    order = [
        t.get("ansible.builtin.import_tasks") or t.get("ansible.builtin.import_role", {}).get("name") for t in tasks
    ]
    assert order[:2] == ["tasks/watchdog-stop-outdated.yml", "sparkops.cluster.ray_cluster"]
    read, block = yaml.safe_load((ROOT / "playbooks/tasks/watchdog-stop-outdated.yml").read_text())
    # One read per node: no run_once, no delegation to the head alone.
    for task in (read, block, *block["block"]):
        assert "run_once" not in task and "delegate_to" not in task, task["name"]
    assert read["ansible.builtin.slurp"]["src"].endswith("/watchdog.json")
    assert "'not found' not in" in read["failed_when"]
    assert "sparkops.cluster.watchdog_outdated(sparkops_node.serving" in block["vars"]["serve_watchdog_outdated"]
    assert "image=sparkops_cluster.serving.image.image" in block["vars"]["serve_watchdog_outdated"]
    assert block["when"] == "serve_watchdog_outdated | length > 0"
    say, stop = block["block"]
    assert stop["ansible.builtin.command"]["argv"][:4] == ["docker", "stop", "--time", "5"]
    assert stop["when"] == "not ansible_check_mode"
    assert "deployments[0]" not in (ROOT / "playbooks/serve.yml").read_text()


def test_the_watchdog_role_starts_a_stopped_watchdog_again():
    """watchdog.yml brings back what serve.yml stopped: the container task runs when the container does not
    match (daemon_state: a stopped container does not), and starts it."""
    tasks = yaml.safe_load((ROOT / "roles/watchdog/tasks/main.yml").read_text())
    (run,) = [t for t in tasks if "community.docker.docker_container" in t]
    assert run["community.docker.docker_container"]["state"] == "started"
    assert "not watchdog_state.containers[watchdog_container_name].matches" in run["when"]
    daemon_state = (ROOT / "plugins/modules/daemon_state.py").read_text()
    assert '"matches": running and not diffs' in daemon_state
