#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_serve_wait
short_description: Wait, one round at a time and with a fixed deadline, until vLLM answers like a ready server
description:
  - Runs on the host of vLLM's API server. Asks the server as M(sparkops.cluster.vllm_health) does,
    C(GET /health), C(GET /v1/models) (I(model) must be listed) and a short streamed completion, until all
    three answer (RV(ready)), the deadline I(started) + I(timeout_s) passes, or the vLLM container has stopped.
  - While the server does not answer, reads the container's state (C(docker inspect)) and its last log
    lines (C(docker logs)). A container that is C(exited), C(dead), C(created), C(removing) or gone
    (C(unknown)) will not answer - its restart policy is not bringing it back, Docker would show it as
    C(restarting) - so the wait fails at once, quoting the last 15 log lines. A restart count above zero
    is history, not a failure.
  - One call is one round of at most I(round_s) seconds. A round that ends without an answer returns
    RV(done)=false with a progress line in RV(msg), so an C(until) loop can show progress between rounds;
    every round is given the same I(started), so calling it again never waits past the deadline.
  - A wrong API key, a model not served and an answer that is not OpenAI's fail at once; waiting does not cure them.
  - Also an action plugin (plugins/action/vllm_serve_wait.py) that marks a round's result to be shown at every
    retry of an C(until) loop, as debug's is, so the progress line shows without C(-v).
  - Read-only; never changes anything. The API key never appears in results or messages.
