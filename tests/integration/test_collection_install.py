"""sparkops.cluster installed the way a user installs it, run by FQCN against the simulated cluster.

The tarball is built and installed (tests/collection-checks.sh install) next to only the
collections galaxy.yml declares, with a config that hides the checkout and the `ansible`
package's bundle. `report` and `status` then run by FQCN from there, on a copy of the sim
inventory that keeps its state next to itself (the shipped default, inventory_dir), and the
installed collection's file listing must not change.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, SIM_STATE, ansible_env, api_key, copy_inventory

pytestmark = pytest.mark.usefixtures("sim_cluster")


def _listing(root: Path) -> dict[str, tuple[int, str]]:
    """Every file under root -> (size, sha256): what a write inside the collection would change."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() or path.is_symlink():
            data = path.read_bytes() if path.is_file() else os.readlink(path).encode()
            out[str(path.relative_to(root))] = (len(data), hashlib.sha256(data).hexdigest())
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    work = tmp_path_factory.mktemp("collection")
    env = dict(os.environ, SPARKOPS_COLLECTION_WORK=str(work))
    res = subprocess.run(
        [str(ROOT / "tests" / "collection-checks.sh"), "install"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    info = dict(
        line.split("=", 1)
        for line in subprocess.run(
            [str(ROOT / "tests" / "collection-checks.sh"), "env"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout.splitlines()
    )
    assert Path(info["SPARKOPS_INSTALLED_COLLECTION"], "MANIFEST.json").is_file()
    info["WORK"] = str(work)
    return info


def _inventory_with_state_next_to_it(tmp_path: Path) -> Path:
    """inventory/sim, copied, without the sim's state overrides: the shipped inventory_dir defaults apply."""
    inv = copy_inventory(tmp_path)
    conn = inv / "group_vars" / "all" / "connection.yml"
    kept = [
        line
        for line in conn.read_text().splitlines()
        if not re.match(
            r"(sparkops_controller_state_dir|sparkops_credentials_dir|sparkops_reports_dir|sparkops_lock_file):", line
        )
    ]
    conn.write_text("\n".join(kept) + "\n")
    return inv


def _run_fqcn(installed: dict, playbook: str, inv: Path, *args: str) -> subprocess.CompletedProcess:
    env = ansible_env({"ANSIBLE_CONFIG": installed["ANSIBLE_CONFIG"], "SPARKOPS_SIM_STATE": str(SIM_STATE)})
    return subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(inv), f"sparkops.cluster.{playbook}", *args],
        capture_output=True,
        text=True,
        cwd=installed["WORK"],  # not the checkout: nothing of it may be found by accident
        env=env,
        timeout=900,
        check=False,
    )


def test_report_and_status_by_fqcn_write_nothing_inside_the_collection(installed, tmp_path):
    collection = Path(installed["SPARKOPS_INSTALLED_COLLECTION"])
    before = _listing(collection)
    assert "playbooks/report.yml" in before and "playbooks/site.yml" in before
    inv = _inventory_with_state_next_to_it(tmp_path)
    state = inv.parent / f"{inv.name}-state"  # the controller's state folder beside the inventory
    key_file = state / "credentials" / "api_key"

    # No key yet: the read-only playbooks must not make one, in check mode or not.
    res = _run_fqcn(installed, "report", inv)
    assert res.returncode != 0
    assert "No API key" in res.stdout and "serve.yml" in res.stdout, res.stdout[-3000:]
    res = _run_fqcn(installed, "report", inv, "--check")
    assert res.returncode != 0 and "No API key" in res.stdout, res.stdout[-3000:]
    res = _run_fqcn(installed, "status", inv)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert not key_file.exists(), "a read-only playbook created the API key"
    assert not (state / "credentials").exists() and not (inv / "credentials").exists()

    # With the cluster's key next to the inventory, report and status work and leave it alone.
    key_file.parent.mkdir(mode=0o700, parents=True)
    key_file.write_text(api_key() + "\n")
    key_file.chmod(0o600)
    key_before = (key_file.read_bytes(), key_file.stat().st_mtime_ns)

    res = _run_fqcn(installed, "report", inv)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    health = state / "reports" / "health.md"
    assert health.is_file(), "the report did not land in the state folder beside the inventory"
    assert re.search(r"\| healthy \| (yes|true|True)", health.read_text(), re.I), health.read_text()[:1500]

    res = _run_fqcn(installed, "status", inv)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    res = _run_fqcn(installed, "status", inv, "--check")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]

    assert (key_file.read_bytes(), key_file.stat().st_mtime_ns) == key_before, "a read-only playbook rewrote the key"
    after = _listing(collection)
    added = sorted(set(after) - set(before))
    changed = sorted(k for k in before if k in after and after[k] != before[k])
    removed = sorted(set(before) - set(after))
    assert not (added or changed or removed), f"inside the collection: added {added}, changed {changed}, gone {removed}"
