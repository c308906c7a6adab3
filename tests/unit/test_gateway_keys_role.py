"""roles/gateway_keys' expressions rendered with Jinja and the collection's filters: the key's limits from its
class (given, else the stored one), its overrides and the deployment's last capacity sweep, and the sweep's
record name as playbooks/benchmark.yml writes it."""

from __future__ import annotations

import json

import jinja2
import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.filter.gateway import FilterModule
from conftest import ROOT

ROLE = ROOT / "roles" / "gateway_keys"
TASKS = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
SPECS = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]


def _render(template: str, **variables):
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["sparkops.cluster.gateway_key_limits"] = FilterModule().filters()["gateway_key_limits"]
    env.filters["string"] = str
    env.globals["omit"] = "__omit__"
    return env.from_string("{{ (" + template.strip()[2:-2] + ") | tojson }}").render(**variables)


def _work_out(**variables):
    (task,) = [t for t in TASKS if t.get("name") == "Work out the key's class and limits"]
    return json.loads(_render(task["ansible.builtin.set_fact"]["gateway_keys_limits"], **variables))


@pytest.fixture
def sweep(tmp_path):
    doc = {"source": "test-double", "capacity": {"users_at_slo": 2}}
    (tmp_path / "spark-sim-20261120T100000Z.json").write_text(json.dumps(doc))
    return {
        "gateway_keys_sweep_dir": str(tmp_path),
        "gateway_keys_sweep_name": "spark-sim",
        "gateway_keys_sweep_source": "test-double",
        "gateway_keys_max_parallel_requests": "",
        "gateway_keys_tpm_limit": "",
    }


def test_no_class_given_keeps_the_stored_one_and_a_new_key_is_interactive(sweep):
    stored = {"limits_before": {"key_class": "batch", "max_parallel_requests": 1, "tpm_limit": None}}
    out = _work_out(gateway_keys_name="nightly", gateway_keys_class="", gateway_keys_stored=stored, **sweep)
    assert out["limits"] == {"key_class": "batch", "max_parallel_requests": 1, "tpm_limit": None}
    new = _work_out(
        gateway_keys_name="alice", gateway_keys_class="", gateway_keys_stored={"limits_before": None}, **sweep
    )
    assert new["limits"] == {"key_class": "interactive", "max_parallel_requests": 2, "tpm_limit": None}
    assert "2 users at the SLO" in new["basis"]
    given = _work_out(
        gateway_keys_name="nightly", gateway_keys_class="interactive", gateway_keys_stored=stored, **sweep
    )
    assert given["limits"]["key_class"] == "interactive"


def test_overrides_from_extra_vars_win_and_bad_ones_stop_the_play(sweep):
    sweep.update(gateway_keys_max_parallel_requests="4", gateway_keys_tpm_limit="6000")
    out = _work_out(gateway_keys_name="a", gateway_keys_class="batch", gateway_keys_stored={}, **sweep)
    assert out["limits"] == {"key_class": "batch", "max_parallel_requests": 4, "tpm_limit": 6000}
    sweep.update(gateway_keys_max_parallel_requests="0")
    with pytest.raises(AnsibleFilterError, match="key a: max_parallel_requests must be a whole number >= 1"):
        _work_out(gateway_keys_name="a", gateway_keys_class="batch", gateway_keys_stored={}, **sweep)


def test_the_sweep_record_name_is_benchmark_yml_s():
    bench = (ROOT / "playbooks" / "benchmark.yml").read_text()
    assert (
        "sparkops_cluster_name ~ ('' if benchmark_target.deployment == 'main' else '-' ~ benchmark_target.deployment)"
        in bench
    )
    template = DEFAULTS["gateway_keys_sweep_name"]
    for dep, name in (("main", "pair"), ("code", "pair-code")):
        assert json.loads(_render(template, sparkops_cluster_name="pair", gateway_keys_deployment=dep)) == name


def test_every_default_has_its_argument_spec():
    for var, value in DEFAULTS.items():
        assert SPECS[var]["default"] == value, var
