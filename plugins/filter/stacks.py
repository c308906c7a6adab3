"""Filters over stacks (plugins/plugin_utils/stacks.py holds the logic).

Documentation: stack_lines.yml next to this file (`ansible-doc -t filter`)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.plugin_utils.stacks import stack_lines as _stack_lines


def stack_lines(stack):
    """The plan's stack (sparkops_cluster.serving.stack) as lines for a person."""
    if stack is not None and not isinstance(stack, dict):
        raise AnsibleFilterError(f"stack_lines: expected the plan's stack (a mapping), got {type(stack).__name__}")
    try:
        return _stack_lines(stack)
    except (KeyError, TypeError) as exc:
        raise AnsibleFilterError(f"stack_lines: not a stack from the plan ({exc})") from exc


class FilterModule:
    """Stack filters."""

    def filters(self):
        return {"stack_lines": stack_lines}
