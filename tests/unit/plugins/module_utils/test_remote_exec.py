"""remote_exec: the two ways sparkops runs its own module source in another python3 (as over ssh)."""

from __future__ import annotations

import base64
import subprocess
import sys

from ansible_collections.sparkops.cluster.plugins.module_utils import image_relay, remote_exec
from ansible_collections.sparkops.cluster.plugins.modules import hf_cache_sync


def test_stdin_boot_runs_the_source_and_exits_with_its_entry_status():
    src = b"import sys\ndef main():\n    sys.stdout.write(__name__ + ' ' + sys.stdin.readline())\n    return 3\n"
    boot = remote_exec.stdin_boot("main", "sparkops_test_remote")
    res = subprocess.run(
        [sys.executable, "-c", boot],
        input=str(len(src)).encode() + b"\n" + src + b"control line\n",
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 3 and res.stdout == b"sparkops_test_remote control line\n"


def test_the_weight_sync_session_is_found_by_its_name_on_the_command_line():
    """Operators (and the interrupted-sync test) find the target's receiver with `pkill -f sparkops_hf_cache_remote`."""
    assert "sparkops_hf_cache_remote" in hf_cache_sync.REMOTE_BOOT


def test_argv_boot_carries_the_relay_file_whole():
    assert base64.b64decode(remote_exec.source_b64(image_relay)) == remote_exec.source(image_relay)
    assert (
        remote_exec.stdin_preamble(image_relay).split(b"\n", 1)[0] == str(len(remote_exec.source(image_relay))).encode()
    )
