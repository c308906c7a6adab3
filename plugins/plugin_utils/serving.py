"""The serving plan: what runs where, computed once on the controller from the cluster model.

``build_serving(cluster, inputs)`` takes the cluster model (``build_cluster``'s result) and plain
data (the profiles, the selected profile's name, the lock file's content, the image pins, the
executor and the node's sizes) and returns the plan as JSON-able dicts, or raises ``ClusterError``
with EVERY problem found, in the messages preflight gave before the plan existed. It does no I/O,
so every entry point (``site.yml``, ``serve.yml`` alone, ``plan.yml``) that hands it the same
inventory and lock gets the same containers, command lines and image tag.

Deployments: without ``sparkops_deployments``, one (``name: main``), the selected profile on every
node, served from the head, exactly as before deployments existed. With it, each deployment is a
profile on its own hosts (a node serves one deployment), cut in the order given into groups of
TP x PP / GPUs-per-node nodes: each group is a replica with its own API on its first host, Ray or
vLLM's executor only where a group spans nodes. Refused, all at once: a node in two deployments,
hosts that do not make whole groups, a profile that does not fit its hosts, one served model name
twice, malformed or repeated names, unknown hosts, and a group whose fast-link traffic to its head
would be forwarded by a node outside it (a ring's routes, followed hop by hop). ``deployments[i]``
keeps the keys consumers read (hosts, members, api_host, endpoint, executor) for its FIRST replica;
``replicas`` and ``all_hosts`` hold every one. One image serves every deployment. The lock records
each deployment's profile, revision and resolved commit under ``models.<name>`` (``model`` is the
first deployment's; a lock holding ``model`` alone is read as that deployment's record), and each
deployment is held to its own. ``records`` is each deployment's record (profile, model commit, image)
with the one deployment_state recorded before it; with ``rollback`` the plan is those records.

A multi-node group's executor (``sparkops_executor``, or the deployment's ``executor``):

* ``ray`` (the default): a Ray container on every node of the group (every node of the cluster for
  the default deployment), ``vllm serve`` on the head attached to the head's raylet, with
  ``--distributed-executor-backend ray`` when TP x PP spans nodes; each member's ``ray.argv`` is its
  ``ray start`` command line (the ``ray_cluster_*`` variables), joining its own group's head
  (``ray.address``). Each group is a Ray cluster of its own: ``ray_groups`` lists them (head, hosts,
  GCS address, expected nodes, GPUs and node IPs) for what waits on Ray and reads its membership;
* ``single`` (``mp`` with a profile that fits one node): one ``vllm serve`` on the head, no Ray;
* ``mp``: vLLM's own multi-node executor: every member runs ``vllm serve --nnodes N --node-rank R
  --master-addr <head fast-link address> --master-port P``; ranks above 0 with ``--headless``
  (vllm/entrypoints/cli/serve.py of 0.19.0 runs them without the API server). vLLM 0.19.0 refuses
  the Ray backend with ``--nnodes > 1`` (vllm/config/parallel.py, ParallelConfig's checks), so the
  plan names one backend per deployment.

Consumers read a member's ``vllm``/``ray`` parts and never ask which executor it is, except the
role that starts Ray. The lock is an input: a moving model revision is replaced by the commit the
lock resolved, and the image's tag is exact (no clone) when the ref is a commit or the lock holds
the commit it resolved. Only an upgrade (``upgrade: true``) plans against values the lock does not
hold; any other run whose inventory differs from the lock is refused here, at every entry point.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re

from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import WILDCARDS, ClusterError, bind_problem
from ansible_collections.sparkops.cluster.plugins.plugin_utils.day2_checks import memory_plan_problems
from ansible_collections.sparkops.cluster.plugins.plugin_utils.gateway import replica_id as gateway_replica_id
from ansible_collections.sparkops.cluster.plugins.plugin_utils.lockfile import conflicts as lock_conflicts
from ansible_collections.sparkops.cluster.plugins.plugin_utils.lockfile import effective_revision
from ansible_collections.sparkops.cluster.plugins.plugin_utils.lockfile import model_conflicts as lock_model_conflicts
from ansible_collections.sparkops.cluster.plugins.plugin_utils.lockfile import model_deployment as lock_model_deployment
from ansible_collections.sparkops.cluster.plugins.plugin_utils.records import (
    plan_records,
    recorded_deployments,
    rollback_image,
    rollback_problems,
)
from ansible_collections.sparkops.cluster.plugins.plugin_utils.registry_image import pull_plan
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving_profile import (
    allowed_rule_warnings,
    normalize_profile,
    profile_violations,
    vllm_serve_args,
)
from ansible_collections.sparkops.cluster.plugins.plugin_utils.stacks import served_by_hint, stack_plan
from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import shared_contract

EXECUTORS = ("ray", "mp")
DEPLOYMENT = "main"
# A deployment of sparkops_deployments: its keys, and its name (a DNS label: it names reports and metrics).
DEPLOYMENT_KEYS = ("name", "profile", "hosts", "executor")
_DEPLOYMENT_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# vLLM 0.19.0's default --master-port (vllm/config/parallel.py: ParallelConfig.master_port = 29501).
MP_MASTER_PORT = 29501
# Under vLLM's own executor NCCL's INFO lines go to each rank's stdout; NCCL writes them to the file
# NCCL_DEBUG_FILE names instead (NCCL's environment variables, since 2.2.12: %h the host, %p the pid),
# here in the host's private Ray folder mounted at /tmp/ray, where the fast-path proof reads them.
MP_NCCL_LOG_DIR = "/tmp/ray/nccl-mp"  # noqa: S108 - inside the container: the host's 0700 private folder
# The API key middleware (roles/vllm_serve/files/sparkops_vllm_auth.py): mounted read-only into the API
# member's container and imported through PYTHONPATH (eugr's image sets none); it reads the key from
# the file SPARKOPS_API_KEY_FILE names, so the key is in neither argv nor env.
AUTH_MOUNT = "/opt/sparkops-auth"
AUTH_MODULE = "sparkops_vllm_auth"
AUTH_ENV = {"PYTHONPATH": AUTH_MOUNT, "SPARKOPS_API_KEY_FILE": f"{AUTH_MOUNT}/api_key"}
CONTAINER_HF_HOME = "/root/.cache/huggingface"
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_DIGEST_RE = re.compile(r"^[^@\s]+@sha256:([0-9a-f]{64})$")
# spark_vllm_image_ref, checked before any clone: a branch, tag or commit within git's refname rules
# (git-check-ref-format(1): no "..", "//", "@{", no component that starts with "." or ends with ".lock",
# nothing that ends with "/" or ".") in a narrower set of characters than git's, and no leading "-" (an
# option to git).
_GIT_REF_RE = re.compile(r"^(?!-)(?!.*\.\.)(?!.*//)(?!.*(?:^|/)\.)(?!.*\.lock(?:/|\Z))[A-Za-z0-9._+/-]+(?<![/.])\Z")
# The inventory variable behind each input (the cluster_facts action reads them; messages name them).
INPUT_VARIABLES = {
    "profile_name": "sparkops_serving_profile",
    "deployments": "sparkops_deployments",
    "profiles": "sparkops_all_serving_profiles",
    "gpus_per_node": "sparkops_gpus_per_node",
    "node_memory_gib": "sparkops_node_memory_gib",
    "memory_overhead_gib": "sparkops_memory_host_overhead_gib",
    "memory_floor_gib": "sparkops_memory_floor_gib",
    "allow_rules": "sparkops_allow_rules",
    "vllm_version": "sparkops_vllm_version",
    # The named stack (image, vLLM, contract) and every stack (roles/sparkops_defaults/defaults/main/stacks.yml).
    "stack_name": "sparkops_stack",
    "stacks": "sparkops_stacks",
    "executor": "sparkops_executor",
    "mp_master_port": "sparkops_mp_master_port",
    "hf_home": "sparkops_hf_home",
    "container_names": "sparkops_container_names",
    "container_cache_env": "sparkops_container_cache_env",
    "weights_source": "weight_cache_source",
    "upgrade": "deployment_state_lock_upgrade",
    # An upgrade of one deployment (playbooks/upgrade.yml -e sparkops_deployment=NAME): only it may move.
    "upgrade_deployment": "sparkops_deployment",
    # What is deployed: the record file on the head, as roles/deployment_state reads it (plan.records).
    "records": "deployment_state",
    # Only an upgrade's rollback (playbooks/tasks/upgrade-swap.yml): plan each deployment's recorded profile
    # on the recorded image (plugins/plugin_utils/records.py).
    "rollback": "deployment_state_rollback",
    # The client gateway on the head (roles/gateway, docs/gateway.md).
    "gateway_enabled": "sparkops_gateway_enabled",
    "gateway_port": "sparkops_gateway_port",
    "gateway_bind": "sparkops_gateway_bind",
}
# The gateway's port when the inventory gives none (roles/sparkops_defaults holds the same value).
GATEWAY_PORT = 4000
# Ray's `ray start` options (roles/sparkops_defaults/defaults/main/ray.yml holds their defaults; the
# firewall of roles/ray_cluster reads the same variables). Each: input name -> (variable, fallback).
# The fallbacks are the shipped defaults, for callers that give none (the unit tests check they agree).
RAY_OPTIONS = {
    "ray_gpus_per_node": ("ray_cluster_gpus_per_node", None),  # None: sparkops_gpus_per_node
    "ray_dashboard": ("ray_cluster_dashboard", True),
    "ray_dashboard_port": ("ray_cluster_dashboard_port", 8265),
    "ray_client": ("ray_cluster_client", False),
    "ray_client_port": ("ray_cluster_client_port", 10001),
    "ray_node_manager_port": ("ray_cluster_node_manager_port", 6381),
    "ray_object_manager_port": ("ray_cluster_object_manager_port", 6382),
    "ray_metrics_export_port": ("ray_cluster_metrics_export_port", 6383),
    "ray_dashboard_agent_grpc_port": ("ray_cluster_dashboard_agent_grpc_port", 6384),
    "ray_dashboard_agent_listen_port": ("ray_cluster_dashboard_agent_listen_port", 52365),
    "ray_runtime_env_agent_port": ("ray_cluster_runtime_env_agent_port", 6385),
    "ray_min_worker_port": ("ray_cluster_min_worker_port", 20000),
    "ray_max_worker_port": ("ray_cluster_max_worker_port", 20999),
    "ray_object_store_bytes": ("ray_cluster_object_store_bytes", "1073741824"),
}
INPUT_VARIABLES.update({key: variable for key, (variable, _default) in RAY_OPTIONS.items()})
# The `ray start` flag of each port option, in the order the command line gives them.
_RAY_PORT_FLAGS = (
    ("ray_node_manager_port", "--node-manager-port"),
    ("ray_object_manager_port", "--object-manager-port"),
    ("ray_metrics_export_port", "--metrics-export-port"),
    ("ray_dashboard_agent_grpc_port", "--dashboard-agent-grpc-port"),
    ("ray_dashboard_agent_listen_port", "--dashboard-agent-listen-port"),
    ("ray_runtime_env_agent_port", "--runtime-env-agent-port"),
    ("ray_min_worker_port", "--min-worker-port"),
    ("ray_max_worker_port", "--max-worker-port"),
)
IMAGE_VARIABLES = {
    "source": "spark_vllm_image_source",
    "name": "spark_vllm_image_name",
    "repo": "spark_vllm_image_repo",
    "ref": "spark_vllm_image_ref",
    "build_args": "spark_vllm_image_build_args",
    "registry_ref": "spark_vllm_image_registry_ref",
    "registry_image": "spark_vllm_image_registry_image",
}
_DEFAULT_CONTAINERS = {"ray": "sparkops-ray", "vllm": "sparkops-vllm", "watchdog": "sparkops-watchdog"}


def _get(inputs: dict, name: str, default):
    value = inputs.get(name)
    return default if value is None else value


def _int(inputs: dict, name: str, default: int, problems: list) -> int:
    value = _get(inputs, name, default)
    if isinstance(value, bool):
        problems.append(f"{INPUT_VARIABLES[name]} must be an integer, got {value!r}")
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        problems.append(f"{INPUT_VARIABLES[name]} must be an integer, got {value!r}")
        return default


def _float(inputs: dict, name: str, default: float, problems: list) -> float:
    value = _get(inputs, name, default)
    try:
        return float(value)
    except (TypeError, ValueError):
        problems.append(f"{INPUT_VARIABLES[name]} must be a number, got {value!r}")
        return default


def _bool(inputs: dict, name: str, default: bool, problems: list) -> bool:
    value = _get(inputs, name, default)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    problems.append(f"{INPUT_VARIABLES[name]} must be true or false, got {value!r}")
    return default


def ray_options(inputs: dict, gpus_per_node: int, problems: list) -> dict:
    """The `ray start` options from the inventory, checked: ports within 1-65535, the worker range in
    order, the object store empty (Ray's default) or a whole number of bytes."""
    opts = {}
    for key, (variable, default) in RAY_OPTIONS.items():
        if key in ("ray_dashboard", "ray_client"):
            opts[key] = _bool(inputs, key, default, problems)
        elif key == "ray_object_store_bytes":
            value = str(_get(inputs, key, default)).strip()
            if value and not value.isdigit():
                problems.append(f"{variable} must be a number of bytes or empty (Ray's default), got {value!r}")
                value = default
            opts[key] = value
        elif key == "ray_gpus_per_node":
            opts[key] = _int(inputs, key, gpus_per_node, problems)
        else:
            opts[key] = _int(inputs, key, default, problems)
            if not 1 <= opts[key] <= 65535:
                problems.append(f"{variable} must be within 1-65535, got {opts[key]}")
    if opts["ray_min_worker_port"] > opts["ray_max_worker_port"]:
        problems.append(
            f"ray_cluster_min_worker_port ({opts['ray_min_worker_port']}) is above ray_cluster_max_worker_port "
            f"({opts['ray_max_worker_port']}): set the lower one first"
        )
    return opts


def ray_start_argv(opts: dict, ip: str, head_address: str, *, head: bool) -> list:
    """A node's `ray start` command line: bound to its fast-link address, every port fixed (the firewall
    names each one); the head starts the GCS (and the dashboard, the client server when asked), a worker
    joins the head's GCS at `head_address` (ip:port)."""
    argv = ["ray", "start", "--block", "--disable-usage-stats", "--node-ip-address", ip]
    argv += ["--num-gpus", str(opts["ray_gpus_per_node"])]
    for key, flag in _RAY_PORT_FLAGS:
        argv += [flag, str(opts[key])]
    if opts["ray_object_store_bytes"]:
        argv += ["--object-store-memory", opts["ray_object_store_bytes"]]
    if not head:
        return [*argv, "--address", head_address]
    argv += ["--head", "--port", head_address.rsplit(":", 1)[1]]
    if opts["ray_client"]:
        argv += ["--ray-client-server-port", str(opts["ray_client_port"])]
    if opts["ray_dashboard"]:
        argv += ["--include-dashboard=true", "--dashboard-host", ip]
        argv += ["--dashboard-port", str(opts["ray_dashboard_port"])]
    else:
        argv.append("--include-dashboard=false")
    return argv


def args_hash(build_args) -> str:
    """The first 8 hex digits of sha256 over the build arguments as JSON, as Ansible's
    `to_json | hash('sha256')` gives them (json.dumps with its default separators)."""
    return hashlib.sha256(json.dumps(list(build_args)).encode()).hexdigest()[:8]


def plan_image(image: dict, lock: dict, upgrade: bool) -> dict:
    """The image every member runs: its exact tag when the commit (or digest) is known without I/O.

    A built image (`eugr`) is `<name>:<commit[:12]>-<args hash>`: the commit is the ref when the ref is
    one, else the commit the lock resolved (not during an upgrade, which resolves the ref anew). A
    pulled image (`registry`) is `<name>:registry-<digest[:12]>`. `resolved: false` means a branch or
    tag the image role must still resolve by a clone; the tag is then unknown here.
    """
    source = str(image.get("source") or "eugr")
    name = str(image.get("name") or "vllm-node")
    locked = {} if upgrade else (lock.get("image") or {})
    out = {"source": source, "name": name, "commit": "", "args_hash": "", "tag": "", "image": "", "resolved": False}
    if source == "registry":
        # The lock's digest, or the one given; a tag the lock holds no digest for is resolved by its first
        # pull (the image role; registry_image.pull_plan decides for both).
        ref = pull_plan(image, lock.get("image") or {}, upgrade)["ref"]
        match = _DIGEST_RE.match(ref)
        out["registry_ref"] = ref
        if match:
            out.update(tag=f"registry-{match.group(1)[:12]}", resolved=True)
    else:
        ref = str(image.get("ref") or "")
        commit = str(locked.get("commit") or "") or (ref if _COMMIT_RE.match(ref) else "")
        build_args = image.get("build_args") or []
        out["ref"] = ref
        out["args_hash"] = args_hash(build_args)
        if _COMMIT_RE.match(commit):
            out.update(commit=commit, tag=f"{commit[:12]}-{out['args_hash']}", resolved=True)
    if out["resolved"]:
        out["image"] = f"{name}:{out['tag']}"
    # The image's ID as the lock recorded it for this very name (the deployment record keeps it).
    out["id"] = str(locked.get("id") or "") if out["resolved"] and locked.get("tag") == out["image"] else ""
    return out


def lock_wanted(image: dict, profile_name: str, profile: dict | None, stack: str | None = None) -> dict:
    """What the inventory asks for, in the lock's shape (deployment_state compares the two). `stack`: the
    stack's name (sparkops_stack), recorded with the image it names."""
    source = str(image.get("source") or "eugr")
    eugr = source == "eugr"
    given = "" if eugr else str(image.get("registry_ref") or "")
    wanted = {
        **({"stack": str(stack)} if stack else {}),
        "image": {
            "source": source,
            "repo": str(image.get("repo") or "") if eugr else "",
            "ref": str(image.get("ref") or "") if eugr else "",
            "build_args": list(image.get("build_args") or []) if eugr else [],
            "registry_ref": given,
        },
        "model": {
            "profile": profile_name,
            "id": (profile or {}).get("model"),
            "revision": (profile or {}).get("revision"),
        },
    }
    if not eugr:
        # A stack's image by tag: the lock holds the digest its first pull resolved (registry_image.py).
        wanted["image"]["registry_image"] = "" if given else str(image.get("registry_image") or "")
    return wanted


def _contract_problems(inputs: dict, profiles: dict, sizes: dict) -> tuple:
    """Every profile (served or not) against the selected stack's contract (plugin_utils/stacks.py): the
    contract, the problems (a bad stack; a profile no stack's vLLM accepts) and the stack's summary with
    the profiles it serves and those only another stack serves."""
    found = stack_plan(inputs, profiles, sizes["gpus_per_node"])
    stack = found["stack"]
    if stack is None:
        return None, found["problems"], None
    return shared_contract(stack["contract"]), found["problems"], stack


def _profile_problems(inputs: dict, profiles: dict, name, gpus_total: int, sizes: dict, **ctx) -> tuple:
    """Preflight's checks of one served profile, with its messages: the name, the rules, the gated
    model's token and the memory plan. `ctx`: the contract and, for a deployment of
    sparkops_deployments, `where` (what names the profile in the messages). Returns the raw profile
    and its normalized form (both None when it cannot be served) and the problems."""
    problems = []
    where = ctx.get("where") or "sparkops_serving_profile"
    known = isinstance(name, str) and name in profiles
    if not known:
        problems.append(
            f"{where} '{name}' is not a known profile. Known: {', '.join(sorted(profiles))}. "
            "Add your own under sparkops_serving_profiles_extra (same keys as the shipped ones)."
        )
        return None, None, problems
    profile = profiles[name]
    allow_rules = inputs.get("allow_rules") or []
    rules = profile_violations(
        profile,
        gpus_total,
        node_memory_gib=sizes["node_memory_gib"],
        gpus_per_node=sizes["gpus_per_node"],
        contract=ctx["contract"],
        allow_rules=allow_rules,
    )
    label = f"Serving profile '{name}'" + (f" ({where}{ctx.get('on', '')})" if ctx.get("where") else "")
    if rules:
        problems.append(f"{label} is refused: {' | '.join(rules)}" + served_by_hint(ctx.get("stack"), name))
        return None, None, problems
    p = normalize_profile(profile)
    if p["gated"] and str(_get(inputs, "weights_source", "hub")) == "hub" and not inputs.get("hf_token_set"):
        problems.append(
            f"{p['model']} is a gated model and no Hugging Face token is set. Put it in a vaulted variable "
            "sparkops_hf_token (ansible-vault encrypt_string) or export HF_TOKEN on the control node."
        )
    memory = memory_plan_problems(p, sizes["node_memory_gib"], sizes["overhead_gib"], sizes["floor_gib"])
    if memory:
        problems.append(f"{label} is refused: {' | '.join(memory)}")
    return profile, p, problems


def _vllm_env(base: dict, cache_env: dict, profile_env: dict, ip: str, *, ray: bool, api: bool, mp: bool) -> dict:
    env = {}
    if ray:
        # vLLM is a Ray driver attached to this node's raylet. RAY_DEDUP_LOGS=0: Ray 2.52.1's driver holds
        # back a worker's line that repeats another's (ray/_private/ray_constants.py RAY_DEDUP_LOGS), so a
        # second rank's start-up lines would reach the log late or folded, and the phases be wrong.
        env.update(RAY_ADDRESS="auto", RAY_DEDUP_LOGS="0")
    env.update(base)
    env.update(cache_env)
    env.update(profile_env)
    # The address vLLM announces and binds its message queue on: the fast link, never the default route's.
    env["VLLM_HOST_IP"] = ip
    if mp:
        env["NCCL_DEBUG_FILE"] = f"{MP_NCCL_LOG_DIR}/nccl.%h.%p.log"
    if api:
        env.update(AUTH_ENV)
    return env


def _deployment_specs(inputs: dict, cluster: dict, executor: str, problems: list) -> list:
    """sparkops_deployments, checked, as [{name, profile_name, hosts, executor, given, label}]; without
    it the one deployment of today: `main`, sparkops_serving_profile on every node, sparkops_executor."""
    hosts = list(cluster["hosts"])
    default_profile = inputs.get("profile_name")
    given = inputs.get("deployments")
    if given in (None, "", []):
        return [
            {"name": DEPLOYMENT, "profile_name": default_profile, "hosts": hosts, "executor": executor, "given": False}
        ]
    if not isinstance(given, list):
        problems.append(
            f"sparkops_deployments must be a list of deployments ({{name, profile, hosts, executor}}), got "
            f"{type(given).__name__}; leave it empty for one deployment of sparkops_serving_profile on every node"
        )
        return []
    specs, names, owner, shared = [], {}, {}, {}
    for i, entry in enumerate(given):
        label = f"sparkops_deployments[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{label} must be a mapping with name, profile and hosts, got {entry!r}")
            continue
        unknown = sorted(set(map(str, entry)) - set(DEPLOYMENT_KEYS))
        if unknown:
            problems.append(
                f"{label} has unknown key(s) {', '.join(unknown)}: a deployment takes {', '.join(DEPLOYMENT_KEYS)}"
            )
        name = entry.get("name")
        if not isinstance(name, str) or not _DEPLOYMENT_NAME_RE.match(name):
            problems.append(
                f"{label}: the name {name!r} is malformed: give each deployment a name of lower-case letters, "
                "digits and '-', at most 63, starting and ending with a letter or digit (e.g. chat)"
            )
        elif name in names:
            problems.append(
                f"sparkops_deployments: the name '{name}' is given twice ({names[name]} and {label}): "
                "give each deployment its own name"
            )
        else:
            names[name] = label
            label = f"sparkops_deployments '{name}'"
        dep_hosts = hosts if entry.get("hosts") is None else entry["hosts"]
        if not isinstance(dep_hosts, list) or not dep_hosts or not all(isinstance(h, str) for h in dep_hosts):
            problems.append(
                f"{label}: hosts must be a list of host names of group 'spark_cluster' ({', '.join(hosts)}), got "
                f"{dep_hosts!r}; leave it out for every node"
            )
            dep_hosts = []
        strangers = [h for h in dep_hosts if h not in hosts]
        if strangers:
            problems.append(
                f"{label}: {', '.join(strangers)} is not a host of group 'spark_cluster' ({', '.join(hosts)}): "
                "name hosts of the inventory"
            )
        twice = sorted({h for h in dep_hosts if dep_hosts.count(h) > 1})
        if twice:
            problems.append(f"{label}: {', '.join(twice)} is listed twice in its hosts: name each host once")
        dep_hosts = [h for h in dict.fromkeys(dep_hosts) if h in hosts]
        for h in dep_hosts:
            if h in owner:
                shared.setdefault((owner[h], label), []).append(h)
            else:
                owner[h] = label
        dep_executor = entry.get("executor") or executor
        if dep_executor not in EXECUTORS:
            problems.append(f"{label}: executor must be one of {', '.join(EXECUTORS)}, got {dep_executor!r}")
        profile = entry.get("profile") or default_profile
        specs.append(
            {"name": str(name), "profile_name": profile, "hosts": dep_hosts, "executor": str(dep_executor),
             "given": True, "label": label}
        )  # fmt: skip
    for (first, second), both in shared.items():
        problems.append(
            f"{', '.join(both)} {'is' if len(both) == 1 else 'are'} in two deployments ({first} and {second}): a node "
            "serves one deployment; remove it from the hosts of one of them (a deployment without hosts takes "
            "every node)"
        )
    return specs