version_added: "0.9.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  base_url:
    description: Server URL without C(/v1), for example C(http://10.0.0.1:8000).
    type: str
    required: true
  api_key:
    description: Bearer key the server was started with (C(--api-key)); omit if it has none.
    type: str
  model:
    description: Served model name expected in C(/v1/models) (C(--served-model-name)), also used for the completion.
    type: str
    required: true
  prompt:
    description: User message sent in the test completion.
    type: str
    default: "Say hello in five words."
  max_tokens:
    description: Tokens to generate in the test completion; at least 2 to measure a decode rate.
    type: int
    default: 16
  container:
    description: Name of the vLLM container on this host, read while the server does not answer.
    type: str
    required: true
  host:
    description: Name of this host in messages (the inventory name), for example C(docker logs <container> on <host>).
    type: str
    required: true
  started:
    description:
      - When the wait began, seconds since the epoch; the deadline is I(started) + I(timeout_s).
      - Give every round the same value (a fact set once before the first round). Compared with this host's clock,
        which is assumed to be in step with the controller's (NTP) when the controller set it.
      - Omitted, the round's own start (a single round then waits at most I(timeout_s)).
    type: float
  timeout_s:
    description: Seconds from I(started) after which the wait fails.
    type: float
    required: true
  round_s:
    description: Seconds one call waits at most before it returns RV(done)=false with a progress line.
    type: float
    default: 30
  docker_path:
    description: The docker CLI (a name looked up on PATH, or a path).
    type: str
    default: docker
extends_documentation_fragment:
  - sparkops.cluster.attributes
  - sparkops.cluster.attributes.read_only
notes:
  - Target side needs only the Python standard library and the docker CLI.
"""

EXAMPLES = r"""
- name: Note when the wait started
  ansible.builtin.set_fact:
    vllm_wait_started: "{{ now(utc=true).timestamp() }}"

- name: Wait for vLLM (a progress line every 30 s, at most 30 minutes in all)
  sparkops.cluster.vllm_serve_wait:
    base_url: "http://{{ head_ip }}:8000"
    api_key: "{{ api_key }}"
    model: qwen3-235b
    container: sparkops-vllm
    host: "{{ inventory_hostname }}"
    started: "{{ vllm_wait_started }}"
    timeout_s: 1800
    round_s: 30
  register: vllm_wait
  until: vllm_wait.done
  retries: 62
  delay: 0
"""

RETURN = r"""
done:
  description: Whether the wait is over (ready, or failed); false after a round that ended without an answer.
  returned: always
  type: bool
ready:
  description: Whether health, models and the completion all answered.
  returned: always
  type: bool
healthy:
  description: Same as RV(ready) (the name M(sparkops.cluster.vllm_health) returns).
  returned: always
  type: bool
msg:
  description: The READY line, the progress line of a round, or what failed and how to look further.
  returned: always
  type: str
elapsed_s:
  description: Seconds since I(started).
  returned: always
  type: float
probes:
  description: Times this round asked the server.
  returned: always
  type: int
failure_kind:
  description: Null when ready, else the last failure's kind (refused, unreachable, timeout, engine_dead, ...).
  returned: always
  type: str
container:
  description:
    - The container as last read this round, C(status), C(exit_code), C(restarts) (null when unknown) and
      C(log_tail) (last log lines); null when the server answered at the first ask of the round.
  returned: always
  type: dict
checks:
  description: Per check (health, models, completion) as M(sparkops.cluster.vllm_health) returns them, with elapsed_s.
  returned: when ready
  type: dict
ttft_s:
  description: Seconds from sending the completion to the first generated token.
  returned: when ready
  type: float
tok_s:
  description: Decode rate of the test completion, tokens per second.
  returned: when ready
  type: float
completion_tokens:
  description: Tokens generated by the test completion.
  returned: when ready
  type: int
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.vllm_wait import (
    probe_ready,
    read_container,
    wait_round,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "model": {"type": "str", "required": True},
            "prompt": {"type": "str", "default": "Say hello in five words."},
            "max_tokens": {"type": "int", "default": 16, "no_log": False},  # a count, not a secret
            "container": {"type": "str", "required": True},
            "host": {"type": "str", "required": True},
            "started": {"type": "float"},
            "timeout_s": {"type": "float", "required": True},
            "round_s": {"type": "float", "default": 30},
            "docker_path": {"type": "str", "default": "docker"},
        },
        # Read-only: check mode waits and reads as a real run does.
        supports_check_mode=True,
    )
    p = module.params
    base = p["base_url"].rstrip("/")
    if base.endswith("/v1"):
        module.fail_json(msg=f"base_url {base!r} ends in /v1; give the server root, e.g. http://10.0.0.1:8000")
    if not base.startswith(("http://", "https://")):
        module.fail_json(msg=f"base_url {base!r} must start with http:// or https://")
    if p["timeout_s"] <= 0 or p["round_s"] <= 0:
        module.fail_json(
            msg="timeout_s and round_s must be greater than 0 (vllm_serve_ready_timeout_s, vllm_serve_progress_every_s)"
        )
    if p["max_tokens"] < 1:
        module.fail_json(msg="max_tokens must be at least 1 (2 or more to measure tok_s; vllm_serve_smoke_max_tokens)")
    docker = p["docker_path"] if os.path.isabs(p["docker_path"]) else module.get_bin_path(p["docker_path"])
    if not docker:
        module.fail_json(
            msg=f"no docker CLI ({p['docker_path']}) on {p['host']}: the vLLM container runs under "
            "Docker there; install it (the docker role) or give docker_path"
        )
    api_key = p["api_key"] or None

    def run(argv):
        return module.run_command(argv)

    res = wait_round(
        probe=lambda timeout: probe_ready(
            base, p["model"], api_key=api_key, prompt=p["prompt"], max_tokens=p["max_tokens"], timeout=timeout
        ),
        container=lambda: read_container(run, docker, p["container"]),
        host=p["host"],
        name=p["container"],
        started=p["started"] if p["started"] is not None else time.time(),
        timeout_s=p["timeout_s"],
        round_s=p["round_s"],
    )
    if api_key:  # the server's words never carry the key, but a message must not either way
        for key in ("msg", "last_error"):
            if isinstance(res.get(key), str):
                res[key] = res[key].replace(api_key, "********")
    res["healthy"] = res["ready"]
    res["changed"] = False
    failed = res.pop("failed")
    if failed:
        module.fail_json(**res)
    module.exit_json(**res)


if __name__ == "__main__":
    main()
