#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: ssh_facts
short_description: Read a node's SSH host keys, a key pair, a user's authorized keys and some files in one call
description:
  - What the fabric_ssh role judges on a node, read in one module run, so that a run with nothing to change
    makes no key, accepts no key and writes no file.
  - Host keys - the public host keys under I(host_keys_dir) (C(ssh_host_<kind>_key.pub)), as Ansible's
    C(ansible_ssh_host_key_<kind>_public) facts give them (key type and base64 blob).
  - I(key_path) - whether the private key is there with which mode, its public key as C(ssh-keygen -y) derives
    it from the private key, and the C(.pub) file beside it.
  - I(authorized_keys_user) - that user's C(~/.ssh/authorized_keys) lines and the modes of the file and folder.
  - I(files) - existence, kind, mode and SHA-1 of files (so the role skips a write already in place).
  - Only public keys are returned, never private key material. Read-only.
version_added: "0.7.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  host_keys_dir:
    description: Where the host's public keys are.
    type: path
    default: /etc/ssh
  key_path:
    description: A private key to read (its public half is derived with C(ssh-keygen -y)); left out, none is read.
    type: path
  key_comment:
    description:
      - With I(key_path), the comment the key was made with; I(key_in_place) then says whether the key pair is as
        C(community.crypto.openssh_keypair) with C(type=ed25519) and this comment leaves it.
    type: str
  authorized_keys_user:
    description: The account whose C(~/.ssh/authorized_keys) to read; left out, none is read.
    type: str
  files:
    description: Files (or folders) whose existence, kind, mode and SHA-1 to report.
    type: list
    elements: path
    default: []
extends_documentation_fragment:
  - sparkops.cluster.attributes
  - sparkops.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Read the host keys, the fabric key, root's authorized keys and the known hosts file
  sparkops.cluster.ssh_facts:
    key_path: /root/.ssh/sparkops_fabric_ed25519
    authorized_keys_user: root
    files: [/root/.ssh, /root/.ssh/sparkops_fabric_known_hosts]
  register: ssh
"""

RETURN = r"""
host_keys:
  description:
    - Per kind (C(ed25519), C(ecdsa), C(rsa)) found, C(keytype) (for example C(ssh-ed25519)) and C(key) (base64).
  returned: always
  type: dict
  sample: {"ed25519": {"keytype": "ssh-ed25519", "key": "AAAAC3NzaC1lZDI1NTE5AAAAI..."}}
key:
  description:
    - C(exists), C(mode), C(public_key) (C(<type> <base64>) derived from the private key; null when it cannot be
      read), C(pub_exists) and C(pub) (the C(.pub) file's C(<type> <base64> <comment>), stripped). Empty without
      I(key_path).
  returned: always
  type: dict
key_in_place:
  description:
    - Whether the key pair is there, the private half mode C(0600), an ed25519 key whose C(.pub) file matches it and
      carries I(key_comment); null without I(key_path) and I(key_comment).
  returned: always
  type: bool
authorized_keys:
  description:
    - C(path), C(exists), C(mode), C(dir_mode), C(lines) (non-empty ones); empty without I(authorized_keys_user).
  returned: always
  type: dict
files:
  description:
    - Per path, C(exists), C(kind) (C(file), C(directory), C(link), C(other)), C(mode) and C(sha1) (files only).
  returned: always
  type: dict
"""

import os
import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils.node_read import file_state, file_states

HOST_KEY_KINDS = ("ed25519", "ecdsa", "rsa")


def _text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def host_keys(folder: str) -> dict:
    out = {}
    for kind in HOST_KEY_KINDS:
        fields = (_text(os.path.join(folder, f"ssh_host_{kind}_key.pub")) or "").split()
        if len(fields) >= 2:
            out[kind] = {"keytype": fields[0], "key": fields[1]}
    return out


def key_pair(module: AnsibleModule, path: str) -> dict:
    state = file_state(path)
    pub = _text(path + ".pub")
    public_key = None
    if state["kind"] == "file":
        rc, out, _err = module.run_command(["ssh-keygen", "-y", "-P", "", "-f", path])
        fields = out.split() if rc == 0 else []
        public_key = " ".join(fields[:2]) if len(fields) >= 2 else None
    return {
        "exists": state["exists"],
        "mode": state["mode"],
        "public_key": public_key,
        "pub_exists": pub is not None,
        "pub": pub.strip() if pub is not None else None,
    }


def key_in_place(key: dict, comment: str) -> bool:
    """What community.crypto.openssh_keypair (type ed25519, this comment, mode 0600) would otherwise fix."""
    public = key.get("public_key") or ""
    return bool(
        key.get("exists")
        and key.get("mode") == "0600"
        and public.startswith("ssh-ed25519 ")
        and key.get("pub") == f"{public} {comment}"
    )


def authorized_keys(module: AnsibleModule, user: str) -> dict:
    try:
        home = pwd.getpwnam(user).pw_dir
    except KeyError:
        module.fail_json(msg=f"authorized_keys_user {user!r} does not exist on this host; create it or name another")
    folder = os.path.join(home, ".ssh")
    path = os.path.join(folder, "authorized_keys")
    text = _text(path)
    return {
        "path": path,
        "exists": text is not None,
        "mode": file_state(path)["mode"],
        "dir_mode": file_state(folder)["mode"],
        "lines": [ln.strip() for ln in (text or "").splitlines() if ln.strip()],
    }


def main():
    module = AnsibleModule(
        argument_spec={
            "host_keys_dir": {"type": "path", "default": "/etc/ssh"},
            "key_path": {"type": "path"},
            "key_comment": {"type": "str", "no_log": False},
            "authorized_keys_user": {"type": "str", "no_log": False},
            "files": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    key = key_pair(module, p["key_path"]) if p["key_path"] else {}
    module.exit_json(
        changed=False,
        host_keys=host_keys(p["host_keys_dir"]),
        key=key,
        key_in_place=key_in_place(key, p["key_comment"]) if p["key_path"] and p["key_comment"] is not None else None,
        authorized_keys=authorized_keys(module, p["authorized_keys_user"]) if p["authorized_keys_user"] else {},
        files=file_states(p["files"]),
    )


if __name__ == "__main__":
    main()
