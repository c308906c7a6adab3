"""Records and locks per deployment: every deployment's model commit in the lock, every deployment's record
(profile, model commit, image) in the plan with the one recorded before, and an upgrade's rollback planned
from those records (plugins/plugin_utils/records.py, lockfile.py, serving.py).

The lock files under tests/fixtures/locks were written by sparkops at 14535e2 (lockfile.merge as
roles/deployment_state/tasks/lock_write.yml called it then, on the plans of tests/unit/plugins/plugin_utils):
`model` alone for the default deployment; `model` for the first of two deployments and `models` without
a resolved commit for both, the form in which deployments after the first followed the Hub.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.plugin_utils import lockfile as lf
from ansible_collections.sparkops.cluster.plugins.plugin_utils import records as rec
from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import ClusterError
from test_serving_plan import PROFILES, REF, plan_of_only

LOCKS = Path(__file__).resolve().parents[3] / "fixtures" / "locks"
GPT_OSS, QWEN30 = "gpt-oss-120b-mxfp4", "qwen3-30b-a3b"
# What an upgrade moves both deployments to (single-node profiles of other models).
QWEN27, QWEN35 = "qwen3.6-27b-fp8", "qwen3.6-35b-a3b-fp8"
TWO = [
    {"name": "chat", "profile": GPT_OSS, "hosts": ["spark-1"]},
    {"name": "code", "profile": QWEN30, "hosts": ["spark-2"]},
]
TWO_V2 = [{**TWO[0], "profile": QWEN27}, {**TWO[1], "profile": QWEN35}]
NEW_REF = "fedcba9876543210fedcba9876543210fedcba98"
# The commits the head's Hugging Face cache resolved `main` to (refs/main of each model).
HUB = {GPT_OSS: "c1" * 20, QWEN30: "c2" * 20, QWEN27: "c3" * 20, QWEN35: "c4" * 20}


def image_in(ref=REF):
    return {**plan_of_only()["deployments"][0]["image"], "ref": ref} | {
        "source": "eugr",
        "repo": "https://github.com/eugr/spark-vllm-docker.git",
        "build_args": ["--vllm-ref", "v0.19.0", "--flashinfer-ref", "v0.6.6"],
    }


def readings(wanted, hub=None, missing=()):
    """ansible.builtin.slurp's results for lock_write.yml's loop over lockfile.model_refs(wanted): each the
    refs file's content in base64 with its loop item, or a failure (failed_when: false) for a missing file."""
    hub = HUB if hub is None else hub
    by_model = {PROFILES[name]["model"]: commit for name, commit in hub.items()}
    out = []
    for item in lf.model_refs(wanted):
        if item["model"] in missing or item["model"] not in by_model:
            out.append({"item": item, "failed": True, "msg": "file not found"})
        else:
            content = base64.b64encode((by_model[item["model"]] + "\n").encode()).decode()
            out.append({"item": item, "content": content, "encoding": "base64"})
    return out


def lock_write(lock, plan, hub=None, upgrade=False, missing=()):
    """roles/deployment_state/tasks/lock_write.yml: the wanted values, the image resolved, every deployment's
    model commit, and the file as written (parsed back as the next run reads it)."""
    hub = HUB if hub is None else hub
    wanted = plan["lock"]["wanted"]
    image = {"image": {"commit": plan["image"]["commit"] or None, "tag": plan["image"]["image"] or None}}
    new = lf.resolve_models(lf.merge(lf.merge(lock, wanted), image), readings(wanted, hub, missing), upgrade)
    return lf.parse_lock(lf.dumps(new))


def record_write(plan, state=None):
    """roles/deployment_state/tasks/record.yml: the new record, the old one as `previous`."""
    image = {"image": plan["image"]["image"], "image_id": "sha256:" + "9" * 64, "image_commit": plan["image"]["commit"]}
    image["stack"] = "vllm-0.19.0"  # record.yml passes sparkops_stack
    now = rec.record_file(plan, image, {"spark-1": "580.95.05-1", "spark-2": "580.95.05-1"})
    old = {k: v for k, v in (state or {}).items() if k != "previous"} or None
    return {**now, "deployed_at": "t", "previous": old}


