"""Small pure views of the cluster model for templates and playbooks."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import bind_problem, summary
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving import (
    changed_api_members,
    deployment_target,
    health_rows,
    ray_rows,
    upgrade_strategy,
)
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving import summary as serving_summary


def cluster_summary(model: dict) -> list:
    """The plan as readable lines (nodes, peers, routes, segments, cables, stages), then what is served:
    each deployment's exact image tag and every member's command line; last the Clients block (the URL clients
    use, the networks that reach it, the key and how it is sent)."""
    lines = summary(model) + (serving_summary(model["serving"]) if model.get("serving") else [])
    return lines + list((model.get("clients") or {}).get("lines") or [])


LOOPBACK_OR_EVERY = ("0.0.0.0", "127.0.0.1")  # noqa: S104 - values compared, not bound


def listen_address_problem(value, variable: str, node: dict, host: str, allowed=LOOPBACK_OR_EVERY) -> str:
    """Why `value` cannot be `variable`, a listen address of `host` ("" when it can): one of the node's own
    IPv4 addresses (its fast links, its management address) or `allowed`; IPv6 is refused (plugin_utils/
    cluster.py bind_problem)."""
    node = node or {}
    mine = [str(ip) for ip in node.get("ips") or []] + ([str(node["mgmt_address"])] if node.get("mgmt_address") else [])
    return bind_problem(variable, value, mine, owner=host, what=f"{variable} of {host}", allowed=tuple(allowed))


def cluster_plan(model: dict) -> dict:
    """The model as written by plan.yml: the whole model, keys in a stable order."""
    return {key: model[key] for key in sorted(model)}


def serving_target(model: dict, deployment=None) -> dict:
    """The first replica's API of the deployment named `deployment` (the first deployment when empty);
    an unknown name stops the play with the names there are."""
    try:
        return deployment_target(model["serving"], deployment)
    except ValueError as err:
        raise AnsibleFilterError(str(err)) from err


def serving_upgrade_strategy(model: dict, deployment: str) -> dict:
    """How upgrade.yml replaces one deployment: blue-green (halves behind the gateway) or a swap, and why
    (plugin_utils/serving.py upgrade_strategy); an unknown name stops the play with the names there are."""
    try:
        return upgrade_strategy(model["serving"], str(deployment or ""))
    except ValueError as err:
        raise AnsibleFilterError(str(err)) from err


def serving_health_rows(checks) -> list:
    """One row per replica from a looped vllm_health's results (plugin_utils/serving.py health_rows)."""
    return health_rows([dict(c) for c in checks or []])


def serving_changed_api_members(model: dict, container_plan) -> list:
    """The API members of the replicas this run starts or replaces, from vllm_serve's container plan
    (plugin_utils/serving.py changed_api_members)."""
    return changed_api_members(model["serving"], [dict(r) for r in container_plan or []])


def serving_ray_rows(readings) -> list:
    """One row per Ray group from a looped ray_cluster_status's results (plugin_utils/serving.py ray_rows)."""
    return ray_rows([dict(r) for r in readings or []])


class FilterModule:
    def filters(self):
        return {
            "bind_problem": listen_address_problem,
            "cluster_summary": cluster_summary,
            "cluster_plan": cluster_plan,
            "serving_target": serving_target,
            "serving_health_rows": serving_health_rows,
            "serving_upgrade_strategy": serving_upgrade_strategy,
            "serving_ray_rows": serving_ray_rows,
            "serving_changed_api_members": serving_changed_api_members,
        }
