"""The lock file: parse, conflicts with the inventory, merge, what moved, the locked model revision."""

from __future__ import annotations

import json

import pytest
from ansible_collections.sparkops.cluster.plugins.plugin_utils import lockfile as lf

WANTED = {
    "image": {
        "source": "eugr",
        "repo": "https://github.com/eugr/spark-vllm-docker.git",
        "ref": "fc08740fba1e79530a879c411b7e39fb65da2a18",
        "build_args": ["--vllm-ref", "v0.19.0", "--flashinfer-ref", "v0.6.6"],
        "registry_ref": "",
    },
    "model": {"profile": "qwen", "id": "Qwen/Qwen3-235B-A22B-GPTQ-Int4", "revision": "main"},
}
RESOLVED = {
    "image": {
        "commit": "fc08740fba1e79530a879c411b7e39fb65da2a18",
        "id": "sha256:" + "a" * 64,
        "tag": "vllm-node:fc08740fba1e",
    },
    "versions": {"vllm": "0.19.0", "torch": "2.12.0.dev20260410+cu130", "nccl": None},
    "model": {"resolved_revision": "b" * 40},
}


def first_lock():
    return lf.merge(lf.merge({}, WANTED), RESOLVED)


def test_first_lock_has_everything_and_drops_unknowns():
    lock = first_lock()
    assert lock["lock_version"] == lf.LOCK_VERSION
    assert lock["image"]["ref"] == WANTED["image"]["ref"]
    assert lock["image"]["id"] == "sha256:" + "a" * 64
    assert "nccl" not in lock["versions"]  # None is "not found", never written as a value
    assert lf.parse_lock(lf.dumps(lock)) == lock


def test_dumps_is_stable_so_no_op_runs_write_nothing():
    a = lf.dumps(first_lock())
    b = lf.dumps(json.loads(a))
    assert a == b


def test_no_conflicts_without_a_lock_or_when_inventory_unchanged():
    assert lf.conflicts({}, WANTED) == []
    assert lf.conflicts(first_lock(), WANTED) == []


def test_inventory_edit_conflicts_with_the_lock():
    moved = json.loads(json.dumps(WANTED))
    moved["image"]["build_args"] = ["--use-wheels"]
    moved["model"]["revision"] = "c" * 40
    problems = lf.conflicts(first_lock(), moved)
    assert problems == [
        'image.build_args: the lock has ["--vllm-ref", "v0.19.0", "--flashinfer-ref", "v0.6.6"], '
        'the inventory asks for ["--use-wheels"]',
        f'model.revision: the lock has "main", the inventory asks for "{"c" * 40}"',
    ]


def test_empty_string_and_missing_are_the_same():
    lock = first_lock()
    wanted = json.loads(json.dumps(WANTED))
    del wanted["image"]["registry_ref"]
    assert lf.conflicts(lock, wanted) == []


def test_diff_says_what_moved_and_ignores_timestamps():
    old = lf.merge(first_lock(), {"written_at": "t1"})
    new = lf.merge(old, {"image": {"ref": "sim-v2", "id": "sha256:" + "c" * 64}, "written_at": "t2"})
    assert lf.diff(old, new) == [
        f'image.id: "sha256:{"a" * 64}" -> "sha256:{"c" * 64}"',
        f'image.ref: "{WANTED["image"]["ref"]}" -> "sim-v2"',
    ]
    assert lf.diff(old, old) == []


def test_locked_revision_used_only_for_the_same_profile_model_and_request():
    lock = first_lock()
    assert lf.effective_revision("main", lock, "qwen", WANTED["model"]["id"]) == "b" * 40
    assert lf.effective_revision("main", lock, "other", WANTED["model"]["id"]) == "main"
    assert lf.effective_revision("d" * 40, lock, "qwen", WANTED["model"]["id"]) == "d" * 40
    assert lf.effective_revision("main", {}, "qwen", WANTED["model"]["id"]) == "main"


@pytest.mark.parametrize(
    ("text", "match"),
    [("{not json", "not JSON"), ('{"lock_version": 99}', "lock_version 99"), ("[1]", "lock_version")],
)
def test_broken_or_foreign_lock_is_refused(text, match):
    with pytest.raises(lf.LockError, match=match):
        lf.parse_lock(text)


def test_no_lock_is_empty():
    assert lf.parse_lock(None) == {}
    assert lf.parse_lock("  \n") == {}


