#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gateway_reload
short_description: Make the gateway serve its new configuration with no failed client request
description:
  - The gateway (LiteLLM's proxy on the head, C(docs/gateway.md)) runs under gunicorn with uvicorn's worker
    class and no C(--preload), and LiteLLM reads its configuration only when a worker starts. This module
    compares the SHA-256 of I(config) with what the live workers loaded (their ready files in I(ready_dir),
    written by the app wrapper once LiteLLM's startup completed). When they differ it sends the master
    C(SIGTTIN) (one worker more, which loads the file), waits until that worker's ready file holds the new
    digest, then sends C(SIGTTOU), and gunicorn retires its OLDEST worker, which stops accepting and finishes its
    requests. There is always a ready worker; gunicorn's C(SIGHUP) would stop the old workers without waiting
    for the new ones (C(docs/gateway.md), "Reloads").
  - Before it sends C(SIGTTIN) it checks that a new worker would load the app (the wrapper's import and its
    secret files, run by the master's Python with the master's environment, as I(user)); if not, it fails and
    signals nothing, since gunicorn's master stops every worker when a new one fails to boot.
  - With workers of an earlier reload still finishing their requests, it sends one C(SIGTTIN) per such worker
    more and as many C(SIGTTOU) once the new worker exists (gunicorn counts a worker until it has exited).
  - If the new worker is not ready within I(timeout) the module fails with the end of the gateway's log and
    signals nothing more; the old worker keeps serving the previous configuration. A later run picks up a
    worker that was still starting.
  - Runs on the gateway's node as root or as the gateway's I(user). As root it forks a child that becomes
    I(user) (groups, gid and uid) before it reads anything, because the run folder and everything in it belong to that
    user, so the reload reads, writes and signals only what that user could. It follows no link there, reads
    only regular files, and signals only a pid whose process is I(user)'s gunicorn master running the gateway's
    app (C(/proc/<pid>/status) and C(/proc/<pid>/cmdline)); a pidfile naming anything else is refused.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  config:
    description: LiteLLM's configuration file the gateway's C(CONFIG_FILE_PATH) names.
    type: path
    required: true
  pidfile:
    description: gunicorn's pidfile (its C(--pid)), the master's pid.
    type: path
    default: /run/sparkops-gateway/gunicorn.pid
  ready_dir:
    description: Where the workers write C(<pid>.ready) (the service's C(SPARKOPS_GATEWAY_READY_DIR)).
    type: path
    default: /run/sparkops-gateway
  user:
    description: The gateway's service user (name or uid), which runs gunicorn; never root.
    type: str
    default: sparkops-gateway
  timeout:
    description: Seconds to wait for the new worker to be ready (LiteLLM starts in 5-12 s, a minute the first time).
    type: int
    default: 180
  force:
    description:
      - Start a new worker even when the live one already loaded this configuration, e.g. because the secrets or
        the wrapper it imports at start changed.
    type: bool
    default: false
  wait_old_exit:
    description:
      - Also wait, at most I(old_exit_timeout) seconds, until the retired worker(s) have exited, i.e. every request
        they were serving has ended. A blue-green switch needs this before it stops the replica it drained.
    type: bool
    default: false
  old_exit_timeout:
    description: How long I(wait_old_exit) waits (at least the longest stream a client may hold).
    type: int
    default: 660
  log_file:
    description: The gateway's log file, quoted when it fails (the init script's); without it, I(unit)'s journal.
    type: path
  unit:
    description: The gateway's systemd unit, whose journal is quoted when it fails and I(log_file) is not given.
    type: str
    default: sparkops-gateway
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: Reads the digests and says whether it would start a worker and which ones it would retire; sends nothing.
  diff_mode:
    support: none
    details: C(old_pids), C(new_pid) and C(digest) say what changed.
seealso:
  - module: sparkops.cluster.gateway_key
"""

EXAMPLES = r"""
- name: Make the gateway serve its new configuration
  sparkops.cluster.gateway_reload:
    config: /etc/sparkops/gateway/config.yaml
  become: true

- name: Switch the routing off a drained replica and wait until its last stream ended
  sparkops.cluster.gateway_reload:
    config: /etc/sparkops/gateway/config.yaml
    wait_old_exit: true
    old_exit_timeout: 900
    log_file: /var/log/sparkops-gateway.log
  become: true
"""

RETURN = r"""
changed:
  description: Whether a new worker was started (or, in check mode, would be).
  returned: always
  type: bool
digest:
  description: SHA-256 of I(config).
  returned: always
  type: str
master_pid:
  description: gunicorn's master.
  returned: always
  type: int
new_pid:
  description: The worker that serves I(config) now.
  returned: always
  type: int
old_pids:
  description: The workers retired (to be retired, in check mode).
  returned: always
  type: list
  elements: int
switch_s:
  description: Seconds from the start of the run to the retirement of the old worker(s); null when nothing was switched.
  returned: always
  type: float
old_exited:
  description: With I(wait_old_exit), true once the retired workers have exited.
  returned: always
  type: bool
drain_s:
  description: With I(wait_old_exit), how long the retired workers took to finish their requests.
  returned: when wait_old_exit
  type: float
msg:
  description: One line saying what happened.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils import gateway_reload


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "config": {"type": "path", "required": True},
            "pidfile": {"type": "path", "default": "/run/sparkops-gateway/gunicorn.pid"},
            "ready_dir": {"type": "path", "default": "/run/sparkops-gateway"},
            "user": {"type": "str", "default": "sparkops-gateway"},
            "timeout": {"type": "int", "default": 180},
            "force": {"type": "bool", "default": False},
            "wait_old_exit": {"type": "bool", "default": False},
            "old_exit_timeout": {"type": "int", "default": 660},
            "log_file": {"type": "path"},
            "unit": {"type": "str", "default": "sparkops-gateway"},
        },
        supports_check_mode=True,
    )
    p = module.params
    for name in ("timeout", "old_exit_timeout"):
        if p[name] < 1:
            module.fail_json(msg=f"{name}={p[name]}: give a number of seconds of at least 1")
    try:
        result = gateway_reload.reload(
            p["pidfile"],
            p["ready_dir"],
            p["config"],
            user=p["user"],
            tail=lambda: gateway_reload.log_tail(p["log_file"], p["unit"]),
            timeout=p["timeout"],
            check_mode=module.check_mode,
            force=p["force"],
            wait_old_exit=p["wait_old_exit"],
            old_exit_timeout=p["old_exit_timeout"],
        )
    except gateway_reload.ReloadError as err:
        module.fail_json(msg=str(err), **err.details)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
