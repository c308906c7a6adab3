"""Moving a cluster from one stack to another (playbooks/upgrade.yml -e sparkops_stack=<name>).

A registry image named by tag is pulled by tag ONCE, on the build host; the digest docker verified is what
every later pull uses, held by the lock (plugins/plugin_utils/registry_image.py, lockfile.py). The lock and
the deployment records name the stack (an older one without it is the default stack's); the plan of an
upgrade checks every profile against the NEW stack's contract before anything stops, and a rollback plans
on the RECORDED stack and image (plugins/plugin_utils/serving.py, records.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkops.cluster.plugins.plugin_utils import lockfile as lf
from ansible_collections.sparkops.cluster.plugins.plugin_utils import records as rec
from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import ClusterError, build_cluster
from ansible_collections.sparkops.cluster.plugins.plugin_utils.registry_image import digest_ref, pull_plan
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving import build_serving
from ansible_collections.sparkops.cluster.plugins.plugin_utils.stacks import DEFAULT_STACK
from cluster_inventories import pair

ROOT = Path(__file__).resolve().parents[4]
DEFAULTS = ROOT / "roles/sparkops_defaults/defaults/main"
PROFILES = yaml.safe_load((DEFAULTS / "serving_profiles.yml").read_text())["sparkops_serving_profiles"]
STACKS_YML = yaml.safe_load((DEFAULTS / "stacks.yml").read_text())
STACKS = STACKS_YML["sparkops_stacks"]
CLUSTER_DEFAULTS = yaml.safe_load((DEFAULTS / "cluster.yml").read_text())
TAG = STACKS["vllm-0.33.0"]["image"]["registry_image"]  # vllm/vllm-openai:v0.33.0-aarch64
D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
REF_0_19 = STACKS["vllm-0.19.0"]["image"]["ref"]
MODEL_COMMIT = "c" * 40
# a profile both stacks serve, and one only vllm-0.19.0 serves (VLLM_MXFP4_USE_MARLIN: 0.33.0 reads no such variable)
BOTH = "qwen3-235b-a22b-gptq-int4-tp2"
OLD_ONLY = "gpt-oss-120b-mxfp4"


# --------------------------------------------------------------------------- which reference is pulled
def test_the_0_33_0_stack_names_its_image_by_tag_and_no_digest():
    image = STACKS["vllm-0.33.0"]["image"]
    assert image["source"] == "registry" and image["registry_digest"] == "" and ":" in image["registry_image"]
    # versions.yml hands the tag to the image role and the plan (spark_vllm_image_registry_image)
    versions = yaml.safe_load((DEFAULTS / "versions.yml").read_text())
    assert "registry_image" in versions["spark_vllm_image_registry_image"]


def test_a_tag_without_a_lock_is_pulled_once_by_tag():
    assert pull_plan({"registry_ref": "", "registry_image": TAG}, {}, False) == {
        "ref": "",
        "tag": TAG,
        "by_tag": True,
        "problems": [],
    }


@pytest.mark.parametrize("upgrade", [False, True])
def test_a_tag_the_lock_holds_a_digest_for_is_never_followed_again(upgrade):
    lock_image = {"registry_image": TAG, "registry_ref": f"vllm/vllm-openai@{D1}"}
    out = pull_plan({"registry_ref": "", "registry_image": TAG}, lock_image, upgrade)
    assert out == {"ref": f"vllm/vllm-openai@{D1}", "tag": "", "by_tag": False, "problems": []}


def test_an_upgrade_to_another_tag_pulls_that_tag_once():
    lock_image = {"registry_image": "vllm/vllm-openai:v0.30.0-aarch64", "registry_ref": f"vllm/vllm-openai@{D1}"}
    out = pull_plan({"registry_ref": "", "registry_image": TAG}, lock_image, True)
    assert out["by_tag"] and out["tag"] == TAG
    # outside an upgrade the lock's digest is pulled (the plan refuses the inventory's new tag first)
    assert pull_plan({"registry_ref": "", "registry_image": TAG}, lock_image, False)["ref"] == f"vllm/vllm-openai@{D1}"


def test_a_digest_given_keeps_today_s_behaviour():
    given = {"registry_ref": f"nvcr.io/nvidia/vllm@{D2}", "registry_image": TAG}
    assert pull_plan(given, {}, False)["ref"] == f"nvcr.io/nvidia/vllm@{D2}"
    locked = {"registry_ref": f"nvcr.io/nvidia/vllm@{D1}"}
    assert pull_plan(given, locked, False)["ref"] == f"nvcr.io/nvidia/vllm@{D1}"  # the lock wins
    assert pull_plan(given, locked, True)["ref"] == f"nvcr.io/nvidia/vllm@{D2}"  # an upgrade moves it
    bad = pull_plan({"registry_ref": "nvcr.io/nvidia/vllm:25.09"}, {}, False)
    assert bad["problems"] and "must name the image by digest" in bad["problems"][0]
    assert "registry_image" in bad["problems"][0]  # and says how to name a tag instead


def test_no_image_or_a_malformed_tag_is_refused_naming_the_key():
    assert "names no image" in pull_plan({"registry_ref": "", "registry_image": ""}, {}, False)["problems"][0]
    out = pull_plan({"registry_image": "Vllm/VLLM@sha256:abc"}, {}, False)
    assert "no image by tag" in out["problems"][0] and not out["by_tag"]


def test_a_locked_digest_that_is_no_digest_is_refused():
    out = pull_plan({"registry_image": TAG}, {"registry_image": TAG, "registry_ref": "vllm/vllm-openai:latest"}, False)
    assert "restore the lock file" in out["problems"][0]


# ---------------------------------------------------------------------------- the digest of the tag
@pytest.mark.parametrize(
    ("tag", "digests", "want"),
    [
        # Docker Hub: RepoDigests name docker.io's repositories without the host
        (TAG, [f"vllm/vllm-openai@{D1}"], f"vllm/vllm-openai@{D1}"),
        (TAG, [f"docker.io/vllm/vllm-openai@{D1}"], f"vllm/vllm-openai@{D1}"),
        ("ubuntu:24.04", [f"ubuntu@{D1}"], f"ubuntu@{D1}"),
        ("ubuntu:24.04", [f"docker.io/library/ubuntu@{D1}"], f"ubuntu@{D1}"),
        # a registry with a port (the simulated cluster's), another repository's digest ignored
        (
            "10.0.0.1:5000/vllm/vllm-openai:v0.33.0-aarch64",
            [f"vllm/vllm-openai@{D2}", f"10.0.0.1:5000/vllm/vllm-openai@{D1}"],
            f"10.0.0.1:5000/vllm/vllm-openai@{D1}",
        ),
    ],
)
def test_the_digest_docker_verified_is_read_from_repo_digests(tag, digests, want):
    assert digest_ref(json.dumps(digests), tag) == want
    assert digest_ref(digests, tag) == want


@pytest.mark.parametrize(
    "answer",
    [
        "[]",  # a local build or load: no digest
        "null",
        json.dumps([f"other/image@{D1}"]),
        json.dumps([f"vllm/vllm-openai@{D1}", f"vllm/vllm-openai@{D2}"]),  # which one? refused
        json.dumps([f"vllm/vllm-openai@sha256:{'z' * 64}"]),
        json.dumps([f"vllm/vllm-openai@{D1}; rm -rf /"]),
        "<html>not json</html>",
    ],
)
def test_no_single_digest_of_the_tag_s_repository_is_refused(answer):
    with pytest.raises(ValueError) as err:
        digest_ref(answer, TAG)
    assert TAG in str(err.value)


# ----------------------------------------------------------------------------------------------- the lock
def wanted(stack="vllm-0.33.0", **image):
    return {
        "stack": stack,
        "image": {"source": "registry", "repo": "", "ref": "", "build_args": [], "registry_ref": "", **image},
        "model": {"profile": BOTH, "id": PROFILES[BOTH]["model"], "revision": PROFILES[BOTH]["revision"]},
    }


def test_after_the_first_pull_the_lock_holds_the_digest_and_a_rerun_conflicts_with_nothing():
    want = wanted(registry_image=TAG)
    # lock_write.yml: what the inventory asks for, then what the run pulled
    lock = lf.merge(lf.merge({}, want), {"image": {"registry_ref": f"vllm/vllm-openai@{D1}"}})
    assert lock["stack"] == "vllm-0.33.0"
    assert lock["image"]["registry_image"] == TAG and lock["image"]["registry_ref"] == f"vllm/vllm-openai@{D1}"
    assert lf.conflicts(lock, want) == []
    # a rerun writes the same lock (nothing moved)
    again = lf.merge(lf.merge(lock, want), {"image": {"registry_ref": f"vllm/vllm-openai@{D1}"}})
    assert lf.diff(lock, again) == []
    # another tag in the inventory is a conflict (the upgrade moves it)
    found = lf.conflicts(lock, wanted(registry_image="vllm/vllm-openai:v0.34.0-aarch64"))
    assert len(found) == 2 and any(c.startswith("image.registry_image:") for c in found), found


def test_a_lock_without_a_stack_is_the_default_stack_s():
    old = lf.merge({}, {**wanted(stack=DEFAULT_STACK), "image": {"source": "eugr", "ref": REF_0_19}})
    old.pop("stack")
    assert lf.conflicts(old, {**wanted(stack=DEFAULT_STACK), "image": old["image"]}) == []
    found = lf.conflicts(old, {**wanted(stack="vllm-0.33.0"), "image": old["image"]})
    assert found == ['stack: the lock has "vllm-0.19.0", the inventory asks for "vllm-0.33.0"']


def test_a_stale_tag_of_an_earlier_stack_is_no_conflict_after_moving_back_to_a_build():
    lock = lf.merge({}, wanted(registry_image=TAG))
    back = {**wanted(stack=DEFAULT_STACK), "image": {"source": "eugr", "repo": "r", "ref": REF_0_19, "build_args": []}}
    moved = lf.merge(lock, back)
    assert lf.conflicts(moved, back) == []


# ---------------------------------------------------------------------------------------------- the plan
def inputs_on(stack, **extra):
    spec = STACKS[stack]
    image = dict(spec["image"])
    if image["source"] == "registry":
        tag = image["registry_image"]
        image = {"source": "registry", "name": "vllm-node", "registry_ref": "", "registry_image": tag}
    base = {
        "profile_name": BOTH,
        "profiles": PROFILES,
        "stack_name": stack,
        "stacks": STACKS,
        "vllm_version": spec["vllm_version"],
        "container_names": CLUSTER_DEFAULTS["sparkops_container_names"],
        "container_cache_env": CLUSTER_DEFAULTS["sparkops_container_cache_env"],
        "image": image,
    }
    return {**base, **extra}


def plan(stack, **extra):
    return build_serving(build_cluster(pair()), inputs_on(stack, **extra))


def site_on_0_19():
    """site.yml on the default stack: the lock and the record the upgrade starts from."""
    first = plan(DEFAULT_STACK)
    lock = lf.merge({}, first["lock"]["wanted"])
    lock["image"].update(commit=REF_0_19, tag=first["image"]["image"], id="sha256:" + "9" * 64)
    lock = lf.resolve_models(lock, [{"item": {}, "content": ""}])
    lock["model"]["resolved_revision"] = MODEL_COMMIT
    served = plan(DEFAULT_STACK, lock=lock)
    image = {"image": served["image"]["image"], "image_id": "sha256:" + "9" * 64, "image_commit": REF_0_19}
    record = rec.record_file(served, {**image, "stack": DEFAULT_STACK}, {})
    return lock, served, record


def test_the_plan_names_the_stack_in_the_lock_and_the_records():
    lock, served, record = site_on_0_19()
    assert lock["stack"] == DEFAULT_STACK and served["lock"]["wanted"]["stack"] == DEFAULT_STACK
    assert record["stack"] == DEFAULT_STACK and record["deployments"]["main"]["stack"] == DEFAULT_STACK
    assert served["records"]["main"]["stack"] == DEFAULT_STACK
    # a record written before stacks were named reads as the default stack's
    old = {k: v for k, v in record.items() if k not in ("stack", "deployments")}
    assert rec.recorded_deployments(old, "main")["main"]["stack"] == DEFAULT_STACK


def test_site_yml_with_another_stack_is_refused_and_names_the_upgrade():
    lock, _served, _record = site_on_0_19()
    with pytest.raises(ClusterError) as err:
        plan("vllm-0.33.0", lock=lock)
    text = str(err.value)
    assert 'stack: the lock has "vllm-0.19.0", the inventory asks for "vllm-0.33.0"' in text
    assert "playbooks/upgrade.yml" in text


def test_the_upgrade_plans_the_new_stack_s_image_by_its_tag_and_then_holds_the_digest():
    lock, _served, record = site_on_0_19()
    up = plan("vllm-0.33.0", lock=lock, upgrade=True, records=record)
    assert up["stack"]["name"] == "vllm-0.33.0" and up["lock"]["wanted"]["stack"] == "vllm-0.33.0"
    assert up["lock"]["wanted"]["image"]["registry_image"] == TAG
    # the digest is not known before the first pull: the image role resolves it
    assert up["image"]["source"] == "registry" and not up["image"]["resolved"]
    assert up["records"]["main"]["stack"] == "vllm-0.33.0"
    assert up["records"]["main"]["previous"]["stack"] == DEFAULT_STACK
    # after the move the lock holds the digest: the plan names the image by it, a rerun conflicts with nothing
    moved = lf.merge(lf.merge(lock, up["lock"]["wanted"]), {"image": {"registry_ref": f"vllm/vllm-openai@{D1}"}})
    again = plan("vllm-0.33.0", lock=moved)
    assert again["image"]["image"] == f"vllm-node:registry-{'1' * 12}"
    # an upgrade on the same stack (a profile, a driver) keeps the digest: the tag is not followed
    same = plan("vllm-0.33.0", lock=moved, upgrade=True)
    assert same["image"]["image"] == f"vllm-node:registry-{'1' * 12}"


def test_a_running_profile_the_new_stack_refuses_stops_the_upgrade_before_anything_stops():
    lock, _served, record = site_on_0_19()
    with pytest.raises(ClusterError) as err:
        plan(
            "vllm-0.33.0",
            profile_name=OLD_ONLY,
            lock=lock,
            upgrade=True,
            records=record,
            allow_rules=[{"rule": "not-recommended", "reason": "test"}],
        )
    text = str(err.value)
    assert "VLLM_MXFP4_USE_MARLIN" in text and "0.33.0" in text
    assert "sparkops_stack: vllm-0.19.0" in text  # the stack that serves it


def test_the_rollback_plans_the_recorded_stack_and_image_whatever_sparkops_stack_says():
    lock, served, record = site_on_0_19()
    back = plan("vllm-0.33.0", lock=lock, upgrade=True, records=record, rollback=True)
    assert back["stack"]["name"] == DEFAULT_STACK  # its contract, its release
    assert back["image"]["image"] == served["image"]["image"] and back["image"]["commit"] == REF_0_19
    assert back["records"]["main"]["stack"] == DEFAULT_STACK

    def argv(p):
        return [(m["vllm"] or {}).get("argv") for d in p["deployments"] for m in d["members"]]

    assert argv(back) == argv(served)
    # the other way round: from 0.33.0 back to 0.19.0, a failure returns to 0.33.0's digest
    moved = lf.merge(lf.merge(lock, plan("vllm-0.33.0", lock=lock, upgrade=True)["lock"]["wanted"]),
                     {"image": {"registry_ref": f"vllm/vllm-openai@{D1}"}})  # fmt: skip
    on_33 = plan("vllm-0.33.0", lock=moved)
    rec33 = rec.record_file(on_33, {"image": on_33["image"]["image"], "image_id": "sha256:" + "8" * 64,
                                    "image_ref": f"vllm/vllm-openai@{D1}", "stack": "vllm-0.33.0"}, {})  # fmt: skip
    back33 = plan(DEFAULT_STACK, lock=moved, upgrade=True, records=rec33, rollback=True)
    assert back33["stack"]["name"] == "vllm-0.33.0"
    assert back33["image"]["image"] == f"vllm-node:registry-{'1' * 12}"


# ------------------------------------------------------------------------------------------ the tasks
def _tasks(path):
    return yaml.safe_load((ROOT / path).read_text())


def test_the_pull_reads_the_tag_once_on_the_build_host_and_every_node_pulls_the_digest():
    tasks = {t["name"]: t for t in _tasks("roles/spark_vllm_image/tasks/pull.yml")}
    by_tag = [t for t in tasks.values() if "spark_vllm_image_pull.tag" in json.dumps(t.get("ansible.builtin.command"))]
    assert len(by_tag) == 2, by_tag  # the pull and the inspect of RepoDigests
    for task in by_tag:
        assert task["run_once"] is True and task["delegate_to"] == "{{ spark_vllm_image_build_host }}"
        assert task["when"] == "spark_vllm_image_pull.by_tag"
    assert "{{json .RepoDigests}}" in json.dumps(by_tag[1]["ansible.builtin.command"]).replace("' }}", "")
    # a check run pulls nothing: before the first pull it stops, saying so (not with a missing-digest error)
    check = tasks["Stop a check run before the tag's first pull (a check pulls nothing, so it has no digest to read)"]
    assert check["when"] == "spark_vllm_image_pull.by_tag and spark_vllm_image_tag_digests.rc != 0"
    assert "not ansible_check_mode" in by_tag[1]["failed_when"]
    chosen = json.dumps(tasks["Pull by that digest from now on"])
    assert "registry_digest_ref(spark_vllm_image_pull.tag)" in chosen
    node_pull = tasks["Pull by digest on every node (docker checks the content against the digest)"]
    assert node_pull["ansible.builtin.command"]["argv"][-1] == "{{ spark_vllm_image_pull_ref }}"
    assert "run_once" not in node_pull and "delegate_to" not in node_pull
    # the lock records the digest pulled (image.registry_ref)
    lock_write = (ROOT / "roles/deployment_state/tasks/lock_write.yml").read_text()
    assert "'registry_ref': spark_vllm_image_pull_ref | default(none)" in lock_write
    assert "'stack': sparkops_stack" in (ROOT / "roles/deployment_state/tasks/record.yml").read_text()


def test_the_filters_wrap_the_logic_and_refuse_with_its_message():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.sparkops.cluster.plugins.filter.stacks import FilterModule

    filters = FilterModule().filters()
    assert filters["registry_pull_plan"]({"registry_ref": "", "registry_image": TAG}, None, False)["by_tag"]
    assert filters["registry_digest_ref"](json.dumps([f"vllm/vllm-openai@{D1}"]), TAG) == f"vllm/vllm-openai@{D1}"
    with pytest.raises(AnsibleFilterError, match="carries no digest"):
        filters["registry_digest_ref"]("[]", TAG)


def test_the_only_deployment_may_move_the_stack_alone_and_one_of_two_may_not():
    """upgrade.yml -e sparkops_stack=... -e sparkops_deployment=NAME: blue-green behind the gateway."""
    lock, _served, record = site_on_0_19()
    only = [{"name": "main", "profile": BOTH, "hosts": ["spark-1", "spark-2"]}]
    up = plan("vllm-0.33.0", lock=lock, upgrade=True, records=record, deployments=only, upgrade_deployment="main")
    assert up["stack"]["name"] == "vllm-0.33.0"
    two = [
        {"name": "main", "profile": "qwen3-30b-a3b", "hosts": ["spark-1"]},
        {"name": "chat", "profile": "qwen3.6-27b-fp8", "hosts": ["spark-2"]},
    ]
    with pytest.raises(ClusterError, match="One image serves every deployment"):
        plan("vllm-0.33.0", lock=lock, upgrade=True, deployments=two, upgrade_deployment="main")


def test_the_upgrade_says_the_stack_moves():
    lock, _served, record = site_on_0_19()
    up = plan("vllm-0.33.0", lock=lock, upgrade=True, records=record)
    lines = rec.changes(up, "vllm-node:registry-111111111111")["lines"]
    assert lines[0] == "stack vllm-0.19.0 -> vllm-0.33.0", lines
    same = plan(DEFAULT_STACK, lock=lock, records=record)
    assert rec.changes(same, same["image"]["image"]) == {"moves": False, "lines": ["nothing changes"]}
