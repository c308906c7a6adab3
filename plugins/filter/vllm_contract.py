"""Filters over recorded vLLM contracts (plugins/plugin_utils/vllm_contract.py holds the logic)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_contract
author: sparkops
version_added: "0.2.0"
short_description: The recorded `vllm serve` contract of a vLLM release
description:
  - Returns the contract recorded from the official wheel of vLLM O(_input) (a version such as V(0.19.0)),
    from C(plugins/plugin_utils/vllm_contracts/vllm-<version>.json) - its serve options, fixed value
    sets, C(VLLM_*) variable names and Prometheus metric families.
  - With O(help_text), the contract is parsed from that C(vllm serve --help=all) output instead (the
    image's own vLLM on real hardware); the recorded fixture of that version, if any, supplies the
    C(VLLM_*) names unless O(env_vars) is given.
  - Fails, naming the recorded versions, when no fixture exists for the version.
options:
  _input:
    description: The vLLM version, e.g. V(0.19.0).
    type: str
    required: true
  help_text:
    description: Output of C(vllm serve --help=all) of that version; empty uses the recorded fixture.
    type: str
    default: ""
  env_vars:
    description: C(VLLM_*) names the vLLM reads (its C(vllm.envs.environment_variables)); used with O(help_text).
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Problems real vLLM 0.19.0 would have with a command line
  ansible.builtin.debug:
    msg: "{{ argv | sparkops.cluster.vllm_serve_problems({'VLLM_API_KEY': 'x'}, '0.19.0') }}"
  vars:
    argv: [vllm, serve, my/model, --tensor-parallel-size, "2"]

- name: The metric families vLLM 0.19.0 exposes
  ansible.builtin.debug:
    msg: "{{ ('0.19.0' | sparkops.cluster.vllm_contract).metrics | map(attribute='name') }}"
"""

RETURN = r"""
_value:
  description: >-
    The contract - keys vllm_version, source, serve_options, value_sets, env_vars, metrics (see
    plugins/plugin_utils/vllm_contract.py).
  type: dict
"""

from ansible.errors import AnsibleFilterError  # noqa: E402 - after the documentation strings
from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: E402
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
