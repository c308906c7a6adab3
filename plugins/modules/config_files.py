#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
"""Module: a role's small configuration files and folders, checked and written in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: config_files
short_description: Write several small configuration files and folders on a node in one call
description:
  - Ensures folders exist with a mode, then compares each file's bytes and mode with what is wanted
    and rewrites only the files that differ (temporary file in the same folder, optional validation,
    atomic rename).
  - One module run checks every file of a role, where one C(ansible.builtin.template) or
    C(ansible.builtin.copy) task per file costs two module runs each even when nothing changes; this is
    what makes a run with nothing to do fast.
  - The action plugin of the same name renders C(template) entries (from the role's C(templates/)
    folder) and reads C(src) entries (from its C(files/) folder) on the controller, and hands the
    module their content.
  - Meant for configuration files (kilobytes), not for large payloads; the content travels in the
    module's arguments.
version_added: "0.6.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  files:
    description: The files to write.
    type: list
    elements: dict
    default: []
    suboptions:
      dest:
        description: Absolute path of the file on the node.
        type: path
        required: true
      content:
        description: The file's content. Give exactly one of O(files[].content), O(files[].template), O(files[].src).
        type: str
      template:
        description:
          - A Jinja2 template in the role's C(templates/) folder, rendered on the controller with the task's variables.
        type: str
      src:
        description: A file in the role's C(files/) folder, copied as it is.
        type: str
      mode:
        description: The file's mode, four octal digits in quotes, such as C("0644").
        type: str
        required: true
      validate:
        description:
          - A command that checks the new file before it replaces the old one; C(%s) is the temporary file's path.
          - Runs only when the file is about to change.
        type: str
  directories:
    description: Folders to create (with parents) before the files are written.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the folder.
        type: path
        required: true
      mode:
        description: The folder's mode, four octal digits in quotes, such as C("0755").
        type: str
        required: true
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: Reports which files and folders would change and writes nothing.
  diff_mode:
    support: full
    details: Shows the old and new content of each file that changes.
notes:
  - Files are written as the connecting user (root on the nodes); owner and group are left as they are.
"""

EXAMPLES = r"""
- name: Write Prometheus' files
  sparkops.cluster.config_files:
    directories:
      - {path: /etc/prometheus/rules, mode: "0755"}
    files:
      - {dest: /etc/prometheus/prometheus.yml, template: prometheus.yml.j2, mode: "0644",
         validate: "promtool check config --syntax-only %s"}
      - {dest: /etc/default/prometheus, template: prometheus.default.j2, mode: "0644"}
  notify: Restart Prometheus
"""

RETURN = r"""
changed_files:
  description: The files that were (or in check mode would be) rewritten.
  returned: always
  type: list
  elements: str
  sample: [/etc/prometheus/prometheus.yml]
changed_directories:
  description: The folders that were (or would be) created or had their mode changed.
  returned: always
  type: list
  elements: str
  sample: [/etc/prometheus/rules]
files:
  description: Per file, whether it changed and why.
  returned: always
  type: list
  elements: dict
  sample: [{dest: /etc/default/prometheus, changed: false, reason: up to date}]
"""

import os
import re
import shlex
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes


def parse_mode(value: str, where: str) -> int:
    """An octal mode string ("0644"); ValueError naming the entry when it is not one."""
    # Four digits, always: YAML reads an unquoted 0644 as the integer 420, which arrives as "420".
    text = str(value).strip()
    if not re.fullmatch(r"[0-7]{4}", text):
        raise ValueError(f'{where}: mode {value!r} is not a four-digit octal string; write it quoted, like "0644"')
    return int(text, 8)


