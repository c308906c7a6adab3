"""Stacks: the named sets of versions that must agree for vLLM to serve, and the profiles each serves.

Controller-only (plugin_utils), stdlib only. A stack is plain data (roles/sparkops_defaults/defaults/main/
stacks.yml, `sparkops_stacks`; `sparkops_stack` names the one deployed):

    vllm_version   "0.19.0"            the release the image's vLLM must be
    vllm_commit    "2a69949bd"         the commit it must be built from (7-40 hex), or ""
    contract       "0.19.0"            the recorded `vllm serve` contract (vllm_contracts/vllm-<contract>.json)
    ray            "2.52.1"            the Ray the image must carry where Ray runs
    pins           {flashinfer, cuda, torch, nccl}: a version, or null (recorded in the lock at the first
                   deployment and held afterwards); optionally flashinfer_cutlass, the CUTLASS headers'
                   digest FlashInfer must ship (null: its own release's, where the image check knows it)
    image          {source: eugr, repo, ref, name, build_args}       a build of eugr/spark-vllm-docker, or
                   {source: registry, name, registry_image, registry_digest}   an image by tag, its digest
                   once known (empty: read at the first pull and recorded in the lock)
    notes          free text

API:
    check_stack(name, spec) -> list of problems (each naming the stack and the key)
    stack_contract(spec)   -> the recorded contract of the stack (ValueError when none is recorded)
    profile_problems_on(profile, contract, gpus_per_node, allow_rules) -> why that release would refuse
                              the profile: its flags, values, VLLM_* variables, speculative config, the
                              FP4 knobs, and min_vllm_version; [] when it serves it
    stack_plan(inputs, profiles, gpus_per_node) -> {"stack": {...}, "problems": [...]}: the selected
                              stack, the profiles it serves and those it does not (with the reasons,
                              each naming the flag and the release), and the stacks that do serve them
"""

from __future__ import annotations

import re

from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving_profile import (
    contract_violations,
    min_version_problems,
)
from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import recorded_versions, shared_contract

DEFAULT_STACK = "vllm-0.19.0"
STACK_KEYS = ("vllm_version", "vllm_commit", "contract", "ray", "pins", "image", "notes")
PIN_KEYS = ("flashinfer", "cuda", "torch", "nccl")
OPTIONAL_PIN_KEYS = ("flashinfer_cutlass",)
IMAGE_KEYS = {
    "eugr": ("source", "repo", "ref", "name", "build_args"),
    "registry": ("source", "name", "registry_image", "registry_digest"),
}
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# name[:port]/path:tag, the tag after the last '/' (a digest is kept apart, in registry_digest)
_TAGGED_RE = re.compile(
    r"^[a-z0-9][a-z0-9._-]*(:[0-9]+)?(/[a-z0-9][a-z0-9._-]*)*/?[a-z0-9._-]*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
)


def _is_text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def check_stack(name, spec) -> list[str]:
    """Every shape problem of stack `name`, each naming the stack and the key; [] when well formed."""
    where = f"sparkops_stacks[{name!r}]"
    if not isinstance(name, str) or not _NAME_RE.match(name):
        return [f"{where}: a stack's name is lower-case letters, digits, '.', '_' and '-' (e.g. vllm-0.33.0)"]
    if not isinstance(spec, dict):
        return [f"{where} must be a mapping with {', '.join(STACK_KEYS)}, got {type(spec).__name__}"]
    out = []
    unknown = sorted(str(k) for k in spec if k not in STACK_KEYS)
    if unknown:
        out.append(f"{where} has unknown key(s) {', '.join(unknown)}: a stack takes {', '.join(STACK_KEYS)}")
    for key in ("vllm_version", "contract"):
        if not (isinstance(spec.get(key), str) and _VERSION_RE.match(spec[key])):
            out.append(f"{where}.{key} must be a release like '0.19.0', got {spec.get(key)!r}")
    commit = spec.get("vllm_commit")
    if commit not in (None, "") and not (isinstance(commit, str) and _COMMIT_RE.match(commit)):
        out.append(f"{where}.vllm_commit must be 7-40 lower-case hex (the commit of the release), got {commit!r}")
    if not (isinstance(spec.get("ray"), str) and _VERSION_RE.match(spec["ray"])):
        out.append(f"{where}.ray must be a Ray release like '2.52.1', got {spec.get('ray')!r}")
    pins = spec.get("pins")
    if not isinstance(pins, dict) or sorted(set(pins) - set(OPTIONAL_PIN_KEYS)) != sorted(PIN_KEYS):
        out.append(
            f"{where}.pins must map exactly {', '.join(PIN_KEYS)} (and optionally {', '.join(OPTIONAL_PIN_KEYS)})"
            f" to a version or null, got {pins!r}"
        )
    else:
        out += [
            f"{where}.pins.{k} must be a version string or null, got {v!r}"
            for k, v in pins.items()
            if v is not None and not _is_text(v)
        ]
    out += _check_image(where, spec.get("image"))
    return out


