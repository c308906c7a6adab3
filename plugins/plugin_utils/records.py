# Copyright: sparkops maintainers
# Apache-2.0
"""What is deployed, deployment by deployment: the record roles/deployment_state keeps on the head
(``deployment_state_file``) and the serving plan's view of it (``plan.records``).

A deployment's record is what runs it: its profile (by name, and as served: the revision is the commit
the lock resolved), its model and model commit, and the image (one for the cluster). The record file
holds every deployment's under ``deployments``, the first deployment's also at its top level (as
versions before records per deployment wrote it alone, and status.yml shows it), and the record before
it as ``previous``. A file of those versions (no ``deployments``) is the first deployment's record.

The plan's ``records[<deployment>]`` is the record this plan deploys and, as ``previous``, the one the
file holds (what was deployed before this run). An upgrade that fails converges to the plan built with
``rollback``: each deployment's profile and the image are its ``previous``. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible_collections.sparkops.cluster.plugins.plugin_utils.stacks import DEFAULT_STACK

# The image every deployment runs, and the stack it is of, as the record names them (the top level of the
# file holds the same keys). A record written before stacks were named is the default stack's.
IMAGE_KEYS = ("image", "image_id", "image_repo", "image_ref", "image_commit", "stack")
RECORD_KEYS = ("profile_name", "profile", "model", "model_revision", *IMAGE_KEYS)


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _record(entry: Mapping, top: Mapping) -> dict:
    """One deployment's record: its keys, the image's from the file's top level where it has none."""
    out = {key: _plain(entry.get(key)) for key in RECORD_KEYS}
    for key in IMAGE_KEYS:
        if out[key] in (None, ""):
            out[key] = _plain(top.get(key))
    out["stack"] = out["stack"] or DEFAULT_STACK
    return out


def recorded_deployments(state: Mapping | None, first: str) -> dict:
    """{deployment: record} from the record file's content. A file without `deployments` (written before
    records per deployment) holds one record at its top level, the first deployment's: it is `first`'s."""
    if not isinstance(state, Mapping) or not state:
        return {}
    deployments = state.get("deployments")
    if isinstance(deployments, Mapping):
        return {str(name): _record(rec, state) for name, rec in deployments.items() if isinstance(rec, Mapping)}
    if state.get("profile_name") or state.get("image"):
        return {str(first): _record(state, state)}
    return {}


def deployment_record(dep: Mapping, image: Mapping) -> dict:
    """The record of one deployment of the plan, on `image` ({image, image_id, image_repo, image_ref,
    image_commit}: the plan's, or what this run built or pulled)."""
    profile = dep["profile_as_given"]
    return {
        "profile_name": dep["profile_name"],
        "profile": _plain(profile),
        "model": profile.get("model"),
        "model_revision": profile.get("revision"),
        **{key: _plain(image.get(key)) or None for key in IMAGE_KEYS},
    }


def planned_image(image: Mapping) -> dict:
    """The plan's image (serving.plan_image) in the record's keys; None where the plan does not know it
    (a branch the image build resolves)."""
    return {
        "image": image.get("image") or None,
        "image_id": image.get("id") or None,
        "image_repo": image.get("repo") or None,
        "image_ref": image.get("ref") or image.get("registry_ref") or None,
        "image_commit": image.get("commit") or None,
        "stack": image.get("stack") or None,
    }


def plan_records(deployments: list, image: Mapping, recorded: Mapping) -> dict:
    """plan.records: each deployment's record on the plan's image, with `previous`, the record the file
    holds for it (None: nothing recorded, a deployment this run adds)."""
    return {
        dep["name"]: {**deployment_record(dep, planned_image(image)), "previous": recorded.get(dep["name"])}
        for dep in deployments
    }


def rollback_problems(names: list, recorded: Mapping) -> list:
    """A rollback converges each deployment to its record: one the file does not hold cannot be."""
    missing = [name for name in names if not (recorded.get(name) or {}).get("image")]
    if not missing:
        return []
    return [
        f"The upgrade failed and the deployment record on the head (deployment_state_file) holds nothing to roll "
        f"back to for {', '.join(missing)}: fix the cause and run site.yml"
    ]


def rollback_image(image: Mapping, record: Mapping) -> dict:
    """The plan's image (serving.plan_image's keys) named by a recorded deployment: the image it ran."""
    name, _colon, tag = str(record.get("image") or "").rpartition(":")
    return {
        **_plain(image),
        "name": name or image.get("name"),
        "tag": tag,
        "image": str(record.get("image") or ""),
        "commit": str(record.get("image_commit") or ""),
        "id": str(record.get("image_id") or ""),
        "ref": str(record.get("image_ref") or ""),
        "repo": str(record.get("image_repo") or ""),
        "args_hash": tag.rpartition("-")[2] if "-" in tag and not tag.startswith("registry-") else "",
        "resolved": bool(record.get("image")),
    }


def record_file(plan: Mapping, image: Mapping, drivers: Mapping) -> dict:
    """What roles/deployment_state record.yml writes (without `deployed_at` and `previous`): every
    deployment's record on the image this run serves (`image`, IMAGE_KEYS), the first deployment's
    also at the top level, and each node's driver version."""
    deployments = {dep["name"]: deployment_record(dep, image) for dep in plan.get("deployments", [])}
    first = next(iter(deployments.values()), {key: None for key in RECORD_KEYS})
    return {**first, "drivers": _plain(drivers), "deployments": deployments}


def changes(plan: Mapping, image: str) -> dict:
    """What an upgrade changes, from plan.records and the image this run serves: `moves` (whether any
    deployment's profile or model commit or the image moves) and `lines` (one for the image, one per
    deployment that moves, or that nothing is recorded for; one for the stack first, when it moves)."""
    records = plan.get("records") or {}
    before = {str((rec.get("previous") or {}).get("image") or "") for rec in records.values()} - {""}
    lines = []
    stacks = {str((rec.get("previous") or {}).get("stack") or "") for rec in records.values()} - {""}
    stack = next((str(rec.get("stack")) for rec in records.values() if rec.get("stack")), "")
    if stack and stacks and stacks != {stack}:
        lines.append(f"stack {', '.join(sorted(stacks))} -> {stack}")
    if before != {str(image)}:
        lines.append(f"image {', '.join(sorted(before)) or 'none recorded'} -> {image}")
    for name, rec in records.items():
        old = rec.get("previous")
        new = f"{rec['profile_name']} ({rec['model']}@{rec['model_revision']})"
        if not old:
            lines.append(f"{name}: nothing recorded -> {new}")
        elif (old.get("profile_name"), old.get("profile")) != (rec["profile_name"], rec["profile"]):
            lines.append(f"{name}: {old.get('profile_name')} ({old.get('model')}@{old.get('model_revision')}) -> {new}")
    return {"moves": bool(lines), "lines": lines or ["nothing changes"]}
