"""Filters over serving profiles: hard-rule checks, normalisation and the `vllm serve` argv.

    {{ profile | sparkops.cluster.serving_profile_violations(gpus_total) }}            -> list of messages
    {{ profile | sparkops.cluster.serving_profile_violations(gpus_total, vllm_version='0.19.0') }}
                                            -> also what that vLLM release would refuse (its recorded contract)
    {{ profiles | sparkops.cluster.serving_profiles_contract_violations('0.19.0') }}   -> {name: [messages]}
    {{ profile | sparkops.cluster.normalize_serving_profile }}                          -> profile with defaults
    {{ profile | sparkops.cluster.vllm_serve_args('0.0.0.0', 8000, gpus_per_node=1) }} -> argv list
    {{ profile | sparkops.cluster.serving_weight_repos }}  -> [{model, revision, what}]: model, then drafter
    {{ sparkops_allow_rules | sparkops.cluster.serving_allowed_rules(name, profile, vllm_version='0.19.0') }}
                                            -> one warning line per allowed SM121 rule, with its reason
    {{ watchdog_json_text | sparkops.cluster.watchdog_outdated(sparkops_node.serving, inventory_hostname,
                                                               sparkops_cluster.nodes, sparkops_container_names,
                                                               image=sparkops_cluster.serving.image.image) }}
                                            -> why the node's running watchdog watches what the plan changes
Every filter that judges rules takes allow_rules= (sparkops_allow_rules): an allowed rule is not refused.

All logic lives in plugins/plugin_utils/serving_profile.py, vllm_contract.py and watchdog_scope.py; these only turn
ValueError into AnsibleFilterError so a playbook stops with the message. `vllm_version` may also be a
contract dict (from the sparkops.cluster.vllm_contract filter, e.g. parsed from the image's own help).
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving_profile import (
    allowed_rule_warnings,
    contract_violations,
    normalize_profile,
    profile_violations,
    weight_repos,
)
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving_profile import (
    vllm_serve_args as _vllm_serve_args,
)
from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import load_contract
from ansible_collections.sparkops.cluster.plugins.plugin_utils.watchdog_scope import outdated_reasons


def _plain(value):
    """Ansible hands over its own str/dict/list subclasses; give the pure code plain ones."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


def _int_arg(name, value):
    if isinstance(value, bool):
        raise AnsibleFilterError(f"{name} must be an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"{name} must be an integer, got {value!r}") from exc


def _contract(vllm_version):
    if vllm_version is None or vllm_version == "":
        return None
    if isinstance(vllm_version, dict):
        return _plain(vllm_version)
    return load_contract(str(vllm_version))


def serving_profile_violations(
    profile, gpus_total, node_memory_gib=128, gpus_per_node=1, vllm_version=None, *, allow_rules=None
):
    """List of messages, one per broken rule; empty when the profile may be served."""
    try:
        return profile_violations(
            _plain(profile),
            _int_arg("gpus_total", gpus_total),
            node_memory_gib=float(node_memory_gib),
            gpus_per_node=_int_arg("gpus_per_node", gpus_per_node),
            contract=_contract(vllm_version),
            allow_rules=_plain(allow_rules),
        )
    except (ValueError, TypeError) as exc:
        raise AnsibleFilterError(f"serving_profile_violations: {exc}") from exc


def serving_profiles_contract_violations(profiles, vllm_version, gpus_per_node=1, allow_rules=None):
    """{profile name: [messages]} for every profile that the vLLM release (or contract) would refuse."""
    try:
        contract = _contract(vllm_version)
        if contract is None:
            raise ValueError("a vLLM version (e.g. '0.19.0') or contract is required")
        out = {}
        for name, profile in _plain(profiles).items():
            found = contract_violations(
                profile,
                contract,
                gpus_per_node=_int_arg("gpus_per_node", gpus_per_node),
                allow_rules=_plain(allow_rules),
            )
            if found:
                out[name] = found
        return out
    except (ValueError, TypeError, AttributeError) as exc:
        raise AnsibleFilterError(f"serving_profiles_contract_violations: {exc}") from exc


def normalize_serving_profile(profile):
    """The profile with every default filled in; fails on wrong types or unknown keys."""
    try:
        return normalize_profile(_plain(profile))
    except ValueError as exc:
        raise AnsibleFilterError(f"normalize_serving_profile: {exc}") from exc


def vllm_serve_args(profile, host, port, gpus_per_node=1, allow_rules=None):
    """The `vllm serve` argv list for the profile; fails on a profile that breaks a hard rule not allowed."""
    try:
        return _vllm_serve_args(
            _plain(profile),
            _plain(host),
            _int_arg("port", port),
            gpus_per_node=_int_arg("gpus_per_node", gpus_per_node),
            allow_rules=_plain(allow_rules),
        )
    except ValueError as exc:
        raise AnsibleFilterError(f"vllm_serve_args: {exc}") from exc


def serving_allowed_rules(allow_rules, profile_name, profile, vllm_version=None):
    """One line per sparkops_allow_rules entry: the rule, the reason, what it lets through in the profile."""
    try:
        return allowed_rule_warnings(
            str(profile_name), _plain(profile), _plain(allow_rules), contract=_contract(vllm_version)
        )
    except (ValueError, TypeError) as exc:
        raise AnsibleFilterError(f"serving_allowed_rules: {exc}") from exc


def serving_weight_repos(profile):
    """[{model, revision, what}]: the model, then the drafter of a speculative profile, for weight_cache."""
    try:
        return weight_repos(_plain(profile))
    except ValueError as exc:
        raise AnsibleFilterError(f"serving_weight_repos: {exc}") from exc


def watchdog_outdated(running, part, host, nodes, container_names, *, image):
    """Why this node's running watchdog (its watchdog.json, text or parsed; empty or None when there is none)
    watches a group the plan changes; an empty list when it may keep running."""
    try:
        return outdated_reasons(
            _plain(running), _plain(part) or [], str(host), _plain(nodes), _plain(container_names), image=str(image)
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise AnsibleFilterError(
            f"watchdog_outdated: {host}'s part of the serving plan or the cluster's nodes are incomplete ({exc!r}); "
            "pass sparkops_node.serving and sparkops_cluster.nodes as roles/cluster_facts sets them"
        ) from exc


class FilterModule:
    """Serving-profile filters."""

    def filters(self):
        return {
            "serving_profile_violations": serving_profile_violations,
            "serving_profiles_contract_violations": serving_profiles_contract_violations,
            "normalize_serving_profile": normalize_serving_profile,
            "vllm_serve_args": vllm_serve_args,
            "serving_allowed_rules": serving_allowed_rules,
            "serving_weight_repos": serving_weight_repos,
            "watchdog_outdated": watchdog_outdated,
        }