def test_merge_copies_lazy_template_containers_into_plain_ones():
    """Inside a template ansible-core hands the filter lazy containers; merge must not deep-copy them.

    A deep copy of a lazy container copies the templar and every variable behind it (1.4-1.8 s per
    call on a converged cluster, where "Describe the new lock" runs twice a site.yml): merge reads
    the items into plain dicts and lists instead, which is also what the JSON writer wants.
    """
    from ansible._internal._datatag._tags import TrustedAsTemplate  # noqa: PLC0415 - ansible-core 2.19+
    from ansible.template import Templar  # noqa: PLC0415

    seen = {}

    def probe(lock, resolved):
        seen["input"] = type(lock).__name__
        new = lf.merge(lock, resolved)
        seen["output"] = [type(new["image"]), type(new["image"]["build_args"]), type(new["versions"])]
        return json.dumps(new, sort_keys=True)

    lock = lf.merge(lf.merge({}, WANTED), RESOLVED)
    templar = Templar(variables={"lock": lock, "resolved": {"versions": {"ray": "2.52.1"}}, "probe": probe})
    out = json.loads(templar.template(TrustedAsTemplate().tag("{{ probe(lock, resolved) }}")))
    assert seen["input"] != "dict", "the test no longer sees a lazy container: it proves nothing"
    assert seen["output"] == [dict, list, dict]
    assert out["versions"]["ray"] == "2.52.1"
    assert out["image"]["build_args"] == WANTED["image"]["build_args"]


# Every key the inventory asks for, named here and not read from lf.WANTED_KEYS: a key dropped from
# that table would stop being compared, and an inventory edit of it would go through unrefused.
WANTED_PATHS = [
    ("image", "source", "local"),
    ("image", "repo", "https://example.invalid/fork.git"),
    ("image", "ref", "0" * 40),
    ("image", "build_args", ["--use-wheels"]),
    ("image", "registry_ref", "registry.example/vllm-node@sha256:" + "e" * 64),
    ("model", "profile", "gpt-oss"),
    ("model", "id", "openai/gpt-oss-120b"),
    ("model", "revision", "f" * 40),
]


@pytest.mark.parametrize(("section", "key", "value"), WANTED_PATHS)
def test_each_wanted_key_edited_alone_is_one_conflict(section, key, value):
    moved = json.loads(json.dumps(WANTED))
    moved[section][key] = value
    problems = lf.conflicts(first_lock(), moved)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{section}.{key}: the lock has {json.dumps(lf._norm(WANTED[section][key]))}, ")
    assert problems[0].endswith(f"the inventory asks for {json.dumps(value)}")


def test_wanted_tuple_and_list_are_the_same_and_missing_sections_conflict():
    wanted = json.loads(json.dumps(WANTED))
    wanted["image"]["build_args"] = tuple(wanted["image"]["build_args"])
    assert lf.conflicts(first_lock(), wanted) == []
    del wanted["model"]
    assert lf.conflicts(first_lock(), wanted) == [
        'model.profile: the lock has "qwen", the inventory asks for null',
        f'model.id: the lock has "{WANTED["model"]["id"]}", the inventory asks for null',
        'model.revision: the lock has "main", the inventory asks for null',
    ]


def test_merge_keeps_every_key_after_a_none():
    """A None is "not found" and skipped; the keys after it are still written (a registry image
    resolves no commit, and its id, tag and digest come after that None)."""
    lock = lf.merge({}, {"image": {"commit": None, "id": "sha256:" + "d" * 64, "tag": "t"}, "versions": None, "z": 1})
    assert lock == {"lock_version": lf.LOCK_VERSION, "image": {"id": "sha256:" + "d" * 64, "tag": "t"}, "z": 1}


def test_merge_replaces_a_scalar_with_a_section_and_keeps_the_old_lock():
    old = {"lock_version": lf.LOCK_VERSION, "image": "broken", "keep": {"a": 1}}
    new = lf.merge(old, {"image": {"id": "x"}, "keep": {"b": 2}})
    assert new == {"lock_version": lf.LOCK_VERSION, "image": {"id": "x"}, "keep": {"a": 1, "b": 2}}
    assert old["keep"] == {"a": 1}, "merge changed the lock it was given"


def test_diff_of_the_first_write_lists_every_leaf():
    """lock_write.yml diffs the old lock against the new one; on the first write the old one is {}."""
    lock = first_lock()
    moved = lf.diff({}, lock)
    assert f'image.ref: null -> "{WANTED["image"]["ref"]}"' in moved
    assert 'versions.vllm: null -> "0.19.0"' in moved
    assert "lock_version: null -> 1" in moved
    # lock_version, image, model, models.main (the same record by its deployment's name), versions (nccl: None
    # is not written)
    assert len(moved) == 1 + 8 + 4 + 4 + 2
    assert lf.diff(None, lock) == moved


