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
keys:
  description: Every key's name, state, created and revoked times and its requests, prompt and completion tokens.
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


def connect(conninfo: str):
    import psycopg  # noqa: PLC0415 - only in the gateway's venv; the error below says so

    return psycopg.connect(conninfo, connect_timeout=10)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "conninfo": {"type": "str", "default": "dbname=sparkops_gateway"},
        },
        supports_check_mode=True,
    )
    name, state = module.params["name"], module.params["state"]
    try:
        gateway_keys.check_name(name)
    except gateway_keys.KeyNameError as exc:
        module.fail_json(msg=str(exc))
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
        keys = gateway_keys.usage(conn)
    changed = after != before
    verbs = {
        "active": ("made a key for", "would make a key for"),
        "revoked": ("revoked the key of", "would revoke the key of"),
    }
    msg = f"{verbs[after][module.check_mode]} {name}" if changed else f"{name}: {before}, nothing to do"
    result = {"changed": changed, "msg": msg, "state_before": before, "state_after": after, "keys": keys}
    if key is not None:
        result["key"] = key
    module.exit_json(**result)


if __name__ == "__main__":
    main()
