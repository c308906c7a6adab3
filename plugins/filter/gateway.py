"""Filters for the client gateway (roles/gateway, playbooks/gateway_wheels.yml); the logic is in
plugins/plugin_utils/gateway.py, these turn its errors into AnsibleFilterError.

    {{ sparkops_cluster.serving | sparkops.cluster.gateway_litellm_config(drained) }} -> LiteLLM's config.yaml
    {{ arch | sparkops.cluster.gateway_wheelhouse_name(python_version) }}           -> linux-<arch>-cp<XY>
    {{ folder | sparkops.cluster.gateway_install_source(version, arch, index_url) }} -> wheelhouse, index or none
    {{ pip | sparkops.cluster.gateway_pip_download(dest, reqs, arch=, python=, glibc=) }} -> argv
    {{ python | sparkops.cluster.gateway_wheelhouse_download(dest, reqs, arch=, python=, glibc=) }} -> argv
    {{ result['keys'] | sparkops.cluster.gateway_usage_lines }}                     -> one line per key
    {{ name | sparkops.cluster.gateway_key_limits(class, parallel, tpm, sweep_dir=, sweep_name=, source=) }}
        -> {limits, basis, sweep}: the key's class and limits (plugins/plugin_utils/key_limits.py)
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.plugin_utils import gateway, key_limits


def gateway_litellm_config(plan: dict, drained=()) -> dict:
    try:
        return gateway.litellm_config(plan, drained=list(drained or ()))
    except gateway.GatewayPlanError as err:
        raise AnsibleFilterError(str(err)) from None


def gateway_wheelhouse_name(arch: str, python: str) -> str:
    try:
        return gateway.wheelhouse_name(str(arch), str(python))
    except gateway.WheelhouseError as err:
        raise AnsibleFilterError(str(err)) from None


def gateway_install_source(platform_folder, litellm_version, arch, index_url) -> str:
    return gateway.install_source(platform_folder, str(litellm_version), str(arch), str(index_url or ""))


def gateway_pip_download(pip, dest: str, requirements: list, *, arch: str, python: str, glibc: str) -> list:
    try:
        pip = [pip] if isinstance(pip, str) else list(pip)
        return gateway.pip_download_argv(
            pip, str(dest), [str(r) for r in requirements], arch=str(arch), python=str(python), glibc=str(glibc)
        )
    except gateway.WheelhouseError as err:
        raise AnsibleFilterError(str(err)) from None


def gateway_wheelhouse_download(interpreter: str, dest: str, requirements: list, *, arch: str, python: str, glibc: str):
    """The command that fills the wheelhouse for the node: plugin_utils/gateway.py run by `interpreter` (the
    controller's Python), pip download plus what the node's exact markers add (download_wheelhouse). The path
    comes from the module itself, never from the playbooks' folder (an installed collection's are elsewhere)."""
    try:
        gateway.wheelhouse_name(str(arch), str(python))
        gateway.wheel_platforms(str(arch), str(glibc))
    except gateway.WheelhouseError as err:
        raise AnsibleFilterError(str(err)) from None
    glibc_version = str(glibc).split()[-1]
    script = [str(interpreter), gateway.__file__, str(dest), str(arch), str(python), glibc_version]
    pip = [str(interpreter), "-m", "pip", "--disable-pip-version-check"]
    return [*script, *pip, "--", *[str(r) for r in requirements]]


def gateway_usage_lines(keys: list) -> list:
    try:
        return gateway.usage_lines(list(keys or []))
    except (TypeError, ValueError) as err:
        raise AnsibleFilterError(f"gateway_usage_lines: {err}") from None


def gateway_key_limits(
    name, key_class=None, max_parallel_requests=None, tpm_limit=None, *, sweep_dir: str, sweep_name: str, source: str
) -> dict:
    """The key's class and limits from its overrides and the newest capacity sweep of `sweep_name` in
    `sweep_dir` with `source` (key_limits.latest_sweep): {limits, basis, sweep: {path, users_at_slo}}."""
    sweep = key_limits.latest_sweep(str(sweep_dir), str(sweep_name), str(source))
    try:
        out = key_limits.key_limits(str(name), key_class, max_parallel_requests, tpm_limit, sweep["users_at_slo"])
    except key_limits.KeyLimitsError as err:
        raise AnsibleFilterError(f"{err}. Nothing was changed.") from None
    return {**out, "sweep": sweep}


class FilterModule:
    def filters(self):
        return {
            "gateway_litellm_config": gateway_litellm_config,
            "gateway_wheelhouse_name": gateway_wheelhouse_name,
            "gateway_install_source": gateway_install_source,
            "gateway_pip_download": gateway_pip_download,
            "gateway_wheelhouse_download": gateway_wheelhouse_download,
            "gateway_usage_lines": gateway_usage_lines,
            "gateway_key_limits": gateway_key_limits,
        }