def test_diff_of_locks_of_another_shape():
    old = first_lock()
    new = lf.merge(old, {"versions": {"ray": "2.52.1"}, "weights": {"bytes": 5}})
    del new["model"]
    assert lf.diff(old, new) == [
        "model.id: " + json.dumps(WANTED["model"]["id"]) + " -> null",
        'model.profile: "qwen" -> null',
        f'model.resolved_revision: "{"b" * 40}" -> null',
        'model.revision: "main" -> null',
        'versions.ray: null -> "2.52.1"',
        "weights.bytes: null -> 5",
    ]
    # A leaf that becomes a section (or the other way) is one line, not a crash.
    assert lf.diff({"a": 1}, {"a": {"b": 2}}) == ['a: 1 -> {"b": 2}']
    assert lf.diff({"a": {"b": 2}}, {"a": 1}) == ['a: {"b": 2} -> 1']


def test_diff_ignores_only_top_level_timestamps_and_history():
    old = {"written_at": "t1", "history": [1], "image": {"written_at": "a"}}
    new = {"written_at": "t2", "history": [1, 2], "image": {"written_at": "b"}}
    assert lf.diff(old, new) == ['image.written_at: "a" -> "b"']
    assert lf.diff(old, new, ignore=()) == [
        "history: [1] -> [1, 2]",
        'image.written_at: "a" -> "b"',
        'written_at: "t1" -> "t2"',
    ]


def test_locked_revision_needs_every_match_and_a_resolved_one():
    lock = first_lock()
    mid = WANTED["model"]["id"]
    assert lf.effective_revision("main", lock, "qwen", "other/model") == "main"
    unresolved = lf.merge(lock, {"model": {"resolved_revision": ""}})
    assert lf.effective_revision("main", unresolved, "qwen", mid) == "main"
    assert lf.effective_revision("main", {"model": "x"}, "qwen", mid) == "main"
    assert lf.effective_revision("main", None, "qwen", mid) == "main"


def test_dumps_is_sorted_indented_json_with_a_newline():
    assert lf.dumps({"b": 1, "a": {"d": 2, "c": 3}}) == '{\n  "a": {\n    "c": 3,\n    "d": 2\n  },\n  "b": 1\n}\n'


def test_the_written_format_is_lock_version_1():
    """Locks already written say lock_version 1: a change of LOCK_VERSION refuses every one of them."""
    assert lf.LOCK_VERSION == 1
    assert lf.parse_lock('{"lock_version": 1, "image": {"ref": "x"}}') == {"lock_version": 1, "image": {"ref": "x"}}
    assert '"lock_version": 1' in lf.dumps(lf.merge({}, {}))


def test_a_section_that_is_not_a_mapping_is_read_as_missing():
    lock = {"lock_version": 1, "image": "sourcerepo", "model": ["profile"]}
    problems = lf.conflicts(lock, WANTED)
    assert problems[0] == 'image.source: the lock has null, the inventory asks for "eugr"'
    assert len(problems) == 7  # every wanted key but the empty registry_ref


def test_merge_writes_tuples_as_lists():
    lock = lf.merge({}, {"image": {"build_args": ("--a", "b")}})
    assert lock["image"]["build_args"] == ["--a", "b"] and isinstance(lock["image"]["build_args"], list)
    assert lf.dumps(lock) == lf.dumps(json.loads(lf.dumps(lock)))


def test_the_model_record_belongs_to_one_deployment_and_another_s_replaces_it_whole():
    """site.yml moving from the default deployment ("main") to others, and back: the lock's `model` is
    the first deployment's, and the old one's commit and name never stay behind to pin the new one."""
    main = {"profile": "big", "id": "org/big", "revision": "main", "resolved_revision": "a" * 40}
    lock = {"lock_version": 1, "model": dict(main)}
    chat = {"deployment": "chat", "profile": "small", "id": "org/small", "revision": "main"}
    moved = lf.merge(lock, {"model": chat})
    assert moved["model"] == chat  # no resolved_revision of "big" left under "small"
    assert lf.conflicts(moved, {"model": chat}) == []
    # The resolution written after it (no profile: not a record of its own) merges into chat's.
    resolved = lf.merge(moved, {"model": {"resolved_revision": "b" * 40}})
    assert resolved["model"] == {**chat, "resolved_revision": "b" * 40}
    # Back to the default deployment: its record without a name, chat's name gone.
    back = lf.merge(resolved, {"model": {"profile": "big", "id": "org/big", "revision": "main"}})
    assert "deployment" not in back["model"] and "resolved_revision" not in back["model"]
    assert lf.model_deployment(back) == "main"
    # The same deployment's record still merges (a no-op run keeps the resolved commit).
    again = lf.merge(lock, {"model": {"profile": "big", "id": "org/big", "revision": "main"}})
    assert again["model"] == main