def profiles_with(**revisions):
    return {**PROFILES, **{name: {**PROFILES[name], "revision": rev} for name, rev in revisions.items()}}


def site(lock=None, deployments=None, **inputs):
    """site.yml twice on a pair: the first run writes the lock, the second serves what it pins."""
    deployments = TWO if deployments is None else deployments
    first = plan_of_only(deployments=deployments, lock=lock or {}, **inputs)
    lock = lock_write(lock or {}, first)
    return lock, plan_of_only(deployments=deployments, lock=lock, **inputs)


# ----------------------------------------------------------------------------------------------- the lock
def test_every_deployment_with_a_moving_revision_is_held_to_the_lock_s_commit():
    lock, plan = site()
    assert {name: r["resolved_revision"] for name, r in lock["models"].items()} == {
        "chat": HUB[GPT_OSS],
        "code": HUB[QWEN30],
    }
    # Both deployments ask for `main`; each serves the commit the lock holds for it, the second as the first.
    chat, code = plan["deployments"]
    assert (chat["own_revision"], code["own_revision"]) == ("main", "main")
    assert chat["profile"]["revision"] == HUB[GPT_OSS]
    assert code["profile"]["revision"] == HUB[QWEN30]
    argv = code["members"][0]["vllm"]["argv"]
    assert argv[argv.index("--revision") + 1] == HUB[QWEN30]
    # The Hub (the head's refs/main) moving later moves neither the plan nor the lock: only an upgrade does.
    moved_hub = {**HUB, QWEN30: "d2" * 20}
    assert lock_write(lock, plan, moved_hub) == lock
    assert plan_of_only(deployments=TWO, lock=lock)["deployments"][1]["profile"]["revision"] == HUB[QWEN30]
    upgraded = lock_write(lock, plan_of_only(deployments=TWO, lock=lock, upgrade=True), moved_hub, upgrade=True)
    assert upgraded["models"]["code"]["resolved_revision"] == "d2" * 20


def test_a_lock_of_the_earlier_single_model_form_is_read():
    text = (LOCKS / "14535e2-default.lock.json").read_text()
    assert "models" not in json.loads(text)
    lock = lf.parse_lock(text)
    assert lock["models"] == {"main": {**json.loads(text)["model"]}}
    plan = plan_of_only(lock=lock)
    assert plan["deployments"][0]["profile"]["revision"] == "1" * 40
    # Nothing moved: no conflict, and the file as written stays byte-identical (it is rewritten only when a
    # value moves; the reader migrates it each time).
    assert lf.conflicts(lock, plan["lock"]["wanted"]) == []
    assert lf.model_conflicts(lock, plan["lock"]["wanted"]) == []
    assert lf.diff(lock, lock_write(lock, plan)) == []


def test_a_lock_of_the_earlier_two_deployment_form_holds_the_first_and_learns_the_second():
    """14535e2 wrote `models` without resolved commits: its second deployment followed the Hub. Read now, the
    first keeps the commit of `model`, and the next run's lock holds the second's too."""
    text = (LOCKS / "14535e2-two-deployments.lock.json").read_text()
    assert "resolved_revision" not in json.loads(text)["models"]["code"]
    lock = lf.parse_lock(text)
    plan = plan_of_only(deployments=TWO, lock=lock)
    chat, code = plan["deployments"]
    assert chat["profile"]["revision"] == "2" * 40
    assert code["profile"]["revision"] == "main"  # nothing recorded yet: this run records it
    assert lf.model_conflicts(lock, plan["lock"]["wanted"]) == []
    written = lock_write(lock, plan)
    assert written["models"]["chat"]["resolved_revision"] == "2" * 40  # the lock's, not the head's refs/main
    assert written["models"]["code"]["resolved_revision"] == HUB[QWEN30]
    assert lf.diff(lock, written) == [f'models.code.resolved_revision: null -> "{HUB[QWEN30]}"']
    assert plan_of_only(deployments=TWO, lock=written)["deployments"][1]["profile"]["revision"] == HUB[QWEN30]


