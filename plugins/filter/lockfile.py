"""Filters over the deployment's lock file (logic in plugins/plugin_utils/lockfile.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.plugin_utils.lockfile import (
    LockError,
    conflicts,
    diff,
    dumps,
    effective_revision,
    merge,
    model_refs,
    parse_lock,
    resolve_models,
)


def sparkops_lock_parse(text):
    try:
        return parse_lock(text)
    except LockError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self):
        return {
            "sparkops_lock_parse": sparkops_lock_parse,
            "sparkops_lock_conflicts": conflicts,
            "sparkops_lock_merge": merge,
            "sparkops_lock_diff": diff,
            "sparkops_lock_dumps": dumps,
            "sparkops_lock_revision": effective_revision,
            "sparkops_lock_refs": model_refs,
            "sparkops_lock_resolve": resolve_models,
        }
