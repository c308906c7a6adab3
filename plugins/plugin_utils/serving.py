"""The serving plan: what runs where, computed once on the controller from the cluster model.

``build_serving(cluster, inputs)`` takes the cluster model (``build_cluster``'s result) and plain
data (the profiles, the selected profile's name, the lock file's content, the image pins, the
executor and the node's sizes) and returns the plan as JSON-able dicts, or raises ``ClusterError``
with EVERY problem found, in the messages preflight gave before the plan existed. It does no I/O,
so every entry point (``site.yml``, ``serve.yml`` alone, ``plan.yml``) that hands it the same
inventory and lock gets the same containers, command lines and image tag.

One deployment today (``name: main``): the selected profile, served from the head. Its executor
(``sparkops_executor``):

* ``ray`` (the default): a Ray container on every node, ``vllm serve`` on the head attached to the
  head's raylet, with ``--distributed-executor-backend ray`` when TP x PP spans nodes;
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

from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import ClusterError
from ansible_collections.sparkops.cluster.plugins.plugin_utils.day2_checks import memory_plan_problems
from ansible_collections.sparkops.cluster.plugins.plugin_utils.lockfile import conflicts as lock_conflicts
from ansible_collections.sparkops.cluster.plugins.plugin_utils.lockfile import effective_revision
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving_profile import (
    allowed_rule_warnings,
    contract_violations,
    normalize_profile,
    profile_violations,
    vllm_serve_args,
)
from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import load_contract

EXECUTORS = ("ray", "mp")
DEPLOYMENT = "main"
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
# The inventory variable behind each input (the cluster_facts action reads them; messages name them).
INPUT_VARIABLES = {
    "profile_name": "sparkops_serving_profile",
    "profiles": "sparkops_all_serving_profiles",
    "gpus_per_node": "sparkops_gpus_per_node",
    "node_memory_gib": "sparkops_node_memory_gib",
    "memory_overhead_gib": "sparkops_memory_host_overhead_gib",
    "memory_floor_gib": "sparkops_memory_floor_gib",
    "allow_rules": "sparkops_allow_rules",
    "vllm_version": "sparkops_vllm_version",
    "executor": "sparkops_executor",
    "mp_master_port": "sparkops_mp_master_port",
    "hf_home": "sparkops_hf_home",
    "container_names": "sparkops_container_names",
    "container_cache_env": "sparkops_container_cache_env",
    "weights_source": "weight_cache_source",
    "upgrade": "deployment_state_lock_upgrade",
    # Set only by an upgrade's rollback (playbooks/tasks/upgrade-swap.yml): the recorded profile.
    "profile_override": "upgrade_rollback_profile",
}
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
INPUT_VARIABLES.update({key: variable for key, (variable, _) in RAY_OPTIONS.items()})
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
        ref = str(locked.get("registry_ref") or image.get("registry_ref") or "")
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


def lock_wanted(image: dict, profile_name: str, profile: dict | None) -> dict:
    """What the inventory asks for, in the lock's shape (deployment_state compares the two)."""
    source = str(image.get("source") or "eugr")
    eugr = source == "eugr"
    return {
        "image": {
            "source": source,
            "repo": str(image.get("repo") or "") if eugr else "",
            "ref": str(image.get("ref") or "") if eugr else "",
            "build_args": list(image.get("build_args") or []) if eugr else [],
            "registry_ref": "" if eugr else str(image.get("registry_ref") or ""),
        },
        "model": {
            "profile": profile_name,
            "id": (profile or {}).get("model"),
            "revision": (profile or {}).get("revision"),
        },
    }