def test_another_profile_for_a_deployment_is_refused_once_and_an_upgrade_replaces_its_record_whole():
    lock = lf.parse_lock((LOCKS / "14535e2-two-deployments.lock.json").read_text())
    # chat is the lock's `model` and also `models.chat` once read: its move is one conflict, not two.
    with pytest.raises(ClusterError) as err:
        plan_of_only(deployments=[{**TWO[0], "profile": QWEN27}, TWO[1]], lock=lock)
    (problem,) = err.value.problems
    assert 'model.profile: the lock has "gpt-oss-120b-mxfp4"' in problem and "models.chat" not in problem
    upgrade = plan_of_only(deployments=TWO_V2, lock=lock, upgrade=True)
    new = lock_write(lock, upgrade, upgrade=True)
    for name, profile in (("chat", QWEN27), ("code", QWEN35)):
        model = PROFILES[profile]["model"]
        want = {"profile": profile, "id": model, "revision": "main", "resolved_revision": HUB[profile]}
        assert new["models"][name] == want
    assert new["model"] == {**new["models"]["chat"], "deployment": "chat"}
    # No refs file read (the cache lacks it): the new record has no commit rather than the old model's.
    bare = lock_write(lock, upgrade, upgrade=True, missing=(PROFILES[QWEN35]["model"],))
    assert "resolved_revision" not in bare["models"]["code"]


def test_a_refs_file_holding_anything_but_a_commit_is_not_trusted():
    wanted = plan_of_only(deployments=TWO)["lock"]["wanted"]
    bad = [
        {"item": lf.model_refs(wanted)[0], "content": base64.b64encode(b"../../etc/passwd\n").decode()},
        {"item": lf.model_refs(wanted)[1], "content": "not base64!"},
    ]
    lock = lf.resolve_models(lf.merge({}, wanted), bad)
    assert all("resolved_revision" not in r for r in lock["models"].values())


def test_model_refs_are_read_only_for_moving_revisions_once_each():
    profiles = profiles_with(**{QWEN30: "e" * 40})
    wanted = plan_of_only(deployments=TWO, profiles=profiles)["lock"]["wanted"]
    assert lf.model_refs(wanted) == [{"model": PROFILES[GPT_OSS]["model"], "revision": "main"}]
    lock = lf.resolve_models(lf.merge({}, wanted), [])
    assert lock["models"]["code"]["resolved_revision"] == "e" * 40  # a commit resolves to itself


# -------------------------------------------------------------------------------------------- the records
def test_the_plan_carries_each_deployment_s_record_and_the_one_recorded_before():
    lock, v1 = site()
    state = record_write(v1)
    assert set(state["deployments"]) == {"chat", "code"}
    assert state["profile_name"] == GPT_OSS and state["model_revision"] == HUB[GPT_OSS]  # the first's, at the top
    up = plan_of_only(deployments=TWO_V2, lock=lock, upgrade=True, image=image_in(NEW_REF), records=state)
    for name, profile in (("chat", QWEN27), ("code", QWEN35)):
        record = up["records"][name]
        assert (record["profile_name"], record["model"]) == (profile, PROFILES[profile]["model"])
        assert record["model_revision"] == "main"  # an upgrade plans the revision asked for
        assert record["previous"] == state["deployments"][name]
        assert record["image"] == f"vllm-node:{NEW_REF[:12]}-{up['image']['args_hash']}"
    lines = rec.changes(up, up["image"]["image"])
    assert lines["moves"] and len(lines["lines"]) == 3, lines
    assert lines["lines"][0] == f"image {v1['image']['image']} -> {up['image']['image']}"
    assert lines["lines"][2].startswith(f"code: {QWEN30} ({PROFILES[QWEN30]['model']}@{HUB[QWEN30]}) -> {QWEN35}")
    same = plan_of_only(deployments=TWO, lock=lock, records=state)
    assert rec.changes(same, v1["image"]["image"]) == {"moves": False, "lines": ["nothing changes"]}


