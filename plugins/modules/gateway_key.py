#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gateway_key
short_description: Create or revoke a client key of the gateway, and list the keys' usage
description:
  - The gateway (the LiteLLM proxy on the head, C(docs/gateway.md)) asks a key on every path and looks its
    SHA-256 digest up in PostgreSQL (C(module_utils/gateway_keys.py)). This module makes a key for I(name)
    (32 random bytes), stores only its digest and returns the key once, in C(key); or revokes it. The gateway
    refuses a revoked key within 2 seconds, without a restart.
  - Runs on the gateway's node with the gateway venv's Python, which has psycopg
    (C(ansible_python_interpreter=/opt/sparkops/gateway/bin/python)). Writing the key to the controller's
    C(<credentials>/keys/NAME) (0600) is the playbook's job.
  - "The task must set C(no_log: true): C(key) is the secret itself."
  - With I(state=present) and an active key of that name, nothing changes and no key is returned (the
    controller already has it); a revoked name gets a new key.
  - I(limits) stores the key's class and admission limits with it (the C(gateway_key_limits) filter computes
    them from the capacity sweep); the gateway hands them to LiteLLM's limiter, which answers a request over
    the limit at once with 429 and C(Retry-After). Changed limits apply within 2 seconds, without a new key or a
    restart.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  name:
    description:
      - The client's name (1-63 letters, digits, C(_), C(.), C(-), starting with a letter or digit). It names the
        key file and labels the usage metrics; the key itself never appears there.
    type: str
    required: true
  state:
    description:
      - C(present) makes a key when the name has no active one; C(absent) revokes the active one.
    type: str
    choices: [present, absent]
    default: present
  limits:
    description:
      - The key's class and limits, with I(state=present). Left out, the stored ones stay (a new key is
        C(interactive) without limits).
    type: dict
    suboptions:
      key_class:
        description: C(interactive) or C(batch) (docs/gateway.md, "Limits per key").
        type: str
        choices: [interactive, batch]
        default: interactive
      max_parallel_requests:
        description: Requests of this key in flight at once (at least 1); unset, no limit.
        type: int
      tpm_limit:
        description: Tokens per minute of this key (at least 1); unset, no limit.
        type: int
  conninfo:
    description:
      - libpq connection string of the key database, without a password (peer authentication over the Unix
        socket, or C(PGPASSFILE)).
    type: str
    default: dbname=sparkops_gateway
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: Reads the key's state and says what it would do; makes and revokes nothing.
  diff_mode:
    support: none
    details: A key is a secret; C(state_before) and C(state_after) say what changed.
seealso:
  - module: sparkops.cluster.iptables_chain
"""

EXAMPLES = r"""
- name: Make the key of client alice
  sparkops.cluster.gateway_key:
    name: alice
  vars:
    ansible_python_interpreter: /opt/sparkops/gateway/bin/python
  become: true
  become_user: sparkops-gateway
  no_log: true
  register: gateway_key_made

- name: Make batch job nightly's key, two requests at a time
  sparkops.cluster.gateway_key:
    name: nightly
    limits:
      key_class: batch
      max_parallel_requests: 2
  vars:
    ansible_python_interpreter: /opt/sparkops/gateway/bin/python
  become: true
  become_user: sparkops-gateway
  no_log: true

- name: Revoke it
  sparkops.cluster.gateway_key:
    name: alice
    state: absent
  vars:
    ansible_python_interpreter: /opt/sparkops/gateway/bin/python
"""

RETURN = r"""
key:
  description: The new key, only when one was made (not in check mode). A secret; set no_log on the task.
  returned: when a key was made
  type: str
state_before:
  description: The name's key before, C(active), C(revoked) or C(absent).
  returned: always
  type: str
state_after:
  description: The name's key after (what it would be, in check mode).
  returned: always
  type: str
limits_before:
  description: The name's class and limits before (null when it had no row).
  returned: always
  type: dict
limits_after:
  description: The name's class and limits after (what they would be, in check mode; null for no row).
  returned: always
  type: dict
