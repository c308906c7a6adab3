"""Filters over perftest results (the parsing lives in module_utils/perftest.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.module_utils.perftest import cable_verdict as _cable_verdict


def cable_verdict(per_twin_results, threshold_gbps=190.0, degraded_floor_gbps=None):
    """healthy / degraded / failed for one cable from its twins' bidirectional ib_write_bw results."""
    try:
        return _cable_verdict(
            per_twin_results,
            float(threshold_gbps),
            None if degraded_floor_gbps in (None, "") else float(degraded_floor_gbps),
        )
    except ValueError as exc:
        raise AnsibleFilterError(f"cable_verdict: {exc}") from exc


class FilterModule:
    def filters(self):
        return {"cable_verdict": cable_verdict}
