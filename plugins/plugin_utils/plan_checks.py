"""What the plan tells a user beyond the model: how clients connect, Sparks that serve nothing, and
inventory variables no role reads. Pure functions of plain data (the model, the inventory's variable
names, the known names), unit-tested without Ansible; the cluster_facts action gathers their inputs.

* ``clients``: the "Clients" block of the plan: the URL clients use (the gateway's when it is on, else
  each replica's API on its bind), the networks the firewall lets reach it, the key and how it is sent,
  and a warning where the listening address and sparkops_client_networks do not fit together.
* ``idle_warnings``: Sparks of the cluster that no replica gives work to.
* ``unknown_variables``: inventory variables of a sparkops prefix that no role declares, each with the
  closest known name; and serving-profile keys set as variables of their own.
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import posixpath
from pathlib import Path

WILDCARDS = ("0.0.0.0", "::")  # noqa: S104 - values compared, not bound
HEADER = "Authorization: Bearer"
# The prefixes whose variables are sparkops': the brief's two, and each role's own (roles/<role>/...).
BASE_PREFIXES = ("sparkops_", "vllm_serve_")
# The test bed's own variables (inventory/sim): no role reads them, the sim inventory does.
EXEMPT_PREFIXES = ("sparkops_sim_",)


def _networks(values) -> list:
    out = []
    for value in values or []:
        try:
            out.append(ipaddress.ip_network(str(value), strict=False))
        except ValueError:
            continue
    return out


def _contains(networks: list, address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip.version == n.version and ip in n for n in networks)


def _lan_hint(mgmt: str) -> str:
    try:
        return str(ipaddress.ip_network(f"{mgmt}/24", strict=False))
    except ValueError:
        return "192.0.2.0/24"


def clients(model: dict, client_networks, *, api_key_given: bool = False) -> dict:
    """{"lines": the plan's Clients block, "warnings": [...], "urls": [...]} for `model` (with its serving
    plan). Clients reach an address the API listens on, through the firewall's chain (SPARKOPS-API, or
    SPARKOPS-GATEWAY), which lets in loopback, the fast links and sparkops_client_networks only."""
    serving = model.get("serving") or {}
    gateway = serving.get("gateway") or {}
    head = model["head"]
    nodes = model["nodes"]
    given = [str(n) for n in client_networks or []]
    nets = _networks(given)
    fast = sorted({link["cidr"] for n in nodes.values() for link in n["links"]})
    lines, warnings, urls = ["Clients:"], [], []
    paths = model["paths"]
    if gateway.get("enabled"):
        bind = str(gateway["bind"])
        url = (gateway["client_url"] if nets or bind not in WILDCARDS else gateway["url"]) + "/v1"
        urls.append(url)
        lines.append(f"  URL {url} (the gateway on {head}, every model by its name; vLLM's own port is closed)")
        key = posixpath.join(paths["credentials_dir"], "keys", "NAME")
        how = f"a key per client: playbooks/keys.yml -e sparkops_key_name=NAME writes it to {key}"
        listening = [nodes[head]["mgmt_address"]] if bind in WILDCARDS else [bind]
        what = "sparkops_gateway_bind"
    else:
        for target in serving.get("targets") or []:
            bind = str(model["endpoint"]["bind"])
            host = target["host"]
            if bind in WILDCARDS:
                url = f"http://{nodes[host]['mgmt_address']}:{target['port']}/v1"
            else:
                url = target["url"] + "/v1"
            urls.append(url)
            lines.append(f"  URL {url} ({target['name']}, model {target['served_model_name']}, on {host})")
        key = paths["api_key_file"]
        how = "sparkops_api_key (your vault)" if api_key_given else f"the key file {key} (made by site.yml, mode 0600)"
        bind = str(model["endpoint"]["bind"])
        listening = (
            [nodes[t["host"]]["mgmt_address"] for t in serving.get("targets") or []] if bind in WILDCARDS else [bind]
        )
        what = "vllm_serve_host"
    on_fast = bind not in WILDCARDS and any(_contains(_networks(fast), a) for a in listening)
    if on_fast and not any(_contains(nets, a) for a in listening):
        lines.append(f"  reached from: the Sparks' fast links only ({', '.join(fast)}); {what} is a fast-link address")
    else:
        extra = f"sparkops_client_networks {', '.join(given)}" if given else "no client network"
        lines.append(f"  reached from: {extra}, and the Sparks' fast links ({', '.join(fast)})")
    if on_fast and not nets and not gateway.get("enabled"):
        lines.append(
            f"  to serve your LAN: vllm_serve_host: 0.0.0.0 (or {nodes[head]['mgmt_address']}) and "
            f"sparkops_client_networks: [{_lan_hint(nodes[head]['mgmt_address'])}]"
        )
    lines.append(f"  key: {how}")
    sample = "$(cat " + (key if not api_key_given or gateway.get("enabled") else "KEYFILE") + ")"
    lines.append(f'  send it as "{HEADER} <key>": curl -H "{HEADER} {sample}" {urls[0] if urls else "URL"}/models')
    mgmt = nodes[head]["mgmt_address"]
    if not on_fast and not nets:
        warnings.append(
            f"{what} is {bind}, so the API listens on the management network, but sparkops_client_networks is empty: "
            "the firewall drops every client outside the Sparks' fast links and LAN clients time out. Add the "
            f"clients' networks, e.g. sparkops_client_networks: [{_lan_hint(mgmt)}]."
        )
    elif on_fast and nets and not gateway.get("enabled"):
        warnings.append(
            f"sparkops_client_networks lets {', '.join(given)} in, but vLLM listens on the fast-link address {bind} "
            f"only, which those clients do not reach: set vllm_serve_host: 0.0.0.0 (or the head's management "
            f"address {mgmt})."
        )
    return {"lines": lines, "warnings": warnings, "urls": urls}


def idle_warnings(model: dict) -> list:
    """A warning for Sparks of the cluster that no replica gives a GPU's work to."""
    serving = model.get("serving") or {}
    busy: set = set()
    out = []
    for dep in serving.get("deployments") or []:
        nnodes = int(dep.get("nnodes") or 1)
        for rep in dep.get("replicas") or []:
            hosts = list(rep["hosts"])
            if len(hosts) > nnodes:
                # Ray on more nodes than the profile's TP x PP: vLLM places its workers on nnodes of them.
                out.append(
                    f"deployment {dep['name']} starts Ray on {len(hosts)} Sparks ({', '.join(hosts)}), but its profile "
                    f"{dep['profile_name']} (tensor_parallel_size x pipeline_parallel_size = {nnodes}) uses {nnodes} "
                    f"of them: {len(hosts) - nnodes} Spark(s) serve nothing. Serve replicas of it instead "
                    f"(sparkops_deployments with executor: mp cuts the hosts into groups of {nnodes}, as in "
                    "inventory/examples/replicas-switch-4), or pick a profile that spans every node."
                )
                busy |= set(hosts)
            else:
                busy |= set(hosts)
    idle = [h for h in model["hosts"] if h not in busy]
    if idle and serving.get("deployments"):
        sizes = ", ".join(
            f"{d['name']}: {d['profile_name']} on {int(d.get('nnodes') or 1)}" for d in serving["deployments"]
        )
        out.append(
            f"{', '.join(idle)} serve{'s' if len(idle) == 1 else ''} nothing: no deployment's replica runs there "
            f"({sizes} node(s) per replica). Give {'it' if len(idle) == 1 else 'them'} a deployment in "
            "sparkops_deployments (executor: mp makes replicas of a multi-node profile), or take "
            f"{'it' if len(idle) == 1 else 'them'} out of spark_cluster."
        )
    return out