def _profile_problems(inputs: dict, profiles: dict, name, gpus_total: int, sizes: dict) -> tuple:
    """Preflight's profile checks, with its messages: the name, every profile's contract, the rules,
    the gated model's token and the memory plan. Returns the raw profile and its normalized form (both
    None when it cannot be served), the pinned vLLM's contract and the problems."""
    problems = []
    known = isinstance(name, str) and name in profiles
    if not known:
        problems.append(
            f"sparkops_serving_profile '{name}' is not a known profile. Known: {', '.join(sorted(profiles))}. "
            "Add your own under sparkops_serving_profiles_extra (same keys as the shipped ones)."
        )
    version = str(_get(inputs, "vllm_version", "0.19.0"))
    contract = load_contract(version)
    allow_rules = inputs.get("allow_rules") or []
    refused = {}
    for pname, prof in profiles.items():
        found = contract_violations(prof, contract, gpus_per_node=sizes["gpus_per_node"], allow_rules=allow_rules)
        if found:
            refused[pname] = found
    if refused:
        text = "".join(f"{pname}: {'; '.join(found)}. " for pname, found in refused.items())
        problems.append(
            f"Serving profiles refused by vLLM {version} (sparkops_vllm_version): {text}"
            "Fix the profile for this vLLM release or pin the release it was written for."
        )
    if not known:
        return None, None, contract, problems
    profile = profiles[name]
    rules = profile_violations(
        profile,
        gpus_total,
        node_memory_gib=sizes["node_memory_gib"],
        gpus_per_node=sizes["gpus_per_node"],
        contract=contract,
        allow_rules=allow_rules,
    )
    if rules:
        problems.append(f"Serving profile '{name}' is refused: {' | '.join(rules)}")
        return None, None, contract, problems
    p = normalize_profile(profile)
    if p["gated"] and str(_get(inputs, "weights_source", "hub")) == "hub" and not inputs.get("hf_token_set"):
        problems.append(
            f"{p['model']} is a gated model and no Hugging Face token is set. Put it in a vaulted variable "
            "sparkops_hf_token (ansible-vault encrypt_string) or export HF_TOKEN on the control node."
        )
    memory = memory_plan_problems(p, sizes["node_memory_gib"], sizes["overhead_gib"], sizes["floor_gib"])
    if memory:
        problems.append(f"Serving profile '{name}' is refused: {' | '.join(memory)}")
    return profile, p, contract, problems


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


