#!/usr/bin/env python3
"""Build the simulated cluster's local apt repository of dummy NVIDIA driver packages.

The packages carry the real package names and versions seen on DGX OS and in
NVIDIA's CUDA repository, but contain only a marker file. They exist so that the
driver pin (apt preferences + dpkg holds) is tested for real: after the
nvidia_driver role, `apt-get upgrade` must keep 580.x although 590.x is
offered, and removing the pin must let 590 in (which proves the test can fail).

The repository is "flat" (Packages and Release in one folder) and is used as
`deb [trusted=yes] file:/srv/sparkops-sim/apt ./` inside the nodes.

Usage: make_repo.py OUT_DIR
"""

from __future__ import annotations

import gzip
import hashlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (name, version, depends). The 580 versions are ones seen on Sparks; 590 is the
# branch with the GB10 regression. `nvidia-open` is the CUDA-repo metapackage
# whose name does not carry the branch: the one a careless upgrade moves to 590.
PACKAGES = [
    ("nvidia-driver-580-open", "580.95.05-0ubuntu1", "nvidia-dkms-580-open (= 580.95.05-0ubuntu1)"),
    ("nvidia-dkms-580-open", "580.95.05-0ubuntu1", ""),
    ("nvidia-driver-580-open", "580.126.09-0ubuntu1", "nvidia-dkms-580-open (= 580.126.09-0ubuntu1)"),
    ("nvidia-dkms-580-open", "580.126.09-0ubuntu1", ""),
    ("nvidia-open", "580.95.05-1", "nvidia-driver-580-open"),
    ("nvidia-open", "580.126.09-1", "nvidia-driver-580-open"),
    ("nvidia-open", "590.44.01-1", ""),
    ("nvidia-driver-pinning-580", "580.126.09-1", ""),
]


def build_deb(workdir: Path, name: str, version: str, depends: str) -> Path:
    root = workdir / f"{name}_{version}"
    (root / "DEBIAN").mkdir(parents=True)
    marker = root / "usr" / "share" / "sparkops-sim" / name
    marker.parent.mkdir(parents=True)
    marker.write_text(f"{name} {version}: a dummy package of the sparkops simulated cluster\n")
    control = [
        f"Package: {name}",
        f"Version: {version}",
        "Architecture: all",
        "Maintainer: sparkops test bed <sim@sparkops.invalid>",
        "Section: misc",
        "Priority: optional",
    ]
    if depends:
        control.append(f"Depends: {depends}")
    control.append(f"Description: dummy {name} {version} for the sparkops simulated cluster")
    (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
    deb = workdir / f"{name}_{version}_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)], check=True, capture_output=True
    )
    return deb


def control_of(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout


def main(out_dir: str) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stanzas = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, version, depends in PACKAGES:
            deb = build_deb(Path(tmp), name, version, depends)
            data = deb.read_bytes()
            target = out / deb.name
            target.write_bytes(data)
            stanza = control_of(deb).rstrip("\n")
            stanza += f"\nFilename: ./{deb.name}\nSize: {len(data)}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
            stanzas.append(stanza)
    packages = ("\n".join(stanzas)).encode()
    (out / "Packages").write_bytes(packages)
    (out / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    lines = [
        "Origin: sparkops-sim",
        "Label: sparkops-sim",
        "Suite: sim",
        "Codename: sim",
        "Architectures: all amd64 arm64",
        "Date: " + time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime(0)),
        "SHA256:",
    ]
    for fname in ("Packages", "Packages.gz"):
        data = (out / fname).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {fname}")
    (out / "Release").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
