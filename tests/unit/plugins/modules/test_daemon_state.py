"""daemon_state: the container comparison on a recorded `docker container inspect` of the watchdog
(tests/fixtures/docker/README.md), the package read with this machine's real dpkg-query, paths."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.modules import daemon_state
from module_runner import run_module

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "docker"
INSPECT = json.loads((FIXTURES / "docker-20.10.24_watchdog_container_inspect.json").read_text())[0]
IMAGE_ID = json.loads((FIXTURES / "docker-20.10.24_watchdog_image_inspect.json").read_text())[0]["Id"]
# What roles/watchdog sets (vars/main.yml, watchdog_container_settings) for the recorded container.
WANTED = {
    "name": "sparkops-watchdog",
    "image": INSPECT["Config"]["Image"],
    "command": INSPECT["Config"]["Cmd"],
    "restart_policy": "on-failure",
    "restart_retries": 10,
    "network_mode": "host",
    "pid_mode": "host",
    "binds": ["/:/host"],
    "labels": {"io.sparkops.role": "watchdog"},
}


def test_the_recorded_watchdog_container_has_what_the_role_sets():
    assert INSPECT["Config"]["Cmd"][:3] == ["chroot", "/host", "/usr/bin/python3"]
    assert daemon_state.container_differences(INSPECT, WANTED, IMAGE_ID) == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda i: i.update(Image="sha256:" + "0" * 64), "image"),
        (lambda i: i["Config"]["Cmd"].append("--verbose"), "command"),
        (lambda i: i["HostConfig"]["RestartPolicy"].update(Name="no"), "restart policy"),
        (lambda i: i["HostConfig"]["RestartPolicy"].update(MaximumRetryCount=3), "restart retries"),
        (lambda i: i["HostConfig"].update(NetworkMode="bridge"), "network mode"),
        (lambda i: i["HostConfig"].update(PidMode=""), "pid mode"),
        (lambda i: i.update(Mounts=[]), "bind mounts"),
        (lambda i: i["Config"]["Labels"].pop("io.sparkops.role"), "label io.sparkops.role"),
    ],
)
def test_each_setting_that_drifted_is_named(change, named):
    info = copy.deepcopy(INSPECT)
    change(info)
    diffs = daemon_state.container_differences(info, WANTED, IMAGE_ID)
    assert len(diffs) == 1 and diffs[0].startswith(named), diffs


def test_an_image_missing_on_the_node_is_a_difference_and_settings_left_out_are_not_compared():
    assert daemon_state.container_differences(INSPECT, WANTED, None)[0].startswith("image")
    info = copy.deepcopy(INSPECT)
    info["HostConfig"]["NetworkMode"] = "bridge"
    assert daemon_state.container_differences(info, {"name": "sparkops-watchdog"}, None) == []


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs Debian's dpkg-query")
def test_packages_paths_and_a_missing_container_in_one_run(tmp_path):
    present = tmp_path / "provisioning"
    present.mkdir()
    res = run_module(
        daemon_state,
        {
            "packages": ["dpkg", "sparkops-no-such-package"],
            "paths": [str(present), str(tmp_path / "absent")],
            "containers": [{"name": "sparkops-no-such-container"}],
            "docker_path": str(tmp_path / "no-docker"),
        },
        check_mode=True,
    )
    assert not res.get("failed") and not res["changed"], res
    assert res["missing_packages"] == ["sparkops-no-such-package"]
    assert res["paths"] == {str(present): True, str(tmp_path / "absent"): False}
    assert res["containers"]["sparkops-no-such-container"]["matches"] is False
    assert res["init_system"] in ("systemd", "sysvinit")


def recorded_docker(tmp_path: Path) -> Path:
    """A `docker` that answers `docker inspect NAME...` from the recordings as docker 20.10 does: the
    objects it found as one JSON list, `Error: No such object` on stderr and exit 1 for the others."""
    objects = {
        "sparkops-watchdog": INSPECT,
        INSPECT["Config"]["Image"]: json.loads((FIXTURES / "docker-20.10.24_watchdog_image_inspect.json").read_text())[
            0
        ],
    }
    (tmp_path / "objects.json").write_text(json.dumps(objects))
    script = tmp_path / "docker"
    script.write_text(
        "#!/usr/bin/env python3\nimport json, sys\n"
        f"objects = json.load(open({str(tmp_path / 'objects.json')!r}))\n"
        "assert sys.argv[1] == 'inspect'\n"
        "found = [objects[n] for n in sys.argv[2:] if n in objects]\n"
        "print(json.dumps(found, indent=4))\n"
        "for n in sys.argv[2:]:\n"
        "    if n not in objects:\n"
        "        print(f'Error: No such object: {n}', file=sys.stderr)\n"
        "sys.exit(0 if len(found) == len(sys.argv) - 2 else 1)\n"
    )
    script.chmod(0o755)
    return script


def test_one_docker_inspect_finds_the_container_and_its_image(tmp_path):
    docker = recorded_docker(tmp_path)
    missing_image = dict(WANTED, name="sparkops-watchdog", image="vllm-node:not-built")
    res = run_module(
        daemon_state,
        {"containers": [WANTED], "docker_path": str(docker)},
        check_mode=True,
    )
    assert res["containers"]["sparkops-watchdog"] == {
        "exists": True,
        "running": True,
        "image": INSPECT["Config"]["Image"],
        "differences": [],
        "matches": True,
    }, res
    res = run_module(daemon_state, {"containers": [missing_image], "docker_path": str(docker)})
    state = res["containers"]["sparkops-watchdog"]
    assert state["exists"] and not state["matches"] and state["differences"][0].startswith("image"), state
    res = run_module(daemon_state, {"containers": [dict(WANTED, name="sparkops-gone")], "docker_path": str(docker)})
    assert res["containers"]["sparkops-gone"] == {
        "exists": False,
        "running": False,
        "image": None,
        "differences": ["no such container"],
        "matches": False,
    }


def test_recorded_json_files_are_read_and_a_broken_one_says_why(tmp_path):
    good, broken = tmp_path / "startup-phases.json", tmp_path / "broken.json"
    good.write_text('{"phases": [{"name": "api_ready", "at_s": 412.5}],\n "compile_cache": "hit"}\n')
    broken.write_text('{"phases": [')
    res = run_module(
        daemon_state, {"json_files": [str(good), str(broken), str(tmp_path / "none.json")]}, check_mode=True
    )
    assert not res.get("failed"), res
    files = res["json_files"]
    assert files[str(good)] == {
        "data": {"phases": [{"name": "api_ready", "at_s": 412.5}], "compile_cache": "hit"},
        "error": None,
    }
    assert files[str(broken)]["data"] is None and files[str(broken)]["error"].startswith(str(broken))
    assert files[str(tmp_path / "none.json")] == {"data": None, "error": None}


def test_a_watchdog_without_net_admin_differs_so_the_role_recreates_it():
    """The watchdog reads the host's firewall (iptables -S) before a group restart: the role adds NET_ADMIN
    (vars/main.yml cap_add). The recorded container (docker 20.10.24) has HostConfig.CapAdd null."""
    assert INSPECT["HostConfig"]["CapAdd"] is None
    diffs = daemon_state.container_differences(INSPECT, dict(WANTED, cap_add=["NET_ADMIN"]), IMAGE_ID)
    assert len(diffs) == 1 and diffs[0].startswith("added capabilities"), diffs
    info = copy.deepcopy(INSPECT)
    info["HostConfig"]["CapAdd"] = ["CAP_NET_ADMIN"]  # newer engines store the CAP_ prefix
    assert daemon_state.container_differences(info, dict(WANTED, cap_add=["NET_ADMIN"]), IMAGE_ID) == []
