# Copyright: sparkops maintainers
# Apache-2.0
"""Whether a node's running watchdog watches what the serving plan changes (controller side, pure).

A node's watchdog (roles/watchdog) restarts the serving group its config names: the replica whose API
runs on the node (`watch`), under its executor, at its endpoint, serving its model, with its vLLM and Ray
containers and its workers by name and fast-link address. When the plan moves that group (another
executor, other workers, the replica elsewhere, another model, another image), the converge removes and
replaces the very containers the old watchdog watches; left running it takes the change for a failure and restarts
the old group under the run. Such a watchdog is stopped before anything else moves (playbooks/serve.yml);
watchdog.yml starts it again on its new config.

Only the fields that say WHICH group is watched are compared. Tunables (intervals, budgets, timeouts,
the quality probe) do not make the old watchdog restart the wrong thing: the watchdog role's own restart
(a changed config file) takes them. A node whose watchdog watches nothing (`watch` false: the memory floor
only) is kept whatever the plan says: it restarts nothing.

The running config is read from the node (watchdog.json): it is judged, never trusted as well formed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

# The fields of watchdog.json that name the watched group (roles/watchdog/vars/main.yml watchdog_config).
# The image is one of them: a new image (an upgrade, a move to another stack, a rollback) replaces Ray's and vLLM's
# containers on every node, and a watchdog that sees a worker's Ray container missing for a moment restarts
# its group under the run.
GROUP_FIELDS = ("executor", "endpoint", "model", "vllm_container", "ray_container", "workers", "image")
_SHOWN = 120  # characters of a value from the node shown in a reason


def _watches(value: object) -> bool:
    """As the watchdog settles `watch` (sparkops_watchdog.py main): the string "true" in any case."""
    return str(value).lower() == "true"


def _shown(value: object) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else value
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _workers(value: object) -> object:
    """The workers as sorted (name, address) pairs; what is not a list of such pairs stays as it is (it then
    differs from any plan and is shown)."""
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        return value
    pairs = []
    for w in value:
        if not isinstance(w, Mapping):
            return value
        pairs.append((str(w.get("name")), str(w.get("address"))))
    return sorted(pairs)


def planned_group(part: Sequence, host: str, nodes: Mapping, container_names: Mapping, image: str) -> dict | None:
    """What this node's watchdog will watch under the plan, in watchdog.json's fields; None when it watches
    nothing (the node serves no replica's API). `part` is this node's part of the serving plan
    (serving.py node_part, `sparkops_node.serving`); the watchdog reads its first member, as the role does.
    `image` is the image the plan runs (the plan's image.image: its containers', and the watchdog's own)."""
    member = part[0] if part else {}
    if member.get("role") != "api":
        return None
    workers = [h for h in member["replica_hosts"] if h != host]
    return {
        "executor": member["executor"],
        "endpoint": member["endpoint"]["url"],
        "model": member["served_model_name"],
        "vllm_container": container_names["vllm"],
        "ray_container": container_names["ray"],
        "workers": [{"name": h, "address": nodes[h]["primary"]["ip"]} for h in workers],
        "image": image,
    }


def _running(config: object) -> tuple[Mapping | None, str]:
    """The running config as a mapping (None: no config, nothing runs), or a reason it cannot be read."""
    if config is None:
        return None, ""
    if isinstance(config, (str, bytes)):
        text = config.decode("utf-8", "replace") if isinstance(config, bytes) else config
        if not text.strip():
            return None, ""
        try:
            config = json.loads(text)
        except ValueError as exc:
            return {}, f"its watchdog.json is not JSON ({exc})"
    if not isinstance(config, Mapping):
        return {}, f"its watchdog.json is not an object ({type(config).__name__})"
    return config, ""


def outdated_reasons(
    running: object, part: Sequence, host: str, nodes: Mapping, container_names: Mapping, *, image: str
) -> list:
    """Why this node's running watchdog watches something the plan changes: one sentence per field that
    differs; empty when it may keep running (no config on the node, it watches nothing, or it watches
    exactly the group the plan keeps here).

    running: the node's watchdog.json (its text, or parsed), None or "" when the node has none.
    part, host, nodes, container_names, image: this node's part of the plan, its inventory name, the cluster
    model's nodes (for the workers' fast-link addresses), sparkops_container_names and the plan's image. A config
    that names no image (written before the watchdog recorded it), or a plan whose image is still to be resolved
    (empty: a branch or tag the image role clones), cannot say it is the same one: outdated."""
    config, unreadable = _running(running)
    if config is None:
        return []
    if unreadable:
        return [unreadable]
    if not _watches(config.get("watch", False)):
        return []
    planned = planned_group(part, host, nodes, container_names, image)
    watched = {**config, "executor": config.get("executor", "ray")}  # the watchdog's own default (runs_ray)
    if planned is None:
        return [
            f"it watches the {watched['executor']} group serving {_shown(watched.get('model'))} at "
            f"{_shown(watched.get('endpoint'))}, and the plan puts no API on {host}"
        ]
    out = []
    for field in GROUP_FIELDS:
        was, now = watched.get(field), planned[field]
        if field == "workers":
            if _workers(was) != _workers(now):
                out.append(f"workers: {_shown(was)} -> {_shown(now)}")
        elif field == "image" and not now:
            out.append(f"image: {_shown(was)} -> the image this run resolves (a branch or tag still to be cloned)")
        elif str(was) != str(now):
            out.append(f"{field}: {_shown(was)} -> {_shown(now)}")
    return out