def _path_outside(cluster: dict, group: list, member: str) -> list:
    """The nodes outside `group` that `member`'s fast-link traffic to the group's head passes through,
    following the model's routes hop by hop (a ring forwards through neighbours; a pair and a switch
    share a segment, no node in between). ['(no route)'] where the model has no path."""
    nodes = cluster["nodes"]
    head = group[0]
    outside = []
    for cidr in [link["cidr"] for link in nodes[head]["links"]]:
        here = member
        for _hop in range(len(nodes)):
            if cidr in {link["cidr"] for link in nodes[here]["links"]}:
                break
            route = next((r for r in nodes[here]["routes"] if r["to"] == cidr), None)
            if route is None:
                outside.append("(no route)")
                break
            here = route["through"]
            if here not in group and here not in outside:
                outside.append(here)
    return outside


def _endpoint_on(cluster: dict, host: str) -> dict:
    """The API endpoint on `host`: the model's (the head's) moved to the same kind of address of `host`
    (a wildcard stays, the head's management address becomes host's, its n-th fast link host's n-th)."""
    ep = dict(cluster["endpoint"])
    if host == cluster["head"]:
        return ep
    head, node = cluster["nodes"][cluster["head"]], cluster["nodes"][host]
    bind = ep["bind"]
    if bind not in WILDCARDS:
        if bind == head.get("mgmt_address"):
            bind = node["mgmt_address"]
        elif bind in head["ips"] and head["ips"].index(bind) < len(node["ips"]):
            bind = node["ips"][head["ips"].index(bind)]
        else:
            bind = node["primary"]["ip"]
    url_host = node["primary"]["ip"] if bind in WILDCARDS else bind
    return {"host": host, "bind": bind, "port": ep["port"], "url": f"http://{url_host}:{ep['port']}"}


