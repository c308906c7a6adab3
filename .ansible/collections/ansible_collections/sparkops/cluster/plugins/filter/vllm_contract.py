"""Filters over recorded vLLM contracts (plugins/plugin_utils/vllm_contract.py holds the logic).

Documentation: vllm_contract.yml and vllm_serve_problems.yml next to this file (`ansible-doc -t filter`)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (
    check_serve_args,
    contract_from_help,
    load_contract,
)


def _contract(value, help_text="", env_vars=None):
    if isinstance(value, dict):
        return value
    try:
        if help_text:
            return contract_from_help(str(help_text), str(value), env_vars=env_vars)
        return load_contract(str(value))
    except ValueError as exc:
        raise AnsibleFilterError(f"vllm_contract: {exc}") from exc


def vllm_contract(version, help_text="", env_vars=None):
    """The contract of vLLM `version` (recorded fixture, or parsed from `help_text`)."""
    return _contract(version, help_text, env_vars)


def vllm_serve_problems(argv, env, contract_or_version):
    """Problems that vLLM (a contract dict or a recorded version) would have with argv and env."""
    contract = _contract(contract_or_version)
    try:
        return check_serve_args([str(a) for a in argv], {str(k): str(v) for k, v in dict(env or {}).items()}, contract)
    except (ValueError, TypeError) as exc:
        raise AnsibleFilterError(f"vllm_serve_problems: {exc}") from exc


class FilterModule:
    """vLLM contract filters."""

    def filters(self):
        return {"vllm_contract": vllm_contract, "vllm_serve_problems": vllm_serve_problems}
