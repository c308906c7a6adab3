#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
"""Module: in one run, whether a role's services and containers run as wanted, its packages, its paths."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: daemon_state
short_description: Read whether services and containers run as wanted, which packages are installed, which paths exist
description:
  - One read of what a role's run with nothing to do needs to know, so that its install, start and
    clean-up tasks can be skipped on the controller when everything is in place. Read-only.
  - I(init_system) is C(systemd) when C(/run/systemd/system) exists (the test that
    C(ansible.builtin.service) makes), else C(sysvinit).
  - For each of I(services), C(running) and C(enabled) as C(ansible.builtin.service) judges them -
    C(systemctl is-active)/C(is-enabled) under systemd; the init script's C(status) exit code and an
    C(/etc/rc?.d/S??name) link otherwise.
  - For each of I(packages), whether C(dpkg-query) reports it installed.
  - For each of I(containers), whether it exists, runs, and has what the wanted settings name (the image's
    ID, command, restart policy, network and PID mode, bind mounts, labels), read with C(docker inspect).
    A difference is listed by name; a role then runs C(community.docker.docker_container), which compares
    in full.
version_added: "0.7.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  services:
    description: Service names (init script or systemd unit) to report on.
    type: list
    elements: str
    default: []
  packages:
    description: Debian packages to report on.
    type: list
    elements: str
    default: []
  paths:
    description: Paths to report as existing or not.
    type: list
    elements: path
    default: []
  containers:
    description: Containers to compare with the settings they should have; settings left out are not compared.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The container's name.
        type: str
        required: true
      image:
        description: The image (name or ID) the container must run; compared by image ID.
        type: str
      command:
        description: The container's command (C(Config.Cmd)), as a list.
        type: list
        elements: str
      restart_policy:
        description: Docker's restart policy name (C(no), C(on-failure), C(always), C(unless-stopped)).
        type: str
      restart_retries:
        description: The restart policy's maximum retry count.
        type: int
      network_mode:
        description: C(HostConfig.NetworkMode), such as C(host).
        type: str
      pid_mode:
        description: C(HostConfig.PidMode), such as C(host).
        type: str
      binds:
        description: Bind mounts as C(source:destination); the container must have exactly these.
        type: list
        elements: str
      cap_add:
        description: Capabilities added (C(HostConfig.CapAdd), without C(CAP_)); the container must have exactly these.
        type: list
        elements: str
      labels:
        description: Labels the container must carry with these values (others may exist).
        type: dict
  json_files:
    description: JSON files to read (a state a role recorded, such as the last start's phases).
    type: list
    elements: path
    default: []
    version_added: "0.9.0"
  docker_path:
    description: The docker CLI (a name looked up on PATH, or a path).
    type: str
    default: docker
extends_documentation_fragment:
  - sparkops.cluster.attributes
  - sparkops.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Read what the monitoring role's run needs
  sparkops.cluster.daemon_state:
    services: [prometheus-node-exporter, prometheus]
    packages: [prometheus-node-exporter, prometheus]
    paths: [/etc/grafana/provisioning]
  register: state

- name: Install what is missing
  ansible.builtin.apt:
    name: "{{ state.missing_packages }}"
  when: state.missing_packages | length > 0

- name: Compare the watchdog container with its settings
  sparkops.cluster.daemon_state:
    containers:
      - name: sparkops-watchdog
        image: registry.local/vllm:abc123
        command: [chroot, /host, /usr/bin/python3, /usr/local/lib/sparkops/sparkops_watchdog.py]
        restart_policy: on-failure
        restart_retries: 10
        network_mode: host
        binds: ["/:/host"]
"""

