"""The gateway keys' default limits from the capacity sweep, the overrides and the errors
(plugins/plugin_utils/key_limits.py, the gateway_key_limits filter); the records are in the shape
plugins/modules/benchmark_report.py writes."""

from __future__ import annotations

import json

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.filter.gateway import gateway_key_limits
from ansible_collections.sparkops.cluster.plugins.module_utils import gateway_keys
from ansible_collections.sparkops.cluster.plugins.modules import benchmark_report
from ansible_collections.sparkops.cluster.plugins.plugin_utils import key_limits as kl


def limits(*args, **kwargs):
    return kl.key_limits("alice", *args, **kwargs)["limits"]


@pytest.mark.parametrize(
    ("users", "interactive", "batch"),
    [(2, 2, 1), (1, 1, 1), (8, 8, 7), (16, 16, 15)],
)
def test_interactive_keys_share_the_seats_at_the_slo_and_batch_gets_what_is_left(users, interactive, batch):
    assert limits("interactive", users_at_slo=users) == {
        "key_class": "interactive",
        "max_parallel_requests": interactive,
        "tpm_limit": None,
    }
    assert limits("batch", users_at_slo=users)["max_parallel_requests"] == batch


@pytest.mark.parametrize("users", [None, -1, "2", True, 2.0])
def test_without_a_sweep_interactive_keys_are_unlimited_and_batch_keys_get_one(users):
    assert kl.BATCH_FALLBACK == 1
    assert limits("interactive", users_at_slo=users)["max_parallel_requests"] is None
    assert limits("batch", users_at_slo=users)["max_parallel_requests"] == 1
    basis = kl.key_limits("alice", "interactive", users_at_slo=users)["basis"]
    assert basis == (
        "alice: interactive, no parallel limit (no capacity sweep recorded: run playbooks/benchmark.yml, then "
        "keys.yml again for this key), no tokens/min limit"
    )


def test_a_sweep_where_nobody_met_the_slo_gives_one_request_at_a_time():
    for key_class in kl.KEY_CLASSES:
        assert limits(key_class, users_at_slo=0)["max_parallel_requests"] == 1


def test_the_class_defaults_to_interactive():
    assert limits(None, users_at_slo=4)["key_class"] == "interactive"
    assert limits("", users_at_slo=4)["max_parallel_requests"] == 4


def test_overrides_win_and_strings_of_digits_count_as_numbers():
    assert limits("batch", max_parallel_requests=6, users_at_slo=2)["max_parallel_requests"] == 6
    assert limits("interactive", "3", "12000", users_at_slo=2) == {
        "key_class": "interactive",
        "max_parallel_requests": 3,
        "tpm_limit": 12000,
    }
    out = kl.key_limits("bob", "batch", None, 5000, users_at_slo=4)
    assert out["limits"]["max_parallel_requests"] == 3
    assert out["basis"] == (
        "bob: batch, 3 parallel, what is left after one interactive user (4 users at the SLO in the last capacity "
        "sweep), 5000 tokens/min (override)"
    )
    assert limits("batch", "", "", users_at_slo=4) == {
        "key_class": "batch",
        "max_parallel_requests": 3,
        "tpm_limit": None,
    }


@pytest.mark.parametrize("field", ["max_parallel_requests", "tpm_limit"])
@pytest.mark.parametrize("bad", [0, -2, "0", "two", "2.5", 2.5, True, [2], {"a": 1}])
def test_a_bad_override_names_the_key_the_field_and_the_fix(field, bad):
    with pytest.raises(kl.KeyLimitsError) as err:
        kl.key_limits("carol", "batch", users_at_slo=2, **{field: bad})
    text = str(err.value)
    assert text.startswith("key carol:") and field in text and f"-e sparkops_key_{field}=" in text
    with pytest.raises(AnsibleFilterError, match="key carol: .*Nothing was changed"):
        gateway_key_limits(
            "carol", "batch", **{field: bad}, sweep_dir="/nonexistent", sweep_name="c", source="hardware"
        )


