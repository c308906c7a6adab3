"""sim/simctl.py bakes the gateway's packages into the nodes and downloads its wheelhouse where roles/gateway
looks by default on the test bed (issue 25), once."""

from __future__ import annotations

import importlib.util
import platform
import subprocess
import zipfile
from pathlib import Path

import yaml
from conftest import ROOT


def load_simctl(monkeypatch, state: Path):
    monkeypatch.setenv("SPARKOPS_SIM_STATE", str(state))
    spec = importlib.util.spec_from_file_location("simctl_gateway_under_test", ROOT / "sim" / "simctl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_node_image_has_postgresql_and_venv(tmp_path, monkeypatch):
    simctl = load_simctl(monkeypatch, tmp_path / "state")
    assert {"postgresql", "python3-venv"} <= set(simctl.NODE_PACKAGES)


def test_the_wheelhouse_is_downloaded_once_for_the_nodes_into_the_roles_default_folder(tmp_path, monkeypatch):
    state = tmp_path / "state"
    simctl = load_simctl(monkeypatch, state)
    calls = []

    def pip_download(cmd, **_k):
        # What pip leaves: a wheel per requirement asked for (no dependencies, so nothing more is missing).
        folder = Path(cmd[cmd.index("--dest") + 1])
        for req in cmd[cmd.index("--dest") + 2 :]:
            name = req.split("[")[0].split("=")[0].replace("-", "_")
            with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as z:
                z.writestr(f"{name}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(simctl, "run", pip_download)
    dest = simctl.build_gateway_wheels()
    # The role's default, sparkops_credentials_dir | dirname ~ '/wheelhouse/gateway', with the sim's credentials
    # folder (.sim/credentials, inventory/sim/group_vars/all/connection.yml).
    defaults = yaml.safe_load((ROOT / "roles/sparkops_defaults/defaults/main/cluster.yml").read_text())
    assert defaults["sparkops_gateway_wheelhouse"] == "{{ sparkops_credentials_dir | dirname }}/wheelhouse/gateway"
    conn = (ROOT / "inventory/sim/group_vars/all/connection.yml").read_text()
    assert 'sparkops_credentials_dir: "{{ sparkops_sim_state }}/credentials"' in conn
    assert dest == state / "wheelhouse" / "gateway" / f"linux-{platform.machine()}-cp311"
    [argv] = calls
    assert argv[argv.index("--python-version") + 1] == "3.11"
    assert simctl.NODE_PYTHON == "3.11.2"  # Debian 12's exact Python: its markers decide what else it needs
    assert f"litellm[proxy]=={defaults['sparkops_gateway_litellm_version']}" in argv
    assert "prometheus_client" in argv and "--only-binary=:all:" in argv
    # Debian 12's glibc bounds the platforms: nothing newer than manylinux_2_36.
    platforms = [argv[i + 1] for i, a in enumerate(argv) if a == "--platform"]
    assert platforms[0] == f"manylinux_2_36_{platform.machine()}"
    simctl.build_gateway_wheels()
    assert len(calls) == 1  # cached
