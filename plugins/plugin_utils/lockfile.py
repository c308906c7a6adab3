# Copyright: sparkops maintainers
# Apache-2.0
"""The deployment's lock file (sparkops_lock_file, next to the inventory), like a package manager's.

The inventory says what is WANTED (an eugr ref, build arguments, a registry reference, a serving
profile whose revision may be the moving `main`); the lock says what that RESOLVED to the first time
(the commit, the image ID or digest, the versions found inside the image, the model's commit). Later
runs, the other nodes and a rebuild use the lock; only playbooks/upgrade.yml moves it, and it says
what moved. Controller-only: no module imports this.

Every deployment's model is recorded under `models.<deployment>` (profile, id, revision, and the commit
the revision resolved to); `model` keeps the first deployment's record, as earlier versions wrote it
alone. parse_lock() reads a lock of those versions (`model` only, or `models` without the resolved
commits) as if it had been written now: its `model` is the record of the deployment it names.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping

from ansible_collections.sparkops.cluster.plugins.plugin_utils.stacks import DEFAULT_STACK

LOCK_VERSION = 1

# What the inventory asks for, by lock path. A difference between these and the lock means the
# inventory was edited since the lock was written: site.yml refuses (the upgrade is the way to move).
WANTED_KEYS = (
    ("stack",),
    ("image", "source"),
    ("image", "repo"),
    ("image", "ref"),
    ("image", "build_args"),
    ("image", "registry_ref"),
    ("image", "registry_image"),
    ("model", "profile"),
    ("model", "id"),
    ("model", "revision"),
)


# A deployment's model record: what the inventory asks for. Another value of any of these is another record
# (a resolved commit of the old one must not stay behind to pin or name the new one).
RECORD_KEYS = ("profile", "id", "revision")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


class LockError(ValueError):
    """The lock file is unreadable or of another format."""


def parse_lock(text: str | None) -> dict:
    """The lock's content; {} for no lock. LockError for a broken or foreign file."""
    if text is None or not text.strip():
        return {}
    try:
        lock = json.loads(text)
    except ValueError as exc:
        raise LockError(f"the lock file is not JSON ({exc}); restore it from version control or delete it") from None
    if not isinstance(lock, dict) or lock.get("lock_version") != LOCK_VERSION:
        raise LockError(
            f"the lock file has lock_version {lock.get('lock_version') if isinstance(lock, dict) else '?'}, "
            f"this sparkops writes {LOCK_VERSION}"
        )
    return migrate(lock)


def _same_record(a: object, b: object) -> bool:
    return (
        isinstance(a, Mapping)
        and isinstance(b, Mapping)
        and all(_norm(a.get(key)) == _norm(b.get(key)) for key in RECORD_KEYS)
    )


def model_records(lock: dict) -> dict:
    """Every deployment's model record, by deployment name: `models`, with `model` (the first deployment's,
    the only one a lock of earlier versions holds) as the record of the deployment it names. `model` is
    written on every run and wins over a `models` entry of another profile, model or revision (an earlier
    version kept `models` without the resolved commit, and a default cluster's run left it as it was)."""
    lock = lock or {}
    records = {
        str(name): _plain(record) for name, record in (lock.get("models") or {}).items() if isinstance(record, Mapping)
    }
    model = lock.get("model")
    if isinstance(model, Mapping) and any(model.get(key) for key in RECORD_KEYS):
        name = model_deployment(lock)
        own = {key: _plain(value) for key, value in model.items() if key != "deployment"}
        kept = records.get(name)
        records[name] = {**(kept if _same_record(kept, own) else {}), **own}
    return records


def migrate(lock: dict) -> dict:
    """The lock in this version's form: `models` holds every deployment's record (model_records)."""
    if not lock:
        return lock
    records = model_records(lock)
    if not records:
        return lock
    return {**lock, "models": records}


def _get(tree: dict, path: tuple) -> object:
    node = tree
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _norm(value: object) -> object:
    if value == "":
        return None
    if isinstance(value, tuple):
        return list(value)
    return value