def _shape(spec: dict, nnodes: int) -> list:
    """(executor kind, hosts) of each replica of a deployment."""
    hosts = spec["hosts"]
    if not spec["given"]:
        if spec["executor"] == "ray":
            # Today's shape: Ray on every node (the head's GCS, the others join) and vLLM attached to the
            # head's raylet, whatever the group's size; the Ray backend only when TP x PP spans nodes.
            return [("ray", hosts)]
        # The head first: the model orders hosts head, then workers.
        return [("single" if nnodes == 1 else "mp", hosts[:nnodes])]
    # A deployment of sparkops_deployments: one replica per TP x PP group, Ray only where a group spans
    # nodes under the Ray executor (a node of one replica runs vLLM alone).
    kind = "single" if nnodes == 1 else spec["executor"]
    return [(kind, hosts[i : i + nnodes]) for i in range(0, len(hosts), nnodes)]


def _replica_members(cluster: dict, kind: str, group: list, p: dict, *, nnodes: int, ctx: dict) -> tuple:
    """A replica's endpoint and members: the head (group[0]) serves the API."""
    head = group[0]
    head_ip = cluster["nodes"][head]["primary"]["ip"]
    endpoint = _endpoint_on(cluster, head)
    names = ctx["names"]
    # The argv builder judges the hard rules again and adds the Ray backend for a multi-node group.
    api_argv = vllm_serve_args(
        p,
        endpoint["bind"],
        endpoint["port"],
        gpus_per_node=ctx["gpus_per_node"],
        allow_rules=ctx["allow_rules"],
    )
    if kind == "mp":
        api_argv = _without(api_argv, "--distributed-executor-backend") + ["--distributed-executor-backend", "mp"]
    members = []
    for rank, host in enumerate(group):
        ip = cluster["nodes"][host]["primary"]["ip"]
        api = rank == 0
        member = {"host": host, "rank": rank, "role": "api" if api else "worker", "ip": ip, "vllm": None, "ray": None}
        if kind == "ray":
            address = f"{head_ip}:{cluster['ray']['port']}"
            member["ray"] = {
                "container": names["ray"],
                "head": api,
                "address": address,
                # The nodes of this Ray cluster; the head tells its workers when it started.
                "hosts": list(group),
                "workers": list(group[1:]),
                "argv": ray_start_argv(ctx["ray"], ip, address, head=api),
            }
        if api or kind == "mp":
            # A headless rank starts no API server (vllm/entrypoints/cli/serve.py:115-116): no --host/--port.
            argv = list(api_argv) if api else _without(api_argv, "--host", "--port")
            if kind == "mp":
                argv += ["--nnodes", str(nnodes), "--node-rank", str(rank)]
                argv += ["--master-addr", head_ip, "--master-port", str(ctx["master_port"])]
                if not api:
                    argv.append("--headless")
            argv += ["--middleware", f"{AUTH_MODULE}.RequireApiKey"] if api else []
            env = _vllm_env(
                ctx["base_env"], ctx["cache_env"], p["env"], ip, ray=kind == "ray", api=api, mp=kind == "mp"
            )
            member["vllm"] = {"container": names["vllm"], "argv": argv, "env": env, "auth": api}
        members.append(member)
    return endpoint, members