def _check_image(where: str, image) -> list[str]:
    if not isinstance(image, dict) or image.get("source") not in IMAGE_KEYS:
        return [f"{where}.image must be a mapping whose source is eugr (a build) or registry (a pulled image)"]
    source = image["source"]
    out = []
    extra = sorted(str(k) for k in image if k not in IMAGE_KEYS[source])
    if extra:
        out.append(
            f"{where}.image ({source}) has unknown key(s) {', '.join(extra)}: it takes {', '.join(IMAGE_KEYS[source])}"
        )
    if not _is_text(image.get("name")):
        out.append(f"{where}.image.name must be the local image name (e.g. vllm-node)")
    if source == "eugr":
        for key in ("repo", "ref"):
            if not _is_text(image.get(key)):
                out.append(f"{where}.image.{key} must be set for an eugr build")
        args = image.get("build_args")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            out.append(f"{where}.image.build_args must be a list of strings (build-and-copy.sh's arguments)")
    else:
        ref = image.get("registry_image")
        if not (isinstance(ref, str) and _TAGGED_RE.match(ref)):
            out.append(
                f"{where}.image.registry_image must be an image by tag (e.g. vllm/vllm-openai:v0.33.0-aarch64), "
                f"got {ref!r}; its digest goes in registry_digest"
            )
        digest = image.get("registry_digest")
        if digest not in (None, "") and not (isinstance(digest, str) and _DIGEST_RE.match(digest)):
            out.append(f"{where}.image.registry_digest must be sha256:<64 hex> or empty, got {digest!r}")
    return out


def stack_contract(spec: dict) -> dict:
    """The recorded `vllm serve` contract of a stack (ValueError naming the recorded ones when none)."""
    return shared_contract(str(spec.get("contract") or spec.get("vllm_version")))


def profile_problems_on(profile, contract: dict, gpus_per_node: int = 1, allow_rules=None) -> list[str]:
    """Why the release of `contract` would not serve `profile`: what its `vllm serve` refuses (each message
    names the flag or variable and the release, and the release that takes it), the FP4 knobs it lacks,
    and the profile's min_vllm_version; [] when it serves it."""
    found = list(contract_violations(profile, contract, gpus_per_node=gpus_per_node, allow_rules=allow_rules))
    return found + min_version_problems(profile, contract)


def _image_summary(spec: dict) -> dict:
    image = spec.get("image") or {}
    if image.get("source") == "registry":
        digest = str(image.get("registry_digest") or "")
        return {
            "source": "registry",
            "registry_image": image.get("registry_image"),
            "registry_digest": digest or "read at the first pull, then held by the lock",
        }
    return {
        "source": "eugr",
        "repo": image.get("repo"),
        "ref": image.get("ref"),
        "build_args": list(image.get("build_args") or []),
    }