def conflicts(lock: dict, wanted: dict) -> list[str]:
    """Where the inventory asks for something else than the lock records (empty: none, or no lock)."""
    if not lock:
        return []
    out = []
    # The lock's `model` belongs to one deployment: "main" (the default one, and every lock written before
    # sparkops_deployments) unless it names another. When the inventory's first deployment is another one,
    # "main" was removed or renamed: site.yml may add and remove deployments (each keeps its own commit
    # under `models`), so only the image is held to the lock then.
    same_deployment = model_deployment(lock) == model_deployment(wanted)
    wanted = held_digest(lock, wanted)
    for path in WANTED_KEYS:
        if path[0] == "model" and not same_deployment:
            continue
        have = _norm(_get(lock, path))
        want = _norm(_get(wanted, path))
        if path == ("image", "registry_image") and want is None:
            continue  # only a registry image by tag is held to its tag (a stale one of an earlier stack is not)
        if path == ("stack",):
            # A lock written before stacks were named is the default stack's; a caller that names none
            # (no stacks) is held to the image alone.
            if want is None:
                continue
            have = have or DEFAULT_STACK
        if have != want:
            out.append(f"{'.'.join(path)}: the lock has {json.dumps(have)}, the inventory asks for {json.dumps(want)}")
    return out


def held_digest(lock: dict, wanted: dict) -> dict:
    """`wanted` with the lock's digest as its registry_ref where it names the image by the tag the lock
    holds a digest for (the first pull resolved it; every later run pulls that digest, not the tag)."""
    want = _get(wanted or {}, ("image",)) or {}
    tag = want.get("registry_image") if isinstance(want, Mapping) else None
    if not tag or want.get("registry_ref") or _get(lock or {}, ("image", "registry_image")) != tag:
        return wanted
    return {**wanted, "image": {**want, "registry_ref": _get(lock, ("image", "registry_ref"))}}


def model_deployment(lock: dict) -> str:
    """The deployment the lock's (or the wanted) `model` belongs to: its `deployment`, else "main"."""
    return str(_get(lock or {}, ("model", "deployment")) or "main")


def model_conflicts(lock: dict, wanted: dict) -> list[str]:
    """Where a deployment of sparkops_deployments asks for another profile or model than the lock records
    under `models` by its name. A name the lock does not record (a lock from before deployments, a new
    deployment) is no conflict: its first run records it."""
    if not lock:
        return []
    recorded = model_records(lock)
    # The deployment conflicts() holds to the lock's `model` is reported there, once.
    checked = model_deployment(wanted) if model_deployment(lock) == model_deployment(wanted) else None
    out = []
    for name, want in (wanted.get("models") or {}).items():
        have = recorded.get(name)
        if not isinstance(have, dict) or name == checked:
            continue
        for key in RECORD_KEYS:
            if _norm(have.get(key)) != _norm(want.get(key)):
                out.append(
                    f"models.{name}.{key}: the lock has {json.dumps(_norm(have.get(key)))}, "
                    f"the inventory asks for {json.dumps(_norm(want.get(key)))}"
                )
    return out


def _plain(value: object) -> object:
    """A copy of nested dicts and lists as plain dict and list.

    Not copy.deepcopy: inside a template, ansible-core 2.19 hands a filter lazy containers, and a
    deep copy of one copies the templar and the variables behind it (1.4-1.8 s per call on a
    converged cluster; this copy is milliseconds). Reading the items renders them once, as JSON needs.
    """
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def merge(lock: dict, resolved: dict) -> dict:
    """The lock with `resolved` written over it (nested dicts merged, None values dropped)."""
    new = _plain(lock) if lock else {}
    new["lock_version"] = LOCK_VERSION

    def into(dst: dict, src: dict) -> None:
        for key, value in src.items():
            if value is None:
                continue
            if isinstance(value, Mapping):
                child = dst.get(key)
                if not isinstance(child, dict):
                    child = dst[key] = {}
                into(child, value)
            else:
                dst[key] = _plain(value)

    # `model` is one deployment's record (model_deployment). What the inventory asks for (a record with
    # its profile) for ANOTHER deployment replaces it whole: the old one's commit, its name included,
    # must not stay behind to pin or name the new one.
    wanted_model = resolved.get("model") if isinstance(resolved, Mapping) else None
    if (
        isinstance(wanted_model, Mapping)
        and "profile" in wanted_model
        and (model_deployment(new) != model_deployment(resolved) or not _same_record(new.get("model"), wanted_model))
    ):
        new.pop("model", None)
    # The same for each deployment's record under `models`: another profile, model or revision for a
    # deployment replaces its record whole (an upgrade of it; its resolved commit is written after).
    wanted_models = resolved.get("models") if isinstance(resolved, Mapping) else None
    if isinstance(wanted_models, Mapping) and isinstance(new.get("models"), dict):
        for name, record in wanted_models.items():
            replaced = isinstance(record, Mapping) and "profile" in record
            if replaced and not _same_record(new["models"].get(name), record):
                new["models"].pop(name, None)
    into(new, resolved)
    # Written in this version's form: every deployment's record under `models`, the first's as well.
    return migrate(new)


