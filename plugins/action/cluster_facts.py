"""Action plugin: the cluster model for this play, computed on the controller, contacting no host.

Reads the groups, every cluster node's fast links and management address, and the cluster-wide
settings; calls the pure build_cluster(); sets `sparkops_cluster` (the whole model) and
`sparkops_node` (this host's entry) for the play. On a broken inventory it fails with every
problem at once. The documentation lives in plugins/modules/cluster_facts.py.
"""

from __future__ import annotations

import os

from ansible.errors import AnsibleError, AnsibleUndefinedVariable
from ansible.plugins.action import ActionBase
from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import ClusterError, build_cluster
from ansible_collections.sparkops.cluster.plugins.plugin_utils.lockfile import LockError, parse_lock
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving import (
    IMAGE_VARIABLES,
    INPUT_VARIABLES,
    build_serving,
    node_part,
)

# Variables the model reads (host-independent settings, normally in group_vars/all).
SETTINGS = (
    "sparkops_topology",
    "sparkops_hardware",
    "sparkops_cluster_name",
    "sparkops_fast_mtu",
    "sparkops_mgmt_interface",
    "sparkops_nvidia_driver_branch",
    "nvidia_driver_version",
    "spark_vllm_image_name",
    "spark_vllm_image_repo",
    "spark_vllm_image_ref",
    "sparkops_image_build_host",
    "sparkops_weights_source_host",
    "ray_cluster_gcs_port",
    "vllm_serve_port",
    "vllm_serve_host",
    "sparkops_credentials_dir",
    "sparkops_reports_dir",
    "sparkops_lock_file",
    "sparkops_plan_file",
    "inventory_dir",
    # Written into the containers' env file by roce_network: checked for one variable per line.
    "roce_network_env_extra",
    "roce_network_nccl_debug",
    "roce_network_nccl_debug_subsys",
)
HOST_VARS = ("sparkops_fast_links", "ansible_host")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset()

    def _value(self, source, name):
        """A variable, templated; None when it is not defined (the model applies its defaults)."""
        try:
            if name not in source:
                return None
            return self._templar.template(source[name])
        except AnsibleUndefinedVariable:
            return None

    def _serving_inputs(self, task_vars: dict, model: dict) -> dict:
        """The plan's inputs: settings, the image pins, the lock file's content (read here, on the
        controller) and whether a Hugging Face token is set (never the token itself)."""
        inputs = {key: self._value(task_vars, name) for key, name in INPUT_VARIABLES.items()}
        inputs["image"] = {key: self._value(task_vars, name) for key, name in IMAGE_VARIABLES.items()}
        inputs["upgrade"] = str(inputs["upgrade"]).lower() in ("true", "yes", "1")
        token = self._value(task_vars, "sparkops_hf_token")
        inputs["hf_token_set"] = bool(token) or bool(os.environ.get("HF_TOKEN"))
        path = model["paths"]["lock_file"]
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except FileNotFoundError:
            text = None
        except OSError as err:
            raise ClusterError([f"cannot read the lock file {path}: {err.strerror}; fix its permissions"]) from None
        try:
            inputs["lock"] = parse_lock(text)
        except LockError as err:
            raise ClusterError([f"{path}: {err}"]) from None
        return inputs

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        groups = task_vars.get("groups", {})
        hostvars = task_vars.get("hostvars", {})
        members = list(groups.get("spark_cluster", []))
        inputs = {
            "groups": {g: list(groups.get(g, [])) for g in ("spark_cluster", "spark_head", "spark_workers")},
            "hostvars": {},
            "settings": {name: self._value(task_vars, name) for name in SETTINGS},
        }
        for host in dict.fromkeys(members + list(groups.get("spark_head", []))):
            if host not in hostvars:
                continue
            hv = hostvars[host]
            inputs["hostvars"][host] = {name: self._value(hv, name) for name in HOST_VARS}
        try:
            model = build_cluster(inputs)
            model["serving"] = build_serving(model, self._serving_inputs(task_vars, model))
        except ClusterError as err:
            result.update(failed=True, msg=str(err), problems=err.problems)
            return result
        except (TypeError, ValueError, KeyError) as err:  # a bug, not the user's inventory
            raise AnsibleError(f"cluster_facts: could not build the cluster model: {err}") from err
        me = task_vars.get("inventory_hostname")
        result["changed"] = False
        result["ansible_facts"] = {
            "sparkops_cluster": model,
            "sparkops_node": {**model["nodes"].get(me, {}), "serving": node_part(model["serving"], me)},
            # The profile as served: normalized, with the locked model commit for a moving revision.
            "sparkops_profile": model["serving"]["deployments"][0]["profile_as_given"],
        }
        image = model["serving"]["deployments"][0]["image"]
        if image["resolved"]:
            # The exact tag, known without a clone: a stage run alone serves what site.yml would.
            result["ansible_facts"]["sparkops_image"] = image["image"]
        # Never written to the fact cache: every play computes the model afresh.
        result["_ansible_facts_cacheable"] = False
        return result
