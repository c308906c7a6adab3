"""gateway_key's refusals, which need no database (issue 25). Making and revoking keys in a real PostgreSQL:
tests/unit/sim/test_gateway_litellm.py (test_the_module_makes_and_revokes_keys)."""

from __future__ import annotations

import importlib.util

import pytest
from ansible_collections.sparkops.cluster.plugins.modules import gateway_key as mod
from module_runner import run_module


def _no_connect(conninfo):
    raise AssertionError("the module connected before checking the name")


@pytest.mark.parametrize("name", ["../etc/passwd", "a b", "", "-x"])
def test_a_bad_name_fails_before_touching_the_database(monkeypatch, name):
    monkeypatch.setattr(mod, "connect", _no_connect)
    r = run_module(mod, {"name": name})
    assert r["failed"] and "not usable" in r["msg"] and "key" not in r


@pytest.mark.skipif(importlib.util.find_spec("psycopg") is not None, reason="psycopg is importable here")
def test_without_psycopg_it_says_which_interpreter_to_use():
    r = run_module(mod, {"name": "alice"})
    assert r["failed"] and "ansible_python_interpreter=/opt/sparkops/gateway/bin/python" in r["msg"]


def test_an_unreachable_database_is_named_with_what_to_check(monkeypatch):
    def refuse(conninfo):
        raise OSError(f"connection to {conninfo} refused")

    monkeypatch.setattr(mod, "connect", refuse)
    r = run_module(mod, {"name": "alice", "conninfo": "host=127.0.0.1 port=1 dbname=x"})
    assert r["failed"] and "cannot reach the key database (host=127.0.0.1 port=1 dbname=x)" in r["msg"]
    assert "PostgreSQL running" in r["msg"]


@pytest.mark.parametrize(
    ("limits", "said"),
    [
        ({"max_parallel_requests": 0}, "key alice: max_parallel_requests must be a whole number >= 1"),
        ({"tpm_limit": -5}, "key alice: tpm_limit must be a whole number >= 1"),
        ({"max_parallel_requests": "two"}, "max_parallel_requests"),
        ({"key_class": "gold"}, "key_class"),
    ],
)
def test_bad_limits_fail_before_touching_the_database_and_name_the_key(monkeypatch, limits, said):
    monkeypatch.setattr(mod, "connect", _no_connect)
    r = run_module(mod, {"name": "alice", "limits": limits})
    assert r["failed"] and said in r["msg"] and "key" not in r
