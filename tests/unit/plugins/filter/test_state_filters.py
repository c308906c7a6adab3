"""files_stale and authorized_keys_in_place: the fabric_ssh role's verdicts on what every node read
(known hosts rendered from all nodes' host keys, the keys of the nodes that log in)."""

from __future__ import annotations

import hashlib

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.filter.state import authorized_keys_in_place, files_stale

KNOWN = "10.0.0.1 ssh-ed25519 AAAA\n"
READ = {
    "/root/.ssh": {"exists": True, "kind": "directory", "mode": "0700", "sha1": None},
    "/root/.ssh/known": {
        "exists": True,
        "kind": "file",
        "mode": "0644",
        "sha1": hashlib.sha1(KNOWN.encode()).hexdigest(),
    },  # noqa: S324
}
WANT = [
    {"path": "/root/.ssh", "kind": "directory", "mode": "0700"},
    {"path": "/root/.ssh/known", "mode": "0644", "content": KNOWN},
]


def test_files_in_place_are_not_stale_and_each_difference_is():
    assert files_stale(READ, WANT) == []
    assert files_stale(READ, [WANT[0], dict(WANT[1], content=KNOWN + "10.0.0.2 ssh-ed25519 BBBB\n")]) == [
        "/root/.ssh/known"
    ]
    assert files_stale(READ, [dict(WANT[0], mode="0755"), WANT[1]]) == ["/root/.ssh"]
    gone = dict(READ, **{"/root/.ssh/known": {"exists": False, "kind": None, "mode": None, "sha1": None}})
    assert files_stale(gone, WANT) == ["/root/.ssh/known"]


def test_files_stale_refuses_a_path_the_module_did_not_read_or_a_bad_mode():
    with pytest.raises(AnsibleFilterError, match="was not read"):
        files_stale(READ, [{"path": "/etc/other", "mode": "0644"}])
    with pytest.raises(AnsibleFilterError, match="is not an octal mode"):
        files_stale(READ, [dict(WANT[0], mode="rwx")])


def test_authorized_keys_hold_every_line_behind_the_options_with_the_modes():
    opts = 'from="10.0.0.0/24",no-agent-forwarding'
    keys = ["ssh-ed25519 AAAA sparkops-fabric@a", "ssh-ed25519 BBBB sparkops-fabric@b"]
    read = {"mode": "0600", "dir_mode": "0700", "lines": [f"{opts} {k}" for k in keys] + ["ssh-rsa CCCC admin"]}
    assert authorized_keys_in_place(read, keys, opts) is True
    assert authorized_keys_in_place(read, [*keys, "ssh-ed25519 DDDD sparkops-fabric@c"], opts) is False
    assert authorized_keys_in_place(read, keys, 'from="10.0.1.0/24",no-agent-forwarding') is False
    assert authorized_keys_in_place(dict(read, mode="0644"), keys, opts) is False
    assert authorized_keys_in_place(dict(read, dir_mode="0755"), keys, opts) is False
    assert authorized_keys_in_place({}, keys, opts) is False