def build_serving(cluster: dict, inputs: dict) -> dict:  # noqa: PLR0914, PLR0915
    """The serving plan for `cluster`; ClusterError with every problem when it cannot be served."""
    problems: list[str] = []
    profiles = inputs.get("profiles") or {}
    if not isinstance(profiles, dict):
        raise ClusterError(
            [f"sparkops_all_serving_profiles must be a mapping of profiles, got {type(profiles).__name__}"]
        )
    name = inputs.get("profile_name")
    if inputs.get("profile_override"):
        # An upgrade's rollback plans the recorded profile, whatever the inventory's profiles say now.
        profiles = {**profiles, str(name): inputs["profile_override"]}
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
    hosts = list(cluster["hosts"])
    raw, normalized, contract, found = _profile_problems(
        inputs, profiles, name, len(hosts) * sizes["gpus_per_node"], sizes
    )
    problems += found

    image_in = inputs.get("image") or {}
    lock = inputs.get("lock") or {}
    upgrade = bool(inputs.get("upgrade"))
    wanted = lock_wanted(image_in, str(name), normalized)
    conflicts = [] if upgrade else lock_conflicts(lock, wanted)
    if conflicts:
        problems.append(
            f"{cluster['paths']['lock_file']} pins what was deployed, and the inventory now asks for something "
            f"else: {'; '.join(conflicts)}. To move to the new values, run playbooks/upgrade.yml (it checks them, "
            "moves the lock and says what moved); to keep the deployment, restore the inventory."
        )
    if problems:
        raise ClusterError(problems)

    p = dict(normalized)
    own_revision = p["revision"]
    p["revision"] = own_revision if upgrade else effective_revision(own_revision, lock, str(name), p["model"])
    world = p["tensor_parallel_size"] * p["pipeline_parallel_size"]
    nnodes = -(-world // sizes["gpus_per_node"])
    if executor == "ray":
        # Today's shape: Ray on every node (the head's GCS, the others join) and vLLM attached to the
        # head's raylet, whatever the group's size; the Ray backend only when TP x PP spans nodes.
        kind, group = "ray", hosts
    else:
        # The head first: the model orders hosts head, then workers.
        kind, group = ("single" if nnodes == 1 else "mp"), hosts[:nnodes]
    head = cluster["head"]
    head_ip = cluster["nodes"][head]["primary"]["ip"]
    endpoint = dict(cluster["endpoint"])
    names = {**_DEFAULT_CONTAINERS, **(inputs.get("container_names") or {})}
    cache_env = {str(k): str(v) for k, v in (inputs.get("container_cache_env") or {}).items()}
    base_env = {
        "HF_HOME": CONTAINER_HF_HOME,
        "HF_HUB_OFFLINE": "1",
        # As eugr/spark-vllm-docker launch-cluster.sh @ 013cd2ea (DOCKER_ARGS): NCCL keeps its threads off
        # the container's CPU mask; expandable segments fragment the shared unified memory less.
        "NCCL_IGNORE_CPU_AFFINITY": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    # The argv builder judges the hard rules again and adds the Ray backend for a multi-node group.
    api_argv = vllm_serve_args(
        p,
        endpoint["bind"],
        endpoint["port"],
        gpus_per_node=sizes["gpus_per_node"],
        allow_rules=inputs.get("allow_rules"),
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
                "argv": ray_start_argv(ray_opts, ip, address, head=api),
            }
        if api or kind == "mp":
            # A headless rank starts no API server (vllm/entrypoints/cli/serve.py:115-116): no --host/--port.
            argv = list(api_argv) if api else _without(api_argv, "--host", "--port")
            if kind == "mp":
                argv += ["--nnodes", str(nnodes), "--node-rank", str(rank)]
                argv += ["--master-addr", head_ip, "--master-port", str(master_port)]
                if not api:
                    argv.append("--headless")
            argv += ["--middleware", f"{AUTH_MODULE}.RequireApiKey"] if api else []
            member["vllm"] = {
                "container": names["vllm"],
                "argv": argv,
                "env": _vllm_env(base_env, cache_env, p["env"], ip, ray=kind == "ray", api=api, mp=kind == "mp"),
                "auth": api,
            }
        members.append(member)
    hf_home = str(_get(inputs, "hf_home", "/var/lib/sparkops/huggingface"))
    deployment = {
        "name": DEPLOYMENT,
        "profile_name": str(name),
        "profile": p,
        "own_revision": own_revision,
        # The profile as the inventory gives it, with the revision served: what the roles that record
        # and compare deployments (deployment_state, upgrade) keep as `sparkops_profile`.
        "profile_as_given": {**raw, "revision": p["revision"]},
        "hosts": group,
        "executor": kind,
        "nnodes": nnodes,
        "members": members,
        "api_host": head,
        "endpoint": endpoint,
        "served_model_name": p["served_model_name"],
        "model_cache_dir": posixpath.join(hf_home, "hub", "models--" + p["model"].replace("/", "--")),
        "image": plan_image(image_in, lock, upgrade),
        "weights": dict(cluster["weights"]),
        "allowed_rules": allowed_rule_warnings(
            str(name),
            raw,
            inputs.get("allow_rules") or [],
            contract=contract,
        ),
    }
    return {"deployments": [deployment], "lock": {"wanted": wanted, "upgrade": upgrade}}


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


def node_part(plan: dict, host: str) -> list:
    """This host's members, each with its deployment's name, image and served model name."""
    out = []
    for dep in plan.get("deployments", []):
        for member in dep["members"]:
            if member["host"] == host:
                out.append({**member, "deployment": dep["name"], "image": dep["image"], "executor": dep["executor"]})
    return out


def summary(plan: dict) -> list:
    """The plan in lines, for plan.yml: per deployment its image, and per member its command line."""
    out = []
    for dep in plan.get("deployments", []):
        img = dep["image"]
        tag = (
            img["image"]
            or f"{img['name']}:<resolved by the image build from {img.get('ref') or img.get('registry_ref')}>"
        )
        out.append(
            f"deployment {dep['name']}: profile {dep['profile_name']} ({dep['profile']['model']} @ "
            f"{dep['profile']['revision']}), executor {dep['executor']} on {', '.join(dep['hosts'])}; image {tag}"
        )
        out.append(f"  API {dep['endpoint']['url']} on {dep['api_host']}, served model name {dep['served_model_name']}")
        for m in dep["members"]:
            where = f"  {m['host']} rank {m['rank']}"
            if m["ray"]:
                out.append(f"{where}: Ray {'head' if m['ray']['head'] else 'worker'} ({m['ray']['container']})")
            if m["vllm"]:
                out.append(f"{where} ({m['role']}, {m['vllm']['container']}): {' '.join(m['vllm']['argv'])}")
        out.extend(f"  {line}" for line in dep["allowed_rules"])
    return out
