"""gateway_keys' pure parts: key names, fresh keys, digests, the bearer header (issue 25).

The SQL runs against a real PostgreSQL in tests/unit/sim/test_gateway_litellm.py."""

from __future__ import annotations

import hashlib

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import gateway_keys as gk


@pytest.mark.parametrize("name", ["alice", "team-a.bot_1", "A" * 63, "7"])
def test_plain_names_pass(name):
    assert gk.check_name(name) == name


@pytest.mark.parametrize("name", ["", "-x", ".hidden", "a/b", "../x", "a b", 'a"b', "A" * 64, "é", None, 3])
def test_names_that_would_break_a_file_name_or_a_label_are_refused(name):
    with pytest.raises(gk.KeyNameError, match="not usable") as err:
        gk.check_name(name)
    assert repr(name) in str(err.value)  # the message names what was given


def test_new_keys_are_long_random_and_prefixed():
    keys = {gk.new_key() for _n in range(50)}
    assert len(keys) == 50
    for key in keys:
        assert key.startswith(gk.KEY_PREFIX) and len(key) >= len(gk.KEY_PREFIX) + 43  # 32 bytes, base64url


def test_digest_is_sha256_hex_of_the_key():
    assert gk.digest("sk-sparkops-x") == hashlib.sha256(b"sk-sparkops-x").hexdigest()
    assert gk.digest("a") != gk.digest("b")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer sk-1", "sk-1"),
        ("bearer  sk-1 ", "sk-1"),
        ("BEARER sk-1", "sk-1"),
        ("Basic sk-1", ""),
        ("sk-1", ""),
        ("", ""),
        (None, ""),
    ],
)
def test_bearer_token(header, token):
    assert gk.bearer_token(header) == token
