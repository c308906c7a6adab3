"""Verdicts on a state module's read that need what other hosts read first (so they cannot be asked of
the module itself): whether files are as the controller renders them, whether authorized_keys holds
the lines other nodes' keys make. Roles read the answer instead of judging in Jinja."""

from __future__ import annotations

import hashlib

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.module_utils.node_read import stale_files, wanted_problems


def files_stale(files: dict, wanted: list) -> list:
    """The paths of `wanted` ({path, kind, mode, content}) that `files` (a state module's per-path read:
    kind, mode, sha1) does not show as wanted; `content` is compared by SHA-1, left out it is not compared."""
    if not isinstance(files, dict) or not isinstance(wanted, list):
        raise AnsibleFilterError("files_stale: give a module's files read (a mapping) and a list of wanted entries")
    entries = []
    for want in wanted:
        entry = {"path": want["path"], "kind": want.get("kind", "file"), "mode": str(want["mode"])}
        if want.get("content") is not None:
            entry["sha1"] = hashlib.sha1(str(want["content"]).encode()).hexdigest()  # noqa: S324 - as hash('sha1')
        entries.append(entry)
    problems = wanted_problems(entries)
    missing = [w["path"] for w in entries if w["path"] not in files]
    if problems or missing:
        raise AnsibleFilterError(
            "files_stale: "
            + "; ".join(problems + [f"{p} was not read (add it to the module's files)" for p in missing])
        )
    return stale_files(entries, files)


def authorized_keys_in_place(read: dict, keys: list, options: str) -> bool:
    """Every key line is in authorized_keys as ansible.posix.authorized_key writes it (options, key,
    comment), the file has mode 0600 and its folder 0700 (ssh_facts' authorized_keys read)."""
    lines = set(read.get("lines") or [])
    return (
        read.get("mode") == "0600"
        and read.get("dir_mode") == "0700"
        and all(f"{options} {key}" in lines for key in keys)
    )


class FilterModule:
    def filters(self):
        return {"files_stale": files_stale, "authorized_keys_in_place": authorized_keys_in_place}
