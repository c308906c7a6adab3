"""What the plan tells a first-time user beyond the model (plugin_utils/plan_checks.py, controller_state.py and
the follow-on rules of cluster.py), without Ansible: the Clients block, Sparks that serve nothing, unknown
variables with the closest known name, the state folder's move out of the inventory, and a refusal without
false follow-ons."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.plugin_utils import controller_state as cs
from ansible_collections.sparkops.cluster.plugins.plugin_utils import plan_checks as pc
from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import build_cluster
from cluster_inventories import pair, ring, switch
from test_cluster_inputs import problems_of
from test_serving_plan import plan_of

ROOT = Path(__file__).resolve().parents[4]
TP2 = "qwen3-235b-a22b-gptq-int4-tp2"
QWEN30 = "qwen3-30b-a3b"


def _model(cluster_inputs=None, **inputs):
    cluster, plan = plan_of(cluster_inputs, **inputs)
    cluster["serving"] = plan
    return cluster


# ------------------------------------------------------------------------------------------- clients
def test_the_default_pair_serves_the_fast_links_and_says_how_to_open_it_to_the_lan():
    out = pc.clients(_model(), [])
    text = "\n".join(out["lines"])
    assert out["urls"] == ["http://192.168.100.11:8000/v1"]
    assert "reached from: the Sparks' fast links only (192.168.100.0/24, 192.168.101.0/24)" in text
    assert (
        "to serve your LAN: vllm_serve_host: 0.0.0.0 (or 10.0.0.11) and sparkops_client_networks: [10.0.0.0/24]" in text
    )
    assert "key: the key file /srv/inv-state/credentials/api_key (made by site.yml, mode 0600)" in text
    assert (
        'curl -H "Authorization: Bearer $(cat /srv/inv-state/credentials/api_key)" http://192.168.100.11:8000/v1/models'
        in text
    )
    assert out["warnings"] == []


def test_a_wildcard_bind_without_client_networks_is_warned_and_the_url_is_the_management_address():
    out = pc.clients(_model(pair(vllm_serve_host="0.0.0.0")), [])
    assert out["urls"] == ["http://10.0.0.11:8000/v1"]
    (warning,) = out["warnings"]
    assert "vllm_serve_host is 0.0.0.0" in warning and "sparkops_client_networks is empty" in warning
    assert "sparkops_client_networks: [10.0.0.0/24]" in warning
    # with the LAN let in: no warning, and the block names it
    fine = pc.clients(_model(pair(vllm_serve_host="0.0.0.0")), ["10.0.0.0/24"])
    assert fine["warnings"] == []
    assert "reached from: sparkops_client_networks 10.0.0.0/24, and the Sparks' fast links" in "\n".join(fine["lines"])


def test_client_networks_with_a_fast_link_bind_are_warned():
    out = pc.clients(_model(), ["10.0.0.0/24"])
    (warning,) = out["warnings"]
    assert "vLLM listens on the fast-link address 192.168.100.11 only" in warning


def test_with_the_gateway_on_clients_use_the_gateway_and_a_key_of_their_own():
    model = _model(gateway_enabled=True)
    out = pc.clients(model, ["10.0.0.0/24"])
    assert out["urls"] == ["http://10.0.0.11:4000/v1"]
    text = "\n".join(out["lines"])
    assert "the gateway on spark-1" in text
    assert "playbooks/keys.yml -e sparkops_key_name=NAME writes it to /srv/inv-state/credentials/keys/NAME" in text
    assert out["warnings"] == []
    assert pc.clients(model, [])["warnings"], "a gateway on every address without client networks reaches no LAN"


def test_each_replica_has_its_url_without_the_gateway():
    model = _model(
        switch(4),
        deployments=[{"name": "team", "profile": QWEN30}],
    )
    assert pc.clients(model, [])["urls"] == [f"http://192.168.100.{11 + i}:8000/v1" for i in range(4)]


def test_the_summary_has_no_ray_line_where_no_ray_runs():
    from ansible_collections.sparkops.cluster.plugins.filter.cluster import cluster_summary  # noqa: PLC0415

    one_each = [
        {"name": "a", "profile": QWEN30, "hosts": ["spark-1"]},
        {"name": "b", "profile": "gpt-oss-120b-mxfp4", "hosts": ["spark-2"]},
    ]
    no_ray = _model(pair(), deployments=one_each)
    assert not any(line.startswith("ray head") for line in cluster_summary(no_ray))
    assert any(line.startswith("ray head") for line in cluster_summary(_model()))


# ------------------------------------------------------------------------------------------- idle
def test_ray_on_four_nodes_for_a_tp2_profile_leaves_two_sparks_idle():
    (warning,) = pc.idle_warnings(_model(ring(4), profile_name=TP2))
    assert "starts Ray on 4 Sparks" in warning and "uses 2 of them: 2 Spark(s) serve nothing" in warning


def test_mp_for_a_tp2_profile_on_four_nodes_names_the_idle_sparks():
    (warning,) = pc.idle_warnings(_model(switch(4), executor="mp"))
    assert warning.startswith("spark-3, spark-4 serve nothing")


def test_replicas_over_every_node_leave_none_idle():
    model = _model(switch(4), deployments=[{"name": "main", "profile": TP2, "executor": "mp"}])
    assert pc.idle_warnings(model) == []
    assert pc.idle_warnings(_model()) == []


# ------------------------------------------------------------------------------------------- variables
def test_a_misspelt_variable_is_named_with_the_closest_known_one():
    known = pc.declared_variables(str(ROOT))
    prefixes = pc.role_prefixes(str(ROOT))
    names = {
        "sparkops_serving_profle": "group_vars/all/cluster.yml",
        "sparkops_serving_profile": "group_vars/all/cluster.yml",
        "vllm_serve_hots": "hosts.yml (host spark-1)",
        "gpu_memory_utilization": "group_vars/all/cluster.yml",
        "ansible_user": "hosts.yml",
        "my_own_thing": "hosts.yml",
        "sparkops_sim_state": "group_vars/all/connection.yml",
    }
    out = pc.unknown_variables(names, known, prefixes, profile_keys={"gpu_memory_utilization"})
    assert len(out) == 3, out
    assert any("sparkops_serving_profle (in group_vars/all/cluster.yml)" in w for w in out)
    assert any("did you mean sparkops_serving_profile?" in w for w in out)
    assert any("vllm_serve_hots" in w and "did you mean vllm_serve_host?" in w for w in out)
    assert any(w.startswith("gpu_memory_utilization (in group_vars/all/cluster.yml) is a key of a serving profile") and
               "sparkops_serving_overrides" in w for w in out)  # fmt: skip


def test_the_known_names_are_the_roles_defaults_and_argument_specs():
    known = pc.declared_variables(str(ROOT))
    assert {"sparkops_serving_profile", "sparkops_client_networks", "vllm_serve_host", "sparkops_serving_overrides",
            "sparkops_controller_state_dir", "ray_cluster_gcs_port"} <= known  # fmt: skip
    assert "sparkops_serving_profle" not in known


def test_inventory_names_walks_hosts_and_groups():
    data = {"all": {"vars": {"a": 1}, "children": {"g": {"hosts": {"h": {"b": 2}}, "vars": {"c": 3}}}}}
    assert pc.inventory_names(data, "hosts.yml") == {
        "a": "hosts.yml (group all)",
        "c": "hosts.yml (group g)",
        "b": "hosts.yml (host h)",
    }


# ------------------------------------------------------------------------------------------- state folder
def test_an_older_layout_is_moved_beside_the_inventory_once(tmp_path):
    inv = tmp_path / "sparks"
    (inv / "credentials" / "keys").mkdir(parents=True)
    (inv / "credentials" / "api_key").write_text("k")
    (inv / "credentials" / "keys" / "alice").write_text("a")
    (inv / "wheelhouse" / "gateway").mkdir(parents=True)
    (inv / "sparkops.lock.json").write_text("{}")
    model = build_cluster(pair(inventory_dir=str(inv)))
    moves = cs.legacy_moves(model["paths"])
    state = tmp_path / "sparks-state"
    assert (str(inv / "credentials"), str(state / "credentials")) in moves
    assert (str(inv / "wheelhouse"), str(state / "wheelhouse")) in moves
    # check mode moves nothing and says where the lock still is
    said, pending = cs.move(moves, check_mode=True)
    assert pending[str(inv / "sparkops.lock.json")] == str(state / "sparkops.lock.json")
    assert (inv / "credentials" / "api_key").exists() and all(m.startswith("would move") for m in said)
    said, pending = cs.move(moves)
    assert not pending and len(said) == 3 and all(m.startswith("moved ") for m in said)
    assert (state / "credentials" / "keys" / "alice").read_text() == "a"
    assert sorted(os.listdir(inv)) == []
    assert cs.move(moves) == ([], {}), "a second run finds nothing to move and says nothing"


def test_a_piece_in_both_places_is_left_and_said(tmp_path):
    inv, state = tmp_path / "sparks", tmp_path / "sparks-state"
    (inv / "credentials").mkdir(parents=True)
    (state / "credentials").mkdir(parents=True)
    model = build_cluster(pair(inventory_dir=str(inv)))
    said, _warned = cs.move(cs.legacy_moves(model["paths"]))
    assert len(said) == 1 and "sparkops uses" in said[0] and (inv / "credentials").exists()


def test_state_kept_inside_the_inventory_on_purpose_is_not_moved():
    model = build_cluster(pair(inventory_dir="/srv/inv", sparkops_controller_state_dir="/srv/inv"))
    assert cs.legacy_moves(model["paths"]) == []


# ------------------------------------------------------------------------------------------- follow-ons
def test_twins_on_one_subnet_are_told_once_without_follow_ons():
    inputs = pair()
    for i, host in enumerate(("spark-1", "spark-2")):
        inputs["hostvars"][host]["sparkops_fast_links"][1]["address"] = f"192.168.100.{21 + i}/24"
    probs = problems_of(inputs)
    assert len(probs) == 2, probs
    assert all("two fast links are on the same subnet 192.168.100.0/24" in p for p in probs)


@pytest.mark.parametrize("netdev", ["enp1s0f1np1:0", "enp1s0f1np1;id"])
def test_a_malformed_netdev_brings_no_reaches_nobody(netdev):
    inputs = pair()
    inputs["hostvars"]["spark-2"]["sparkops_fast_links"][0]["netdev"] = netdev
    probs = problems_of(inputs)
    assert len(probs) == 1, probs
    assert "is malformed" in probs[0]


def test_a_link_that_really_reaches_nobody_is_still_told():
    inputs = pair()
    inputs["hostvars"]["spark-2"]["sparkops_fast_links"][0]["address"] = "192.168.102.12/24"
    probs = problems_of(inputs)
    assert any("this link reaches nobody" in p for p in probs), probs


def test_the_gateway_s_empty_wheelhouse_is_said_by_the_plan(tmp_path):
    model = _model(gateway_enabled=True)
    (warning,) = pc.wheelhouse_warnings(model, tmp_path / "gateway", "1.108.7")
    assert "holds no litellm-1.108.7 wheel" in warning and "playbooks/gateway_wheels.yml" in warning
    (tmp_path / "gateway" / "linux-aarch64-cp312").mkdir(parents=True)
    (tmp_path / "gateway" / "linux-aarch64-cp312" / "litellm-1.108.7-py3-none-any.whl").write_text("")
    assert pc.wheelhouse_warnings(model, tmp_path / "gateway", "1.108.7") == []
    assert pc.wheelhouse_warnings(_model(), tmp_path / "nowhere", "1.108.7") == [], "no gateway, no wheelhouse"


def test_an_index_to_install_from_needs_no_wheelhouse_and_the_plan_says_nothing(tmp_path):
    model = _model(gateway_enabled=True)
    assert pc.wheelhouse_warnings(model, tmp_path / "gateway", "1.108.7", index_url="https://pypi.org/simple/") == []
    (warning,) = pc.wheelhouse_warnings(model, tmp_path / "gateway", "1.108.7", index_url="")
    assert "sparkops_gateway_index_url is empty" in warning