@pytest.mark.parametrize("bad", ["premium", "Batch", 1])
def test_an_unknown_class_names_the_key_and_the_classes(bad):
    with pytest.raises(kl.KeyLimitsError, match=r"key dave: class .* is not one of interactive, batch; give -e"):
        kl.key_limits("dave", bad)


def test_what_the_filter_computes_the_store_accepts():
    for key_class in kl.KEY_CLASSES:
        out = limits(key_class, tpm_limit=100, users_at_slo=3)
        assert gateway_keys.check_limits("alice", out) == out


@pytest.mark.parametrize(
    "bad",
    [
        {"key_class": "gold"},
        {"max_parallel_requests": 0},
        {"tpm_limit": "9"},
        {"max_parallel_requests": True},
        {"x": 1},
    ],
)
def test_the_store_refuses_what_it_cannot_hand_to_litellm(bad):
    with pytest.raises(gateway_keys.KeyLimitsError, match="key alice: "):
        gateway_keys.check_limits("alice", bad)


def _record(folder, cluster, stamp, users, source="hardware"):
    doc = {"cluster_name": cluster, "timestamp": stamp, "source": source, "runs": []}
    if users is not None:
        doc["capacity"] = {"slo": {}, "users_at_slo": users}
    path = folder / f"{cluster}-{stamp}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_newest_record_of_the_cluster_and_source_with_a_capacity_is_read(tmp_path):
    assert kl.TIMESTAMP_RE == benchmark_report.TIMESTAMP_RE  # the same file names the report writes
    older = _record(tmp_path, "pair", "20261101T100000Z", 4)
    newest = _record(tmp_path, "pair", "20261120T100000Z", 2)
    _record(tmp_path, "pair", "20261121T100000Z", None)  # a fixed-levels run: no capacity, skipped
    _record(tmp_path, "pair", "20261122T100000Z", 9, source="test-double")  # the simulated pair's
    _record(tmp_path, "pair-b", "20261123T100000Z", 7)  # another deployment's
    (tmp_path / "pair-20261124T100000Z.json").write_text("{not json")  # unreadable: never trusted
    assert kl.latest_sweep(str(tmp_path), "pair", "hardware") == {"path": newest, "users_at_slo": 2}
    assert kl.latest_sweep(str(tmp_path), "pair", "test-double")["users_at_slo"] == 9
    assert kl.latest_sweep(str(tmp_path), "pair-b", "hardware")["users_at_slo"] == 7
    assert kl.latest_sweep(str(tmp_path), "other", "hardware") == {"path": None, "users_at_slo": None}
    assert kl.latest_sweep(str(tmp_path / "none"), "pair", "hardware") == {"path": None, "users_at_slo": None}
    assert older != newest


def test_a_record_written_by_benchmark_report_is_read(tmp_path):
    """A record from benchmark_report's own writer (its JSON document's keys), not a hand-made one."""
    from module_runner import run_module  # noqa: PLC0415

    capacity = {"slo": {"min_tok_s_per_user": 10.0, "max_ttft_p95_s": 2.0}, "users_at_slo": 2, "first_failing": None}
    run_module(
        benchmark_report,
        {
            "results": [{"concurrency": 1, "aggregate_tok_s": 17.0}],
            "capacity": capacity,
            "output_dir": str(tmp_path),
            "cluster_name": "two-sparks",
            "source": "hardware",
        },
    )
    assert kl.latest_sweep(str(tmp_path), "two-sparks", "hardware")["users_at_slo"] == 2


def test_the_filter_reads_the_sweep_and_says_where_the_limit_comes_from(tmp_path):
    path = _record(tmp_path, "spark-sim", "20261120T100000Z", 2, source="test-double")
    out = gateway_key_limits("batchy", "batch", sweep_dir=str(tmp_path), sweep_name="spark-sim", source="test-double")
    assert out["limits"] == {"key_class": "batch", "max_parallel_requests": 1, "tpm_limit": None}
    assert out["sweep"] == {"path": path, "users_at_slo": 2}
    assert "2 users at the SLO in the last capacity sweep" in out["basis"]
    none = gateway_key_limits("inter", None, sweep_dir=str(tmp_path), sweep_name="spark-sim", source="hardware")
    assert none["limits"]["max_parallel_requests"] is None and none["sweep"]["path"] is None