@functools.lru_cache(maxsize=4)
def declared_variables(root: str) -> frozenset:
    """Every variable a role of the collection at `root` declares: its defaults and its argument specs."""
    import yaml  # noqa: PLC0415 - only the controller reads the roles

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    names: set = set()
    base = Path(root) / "roles"
    for path in sorted(base.glob("*/defaults/**/*.yml")) + sorted(base.glob("*/defaults/*.yml")):
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 - a safe loader
        if isinstance(data, dict):
            names |= {str(k) for k in data}
    for path in sorted(base.glob("*/meta/argument_specs.yml")):
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 - a safe loader
        for entry in ((data or {}).get("argument_specs") or {}).values():
            names |= {str(k) for k in ((entry or {}).get("options") or {})}
    return frozenset(names)


@functools.lru_cache(maxsize=4)
def settings_spec(root: str, skip: tuple = ()) -> dict:
    """The cluster-wide settings' spec: roles/sparkops_defaults' entry point `settings` and roles/cluster_facts'
    `inventory`, without the names in `skip` (the per-host variables the model judges, saying more than a type)."""
    import yaml  # noqa: PLC0415 - only the controller reads the roles

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    spec: dict = {}
    for role, entry in (("sparkops_defaults", "settings"), ("cluster_facts", "inventory")):
        path = Path(root) / "roles" / role / "meta" / "argument_specs.yml"
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 - a safe loader
        spec.update(((data or {}).get("argument_specs") or {}).get(entry, {}).get("options") or {})
    for name in skip:
        spec.pop(name, None)
    return spec