def file_state(path: str, want: bytes, mode: int) -> tuple[bool, str, bytes | None]:
    """(needs writing, why, the current bytes or None)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True, "missing", None
    if not stat.S_ISREG(st.st_mode):
        return True, "not a regular file", None
    with open(path, "rb") as f:
        have = f.read()
    if have != want:
        return True, "content differs", have
    if stat.S_IMODE(st.st_mode) != mode:
        return True, f"mode {stat.S_IMODE(st.st_mode):04o} -> {mode:04o}", have
    return False, "up to date", have


def write_file(module: AnsibleModule, path: str, data: bytes, mode: int, validate: str | None) -> None:
    folder = os.path.dirname(path) or "/"
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if validate:
            if "%s" not in validate:
                module.fail_json(msg=f"{path}: validate must contain %s (the file to check): {validate!r}")
            # The command line is split like a shell's (run_command): the path goes in quoted, one argument.
            rc, out, err = module.run_command(validate % shlex.quote(tmp))
            if rc != 0:
                # What the check said is the reason (e.g. netplan's parse error): it leads the message.
                said = (err or out or "").strip()[-800:] or "no output"
                command = validate % path
                command = command if len(command) <= 160 else command[:157] + "..."
                module.fail_json(
                    msg=f"{path}: the new content fails its check ({command}, rc {rc}): {said}. Nothing was "
                    "replaced (the old file stays). Fix the template or the variables it reads.",
                    stdout=out,
                    stderr=err,
                )
        os.rename(tmp, path)
        tmp = None
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "dest": {"type": "path", "required": True},
                    "content": {"type": "str"},
                    "template": {"type": "str"},
                    "src": {"type": "str"},
                    "mode": {"type": "str", "required": True},
                    "validate": {"type": "str"},
                },
            },
            "directories": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "path": {"type": "path", "required": True},
                    "mode": {"type": "str", "required": True},
                },
            },
        },
        supports_check_mode=True,
    )
    files, dirs = module.params["files"], module.params["directories"]
    problems = []
    for i, d in enumerate(dirs):
        if not os.path.isabs(d["path"]):
            problems.append(f"directories[{i}]: path {d['path']!r} is not absolute")
    for i, f in enumerate(files):
        if not os.path.isabs(f["dest"]):
            problems.append(f"files[{i}]: dest {f['dest']!r} is not absolute")
        if f["content"] is None:
            problems.append(
                f"files[{i}] ({f['dest']}): no content. Give content, or template/src through the task "
                "(the action plugin renders them on the controller)"
            )
    try:
        dir_modes = [parse_mode(d["mode"], f"directories[{i}] ({d['path']})") for i, d in enumerate(dirs)]
        file_modes = [parse_mode(f["mode"], f"files[{i}] ({f['dest']})") for i, f in enumerate(files)]
    except ValueError as e:
        problems.append(str(e))
    dests = [f["dest"] for f in files]
    dupes = sorted({d for d in dests if dests.count(d) > 1})
    if dupes:
        problems.append(f"files named twice: {', '.join(dupes)}")
    if problems:
        module.fail_json(msg="; ".join(problems) + ". Nothing was written.")

    changed_dirs, changed_files, report, diffs = [], [], [], []
    for i, d in enumerate(dirs):
        path, mode = d["path"], dir_modes[i]
        if os.path.isdir(path):
            if stat.S_IMODE(os.stat(path).st_mode) == mode:
                continue
            changed_dirs.append(path)
            if not module.check_mode:
                os.chmod(path, mode)
        elif os.path.lexists(path):
            module.fail_json(msg=f"{path} exists and is not a folder; move it away and run again. Nothing was written.")
        else:
            changed_dirs.append(path)
            if not module.check_mode:
                os.makedirs(path, exist_ok=True)
                os.chmod(path, mode)
    for i, f in enumerate(files):
        mode = file_modes[i]
        want = to_bytes(f["content"], errors="surrogate_or_strict")
        needed, why, have = file_state(f["dest"], want, mode)
        report.append({"dest": f["dest"], "changed": needed, "reason": why})
        if not needed:
            continue
        changed_files.append(f["dest"])
        if module._diff and have != want:
            diffs.append(
                {
                    "before_header": f["dest"],
                    "after_header": f["dest"],
                    "before": (have or b"").decode("utf-8", "replace"),
                    "after": want.decode("utf-8", "replace"),
                }
            )
        if module.check_mode:
            continue
        folder = os.path.dirname(f["dest"])
        if not os.path.isdir(folder):
            module.fail_json(
                msg=f"{f['dest']}: its folder {folder} does not exist; list it under directories. "
                f"Written so far: {changed_files[:-1] or 'nothing'}."
            )
        write_file(module, f["dest"], want, mode, f["validate"])
    result = {
        "changed": bool(changed_files or changed_dirs),
        "changed_files": changed_files,
        "changed_directories": changed_dirs,
        "files": report,
    }
    if diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