RETURN = r"""
init_system:
  description: C(systemd) or C(sysvinit).
  returned: always
  type: str
  sample: sysvinit
services:
  description: Per service name, C(running) and C(enabled) (booleans).
  returned: always
  type: dict
  sample: {prometheus: {running: true, enabled: true}}
missing_packages:
  description: The I(packages) that are not installed, in the order given.
  returned: always
  type: list
  elements: str
  sample: []
paths:
  description: Per path, whether it exists.
  returned: always
  type: dict
  sample: {/etc/grafana/provisioning: false}
containers:
  description:
    - Per container name, C(exists), C(running), C(image) (the image reference it was started from,
      C(Config.Image); null without the container), C(differences) (a list of sentences naming each setting that
      differs) and C(matches) (exists, runs and has no difference).
  returned: always
  type: dict
  sample: {sparkops-watchdog: {exists: true, running: true, image: "vllm-node:abc", differences: [], matches: true}}
json_files:
  description:
    - Per path of I(json_files), C(data) (the parsed content; null when the file is missing or not JSON) and
      C(error) (why C(data) is null for a file that exists; null otherwise).
  returned: always
  type: dict
  sample: {/var/lib/sparkops/startup-phases.json: {data: {phases: []}, error: null}}
"""

import glob
import json
import os

from ansible.module_utils.basic import AnsibleModule


def systemd_runs() -> bool:
    return os.path.isdir("/run/systemd/system")


def service_state(module: AnsibleModule, name: str, systemd: bool) -> dict:
    if systemd:
        systemctl = module.get_bin_path("systemctl", required=True)
        out = module.run_command([systemctl, "is-active", name])[1]
        running = out.strip() in ("active", "activating", "reloading")
        return {"running": running, "enabled": module.run_command([systemctl, "is-enabled", name])[0] == 0}
    script = f"/etc/init.d/{name}"
    if not os.access(script, os.X_OK):
        return {"running": False, "enabled": False}
    rc = module.run_command([script, "status"])[0]
    return {"running": rc == 0, "enabled": bool(glob.glob(f"/etc/rc?.d/S??{name}"))}


def missing_packages(module: AnsibleModule, names: list[str]) -> list[str]:
    if not names:
        return []
    dpkg = module.get_bin_path("dpkg-query")
    if dpkg is None:
        return list(names)
    # Exit code 1 only says that some name is unknown; the lines tell which are installed.
    out = module.run_command([dpkg, "-W", "-f", "${Package} ${db:Status-Status}\\n", *names])[1]
    installed = {line.split(" ")[0] for line in out.splitlines() if line.endswith(" installed")}
    return [n for n in names if n not in installed]


def json_file(path: str) -> dict:
    """A recorded JSON state: its data, or why there is none (a missing file is no error: nothing recorded yet)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return {"data": json.load(fh), "error": None}
    except FileNotFoundError:
        return {"data": None, "error": None}
    except (OSError, ValueError) as exc:
        return {"data": None, "error": f"{path}: {exc}"}


def container_differences(info: dict, want: dict, image_id: str | None) -> list[str]:
    """Sentences naming each wanted setting that `docker inspect`'s `info` does not have."""
    config, host = info.get("Config") or {}, info.get("HostConfig") or {}
    diffs = []
    if want.get("image") is not None and (image_id is None or info.get("Image") != image_id):
        diffs.append(f"image: runs {info.get('Image')}, {want['image']} is {image_id or 'not on this node'}")
    if want.get("command") is not None and list(config.get("Cmd") or []) != list(want["command"]):
        diffs.append(f"command: {config.get('Cmd')} (wanted {want['command']})")
    policy = host.get("RestartPolicy") or {}
    if want.get("restart_policy") is not None and (policy.get("Name") or "no") != want["restart_policy"]:
        diffs.append(f"restart policy: {policy.get('Name') or 'no'} (wanted {want['restart_policy']})")
    if want.get("restart_retries") is not None and policy.get("MaximumRetryCount", 0) != want["restart_retries"]:
        diffs.append(f"restart retries: {policy.get('MaximumRetryCount')} (wanted {want['restart_retries']})")
    for key, field in (("network_mode", "NetworkMode"), ("pid_mode", "PidMode")):
        if want.get(key) is not None and (host.get(field) or "") != want[key]:
            diffs.append(f"{key.replace('_', ' ')}: {host.get(field) or 'default'} (wanted {want[key]})")
    if want.get("binds") is not None:
        have = sorted(
            f"{m.get('Source')}:{m.get('Destination')}" for m in info.get("Mounts") or [] if m.get("Type") == "bind"
        )
        if have != sorted(want["binds"]):
            diffs.append(f"bind mounts: {have} (wanted {sorted(want['binds'])})")
    if want.get("cap_add") is not None:
        have_caps = sorted(str(c).upper().removeprefix("CAP_") for c in host.get("CapAdd") or [])
        if have_caps != sorted(str(c).upper().removeprefix("CAP_") for c in want["cap_add"]):
            diffs.append(f"added capabilities: {have_caps} (wanted {sorted(want['cap_add'])})")
    labels = config.get("Labels") or {}
    for key, value in (want.get("labels") or {}).items():
        if labels.get(key) != str(value):
            diffs.append(f"label {key}: {labels.get(key)!r} (wanted {value!r})")
    return diffs


