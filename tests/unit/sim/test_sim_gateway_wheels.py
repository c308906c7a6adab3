"""sim/simctl.py bakes the gateway's packages into the nodes, downloads the gateway's wheels once and serves them as
the test bed's package index (PEP 503), outside the role's default wheelhouse: the head installs from the index."""

from __future__ import annotations

import hashlib
import importlib.util
import platform
import re
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


def test_the_wheels_are_downloaded_once_and_served_as_an_index_not_as_the_roles_wheelhouse(tmp_path, monkeypatch):
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
    # An earlier test bed's wheelhouse, where the role looks by default (sparkops_credentials_dir | dirname ~
    # '/wheelhouse/gateway', the sim's credentials in .sim/credentials): its wheels move to the index, and the
    # folder goes, so that the head installs from the index as a site without a wheelhouse does.
    defaults = yaml.safe_load((ROOT / "roles/sparkops_defaults/defaults/main/cluster.yml").read_text())
    assert defaults["sparkops_gateway_wheelhouse"] == "{{ sparkops_credentials_dir | dirname }}/wheelhouse/gateway"
    conn = (ROOT / "inventory/sim/group_vars/all/connection.yml").read_text()
    assert 'sparkops_credentials_dir: "{{ sparkops_sim_state }}/credentials"' in conn
    earlier = state / "wheelhouse" / "gateway" / f"linux-{platform.machine()}-cp311"
    earlier.mkdir(parents=True)
    (earlier / "kept-1.0-py3-none-any.whl").write_text("")
    dest = simctl.build_gateway_wheels()
    assert not (state / "wheelhouse").exists() and (dest / "kept-1.0-py3-none-any.whl").exists()
    assert dest == state / "pypi" / "files" / f"linux-{platform.machine()}-cp311"
    # PEP 503 pages: the project list, and each project's files with their sha256 (pip checks them).
    listed = (state / "pypi" / "simple" / "index.html").read_text()
    assert 'href="litellm/"' in listed and 'href="prometheus-client/"' in listed
    page = (state / "pypi" / "simple" / "prometheus-client" / "index.html").read_text()
    (href,) = re.findall(r'href="([^"]+)"', page)
    path, digest = href.split("#sha256=")
    wheel = (state / "pypi" / "simple" / "prometheus-client" / path).resolve()
    assert wheel.parent == dest and hashlib.sha256(wheel.read_bytes()).hexdigest() == digest
    inv = (ROOT / "inventory/sim/group_vars/all/cluster.yml").read_text()
    assert f"sparkops_gateway_index_url: {simctl.PYPI_INDEX_URL}" in inv
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
