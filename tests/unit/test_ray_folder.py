"""Ray's host folder is out of other local users' reach (issue 23: "shared folders").

Ray makes its session folders 0777 and the fast-path proof (root) reads NCCL's logs in them: the
folder the containers mount as /tmp/ray must lie under one only root may enter, created before it.
The role variables are templated by ansible-core's own Templar from the role files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests/unit/plugins/plugin_utils"))
from role_templates import trusted  # noqa: E402


def _variables():
    names = {}
    for path in sorted((ROOT / "roles/sparkops_defaults/defaults/main").glob("*.yml")):
        names.update(yaml.safe_load(path.read_text()) or {})
    names.update(yaml.safe_load((ROOT / "roles/ray_cluster/vars/main.yml").read_text()))
    names.update(yaml.safe_load((ROOT / "roles/fastpath/defaults/main.yml").read_text()))
    return trusted(names)


def _template(expr: str):
    from ansible.template import Templar  # noqa: PLC0415

    return Templar(variables=_variables()).template(trusted(expr))


def test_rays_folder_is_created_under_a_root_only_folder_first():
    dirs = _template("{{ ray_cluster_mount_dirs }}")
    paths = [d["path"] for d in dirs]
    ray = next(v.split(":")[0] for v in _template("{{ sparkops_container_volumes }}") if v.endswith(":/tmp/ray"))
    private = next(d for d in dirs if d["mode"] == "0700")
    assert private == {"path": "/var/lib/sparkops/private", "mode": "0700"}
    assert paths.index(private["path"]) < paths.index(ray)  # closed before Ray's folder is made in it
    assert Path(ray).parent == Path(private["path"])
    assert {"path": ray, "mode": "0777"} in dirs  # Ray's own mode, so reruns change nothing
    # nothing else world-writable, and no other mounted folder inside the closed one by accident
    assert [d["path"] for d in dirs if d["mode"] == "0777"] == [ray]


def test_the_fast_path_proof_reads_logs_only_under_the_closed_folder():
    globs = _template("{{ fastpath_nccl_log_globs }}")
    private = _template("{{ sparkops_private_dir }}")
    assert globs and all(g.startswith(private + "/ray/") for g in globs)
    doctor = (ROOT / "playbooks/doctor.yml").read_text()
    assert "/var/lib/sparkops/ray" not in doctor and "sparkops_ray_dir ~ '/session_latest/logs/" in doctor