def model_refs(wanted: dict) -> list[dict]:
    """The Hugging Face cache refs to read for the models the inventory asks for by a moving revision (a
    branch or a tag; a commit needs no reading), one per model and revision: [{model, revision}]."""
    out = []
    for record in [(wanted or {}).get("model"), *((wanted or {}).get("models") or {}).values()]:
        if not isinstance(record, Mapping) or not record.get("id") or not record.get("revision"):
            continue
        ref = {"model": str(record["id"]), "revision": str(record["revision"])}
        if not _COMMIT_RE.match(ref["revision"]) and ref not in out:
            out.append(ref)
    return out


def _read_commit(reading: Mapping) -> str | None:
    """The commit a slurped refs file holds (base64, as ansible.builtin.slurp returns it), or None: the
    file is missing, unreadable or holds anything but one commit (the cache's content is not trusted)."""
    try:
        text = base64.b64decode(str(reading.get("content") or ""), validate=True).decode("ascii").strip()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return text if _COMMIT_RE.match(text) else None


def resolve_models(lock: dict, readings: list | None, upgrade: bool = False) -> dict:
    """The lock with each deployment's resolved commit (`resolved_revision`) written, `model`'s included.

    `readings`: the slurped refs files of model_refs(), each with its `item` ({model, revision}). A record
    whose revision is a commit resolves to it. One with a moving revision keeps the commit the lock holds
    for it (the same record's: merge() drops another's), whatever the head's cache says now (a failed
    upgrade may have moved its refs); only a record without one, or an `upgrade`, takes its refs file's."""
    found = {}
    for reading in readings or []:
        item = (reading or {}).get("item") or {}
        commit = _read_commit(reading or {})
        if commit:
            found[(str(item.get("model")), str(item.get("revision")))] = commit
    new = _plain(lock) if lock else {"lock_version": LOCK_VERSION}

    def resolved(record: dict) -> str | None:
        revision = str(record.get("revision") or "")
        if _COMMIT_RE.match(revision):
            return revision
        have = record.get("resolved_revision") or None
        read = found.get((str(record.get("id")), revision))
        return (read or have) if upgrade else (have or read)

    for record in (new.get("models") or {}).values():
        if isinstance(record, dict) and record.get("id") and resolved(record):
            record["resolved_revision"] = resolved(record)
    model = new.get("model")
    if isinstance(model, dict) and model.get("id") and resolved(model):
        model["resolved_revision"] = resolved(model)
    return new


def diff(old: dict, new: dict, ignore: tuple = ("written_at", "history")) -> list[str]:
    """What moved, one line per changed leaf: 'path: old -> new' (the upgrade's report)."""
    out = []

    def walk(a: object, b: object, path: str) -> None:
        # A section only one side has (the first write, a lock gaining or losing a section) is
        # walked against an empty one, so the report still names each leaf.
        if a is None and isinstance(b, dict):
            a = {}
        if b is None and isinstance(a, dict):
            b = {}
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if not path and key in ignore:
                    continue
                walk(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        elif a != b:
            out.append(f"{path}: {json.dumps(a)} -> {json.dumps(b)}")

    walk(old, new, "")  # no lock (None) is an empty one: walk() reads None beside a dict as {}
    return out


def effective_revision(profile_revision: str, lock: dict, profile_name: str, model_id: str, deployment=None) -> str:
    """The model commit to use: the locked one when the lock is for this profile and model, else the profile's.
    With `deployment`, the record of that deployment (model_records), else the lock's `model`."""
    if not lock:
        return profile_revision
    model = model_records(lock).get(str(deployment)) if deployment is not None else lock.get("model")
    if (
        isinstance(model, dict)
        and model.get("profile") == profile_name
        and model.get("id") == model_id
        and model.get("revision") == profile_revision
        and model.get("resolved_revision")
    ):
        return model["resolved_revision"]
    return profile_revision


def dumps(lock: dict) -> str:
    """The lock as written: stable key order, so an unchanged lock is byte-identical (no-op runs change nothing)."""
    return json.dumps(lock, indent=2, sort_keys=True) + "\n"
