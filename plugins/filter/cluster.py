"""Small pure views of the cluster model for templates and playbooks."""

from __future__ import annotations

from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import summary
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving import summary as serving_summary


def cluster_summary(model: dict) -> list:
    """The plan as readable lines (nodes, peers, routes, segments, cables, stages), then what is served:
    each deployment's exact image tag and every member's command line."""
    return summary(model) + (serving_summary(model["serving"]) if model.get("serving") else [])


def cluster_plan(model: dict) -> dict:
    """The model as written by plan.yml: the whole model, keys in a stable order."""
    return {key: model[key] for key in sorted(model)}


class FilterModule:
    def filters(self):
        return {"cluster_summary": cluster_summary, "cluster_plan": cluster_plan}
