#!/usr/bin/python
"""Documentation of the image_build_watch action plugin (plugins/action/image_build_watch.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: image_build_watch
short_description: Say where a running image build is (phase, step, time), from its log on the build node
description:
  - Reads the end of the log that C(sparkops.cluster.image_build) writes, and its exit status file
    (C(<log_path>.rc)), on the task's host (one C(tail) over the connection).
  - Returns the phase of eugr/spark-vllm-docker's build (C(FlashInfer), C(vLLM), C(runner image), from the
    Dockerfile's stage names and build-and-copy.sh's own lines), the BuildKit step and the time since I(started),
    in RV(msg). The result is shown at every retry of an C(until) loop without C(-v).
  - Once the build has ended, RV(finished) is true; a non-zero exit status fails the task with where the build
    stopped, its error line, the log's last lines and the log's path.
  - Runs as an action plugin on the controller; it never changes the node.
version_added: "0.3.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  log_path:
    description: The build log on the node (C(image_build)'s I(log_path)).
    type: path
    required: true
  started:
    description: When the build started, seconds since the epoch (the controller's clock).
    type: float
  run_id:
    description: The I(run_id) given to M(sparkops.cluster.image_build); only that run's exit status counts.
    type: str
  timeout_s:
    description: The build's limit; without an exit status this long (plus 5 minutes) after I(started), it fails.
    type: int
    default: 10800
  tail_lines:
    description: How many of the log's last lines a failure shows.
    type: int
    default: 40
  wait_s:
    description:
      - Wait up to this many seconds for the build to end before returning, reading the log again every 2 seconds;
        it returns as soon as the build has ended. With an C(until) loop, this is the poll, so the loop's C(delay)
        can be short, and the build's end is seen within 2 seconds instead of up to a whole delay later.
      - C(0) reads the log once.
    type: int
    default: 0
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: In check mode no build runs, so the watch is skipped and says so.
  diff_mode:
    support: none
    details: It only reads.
"""

EXAMPLES = r"""
- name: Wait for the build, saying where it is at each poll
  sparkops.cluster.image_build_watch:
    log_path: /var/lib/sparkops/logs/image-build.log
    started: "{{ build_started }}"
    run_id: "{{ build_started }}"
    wait_s: 30
  register: build
  until: build.finished
  retries: 400
  delay: 1
"""

RETURN = r"""
finished:
  description: Whether the build has ended (its exit status file exists).
  returned: always
  type: bool
rc:
  description: The build's exit status, null while it runs.
  returned: always
  type: int
phase:
  description: C(FlashInfer), C(vLLM), C(runner image), C(base image (CUDA, NCCL)) or null before the first.
  returned: always
  type: str
step:
  description: The BuildKit step, e.g. C(vllm-builder 7/9).
  returned: always
  type: str
elapsed_s:
  description: Seconds since I(started).
  returned: always
  type: float
msg:
  description: One line saying what is building, which step, for how long, and the log's path.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.build_log import WATCH_ARGUMENT_SPEC


def main():
    module = AnsibleModule(argument_spec=WATCH_ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="image_build_watch runs on the controller as an action plugin; it is never sent to a host.")


if __name__ == "__main__":
    main()
