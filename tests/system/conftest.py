"""System tests start real daemons on loopback (sshd, rsync, a Hub-speaking HTTP server) and run real
clients against them.

The huggingface_hub versions tested live in HUB_CLIENT_VERSIONS, one place. Each is installed with pip
into ``.cache/hub-clients/<version>`` (not the project venv: two versions side by side) the first time it
is needed; `tests/run-stages.sh system` does the same up front. Without PyPI the tests skip, unless
SPARKOPS_REQUIRE_HUB_CLIENTS=1 (CI), where a missing client fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

# 0.36.x: the last 0.x line (requests-based, hf_transfer); 1.33.0: the newest 1.x (httpx-based).
HUB_CLIENT_VERSIONS = ("0.36.2", "1.33.0")
CLIENTS = ROOT / ".cache" / "hub-clients"


def install_hub_client(version: str) -> Path:
    target = CLIENTS / version
    marker = target / ".installed"
    if not marker.exists():
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--upgrade",
                "--target",
                str(target),
                f"huggingface_hub[cli]=={version}",
            ],
            check=True,
            timeout=600,
        )
        marker.write_text(version)
    return target


@pytest.fixture(scope="session", params=HUB_CLIENT_VERSIONS)
def hub_client(request):
    """(version, PYTHONPATH dir) of a real huggingface_hub install."""
    try:
        return request.param, install_hub_client(request.param)
    except (subprocess.SubprocessError, OSError) as exc:
        if os.environ.get("SPARKOPS_REQUIRE_HUB_CLIENTS") == "1":
            pytest.fail(f"SPARKOPS_REQUIRE_HUB_CLIENTS=1 but huggingface_hub {request.param} did not install: {exc}")
        pytest.skip(f"huggingface_hub {request.param} could not be installed (no PyPI?): {exc}")


@pytest.fixture
def sshd(tmp_path):
    """A throw-away sshd on loopback (sshd_helpers.LoopbackSshd) for the tests that ssh to a "node".

    Skipped where it cannot run (no openssh-server, not root), unless SPARKOPS_REQUIRE_SSHD=1 (CI).
    """
    from sshd_helpers import LoopbackSshd, sshd_available  # noqa: PLC0415 - HERE is on sys.path above

    reason = sshd_available()
    if reason:
        if os.environ.get("SPARKOPS_REQUIRE_SSHD") == "1":
            pytest.fail(f"SPARKOPS_REQUIRE_SSHD=1 but {reason}")
        pytest.skip(reason)
    (tmp_path / "ssh").mkdir()
    server = LoopbackSshd(tmp_path / "ssh").start()
    yield server
    server.stop()
