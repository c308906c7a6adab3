"""Filters over stacks (plugins/plugin_utils/stacks.py holds the logic).

Documentation: stack_lines.yml next to this file (`ansible-doc -t filter`)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.plugin_utils.registry_image import digest_ref, pull_plan
from ansible_collections.sparkops.cluster.plugins.plugin_utils.stacks import stack_lines as _stack_lines


def stack_lines(stack):
    """The plan's stack (sparkops_cluster.serving.stack) as lines for a person."""
    if stack is not None and not isinstance(stack, dict):
        raise AnsibleFilterError(f"stack_lines: expected the plan's stack (a mapping), got {type(stack).__name__}")
    try:
        return _stack_lines(stack)
    except (KeyError, TypeError) as exc:
        raise AnsibleFilterError(f"stack_lines: not a stack from the plan ({exc})") from exc


def registry_pull_plan(image, lock_image=None, upgrade=False):
    """Which reference the registry source pulls (plugin_utils/registry_image.py pull_plan)."""
    if not isinstance(image, dict):
        raise AnsibleFilterError(
            f"registry_pull_plan: expected {{registry_ref, registry_image}}, got {type(image).__name__}"
        )
    return pull_plan(image, lock_image if isinstance(lock_image, dict) else {}, bool(upgrade))


def registry_digest_ref(repo_digests, tag):
    """The digest reference a pull of `tag` resolved to (plugin_utils/registry_image.py digest_ref)."""
    try:
        return digest_ref(repo_digests, tag)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    """Stack filters."""

    def filters(self):
        return {
            "stack_lines": stack_lines,
            "registry_pull_plan": registry_pull_plan,
            "registry_digest_ref": registry_digest_ref,
        }