def _served(plan):
    """What a plan runs: each deployment's profile and every member's command line and environment, and the
    image (the keys a rollback must give back; own_revision is what the inventory asks for)."""
    return {
        "image": (plan["image"]["image"], plan["image"]["commit"]),
        "deployments": [
            {k: d[k] for k in ("name", "profile_name", "profile", "profile_as_given", "hosts", "executor", "endpoint")}
            | {"members": [(m["host"], m["vllm"]["argv"], m["vllm"]["env"], m["ray"]) for m in d["members"]]}
            for d in plan["deployments"]
        ],
    }


def test_a_failed_upgrade_of_two_deployments_rolls_both_back_to_their_recorded_profiles_and_image():
    lock, v1 = site()
    state = record_write(v1)
    inputs = {"deployments": TWO_V2, "lock": lock, "upgrade": True, "image": image_in(NEW_REF), "records": state}
    up = plan_of_only(**inputs)
    assert _served(up) != _served(v1)  # both profiles and the image move
    back = plan_of_only(**inputs, rollback=True)
    assert back["rollback"] is True
    # The rollback plan runs exactly what was recorded: both deployments' profiles (at their model commits,
    # although the upgrade asked for `main`) and the image.
    assert _served(back) == _served(v1)
    for name in ("chat", "code"):
        for key in ("profile_name", "profile", "model", "model_revision", "image", "image_commit"):
            assert back["records"][name][key] == state["deployments"][name][key], (name, key)
    # The lock is an input, not a result: the rollback plans without moving it.
    assert lf.conflicts(lock, v1["lock"]["wanted"]) == []


def test_a_rollback_of_a_deployment_nothing_is_recorded_for_is_refused_naming_it():
    lock, v1 = site(deployments=TWO[:1])
    state = record_write(v1)
    with pytest.raises(ClusterError) as err:
        plan_of_only(deployments=TWO_V2, lock=lock, upgrade=True, records=state, rollback=True)
    (problem,) = err.value.problems
    assert "holds nothing to roll back to for code" in problem and "run site.yml" in problem


def test_a_record_file_of_the_earlier_form_is_the_first_deployment_s():
    """record.yml at 14535e2 wrote one record (the first deployment's profile) at the top level."""
    _lock, v1 = site(deployments=TWO[:1])
    dep = v1["deployments"][0]
    old = {
        "image": v1["image"]["image"], "image_id": "sha256:" + "9" * 64, "image_repo": "r", "image_ref": REF,
        "image_commit": v1["image"]["commit"], "profile_name": GPT_OSS, "profile": dep["profile_as_given"],
        "model": dep["profile"]["model"], "model_revision": dep["profile"]["revision"], "drivers": {},
        "deployed_at": "t", "previous": None,
    }  # fmt: skip
    recorded = rec.recorded_deployments(old, "chat")
    assert list(recorded) == ["chat"] and recorded["chat"]["profile"] == dep["profile_as_given"]
    assert rec.recorded_deployments({}, "chat") == {} and rec.recorded_deployments(None, "chat") == {}
    # The file written next holds it as `previous` and every deployment by name.
    new = record_write(v1, old)
    assert new["previous"]["image"] == old["image"] and "deployments" not in new["previous"]
    assert rec.recorded_deployments(new, "other") == {"chat": new["deployments"]["chat"]}
