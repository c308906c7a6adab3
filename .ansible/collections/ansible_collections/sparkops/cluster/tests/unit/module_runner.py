"""Run an Ansible module's main() in-process and capture what it returns.

Used by every module test: sets the module arguments the way ansible-core does
(a JSON blob on _ANSIBLE_ARGS), runs main(), and turns exit_json/fail_json
into a plain dict with `failed` set accordingly.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout, suppress

from ansible.module_utils import basic
from ansible.module_utils.common.text.converters import to_bytes


def run_module(module, args: dict, check_mode: bool = False) -> dict:
    """Run `module.main()` with `args`; return the result dict it printed."""
    payload = dict(args)
    payload["_ansible_check_mode"] = check_mode
    payload.setdefault("_ansible_remote_tmp", "/tmp")
    payload.setdefault("_ansible_keep_remote_files", False)
    basic._ANSIBLE_ARGS = to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": payload}))
    # ansible-core >= 2.19 also caches profile/serialization settings; resetting
    # _ANSIBLE_PROFILE keeps older and newer cores happy.
    if hasattr(basic, "_ANSIBLE_PROFILE"):
        basic._ANSIBLE_PROFILE = "legacy"
    out = io.StringIO()
    with redirect_stdout(out), suppress(SystemExit):
        module.main()
    text = out.getvalue().strip()
    if not text:
        raise AssertionError("module printed nothing")
    # The JSON result is the last line printed.
    return json.loads(text.splitlines()[-1])