def build_serving(cluster: dict, inputs: dict) -> dict:  # noqa: PLR0912, PLR0914, PLR0915
    """The serving plan for `cluster`; ClusterError with every problem when it cannot be served."""
    problems: list[str] = []
    profiles = inputs.get("profiles") or {}
    if not isinstance(profiles, dict):
        raise ClusterError(
            [f"sparkops_all_serving_profiles must be a mapping of profiles, got {type(profiles).__name__}"]
        )
    name = inputs.get("profile_name")
    sizes = {
        "gpus_per_node": _int(inputs, "gpus_per_node", 1, problems),
        "node_memory_gib": _float(inputs, "node_memory_gib", 128.0, problems),
        "overhead_gib": _float(inputs, "memory_overhead_gib", 6.0, problems),
        "floor_gib": _float(inputs, "memory_floor_gib", 4.0, problems),
    }
    if sizes["gpus_per_node"] < 1:
        problems.append(f"sparkops_gpus_per_node must be at least 1, got {sizes['gpus_per_node']}")
        sizes["gpus_per_node"] = 1
    executor = str(_get(inputs, "executor", "ray"))
    if executor not in EXECUTORS:
        problems.append(f"sparkops_executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    master_port = _int(inputs, "mp_master_port", MP_MASTER_PORT, problems)
    if not 1 <= master_port <= 65535:
        problems.append(f"sparkops_mp_master_port must be within 1-65535, got {master_port}")
    ray_opts = ray_options(inputs, sizes["gpus_per_node"], problems)
    specs = _deployment_specs(inputs, cluster, executor, problems)
    recorded = recorded_deployments(inputs.get("records"), specs[0]["name"] if specs else DEPLOYMENT)
    rollback = _bool(inputs, "rollback", False, problems)
    if rollback:
        # An upgrade's rollback plans each deployment's recorded profile, whatever the inventory says now.
        problems += rollback_problems([s["name"] for s in specs], recorded)
        for spec in specs:
            if spec["name"] in recorded:
                spec["profile_name"] = recorded[spec["name"]]["profile_name"]
                profiles = {**profiles, str(spec["profile_name"]): recorded[spec["name"]]["profile"]}
        if inputs.get("stacks") and specs and specs[0]["name"] in recorded:
            # ... on the recorded stack (its contract, its release), whatever -e sparkops_stack says now.
            inputs = {**inputs, "stack_name": recorded[specs[0]["name"]]["stack"], "vllm_version": None}
    contract, contract_problems, stack = _contract_problems(inputs, profiles, sizes)
    served, by_model = [], {}
    for spec in specs:
        gpus = len(spec["hosts"]) * sizes["gpus_per_node"]
        # A deployment's profile is judged on its own hosts (the messages' "cluster" is those hosts).
        where = f"{spec['label']}: profile" if spec["given"] else None
        if not gpus:  # no host of the cluster (reported): only whether its profile exists is known
            if spec["profile_name"] not in profiles:
                problems += _profile_problems(inputs, profiles, spec["profile_name"], 1, sizes, where=where)[2]
            served.append((spec, None, None, 0))
            continue
        raw, normalized, found = _profile_problems(
            inputs,
            profiles,
            spec["profile_name"],
            gpus,
            sizes,
            contract=contract,
            stack=stack,
            where=where,
            on=f" on {len(spec['hosts'])} host(s)",
        )
        problems += found
        if normalized is None:
            served.append((spec, raw, normalized, 0))
            continue
        world = normalized["tensor_parallel_size"] * normalized["pipeline_parallel_size"]
        nnodes = -(-world // sizes["gpus_per_node"])
        served.append((spec, raw, normalized, nnodes))
        by_model.setdefault(normalized["served_model_name"], []).append(spec.get("label") or spec["name"])
        if not spec["given"]:
            continue
        if len(spec["hosts"]) % nnodes:
            problems.append(
                f"{spec['label']}: its {len(spec['hosts'])} host(s) ({', '.join(spec['hosts'])}) do not divide into "
                f"groups of {nnodes} node(s), the TP x PP = {world} GPUs of profile '{spec['profile_name']}' at "
                f"{sizes['gpus_per_node']} GPU(s) per node: give it a multiple of {nnodes} hosts (each group of "
                f"{nnodes} is one replica)"
            )
            continue
        for index, (_kind, group) in enumerate(_shape(spec, nnodes)):
            for member in group[1:]:
                outside = _path_outside(cluster, group, member)
                if outside:
                    problems.append(
                        f"{spec['label']} replica {index} ({', '.join(group)}): {member} reaches the group's head "
                        f"{group[0]} over the fast links only through {', '.join(outside)}, outside the group, "
                        f"which would forward this group's NCCL traffic ({cluster['topology']}, ring order "
                        f"{', '.join(cluster['ring_order']) or '-'}). List the hosts so that each group of {nnodes} "
                        "are neighbours on the fast links"
                    )
    for model, labels in by_model.items():
        if len(labels) > 1:
            problems.append(
                f"{' and '.join(labels)} serve the same served model name '{model}': a client could not tell them "
                "apart; give one of them another profile (or one with its own served_model_name)"
            )
    problems += contract_problems
    gateway = plan_gateway(cluster, inputs, problems)

    image_in = inputs.get("image") or {}
    ref_in = str(image_in.get("ref") or "")
    if str(image_in.get("source") or "eugr") == "eugr" and ref_in and not _GIT_REF_RE.match(ref_in):
        problems.append(
            f"spark_vllm_image_ref is {ref_in!r}, which is no git commit, branch or tag sparkops takes: give a "
            "commit (40 hex digits) or a branch or tag of letters, digits and . _ + / - (not starting with - or "
            "., without .. or //)"
        )
    lock = inputs.get("lock") or {}
    upgrade = bool(inputs.get("upgrade"))
    first = served[0] if served else ({"profile_name": name}, None, None, 0)
    stack_name = stack["name"] if stack and inputs.get("stacks") else None
    wanted = lock_wanted(image_in, str(first[0]["profile_name"]), first[2], stack_name)
    first_name = str(first[0].get("name") or "main")
    if first_name != "main":
        # Only a deployment other than the default names itself: a default cluster's lock stays byte-identical.
        wanted["model"]["deployment"] = first_name
    if any(spec["given"] for spec in specs):
        # Every deployment's profile and revision by name; `model` stays the first's (today's lock readers).
        wanted["models"] = {
            spec["name"]: lock_wanted(image_in, str(spec["profile_name"]), normalized)["model"]
            for spec, _raw, normalized, _n in served
        }
    conflicts = [] if upgrade else lock_conflicts(lock, wanted) + lock_model_conflicts(lock, wanted)
    only = str(inputs.get("upgrade_deployment") or "") if upgrade else ""
    if only:
        problems += _one_deployment_upgrade_problems(only, [s["name"] for s in specs], lock, wanted)
    if conflicts:
        problems.append(
            f"{cluster['paths']['lock_file']} pins what was deployed, and the inventory now asks for something "
            f"else: {'; '.join(conflicts)}. To move to the new values, run playbooks/upgrade.yml (it checks them, "
            "moves the lock and says what moved); to keep the deployment, restore the inventory."
        )
    if problems:
        raise ClusterError(problems)

    ctx = {
        "names": {**_DEFAULT_CONTAINERS, **(inputs.get("container_names") or {})},
        "cache_env": {str(k): str(v) for k, v in (inputs.get("container_cache_env") or {}).items()},
        "base_env": {
            "HF_HOME": CONTAINER_HF_HOME,
            "HF_HUB_OFFLINE": "1",
            # As eugr/spark-vllm-docker launch-cluster.sh @ 013cd2ea (DOCKER_ARGS): NCCL keeps its threads off
            # the container's CPU mask; expandable segments fragment the shared unified memory less.
            "NCCL_IGNORE_CPU_AFFINITY": "1",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        },
        "gpus_per_node": sizes["gpus_per_node"],
        "allow_rules": inputs.get("allow_rules"),
        "master_port": master_port,
        "ray": ray_opts,
    }
    hf_home = str(_get(inputs, "hf_home", "/var/lib/sparkops/huggingface"))
    # One image for the whole cluster: every deployment runs the same vLLM build (the lock pins one).
    image = plan_image(image_in, lock, upgrade)
    if rollback:
        image = rollback_image(image, recorded[specs[0]["name"]])
    deployments = []
    for spec, raw, normalized, nnodes in served:
        p = dict(normalized)
        own_revision = p["revision"]
        pname = str(spec["profile_name"])
        # Each deployment's model commit is its record in the lock (`models.<name>`; a lock of earlier
        # versions: `model`, the record of the deployment it names, lockfile.model_records).
        p["revision"] = (
            own_revision if upgrade else effective_revision(own_revision, lock, pname, p["model"], spec["name"])
        )
        replicas = []
        for index, (kind, group) in enumerate(_shape(spec, nnodes)):
            endpoint, members = _replica_members(cluster, kind, group, p, nnodes=nnodes, ctx=ctx)
            replicas.append(
                {"index": index, "hosts": list(group), "head": group[0], "executor": kind, "endpoint": endpoint,
                 "members": members}
            )  # fmt: skip
        one = replicas[0]
        deployments.append(
            {
                "name": spec["name"],
                "profile_name": pname,
                "profile": p,
                "own_revision": own_revision,
                # The profile as the inventory gives it, with the revision served: what the roles that record
                # and compare deployments (deployment_state, upgrade) keep as `sparkops_profile`.
                "profile_as_given": {**raw, "revision": p["revision"]},
                # The first replica, as every consumer read the one deployment before replicas existed.
                "hosts": one["hosts"],
                "executor": one["executor"],
                "nnodes": nnodes,
                "members": one["members"],
                "api_host": one["head"],
                "endpoint": one["endpoint"],
                # Every replica (one TP x PP group each) and every node of the deployment.
                "replicas": replicas,
                "all_hosts": [h for r in replicas for h in r["hosts"]],
                "served_model_name": p["served_model_name"],
                "model_cache_dir": posixpath.join(hf_home, "hub", "models--" + p["model"].replace("/", "--")),
                "image": image,
                "weights": dict(cluster["weights"]),
                "allowed_rules": allowed_rule_warnings(pname, raw, inputs.get("allow_rules") or [], contract=contract),
            }
        )
    plan = {"deployments": deployments, "lock": {"wanted": wanted, "upgrade": upgrade}, "rollback": rollback}
    # Each deployment's record (profile, model commit, image) and the one recorded before (records.py).
    plan["records"] = plan_records(deployments, {**image, "stack": stack_name}, recorded)
    # The roles that run vLLM plan every member's container in one task (vllm_serve container.yml).
    plan["vllm_members"] = vllm_members(plan)
    # Every replica's API, for what checks, watches and reports on serving (monitoring, verify, doctor, the
    # health report, status, the benchmark): they read this list, not deployments[0].
    plan["targets"] = serving_targets(plan)
    # Every Ray cluster the plan starts (one per replica under Ray), for what waits on and reads Ray's
    # membership (ray_cluster's wait, verify, doctor, the health report, status): each from its own head.
    plan["ray_groups"] = ray_groups(plan, ray_opts["ray_gpus_per_node"])
    # Whether a replica runs under Ray: where Ray's membership is read (report, verify, doctor).
    plan["ray_used"] = bool(plan["ray_groups"])
    plan["image"] = image  # the cluster's one image (every deployment's)
    plan["stack"] = stack  # the stack it comes from, the profiles it serves (plugin_utils/stacks.py)
    plan["gateway"] = gateway  # checked with the rest, above
    return plan


def _one_deployment_upgrade_problems(name: str, names: list, lock: dict, wanted: dict) -> list:
    """An upgrade of deployment `name` alone moves its lock record only: the image (every deployment's) and
    every other deployment must be as the lock has them, else the run would serve what it says it leaves.
    The only deployment of the cluster may move the image and the stack with it."""
    if name not in names:
        return [
            f"sparkops_deployment={name!r} is no deployment of this cluster; it serves {', '.join(names)}: name one "
            "of them, or leave sparkops_deployment out to upgrade the whole cluster"
        ]
    if names == [name]:
        # The cluster's only deployment: the image (a new stack's, too) is its own, and it may move with it
        # (blue-green behind the gateway where its replicas allow it).
        return []
    own = ("models." + name + ".",) + (("model.",) if lock_model_deployment(wanted) == name else ())
    others = [c for c in lock_conflicts(lock, wanted) + lock_model_conflicts(lock, wanted) if not c.startswith(own)]
    if not others:
        return []
    return [
        f"sparkops_deployment={name} upgrades {name} alone, but the inventory also moves what the lock pins for the "
        f"rest of the cluster: {'; '.join(others)}. One image serves every deployment: upgrade those with "
        "playbooks/upgrade.yml without sparkops_deployment, or restore them in the inventory"
    ]


def upgrade_strategy(plan: dict, name: str) -> dict:
    """How playbooks/upgrade.yml -e sparkops_deployment=NAME replaces deployment `name`'s containers.

    blue-green: the gateway is on and the deployment has two replicas or more, each on one node: the first
    half (`green`) is taken out of the gateway, replaced and smoke-tested with a real completion while the
    rest (`blue`) serves; the gateway then switches to the green half, the blue half is replaced the same way,
    and the gateway sends to every replica again. Clients see no replica go away.
    swap: every replica at once (clients of this deployment wait), rolled back on failure. `why` says why.
    Each half: [{"index", "id" (the gateway's replica id), "host"}]."""
    deps = {d["name"]: d for d in plan.get("deployments", [])}
    if name not in deps:
        raise ValueError(
            f"sparkops_deployment={name!r} is no deployment of this cluster; it serves {', '.join(deps) or 'nothing'}"
        )
    dep = deps[name]
    reps = [
        {"index": r["index"], "id": gateway_replica_id(name, r["index"]), "host": r["head"], "hosts": list(r["hosts"])}
        for r in dep["replicas"]
    ]
    why = None
    if not (plan.get("gateway") or {}).get("enabled"):
        why = "the gateway is off (sparkops_gateway_enabled): clients reach the replicas directly"
    elif len(reps) < 2:
        why = f"{name} has one replica: no other serves while it is replaced"
    elif any(len(r["hosts"]) != 1 for r in reps):
        why = f"{name}'s replicas span nodes: a half of them would not free whole groups"
    if why:
        return {"deployment": name, "mode": "swap", "why": why, "halves": [reps]}
    cut = len(reps) // 2
    return {
        "deployment": name,
        "mode": "blue-green",
        "why": f"{len(reps)} single-node replicas behind the gateway: {cut} replaced while {len(reps) - cut} serve",
        "halves": [reps[:cut], reps[cut:]],
    }


def plan_gateway(cluster: dict, inputs: dict, problems: list) -> dict:
    """Where the client gateway listens: on the head (the one endpoint clients use), `bind` (default every
    address: nodes come over the fast links, clients over the management LAN, and uvicorn binds one address;
    the gateway's iptables chain keeps the port to loopback, the fast links and sparkops_client_networks).
    `url` is the head's fast-link address (what the nodes reach), `client_url` its management address."""
    port = _int(inputs, "gateway_port", GATEWAY_PORT, problems)
    if not 1 <= port <= 65535:
        problems.append(f"sparkops_gateway_port must be within 1-65535, got {port}")
    elif port == cluster["endpoint"]["port"]:
        problems.append(
            f"sparkops_gateway_port ({port}) is vLLM's port on the head (vllm_serve_port): give the gateway another"
        )
    bind = str(_get(inputs, "gateway_bind", "") or "0.0.0.0")  # noqa: S104 - the firewall chain is the gate
    head = cluster["head"]
    node = cluster["nodes"][head]
    why = bind_problem(
        "sparkops_gateway_bind",
        bind,
        node["ips"] + [node["mgmt_address"]],
        owner=f"the head {head}",
        what="The gateway",
    )
    if why:
        problems.append(why)
    fast = node["primary"]["ip"]
    return {
        "enabled": _bool(inputs, "gateway_enabled", False, problems),
        "host": head,
        "bind": bind,
        "port": port,
        "url": f"http://{fast if bind in WILDCARDS else bind}:{port}",
        "client_url": f"http://{node['mgmt_address'] if bind in WILDCARDS else bind}:{port}",
    }


def _without(argv: list, *flags: str) -> list:
    """argv without each of `flags` and its value."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in flags:
            skip = True
            continue
        out.append(arg)
    return out


def vllm_members(plan: dict) -> list:
    """Every member of the plan that runs vLLM, in node_part's form (its deployment, replica, hosts, endpoint
    and model beside it), replica by replica, each replica's API member first."""
    hosts = []
    for dep in plan.get("deployments", []):
        for replica in dep.get("replicas") or [{"members": dep["members"]}]:
            hosts.extend(m["host"] for m in replica["members"])
    return [m for host in dict.fromkeys(hosts) for m in node_part(plan, host) if m["vllm"]]


def changed_api_members(plan: dict, container_plan: list) -> list:
    """The API members (vllm_members' form) of every replica that the container plan (vllm_serve's check-mode
    run of each member's container, one result per member with `changed` and the member) says this run starts
    or replaces: the replicas whose answers are judged before the run calls them serving. A replica counts once,
    whichever of its members changed (a rank of vLLM's own executor replaces the whole replica)."""
    changed = {
        (r["vllm_serve_member"]["deployment"], r["vllm_serve_member"]["replica"])
        for r in container_plan or []
        if r.get("changed") and isinstance(r.get("vllm_serve_member"), dict)
    }
    return [m for m in vllm_members(plan) if m["role"] == "api" and (m["deployment"], m["replica"]) in changed]


def serving_targets(plan: dict) -> list:
    """Every replica's API, deployment by deployment, replica by replica: what a check, a scrape or a report
    of serving asks. Each: deployment, replica (its index), name ("<deployment> replica <index>"), host (the
    replica's API node), hosts (its nodes), url, port, served_model_name, profile_name and executor. With one
    deployment of one replica (the default) it is one target: the head's endpoint, as before deployments."""
    out = []
    for dep in plan.get("deployments", []):
        replicas = dep.get("replicas") or [
            {"index": 0, "hosts": dep["hosts"], "head": dep["api_host"], "executor": dep["executor"],
             "endpoint": dep["endpoint"]}
        ]  # fmt: skip
        for rep in replicas:
            out.append(
                {
                    "deployment": dep["name"],
                    "replica": rep["index"],
                    "name": f"{dep['name']} replica {rep['index']}",
                    "host": rep["head"],
                    "hosts": list(rep["hosts"]),
                    "url": rep["endpoint"]["url"],
                    "port": rep["endpoint"]["port"],
                    "served_model_name": dep["served_model_name"],
                    "profile_name": dep["profile_name"],
                    "executor": rep["executor"],
                }
            )
    return out


def ray_groups(plan: dict, gpus_per_node: int) -> list:
    """Every Ray cluster of the plan, one per replica under Ray (the default deployment: one, on every node of
    the cluster, its head the cluster's head). Each: deployment, replica, name ("<deployment> replica <index>"),
    head (the host holding the GCS), head_ip, hosts, gcs_address (what each of its workers joins), and what
    its membership must reach: expected_nodes, expected_gpus (the GPUs each node declares, `--num-gpus`, times
    its nodes) and node_ips (each node's fast-link address, as Ray's GCS lists it)."""
    out = []
    for dep in plan.get("deployments", []):
        for rep in dep.get("replicas") or []:
            members = [m for m in rep["members"] if m.get("ray")]
            if rep["executor"] != "ray" or not members:
                continue
            head = next(m for m in members if m["ray"]["head"])
            out.append(
                {
                    "deployment": dep["name"],
                    "replica": rep["index"],
                    "name": f"{dep['name']} replica {rep['index']}",
                    "head": head["host"],
                    "head_ip": head["ip"],
                    "hosts": [m["host"] for m in members],
                    "gcs_address": head["ray"]["address"],
                    "expected_nodes": len(members),
                    "expected_gpus": len(members) * int(gpus_per_node),
                    "node_ips": [m["ip"] for m in members],
                }
            )
    return out


def ray_rows(readings: list) -> list:
    """One row per Ray group from a looped ray_cluster_status's results (each with its group as its loop
    variable: `item`, or the one its `ansible_loop_var` names): the
    group's keys and ready, summary, msg, nodes_alive, gpus_total, gpus_used, dead_node_ips, missing_node_ips,
    `state` (ok or DEGRADED) and `line` (status.yml's and verify.yml's Ray line: with one group as it was
    before groups, "ray: ok: <summary>"; with several each named, "ray <name> (<hosts>): ok: <summary>")."""
    several = len(readings) > 1
    rows = []
    for reading in readings:
        group = dict(reading.get(reading.get("ansible_loop_var") or "item") or {})
        ready = bool(reading.get("ready"))
        state = "ok" if ready else "DEGRADED"
        summary_text = reading.get("summary") or "not read"
        label = f" {group.get('name')} ({', '.join(group.get('hosts') or [])})" if several else ""
        rows.append(
            {**group, "ready": ready, "summary": reading.get("summary"), "msg": reading.get("msg") or "no answer",
             "nodes_alive": reading.get("nodes_alive"), "gpus_total": reading.get("gpus_total"),
             "gpus_used": reading.get("gpus_used"), "dead_node_ips": list(reading.get("dead_node_ips") or []),
             "missing_node_ips": list(reading.get("missing_node_ips") or []), "state": state,
             "line": f"ray{label}: {state}: {summary_text}"}
        )  # fmt: skip
    return rows


def deployment_target(plan: dict, name=None) -> dict:
    """The first replica's target of the deployment called `name` (the first deployment when `name` is
    empty): what the benchmark measures. ValueError naming the deployments when there is no such one."""
    targets = plan["targets"]
    names = list(dict.fromkeys(t["deployment"] for t in targets))
    if not targets:
        raise ValueError("the serving plan has no deployment to measure")
    wanted = str(name) if name not in (None, "") else names[0]
    for target in targets:
        if target["deployment"] == wanted:
            return target
    raise ValueError(
        f"sparkops_deployment={wanted!r} is no deployment of this cluster; it serves {', '.join(names)}: "
        "name one of them (-e sparkops_deployment=NAME), or leave it out for the first"
    )


def _shown(values: dict, key: str):
    """A reading as the reports print it: '?' when it was not read (a template's default('?'))."""
    return "?" if values.get(key) is None else values[key]


def health_rows(checks: list) -> list:
    """One row per replica from the health checks of every target (a looped vllm_health's results, each
    with its target as `item`): its target's keys and healthy, failure_kind, ttft_s, tok_s, metrics,
    `status` (HEALTHY, or UNHEALTHY (<kind>)), `line` (status.yml's endpoint line: with one replica as it
    was before deployments, with several named) and `problem` (None when healthy, else what is wrong)."""
    several = len(checks) > 1
    rows = []
    for check in checks:
        target = dict(check["item"])
        metrics = check.get("metrics") or {}
        healthy = bool(check.get("healthy"))
        kind = check.get("failure_kind")
        why = check.get("msg") or kind or "no answer"
        status = "HEALTHY" if healthy else f"UNHEALTHY ({kind or '?'})"
        label = f" {target.get('name')} ({target.get('served_model_name')})" if several else ""
        url = target.get("url", "?")
        line = (
            f"endpoint{label}: {url}/v1 {status}; KV cache {_shown(metrics, 'kv_cache_usage')}; running "
            f"{_shown(metrics, 'num_requests_running')}, waiting {_shown(metrics, 'num_requests_waiting')}"
        )
        problem = None
        if not healthy:
            problem = f"{target.get('name')} ({url})" if several else f"The endpoint {url}"
            problem += f" is not healthy: {why}"
        rows.append(
            {**target, "healthy": healthy, "failure_kind": kind, "ttft_s": check.get("ttft_s"),
             "tok_s": check.get("tok_s"), "metrics": metrics, "status": status, "line": line, "problem": problem}
        )  # fmt: skip
    return rows


def node_part(plan: dict, host: str) -> list:
    """This host's members (of whichever replica holds it), each with what a node's roles need to run it
    and watch it without looking at the rest of the plan: its deployment's name, image, served model
    name and model cache folder, and its replica's index, executor, hosts and endpoint."""
    out = []
    for dep in plan.get("deployments", []):
        replicas = dep.get("replicas") or [
            {"index": 0, "executor": dep["executor"], "members": dep["members"], "hosts": dep["hosts"],
             "endpoint": dep["endpoint"]}
        ]  # fmt: skip
        for replica in replicas:
            for member in replica["members"]:
                if member["host"] == host:
                    out.append(
                        {**member, "deployment": dep["name"], "replica": replica["index"], "image": dep["image"],
                         "executor": replica["executor"], "replica_hosts": list(replica["hosts"]),
                         "endpoint": replica["endpoint"], "served_model_name": dep["served_model_name"],
                         "model_cache_dir": dep["model_cache_dir"], "profile_name": dep["profile_name"]}
                    )  # fmt: skip
    return out


def summary(plan: dict) -> list:
    """The plan in lines, for plan.yml: per deployment its image, per replica its API, and per member its
    command lines."""
    out = []
    for dep in plan.get("deployments", []):
        img = dep["image"]
        tag = (
            img["image"]
            or f"{img['name']}:<resolved by the image build from {img.get('ref') or img.get('registry_ref')}>"
        )
        replicas = dep.get("replicas") or [
            {"index": 0, "hosts": dep["hosts"], "head": dep["api_host"], "executor": dep["executor"],
             "endpoint": dep["endpoint"], "members": dep["members"]}
        ]  # fmt: skip
        out.append(
            f"deployment {dep['name']}: profile {dep['profile_name']} ({dep['profile']['model']} @ "
            f"{dep['profile']['revision']}), served model name {dep['served_model_name']}, {len(replicas)} "
            f"replica(s) of {dep['nnodes']} node(s); image {tag}"
        )
        for rep in replicas:
            out.append(
                f"  replica {rep['index']}: executor {rep['executor']} on {', '.join(rep['hosts'])}; "
                f"API {rep['endpoint']['url']} on {rep['head']}"
            )
            for m in rep["members"]:
                where = f"    {m['host']} rank {m['rank']}"
                if m["ray"]:
                    role = "head" if m["ray"]["head"] else "worker"
                    out.append(f"{where}: Ray {role} ({m['ray']['container']}): {' '.join(m['ray'].get('argv', []))}")
                if m["vllm"]:
                    out.append(f"{where} ({m['role']}, {m['vllm']['container']}): {' '.join(m['vllm']['argv'])}")
        out.extend(f"  {line}" for line in dep["allowed_rules"])
    return out
