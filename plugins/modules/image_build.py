#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_build
short_description: Run an image build command with its output kept in a log file on the node
description:
  - Runs I(argv) (no shell) in I(chdir), its standard output and error written to I(log_path) as they come, so
    the hour-long build of eugr/spark-vllm-docker can be followed (C(sparkops.cluster.image_build_watch) reads the
    log's end at each poll) and read after it failed.
  - When the command ends, its exit status is written to C(<log_path>.rc); a stale one is removed first.
  - After I(timeout_s) seconds the command and everything it started (its process group) are killed, and the exit
    status is 124.
  - Fails on a non-zero exit with where the build stopped, its error line, the log's last lines and its path.
  - "Meant to run with C(async) and C(poll: 0), followed by C(sparkops.cluster.image_build_watch)."
version_added: "0.3.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  argv:
    description: The command and its arguments, each passed as one word (no shell, so no value is re-parsed).
    type: list
    elements: str
    required: true
  chdir:
    description: Folder to run in (the checkout of the build repository).
    type: path
    required: true
  log_path:
    description: The log file (its folder is created, mode 0755; the file is replaced, mode 0644).
    type: path
    required: true
  run_id:
    description:
      - Names this run; it is written next to the exit status, so that a watch given the same I(run_id)
        never takes an earlier build's status for this one's (the build starts in the background, and the
        first poll can come before it has removed the old status file).
    type: str
  timeout_s:
    description: Seconds the command may run before it is killed.
    type: int
    default: 10800
  tail_lines:
    description: How many of the log's last lines a failure shows.
    type: int
    default: 40
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: In check mode nothing runs and nothing is written; the result says the build would run.
  diff_mode:
    support: none
    details: A build has no file content to show; the log (I(log_path)) says what it did.
"""

EXAMPLES = r"""
- name: Build, the output in a log on the build node
  sparkops.cluster.image_build:
    argv: [./build-and-copy.sh, -t, vllm-node:fc08740fba1e-unlabelled, --vllm-ref, v0.19.0]
    chdir: /var/lib/sparkops/src/spark-vllm-docker
    log_path: /var/lib/sparkops/logs/image-build.log
    run_id: "{{ build_started }}"
  async: 10920
  poll: 0
"""

RETURN = r"""
rc:
  description: The command's exit status (124 when it was killed after I(timeout_s)).
  returned: unless check mode
  type: int
log_path:
  description: The log file.
  returned: always
  type: str
elapsed_s:
  description: Seconds the command ran.
  returned: unless check mode
  type: float
tail:
  description: The log's last I(tail_lines) lines.
  returned: unless check mode
  type: list
  elements: str
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.build_log import failure_message, run_logged, tail_lines

_TAIL_BYTES = 262144


def read_tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def write_rc(path: str, rc: int, run_id: str | None = None) -> None:
    tmp = path + ".rc.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"{rc} {run_id}\n" if run_id else f"{rc}\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path + ".rc")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            argv=dict(type="list", elements="str", required=True),
            chdir=dict(type="path", required=True),
            log_path=dict(type="path", required=True),
            timeout_s=dict(type="int", default=10800),
            tail_lines=dict(type="int", default=40),
            run_id=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not p["argv"]:
        module.fail_json(msg="argv is empty: give the build command and its arguments")
    if not os.path.isdir(p["chdir"]):
        module.fail_json(msg=f"chdir {p['chdir']} is not a folder: check out the build repository first")
    if p["timeout_s"] <= 0:
        module.fail_json(msg=f"timeout_s is {p['timeout_s']}; give the seconds the build may take (> 0)")
    if module.check_mode:
        module.exit_json(changed=True, log_path=p["log_path"], msg="the build would run")
    log_path = p["log_path"]
    try:
        os.makedirs(os.path.dirname(log_path) or ".", mode=0o755, exist_ok=True)
        for stale in (log_path + ".rc", log_path):
            if os.path.exists(stale):
                os.unlink(stale)
        with open(log_path, "w", encoding="utf-8") as f:
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            f.write(f"sparkops: {' '.join(p['argv'])} (in {p['chdir']}), started {now}\n")
        os.chmod(log_path, 0o644)
    except OSError as exc:
        module.fail_json(
            msg=f"cannot write the build log {log_path}: {exc}; check the folder's permissions and free disk"
        )
    rc, elapsed = run_logged(p["argv"], p["chdir"], log_path, p["timeout_s"])
    try:
        write_rc(log_path, rc, p["run_id"])
    except OSError as exc:
        module.warn(f"could not write {log_path}.rc ({exc}); the watch waits until its time limit")
    text = read_tail(log_path)
    result = dict(
        changed=True, rc=rc, log_path=log_path, elapsed_s=round(elapsed, 1), tail=tail_lines(text, p["tail_lines"])
    )
    if rc != 0:
        module.fail_json(msg=failure_message(text, rc, elapsed, log_path, p["tail_lines"]), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
