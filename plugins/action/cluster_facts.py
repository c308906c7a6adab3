"""Action plugin: the cluster model for this play, computed on the controller, contacting no host.

Reads the groups, every cluster node's fast links and management address, and the cluster-wide
settings; calls the pure build_cluster(); sets `sparkops_cluster` (the whole model) and
`sparkops_node` (this host's entry) for the play. On a broken inventory it fails with every
problem at once. The documentation lives in plugins/modules/cluster_facts.py.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from ansible.errors import AnsibleError, AnsibleUndefinedVariable
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import ClusterError, build_cluster
from ansible_collections.sparkops.cluster.plugins.plugin_utils.controller_state import (
    legacy_moves,
    make_private_dirs,
    move,
)
from ansible_collections.sparkops.cluster.plugins.plugin_utils.lockfile import LockError, parse_lock
from ansible_collections.sparkops.cluster.plugins.plugin_utils.plan_checks import (
    clients,
    declared_variables,
    idle_warnings,
    inventory_names,
    role_prefixes,
    settings_spec,
    unknown_variables,
    wheelhouse_warnings,
)
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
    "sparkops_controller_state_dir",
    "sparkops_credentials_dir",
    "sparkops_reports_dir",
    "sparkops_lock_file",
    "sparkops_plan_file",
    "inventory_dir",
    "sparkops_client_networks",
    # Written into the containers' env file by roce_network: checked for one variable per line.
    "roce_network_env_extra",
    "roce_network_nccl_debug",
    "roce_network_nccl_debug_subsys",
)
HOST_VARS = ("sparkops_fast_links", "ansible_host")
# The collection's root (roles/ holds the declared variables).
COLLECTION = str(Path(__file__).resolve().parents[2])
# Inventory variables no role declares that the plan itself reads (its documented inputs).
PLAN_INPUTS = frozenset(
    {*SETTINGS, *HOST_VARS, *INPUT_VARIABLES.values(), *IMAGE_VARIABLES.values(), "sparkops_hf_token"}
)
VARS_FILES = (".yml", ".yaml", ".json", "")


def warm_caches() -> None:
    """Read the roles' declared variables and the settings' spec into their caches. The preload_plugins callback
    calls this in ansible-playbook's main process: every task's worker is a fork of it and finds them read,
    instead of reading every role's files again in every play (about 0.2 s each time on 2 cores)."""
    declared_variables(COLLECTION)
    settings_spec(COLLECTION, HOST_VARS)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("fail_on_problems", "require_image", "make_state_dirs"))
    # This task's variables and what _value templated of them (set by run).
    _task_vars_seen: dict | None = None
    _templated: dict | None = None

    def _value(self, source, name):
        """A variable, templated; None when it is not defined (the model applies its defaults). This host's
        variables are templated once per task: the checks and the plan read some of them several times, and a
        profile table is large."""
        memo = source is self._task_vars_seen
        if memo and name in self._templated:
            return self._templated[name]
        try:
            value = self._templar.template(source[name]) if name in source else None
        except AnsibleUndefinedVariable:
            value = None
        if memo:
            self._templated[name] = value
        return value

    def _serving_inputs(self, task_vars: dict, model: dict, pending: dict | None = None) -> dict:
        """The plan's inputs: settings, the image pins, the lock file's content (read here, on the
        controller) and whether a Hugging Face token is set (never the token itself)."""
        inputs = {key: self._value(task_vars, name) for key, name in INPUT_VARIABLES.items()}
        inputs["image"] = {key: self._value(task_vars, name) for key, name in IMAGE_VARIABLES.items()}
        inputs["upgrade"] = str(inputs["upgrade"]).lower() in ("true", "yes", "1")
        token = self._value(task_vars, "sparkops_hf_token")
        inputs["hf_token_set"] = bool(token) or bool(os.environ.get("HF_TOKEN"))
        path = model["paths"]["lock_file"]
        # In check mode an older layout's lock is read where it still is (nothing was moved).
        path = next((old for old, new in (pending or {}).items() if new == path), path)
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
        self._task_vars_seen, self._templated = task_vars, {}
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
        task_args = self._task.args or {}
        flags = {}
        for name, default in (("fail_on_problems", True), ("require_image", False), ("make_state_dirs", False)):
            value = task_args.get(name, default)
            try:
                flags[name] = boolean(value, strict=True)
            except TypeError:
                # The role passes its option cluster_facts_require_image here as given: checked by the action, not by
                # an argument spec entry point `main`, which would cost every play a task of its own.
                result.update(
                    failed=True,
                    msg=f"cluster_facts: {name} is {value!r}, not a boolean; give true or false"
                    + (" (cluster_facts_require_image)" if name == "require_image" else ""),
                )
                return result
        fail, require_image, make_dirs = flags["fail_on_problems"], flags["require_image"], flags["make_state_dirs"]
        warnings = []
        try:
            # The settings' types and choices first: a wrong type would only bring follow-ons below.
            spec_problems = self._settings_problems(task_vars)
            if spec_problems:
                raise ClusterError(spec_problems)
            model = build_cluster(inputs)
            # The controller's state out of the inventory folder (an older release's layout), before it is read.
            moved, pending = move(legacy_moves(model["paths"]), check_mode=bool(self._task.check_mode))
            warnings += moved
            problems = self._override_problems(task_vars)
            try:
                model["serving"] = build_serving(model, self._serving_inputs(task_vars, model, pending))
            except ClusterError as err:
                raise ClusterError(problems + err.problems) from None
            if problems:
                raise ClusterError(problems)
        except ClusterError as err:
            headline = f"{err.HEADLINE}: {err.count()}"
            result.update(failed=fail, msg=str(err), headline=headline, problems=err.problems, changed=False)
            return result
        except (TypeError, ValueError, KeyError) as err:  # a bug, not the user's inventory
            raise AnsibleError(f"cluster_facts: could not build the cluster model: {err}") from err
        api_key = self._value(task_vars, "sparkops_api_key")
        model["clients"] = clients(
            model, inputs["settings"].get("sparkops_client_networks"), api_key_given=bool(api_key)
        )
        warnings += model["clients"]["warnings"] + idle_warnings(model)
        image = model["serving"]["deployments"][0]["image"]
        if require_image and not image["resolved"] and "sparkops_image" not in task_vars:
            # The stages that run the image without building it need its exact name (an earlier play of this
            # run may have built it and set the fact).
            ref, lock = self._value(task_vars, "spark_vllm_image_ref"), model["paths"]["lock_file"]
            problem = (
                f"spark_vllm_image_ref ({ref}) is a branch or tag, and no lock file records the commit it was built "
                f"from ({lock}): run site.yml (or playbooks/image.yml) first."
            )
            result.update(
                failed=fail,
                msg=problem,
                headline="The serving image is not known yet",
                problems=[problem],
                changed=False,
            )
            return result
        me = task_vars.get("inventory_hostname")
        first_host = me == (task_vars.get("ansible_play_hosts_all") or [me])[0]
        result["changed"] = False
        if make_dirs and first_host and not self._task.check_mode:
            # The controller's state folders (the stages write into them from the control node): only what is
            # missing, by one host, so that a run reports it once.
            made = make_private_dirs(
                [
                    model["paths"]["state_dir"],
                    model["paths"]["reports_dir"],
                    os.path.dirname(model["paths"]["lock_file"]),
                ]
            )
            result["changed"] = bool(made)
            result["state_dirs_made"] = made
        if first_host:
            # The same for every host: read and said by the play's first host only (files, the roles' specs).
            warnings += self._unknown_variables(task_vars)
            warnings += wheelhouse_warnings(
                model,
                self._value(task_vars, "sparkops_gateway_wheelhouse"),
                self._value(task_vars, "sparkops_gateway_litellm_version"),
                index_url=self._value(task_vars, "sparkops_gateway_index_url"),
            )
        result["problems"] = []
        if warnings:
            # The same text from every host: Ansible prints each warning once.
            result["warnings"] = warnings
        result["ansible_facts"] = {
            "sparkops_cluster": model,
            "sparkops_node": {**model["nodes"].get(me, {}), "serving": node_part(model["serving"], me)},
            # The profile as served: normalized, with the locked model commit for a moving revision.
            "sparkops_profile": model["serving"]["deployments"][0]["profile_as_given"],
        }
        if image["resolved"]:
            # The exact tag, known without a clone: a stage run alone serves what site.yml would.
            result["ansible_facts"]["sparkops_image"] = image["image"]
        # Never written to the fact cache: every play computes the model afresh.
        result["_ansible_facts_cacheable"] = False
        return result

    def _settings_problems(self, task_vars: dict) -> list:
        """The cluster-wide settings against roles/sparkops_defaults' spec (entry point `settings`), as Ansible
        checks a role's arguments, each error one problem (without the spec Ansible would print with it)."""
        spec = settings_spec(COLLECTION, HOST_VARS)
        args = {}
        for name in spec:
            if name in task_vars:
                try:
                    value = self._value(task_vars, name)
                except AnsibleError:
                    continue  # a value that does not template is the model's (or its reader's) to report
                if value is not None:
                    args[name] = value
        errors = ArgumentSpecValidator(spec).validate(args, validate_role_argument_spec=True).error_messages
        return [
            f"{error} (ansible-doc -t role sparkops.cluster.sparkops_defaults, entry point settings, lists each "
            "variable with its type)"
            for error in errors
        ]

    def _override_problems(self, task_vars: dict) -> list:
        """sparkops_serving_overrides may change only profiles there are (a new name would be half a profile)."""
        overrides = self._value(task_vars, "sparkops_serving_overrides") or {}
        if not isinstance(overrides, dict):
            return [
                f"sparkops_serving_overrides is a {type(overrides).__name__}; give a mapping PROFILE: {{KEY: VALUE}}"
            ]
        names = sorted(
            set(self._value(task_vars, "sparkops_serving_profiles") or {})
            | set(self._value(task_vars, "sparkops_serving_profiles_extra") or {})
        )
        out = []
        for name, change in overrides.items():
            if str(name) not in names:
                close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
                hint = f"did you mean {close[0]}?" if close else f"the profiles are {', '.join(names)}"
                out.append(
                    f"sparkops_serving_overrides names the profile '{name}', which is none: {hint} (a profile of your "
                    "own goes into sparkops_serving_profiles_extra)"
                )
            elif not isinstance(change, dict):
                out.append(
                    f"sparkops_serving_overrides['{name}'] is a {type(change).__name__}; give a mapping KEY: VALUE"
                )
        return out

    def _unknown_variables(self, task_vars: dict) -> list:
        """Variables the inventory's files set with a sparkops prefix that no role declares (and profile keys
        set as variables), read from the inventory folder's hosts file, group_vars and host_vars."""
        folder = task_vars.get("inventory_dir")
        if not folder or not os.path.isdir(folder):
            return []
        names: dict = {}
        for sub in ("group_vars", "host_vars"):
            for root, _dirs, files in os.walk(os.path.join(folder, sub)):
                for name in sorted(files):
                    path = os.path.join(root, name)
                    if os.path.splitext(name)[1] not in VARS_FILES:
                        continue
                    data = self._load(path)
                    for var in data if isinstance(data, dict) else ():
                        names.setdefault(str(var), os.path.relpath(path, folder))
        source = task_vars.get("inventory_file")
        if source and os.path.splitext(source)[1] in (".yml", ".yaml"):
            for var, where in inventory_names(self._load(source), os.path.basename(source)).items():
                names.setdefault(var, where)
        known = declared_variables(COLLECTION) | PLAN_INPUTS
        profiles = self._value(task_vars, "sparkops_serving_profiles") or {}
        keys = {k for p in profiles.values() if isinstance(p, dict) for k in p}
        return unknown_variables(names, known, role_prefixes(COLLECTION), profile_keys=keys)

    def _load(self, path: str):
        try:
            return self._loader.load_from_file(path)
        except Exception:  # noqa: BLE001 - an unreadable file is Ansible's to report, not this check's
            return None