def stack_plan(inputs: dict, profiles: dict, gpus_per_node: int) -> dict:
    """The selected stack with the profiles it serves, and the problems that stop the plan.

    inputs: stack_name (sparkops_stack), stacks (sparkops_stacks), vllm_version (sparkops_vllm_version),
    allow_rules. Without stacks (an inventory from before stacks), the release of vllm_version is the
    stack, named after it. Problems: an unknown or malformed stack; sparkops_vllm_version set to another
    release than the stack's; a profile that no stack's release accepts (broken everywhere: a typo, a
    flag no release has). A profile only another stack serves is listed under `not_served` with the
    reasons and the stacks that serve it; it is refused only when it is the one deployed (preflight's
    profile check, with the same messages).
    """
    problems: list[str] = []
    stacks = inputs.get("stacks") or {}
    allow_rules = inputs.get("allow_rules") or []
    version = str(inputs.get("vllm_version") or "").strip()
    name = inputs.get("stack_name")
    if not stacks:
        # no stacks given (callers from before stacks existed): the pinned release is the stack, and every
        # other recorded release stands for a stack of its own
        version = version or DEFAULT_STACK.split("-", 1)[1]
        name = f"vllm-{version}"
        stacks = {f"vllm-{v}": {"vllm_version": v, "contract": v} for v in recorded_versions()}
        stacks[name] = {"vllm_version": version, "contract": version}
        shaped = True
    else:
        if not isinstance(stacks, dict):
            return {"stack": None, "problems": [f"sparkops_stacks must be a mapping of stack names, got {stacks!r}"]}
        name = str(name or DEFAULT_STACK)
        if name not in stacks:
            return {
                "stack": None,
                "problems": [
                    f"sparkops_stack '{name}' is not a known stack. Known: {', '.join(sorted(stacks))} "
                    "(sparkops_stacks, roles/sparkops_defaults/defaults/main/stacks.yml)"
                ],
            }
        for sname, spec in stacks.items():
            problems += check_stack(sname, spec)
        shaped = not problems
    if not shaped:
        return {"stack": None, "problems": problems}
    spec = stacks[name]
    if version and version != spec["vllm_version"]:
        problems.append(
            f"sparkops_vllm_version is {version} but sparkops_stack '{name}' is vLLM {spec['vllm_version']}: "
            "a stack is what must agree (image, vLLM, contract); pick the stack with sparkops_stack and leave "
            "sparkops_vllm_version to it"
        )
    contracts = {}
    for sname, sspec in stacks.items():
        try:
            contracts[sname] = stack_contract(sspec)
        except ValueError as err:
            problems.append(f"sparkops_stacks[{sname!r}]: {err}")
    if name not in contracts:
        return {"stack": None, "problems": problems}
    on_stack = {
        sname: {pname: profile_problems_on(prof, c, gpus_per_node, allow_rules) for pname, prof in profiles.items()}
        for sname, c in contracts.items()
    }
    mine = on_stack[name]
    served = sorted(p for p, found in mine.items() if not found)
    not_served = {}
    for pname in sorted(p for p, found in mine.items() if found):
        elsewhere = sorted(s for s in contracts if s != name and not on_stack[s][pname])
        not_served[pname] = {"reasons": mine[pname], "served_by": elsewhere}
        # refused by every stack's release on its flags alone: broken everywhere, not "another stack's"
        contract_only = {
            s: contract_violations(profiles[pname], contracts[s], gpus_per_node=gpus_per_node, allow_rules=allow_rules)
            for s in contracts
        }
        if all(contract_only.values()):
            problems.append(
                f"Serving profile '{pname}' is refused by every stack's vLLM "
                f"({', '.join(f'{s}: {len(v)} problem(s)' for s, v in contract_only.items())}); on {name} "
                f"(vLLM {spec['vllm_version']}): {'; '.join(mine[pname])}. Fix the profile for one of the stacks."
            )
    return {
        "stack": {
            "name": name,
            "vllm_version": spec["vllm_version"],
            "vllm_commit": spec.get("vllm_commit") or "",
            "contract": contracts[name]["vllm_version"],
            "contract_wheel": (contracts[name].get("source") or {}).get("wheel", ""),
            "ray": spec.get("ray"),
            "pins": dict(spec.get("pins") or {}),
            "image": _image_summary(spec),
            "serves": served,
            "not_served": not_served,
            "stacks": sorted(stacks),
        },
        "problems": problems,
    }


def served_by_hint(stack: dict | None, profile_name: str) -> str:
    """' It is served by stack X (vLLM Y): set sparkops_stack: X.' for a profile another stack serves."""
    if not stack:
        return ""
    entry = (stack.get("not_served") or {}).get(profile_name)
    if not entry or not entry["served_by"]:
        return ""
    names = ", ".join(entry["served_by"])
    return (
        f" Stack {names} serves it: set sparkops_stack: {entry['served_by'][0]} "
        "(playbooks/plan.yml lists each stack's profiles)."
    )


def stack_lines(stack: dict | None) -> list[str]:
    """The stack of a plan (stack_plan's `stack`) as lines for a person: what it is, the profiles it
    serves and, for each profile it does not, the first reason and the stacks that serve it."""
    if not stack:
        return ["no stack: the plan has none (see the problems above)"]
    image = stack["image"]
    if image["source"] == "registry":
        where = f"pulled {image['registry_image']} (digest: {image['registry_digest']})"
    else:
        where = f"built from {image['repo']} at {image['ref']} with {' '.join(image['build_args']) or 'no arguments'}"
    pins = ", ".join(
        f"{k} {v if v is not None else '(recorded at the first deployment)'}" for k, v in stack["pins"].items()
    )
    lines = [
        f"stack {stack['name']}: vLLM {stack['vllm_version']}"
        + (f" (commit {stack['vllm_commit']})" if stack["vllm_commit"] else "")
        + f", image {where}",
        f"  Ray {stack['ray']}; {pins}",
        f"  contract: vLLM {stack['contract']}'s recorded `vllm serve` options "
        f"({stack['contract_wheel'] or 'from help'})",
        f"  serves {len(stack['serves'])} profile(s): {', '.join(stack['serves']) or 'none'}",
    ]
    for pname, entry in stack["not_served"].items():
        others = f" (served by {', '.join(entry['served_by'])})" if entry["served_by"] else " (served by no stack)"
        lines.append(f"  not {pname}{others}: {entry['reasons'][0]}")
    others = [s for s in stack["stacks"] if s != stack["name"]]
    if others:
        lines.append(f"  other stacks: {', '.join(others)} (plan with -e sparkops_stack=<name>)")
    return lines
