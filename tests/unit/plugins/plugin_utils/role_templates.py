"""A role's variables as Ansible renders them on one node of a plan, for the unit tests that read what a role
writes (the watchdog's config, Ray's start command) without running a play: the shared defaults, the role's
defaults and vars, and the node's part of the serving plan, rendered by ansible-core's own Templar."""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving import node_part

ROOT = Path(__file__).resolve().parents[4]


def trusted(value):
    """ansible-core 2.19+ renders only strings tagged as trusted templates (as files from a role are)."""
    tag = importlib.import_module("ansible._internal._datatag._tags").TrustedAsTemplate()
    if isinstance(value, str):
        return tag.tag(value)
    if isinstance(value, list):
        return [trusted(v) for v in value]
    if isinstance(value, dict):
        return {k: trusted(v) for k, v in value.items()}
    return value


def render_role(role: str, expr, cluster: dict, plan: dict, host: str, **more):
    """`expr` rendered with `role`'s variables on `host`, the cluster model holding `plan` as its serving plan."""
    from ansible.template import Templar  # noqa: PLC0415

    names = {}
    for path in sorted((ROOT / "roles/sparkops_defaults/defaults/main").glob("*.yml")):
        names.update(yaml.safe_load(path.read_text()) or {})
    names.update(yaml.safe_load((ROOT / "roles" / role / "defaults/main.yml").read_text()))
    names.update(yaml.safe_load((ROOT / "roles" / role / "vars/main.yml").read_text()))
    names = trusted(names)
    names.update(
        sparkops_cluster={**cluster, "serving": plan},
        sparkops_node={**cluster["nodes"][host], "serving": node_part(plan, host)},
        inventory_hostname=host,
        **more,
    )
    return Templar(variables=names).template(trusted(expr))


def find_task(path: Path, name: str) -> dict:
    """The one task named `name` in the task file at `path`, looked for inside blocks too."""
    found = []

    def walk(items):
        for t in items or []:
            if t.get("name") == name:
                found.append(t)
            walk(t.get("block"))

    walk(yaml.safe_load(path.read_text()))
    (task,) = found
    return task
