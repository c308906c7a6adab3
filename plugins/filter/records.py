"""Filters over what is deployed, deployment by deployment (logic in plugins/plugin_utils/records.py)."""

from __future__ import annotations

from ansible_collections.sparkops.cluster.plugins.plugin_utils.records import changes, record_file


class FilterModule:
    def filters(self):
        return {
            "sparkops_deployment_record": record_file,
            "sparkops_record_changes": changes,
        }
