"""The keys' usage lines (plugins/plugin_utils/gateway.py usage_lines) that playbooks/keys.yml and status print,
from rows in the shape the key store really returns (plugins/module_utils/gateway_keys.py usage())."""

from __future__ import annotations

import datetime as dt

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.filter.gateway import gateway_usage_lines
from ansible_collections.sparkops.cluster.plugins.module_utils import gateway_keys
from ansible_collections.sparkops.cluster.plugins.plugin_utils import gateway

T0 = dt.datetime(2026, 11, 25, 10, 0, tzinfo=dt.timezone.utc)


class Rows:
    """A connection whose one SELECT answers `rows` (name, created, revoked, requests, prompt, completion, class,
    max_parallel_requests, tpm_limit, refused), the columns usage() asks for, in its order."""

    def __init__(self, rows):
        self.rows = rows
        self.sql = []

    def cursor(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def execute(self, sql, params=None):
        self.sql.append(sql)

    def fetchall(self):
        return self.rows

    def commit(self):
        pass


def store_usage(rows) -> list[dict]:
    return gateway_keys.usage(Rows(rows))


def test_each_key_is_one_line_with_its_state_and_counters_by_name():
    keys = store_usage(
        [
            ("bob", T0, T0, 2, 30, 4, "batch", 1, 5000, 7),
            ("alice", T0, None, 3, 45, 120, "interactive", 2, None, 0),
            ("carol", T0, None, 0, 0, 0, "interactive", None, None, 0),
        ]
    )
    assert gateway.usage_lines(list(reversed(keys))) == [
        "alice: active, interactive, 2 parallel, 3 requests, 45 prompt and 120 completion tokens, 0 refused (429)",
        "bob: revoked, batch, 1 parallel, 5000 tokens/min, 2 requests, 30 prompt and 4 completion tokens, "
        "7 refused (429)",
        "carol: active, interactive, no parallel limit, 0 requests, 0 prompt and 0 completion tokens, 0 refused (429)",
    ]


def test_no_key_no_line():
    assert gateway.usage_lines([]) == []
    assert gateway_usage_lines(None) == []


def test_nothing_but_the_name_state_and_counters_reaches_a_line():
    [row] = store_usage([("alice", T0, None, 1, 2, 3, "batch", 1, None, 4)])
    secret = "sk-sparkops-" + "x" * 43
    row = {**row, "key": secret, "digest": "ab" * 32, "created": "2026"}
    [line] = gateway.usage_lines([row])
    assert secret not in line and "ab" * 32 not in line and "2026" not in line
    assert line == "alice: active, batch, 1 parallel, 1 requests, 2 prompt and 3 completion tokens, 4 refused (429)"


@pytest.mark.parametrize("field", gateway.USAGE_FIELDS)
def test_a_row_without_a_field_is_an_error_that_names_it(field):
    [row] = store_usage([("alice", T0, None, 1, 2, 3, "batch", 1, None, 4)])
    del row[field]
    with pytest.raises(ValueError, match=field):
        gateway.usage_lines([row])
    with pytest.raises(AnsibleFilterError, match=f"gateway_usage_lines: .*{field}"):
        gateway_usage_lines([row])


def test_a_row_that_is_not_a_mapping_is_an_error():
    with pytest.raises(AnsibleFilterError, match="lacks name"):
        gateway_usage_lines(["alice"])