def role_prefixes(root: str) -> tuple:
    roles = sorted(p.name for p in (Path(root) / "roles").iterdir() if p.is_dir())
    return tuple(dict.fromkeys([*BASE_PREFIXES, *(f"{r}_" for r in roles)]))


def inventory_names(data, where: str) -> dict:
    """name -> where, for the variables a YAML inventory (hosts.yml) sets on its hosts and groups."""
    out: dict = {}

    def group(name, body):
        if not isinstance(body, dict):
            return
        for var in body.get("vars") or {}:
            out.setdefault(str(var), f"{where} (group {name})")
        for host, hv in (body.get("hosts") or {}).items():
            for var in hv or {}:
                out.setdefault(str(var), f"{where} (host {host})")
        for child, sub in (body.get("children") or {}).items():
            group(child, sub)

    for name, body in (data or {}).items() if isinstance(data, dict) else ():
        group(name, body)
    return out


def unknown_variables(names: dict, known, prefixes, profile_keys=()) -> list:
    """A warning for each variable of `names` (name -> where it is set) that starts with one of `prefixes`
    and is not `known`, with the closest known name; and for each key of a serving profile set as a variable
    of its own (a profile key is read from the profile, never from a variable)."""
    known = set(known)
    out = []
    for name in sorted(names):
        where = names[name]
        if name in profile_keys and name not in known:
            out.append(
                f"{name} (in {where}) is a key of a serving profile, not a variable: no role reads it. Change it in "
                f"the profile: sparkops_serving_overrides: {{PROFILE: {{{name}: VALUE}}}} (the served profile's other "
                "keys stay)."
            )
            continue
        if name in known or not name.startswith(tuple(prefixes)) or name.startswith(EXEMPT_PREFIXES):
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else "; no role declares it (docs list every variable)"
        out.append(f"{name} (in {where}) is no sparkops variable: nothing reads it and its default applies{hint}")
    return out


def wheelhouse_warnings(model: dict, wheelhouse, litellm_version, index_url="") -> list:
    """With the gateway on and offline only (no index): a warning when the control node's wheelhouse holds no
    LiteLLM wheel of the pinned version for any platform. The gateway then has nothing to install from, and
    site.yml reaches the gateway after the image build and the weights: better said by the plan than an hour
    into the first run. With an index, the head installs from it (roles/gateway checks that it reaches it)."""
    if not ((model.get("serving") or {}).get("gateway") or {}).get("enabled") or not wheelhouse or index_url:
        return []
    folder = Path(str(wheelhouse))
    if any(folder.glob(f"*/litellm-{litellm_version}-*.whl")):
        return []
    return [
        f"the gateway is on (sparkops_gateway_enabled), offline only (sparkops_gateway_index_url is empty), and "
        f"its wheelhouse {folder} holds no litellm-{litellm_version} wheel: site.yml would stop at the gateway, "
        "after the image build and the weights. Fill it first: ansible-playbook playbooks/gateway_wheels.yml -i "
        "<inventory> (where PyPI or a mirror is reachable; an air-gapped site copies the folder here), set "
        "sparkops_gateway_wheelhouse, or set sparkops_gateway_index_url to an index the head reaches."
    ]