def docker_inspect(module: AnsibleModule, docker: str, *names: str) -> list[dict]:
    """What one `docker inspect` finds of `names` (it exits 1 when one is missing and prints the others)."""
    out = module.run_command([docker, "inspect", *names])[1]
    try:
        found = json.loads(out)
    except ValueError:
        return []
    return found if isinstance(found, list) else []


def container_state(module: AnsibleModule, docker: str | None, want: dict) -> dict:
    if docker is None:
        return {
            "exists": False,
            "running": False,
            "image": None,
            "differences": ["no docker CLI on this node"],
            "matches": False,
        }
    # One docker process for the container and its image: a container has State, an image RepoTags
    # (a container's name cannot contain the image reference's colon, and containers are looked up first).
    found = docker_inspect(module, docker, want["name"], *([want["image"]] if want.get("image") else []))
    info = next((o for o in found if "State" in o and o.get("Name") == "/" + want["name"]), None)
    if info is None:
        return {
            "exists": False,
            "running": False,
            "image": None,
            "differences": ["no such container"],
            "matches": False,
        }
    image = next((o for o in found if "RepoTags" in o), None)
    image_id = image.get("Id") if image else None
    running = bool((info.get("State") or {}).get("Running"))
    diffs = container_differences(info, want, image_id)
    return {
        "exists": True,
        "running": running,
        "image": (info.get("Config") or {}).get("Image"),
        "differences": diffs,
        "matches": running and not diffs,
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "services": {"type": "list", "elements": "str", "default": []},
            "packages": {"type": "list", "elements": "str", "default": []},
            "paths": {"type": "list", "elements": "path", "default": []},
            "containers": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "name": {"type": "str", "required": True},
                    "image": {"type": "str"},
                    "command": {"type": "list", "elements": "str"},
                    "restart_policy": {"type": "str"},
                    "restart_retries": {"type": "int"},
                    "network_mode": {"type": "str"},
                    "pid_mode": {"type": "str"},
                    "binds": {"type": "list", "elements": "str"},
                    "cap_add": {"type": "list", "elements": "str"},
                    "labels": {"type": "dict"},
                },
            },
            "json_files": {"type": "list", "elements": "path", "default": []},
            "docker_path": {"type": "str", "default": "docker"},
        },
        supports_check_mode=True,
    )
    p = module.params
    systemd = systemd_runs()
    if p["services"] and systemd and module.get_bin_path("systemctl") is None:
        module.fail_json(msg="/run/systemd/system exists but systemctl is not on PATH; fix the node's PATH.")
    docker = None
    if p["containers"]:
        docker = p["docker_path"] if os.path.isabs(p["docker_path"]) else module.get_bin_path(p["docker_path"])
        if docker is not None and not os.access(docker, os.X_OK):
            docker = None
    module.exit_json(
        changed=False,
        init_system="systemd" if systemd else "sysvinit",
        services={name: service_state(module, name, systemd) for name in p["services"]},
        missing_packages=missing_packages(module, p["packages"]),
        paths={path: os.path.lexists(path) for path in p["paths"]},
        containers={c["name"]: container_state(module, docker, c) for c in p["containers"]},
        json_files={path: json_file(path) for path in p["json_files"]},
    )


if __name__ == "__main__":
    main()
