#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Read the NVIDIA GPUs, driver version and branch of a host through nvidia-smi
description:
  - Runs C(nvidia-smi --query-gpu=driver_version,name,compute_cap,memory.total,memory.used,pci.bus_id,uuid,index
    --format=csv,noheader,nounits) and plain C(nvidia-smi) (for the C(CUDA Version) the driver supports), and
    reads the loaded kernel module's version from I(proc_version_path).
  - A host without nvidia-smi, or whose nvidia-smi cannot communicate with the driver, is reported with
    I(gpu_present=false) and a I(reason); that is not a failure.
  - Fails when nvidia-smi reports a driver/library version mismatch (the loaded kernel module differs from the
    user-space driver, typically after a driver update without a reboot), or prints something unexpected.
  - On a DGX Spark (GB10) C(memory.total) is C([N/A]) (unified memory); I(memory_total_mib) is then null.
  - With I(packages), also reads those Debian packages' versions and apt selections with one
    C(dpkg-query), so that a role needs no second module run for the driver packages.
  - With I(files), also reports those files' existence, mode and SHA-1, so that a role can skip writing a file
    (the driver pin) that is already in place, without a module run of its own.
  - Returns plain results, not ansible_facts. Read-only.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  nvidia_smi_path:
    description: The nvidia-smi executable (a name looked up on PATH, or a path).
    type: str
    default: nvidia-smi
  proc_version_path:
    description: File holding the loaded kernel module's version; unreadable means unknown, not a failure.
    type: path
    default: /proc/driver/nvidia/version
  expected_branch:
    description:
      - Driver branch every version must be on for I(on_branch) to be true (both the user-space driver and the
        loaded kernel module). DGX Sparks run the 580 branch; 590.x regresses on GB10.
    type: str
    default: "580"
  timeout_s:
    description: Timeout of one nvidia-smi run, in seconds.
    type: float
    default: 30
  packages:
    description: Debian packages (the driver's) to report in I(packages), read with C(dpkg-query).
    type: list
    elements: str
    default: []
  query_gpu:
    description:
      - Ask nvidia-smi. C(false) reads only I(packages) and the kernel module's version - right after a driver
        package changed, nvidia-smi fails with a driver/library mismatch until the reboot.
    type: bool
    default: true
  files:
    description: Files whose existence, kind, mode and SHA-1 to report in I(files).
    type: list
    elements: path
    default: []
    version_added: "0.7.0"
  package_version:
    description:
      - The exact version every package of I(packages) must be at for I(install_needed) to be false; empty
        accepts any installed version (the branch is judged apart, I(off_branch)).
    type: str
    default: ""
  files_wanted:
    description:
      - What the role would write - each entry's C(path) must be of C(kind), have C(mode) and, given C(sha1), that
        SHA-1 (C(hash('sha1')) of the rendered content); those that are not are I(files_stale).
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The file or folder.
        type: path
        required: true
      kind:
        description: What it must be.
        type: str
        choices: [file, directory]
        default: file
      mode:
        description: Its mode, four octal digits such as C(0644).
        type: str
        required: true
      sha1:
        description: The SHA-1 of the content it must hold; left out, the content is not compared.
        type: str
extends_documentation_fragment:
  - sparkops.cluster.attributes
  - sparkops.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Read the GPU and driver
  sparkops.cluster.gpu_facts:
  register: gpu

- name: Stop unless the driver is on the 580 branch
  ansible.builtin.assert:
    that: gpu.gpu_present and gpu.on_branch
    fail_msg: "{{ gpu.reason or gpu.branch_reason }}"

- name: Read through a container's nvidia-smi wrapper, expecting another branch
  sparkops.cluster.gpu_facts:
    nvidia_smi_path: /usr/local/bin/nvidia-smi
    expected_branch: "590"
"""

RETURN = r"""
gpu_present:
  description: Whether nvidia-smi answered with at least one GPU.
  returned: always
  type: bool
reason:
  description: Why I(gpu_present) is false (nvidia-smi missing, or it cannot talk to the driver); null otherwise.
  returned: always
  type: str
gpu_count:
  description: Number of GPUs nvidia-smi listed.
  returned: always
  type: int
gpus:
  description:
    - One entry per GPU, keys C(index), C(name), C(driver_version), C(compute_capability) (for example C(12.1)),
      C(memory_total_mib) and C(memory_used_mib) (null when nvidia-smi says C([N/A]), as on a GB10), C(uuid),
      C(pci_bus_id).
  returned: always
  type: list
  elements: dict
driver_version:
  description: User-space driver version (for example C(580.159.04)); null when unknown.
  returned: always
  type: str
driver_branch:
  description: Branch of I(driver_version) (or of the kernel module when nvidia-smi gave none), for example C(580).
  returned: always
  type: str
kernel_module_version:
  description: Version of the loaded kernel module from I(proc_version_path); null when unreadable.
  returned: always
  type: str
kernel_module_flavor:
  description: C(open) or C(proprietary) kernel module; null when unknown.
  returned: always
  type: str
kernel_module_matches:
  description:
    - Whether the loaded kernel module and the user-space driver have the same version; null when either is unknown.
  returned: always
  type: bool
expected_branch:
  description: The I(expected_branch) checked against.
  returned: always
  type: str
on_branch:
  description:
    - Whether every known version (driver and kernel module) is on I(expected_branch); false when none is known.
  returned: always
  type: bool
branch_reason:
  description: Why I(on_branch) is false; null when it is true.
  returned: always
  type: str
cuda_driver_version:
  description:
    - Newest CUDA version the driver supports (C(CUDA Version) of the nvidia-smi banner); null when not obtainable.
  returned: always
  type: str
packages:
  description:
    - One entry per package of I(packages) that dpkg knows, keys C(version), C(selection) (C(install), C(hold),
      C(deinstall), C(purge)) and C(installed) (whether its status is C(installed)). A package dpkg has never
      seen is absent; no C(dpkg-query) on the host leaves it empty.
  returned: always
  type: dict
  sample: {"nvidia-driver-580-open": {"version": "580.95.05-0ubuntu1", "selection": "hold", "installed": true}}
files:
  description: Per path of I(files), C(exists), C(kind) (C(file), C(directory), C(link), C(other)), C(mode) and C(sha1).
  returned: always
  type: dict
  sample: {"/etc/apt/preferences.d/sparkops-nvidia-driver-pin": {"exists": true, "kind": "file", "mode": "0644",
           "sha1": "0a4d55a8d778e5022fab701977c5d840bbc486d0"}}
installed:
  description: Per package of I(packages) that is installed, its version.
  returned: always
  type: dict
  sample: {"nvidia-driver-580-open": "580.95.05-0ubuntu1"}
held:
  description: The packages of I(packages) whose apt selection is C(hold).
  returned: always
  type: list
  elements: str
unheld:
  description: The packages of I(packages) not held, in the order given.
  returned: always
  type: list
  elements: str
packages_on_branch:
  description: The installed packages whose version is on I(expected_branch).
  returned: always
  type: list
  elements: str
packages_not_on_branch:
  description: The packages of I(packages) not installed on I(expected_branch) (missing or another branch).
  returned: always
  type: list
  elements: str
off_branch:
  description:
    - Whether an installed package, or the driver of a GPU that answered, is off I(expected_branch) (fixing it
      needs a reboot).
  returned: always
  type: bool
install_needed:
  description: Whether a package of I(packages) is missing, or not at I(package_version) when one is given.
  returned: always
  type: bool
files_stale:
  description: The paths of I(files_wanted) not in place (missing, other kind, mode or content).
  returned: always
  type: list
  elements: str
"""

import subprocess
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.driver_packages import package_verdicts
from ansible_collections.sparkops.cluster.plugins.module_utils.node_read import (
    FILES_WANTED_SPEC,
    file_states,
    files_with_wanted,
    stale_files,
    wanted_problems,
)
from ansible_collections.sparkops.cluster.plugins.module_utils.nvidia_smi import (
    NvidiaSmiError,
    branch_status,
    driver_branch,
    driver_mismatch,
    gpus_from_rows,
    no_driver_reason,
    parse_banner,
    parse_proc_version,
    parse_query_csv,
    query_args,
)


class SmiMissing(Exception):
    pass


def _run(argv: list[str], timeout: float):
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (FileNotFoundError, PermissionError) as exc:
        raise SmiMissing(f"{argv[0]} not found or not executable ({exc.strerror or exc})") from exc
    return proc.returncode, proc.stdout or "", proc.stderr or ""


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def gather(p: dict) -> tuple[dict, str | None]:
    """Return (result fields, error message or None)."""
    proc = _read(p["proc_version_path"])
    module = parse_proc_version(proc) if proc else parse_proc_version("")
    result = {
        "gpu_present": False,
        "reason": None,
        "gpu_count": 0,
        "gpus": [],
        "driver_version": None,
        "driver_branch": None,
        "kernel_module_version": module["kernel_module_version"],
        "kernel_module_flavor": module["kernel_module_flavor"],
        "kernel_module_matches": None,
        "expected_branch": p["expected_branch"],
        "on_branch": False,
        "branch_reason": None,
        "cuda_driver_version": None,
    }
    if not p.get("query_gpu", True):
        result["reason"] = "nvidia-smi not asked (query_gpu=false)"
        return _with_branch(result, p), None
    smi = p["nvidia_smi_path"]
    error = None
    try:
        rc, out, err = _run([smi, *query_args()], p["timeout_s"])
    except SmiMissing as exc:
        result["reason"] = f"{exc}: no NVIDIA driver user space on this host"
    except subprocess.TimeoutExpired:
        error = f"{smi} did not answer within {p['timeout_s']:g} s (a hung GPU or driver; check dmesg for Xid errors)"
    else:
        both = f"{out}\n{err}"
        mismatch = driver_mismatch(both)
        if mismatch is not None:
            lib = f" (NVML library {mismatch})" if mismatch else ""
            kmod = result["kernel_module_version"] or "unknown"
            error = (
                f"nvidia-smi reports a driver/library version mismatch{lib}: the loaded kernel module is {kmod}. "
                "The driver was updated without a reboot; reboot the host (or reload the nvidia modules)."
            )
        elif no_driver_reason(both):
            result["reason"] = no_driver_reason(both)
        elif rc != 0:
            tail = " ".join(both.split())[-400:]
            error = f"{smi} failed (rc={rc}): {tail}"
        else:
            try:
                gpus = gpus_from_rows(parse_query_csv(out))
            except NvidiaSmiError as exc:
                error = f"could not read {smi} output: {exc}"
            else:
                result.update(
                    gpu_present=True, gpus=gpus, gpu_count=len(gpus), driver_version=gpus[0]["driver_version"]
                )
                try:
                    rc2, banner, _err = _run([smi], p["timeout_s"])
                except (SmiMissing, subprocess.TimeoutExpired):
                    rc2, banner = 1, ""
                if rc2 == 0:
                    result["cuda_driver_version"] = parse_banner(banner)["cuda_driver_version"]
    return _with_branch(result, p), error


def _with_branch(result: dict, p: dict) -> dict:
    drv, kmod = result["driver_version"], result["kernel_module_version"]
    result["driver_branch"] = driver_branch(drv) or driver_branch(kmod)
    if drv and kmod:
        result["kernel_module_matches"] = drv == kmod
    status = branch_status(p["expected_branch"], drv, kmod)
    result["on_branch"] = status["on_branch"]
    result["branch_reason"] = status["reason"]
    return result


def read_packages(names: list, timeout: float) -> dict:
    """Version, apt selection and installed state of each package dpkg knows (dpkg-query exits 1 for the rest)."""
    if not names:
        return {}
    fmt = "${Package}\t${Version}\t${db:Status-Want}\t${db:Status-Status}\n"
    try:
        rc, out, _err = _run(["dpkg-query", "-W", f"-f={fmt}", *names], timeout)
    except (SmiMissing, subprocess.TimeoutExpired):
        return {}
    found = {}
    for line in out.splitlines() if rc in (0, 1) else []:
        fields = line.split("\t")
        if len(fields) == 4 and fields[0] in names:
            found[fields[0]] = {
                "version": fields[1] or None,
                "selection": fields[2],
                "installed": fields[3] == "installed",
            }
    return found


def main():
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi_path": {"type": "str", "default": "nvidia-smi"},
            "proc_version_path": {"type": "path", "default": "/proc/driver/nvidia/version"},
            "expected_branch": {"type": "str", "default": "580"},
            "timeout_s": {"type": "float", "default": 30},
            "packages": {"type": "list", "elements": "str", "default": []},
            "query_gpu": {"type": "bool", "default": True},
            "files": {"type": "list", "elements": "path", "default": []},
            "package_version": {"type": "str", "default": ""},
            "files_wanted": FILES_WANTED_SPEC,
        },
        supports_check_mode=True,
    )
    p = module.params
    if not p["expected_branch"].isdigit():
        module.fail_json(
            msg=f"expected_branch must be a driver branch number such as 580, got {p['expected_branch']!r}"
        )
    if p["timeout_s"] <= 0:
        module.fail_json(msg=f"timeout_s must be positive, got {p['timeout_s']:g}")
    problems = wanted_problems(p["files_wanted"])
    if problems:
        module.fail_json(msg="; ".join(problems))
    result, error = gather(p)
    result["packages"] = read_packages(p["packages"], p["timeout_s"])
    result.update(
        package_verdicts(result["packages"], p["packages"], p["expected_branch"], p["package_version"], result)
    )
    result["files"] = file_states(files_with_wanted(p["files"], p["files_wanted"]))
    result["files_stale"] = stale_files(p["files_wanted"], result["files"])
    if error:
        module.fail_json(msg=error, changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