keys:
  description: >-
    Every key's name, state, created and revoked times, its requests, prompt and completion tokens, its class
    (key_class) and limits (max_parallel_requests, tpm_limit: null for none).
  returned: always
  type: list
  elements: dict
msg:
  description: One line saying what changed.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils import gateway_keys

NO_LIMITS = {"key_class": "interactive", "max_parallel_requests": None, "tpm_limit": None}  # a new row's


def connect(conninfo: str):
    import psycopg  # noqa: PLC0415 - only in the gateway's venv; the error below says so

    return psycopg.connect(conninfo, connect_timeout=10)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "limits": {
                "type": "dict",
                "options": {
                    "key_class": {
                        "type": "str",
                        "choices": list(gateway_keys.KEY_CLASSES),
                        "default": "interactive",
                    },
                    "max_parallel_requests": {"type": "int"},
                    "tpm_limit": {"type": "int"},
                },
            },
            "conninfo": {"type": "str", "default": "dbname=sparkops_gateway"},
        },
        supports_check_mode=True,
    )
    name, state = module.params["name"], module.params["state"]
    try:
        gateway_keys.check_name(name)
    except gateway_keys.KeyNameError as exc:
        module.fail_json(msg=str(exc))
    wanted = None
    if module.params["limits"] is not None:
        try:
            wanted = gateway_keys.check_limits(name, module.params["limits"])
        except gateway_keys.KeyLimitsError as exc:
            module.fail_json(msg=f"{exc}. Nothing was changed.")
    try:
        conn = connect(module.params["conninfo"])
    except ImportError:
        module.fail_json(
            msg="psycopg is not importable by this Python: run the task with the gateway venv's interpreter "
            "(ansible_python_interpreter=/opt/sparkops/gateway/bin/python), which the gateway role installs"
        )
    except Exception as exc:  # psycopg.OperationalError and friends, without importing psycopg here
        module.fail_json(
            msg=f"cannot reach the key database ({module.params['conninfo']}): {exc}. Is PostgreSQL running on "
            "the gateway's node and does this user have a role in it (the gateway role makes both)?"
        )
    with conn:
        gateway_keys.ensure_schema(conn)
        before = gateway_keys.key_state(conn, name)
        limits_before = gateway_keys.key_limits(conn, name)
        after, key = before, None
        if state == "present" and before != "active":
            after = "active"
            if not module.check_mode:
                key = gateway_keys.create(conn, name)
                if key is None:  # another run made it between the two statements: that one returned it
                    after = before = "active"
        elif state == "absent" and before == "active":
            after = "revoked"
            if not module.check_mode:
                gateway_keys.revoke(conn, name)
        # A new row has the table's defaults: interactive, no limit.
        predicted = limits_before or (dict(NO_LIMITS) if after == "active" else None)
        if state == "present" and wanted is not None and wanted != predicted:
            predicted = wanted
            if not module.check_mode:
                gateway_keys.set_limits(conn, name, wanted)
        limits_after = predicted if module.check_mode else gateway_keys.key_limits(conn, name)
        keys = gateway_keys.usage(conn)
    limits_changed = after == "active" and limits_after != (limits_before or NO_LIMITS)
    changed = after != before or limits_changed
    verbs = {
        "active": ("made a key for", "would make a key for"),
        "revoked": ("revoked the key of", "would revoke the key of"),
    }
    if after != before:
        msg = f"{verbs[after][module.check_mode]} {name}"
    elif limits_changed:
        msg = f"{'would set' if module.check_mode else 'set'} the limits of {name}"
    else:
        msg = f"{name}: {before}, nothing to do"
    result = {
        "changed": changed,
        "msg": msg,
        "state_before": before,
        "state_after": after,
        "limits_before": limits_before,
        "limits_after": limits_after,
        "keys": keys,
    }
    if key is not None:
        result["key"] = key
    module.exit_json(**result)


if __name__ == "__main__":
    main()
