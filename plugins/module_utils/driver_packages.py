# Copyright: sparkops maintainers
# Apache-2.0
"""What the nvidia_driver role judges from gpu_facts' package read, as ready answers (standard library only)."""

from __future__ import annotations

import re


def package_verdicts(found: dict, packages: list, branch: str, version: str, gpu: dict) -> dict:
    """From read_packages()' {name: {version, selection, installed}}: which driver packages are installed
    (name -> version), held, not held, on the branch; whether one (or the loaded driver, when a GPU answered)
    is off the branch, and whether an install is needed (a package missing, or not at `version` when set)."""
    installed = {name: x["version"] for name, x in found.items() if x["installed"]}
    held = [name for name, x in found.items() if x["selection"] == "hold"]
    on_branch = [name for name, v in installed.items() if re.match(re.escape(branch) + r"\.", v or "")]
    return {
        "installed": installed,
        "held": held,
        "unheld": [name for name in packages if name not in held],
        "packages_on_branch": on_branch,
        "packages_not_on_branch": [name for name in packages if name not in on_branch],
        # Fixing either needs a reboot (the role refuses without permission).
        "off_branch": len(installed) > len(on_branch)
        or (bool(gpu.get("gpu_present")) and not gpu.get("on_branch", True)),
        "install_needed": len(installed) < len(packages)
        or (version != "" and any(v != version for v in installed.values())),
    }
