"""The gateway's LiteLLM config (plugins/plugin_utils/gateway.py) from a real serving plan (issue 25)."""

from __future__ import annotations

import copy

import pytest
import yaml
from ansible_collections.sparkops.cluster.plugins.plugin_utils import gateway
from conftest import ROOT
from test_serving_plan import plan_of_only


def test_todays_plan_gives_one_entry_at_the_deployments_endpoint():
    plan = plan_of_only()
    dep = plan["deployments"][0]
    cfg = gateway.litellm_config(plan)
    [entry] = cfg["model_list"]
    assert entry["model_name"] == dep["served_model_name"]
    assert entry["litellm_params"]["api_base"] == dep["endpoint"]["url"] + "/v1"
    assert entry["litellm_params"]["model"] == "hosted_vllm/" + dep["served_model_name"]
    # The vLLM key by reference only: never its value in a config file.
    assert entry["litellm_params"]["api_key"] == "os.environ/SPARKOPS_VLLM_API_KEY"
    assert entry["model_info"] == {"id": dep["name"] + "-0", "sparkops_host": dep["api_host"]}


def test_every_replica_is_an_entry_under_the_served_name_with_its_own_id():
    plan = plan_of_only()
    dep = plan["deployments"][0]
    # The replicas as the serving plan names them (serving.py: each with its head and endpoint).
    dep["replicas"] = [
        {"index": 0, "head": "spark-1", "endpoint": {"url": "http://10.0.0.1:8000"}},
        {"index": 1, "head": "spark-3", "endpoint": {"url": "http://10.0.0.3:8000/"}},
    ]
    other = copy.deepcopy(dep)
    other.update(name="second", served_model_name="small", replicas=None, api_host="spark-5")
    other["endpoint"] = {"url": "http://10.0.0.5:8001"}
    plan["deployments"].append(other)
    entries = gateway.litellm_config(plan)["model_list"]
    assert [(e["model_name"], e["litellm_params"]["api_base"], e["model_info"]["id"]) for e in entries] == [
        (dep["served_model_name"], "http://10.0.0.1:8000/v1", dep["name"] + "-0"),
        (dep["served_model_name"], "http://10.0.0.3:8000/v1", dep["name"] + "-1"),
        ("small", "http://10.0.0.5:8001/v1", "second-0"),
    ]


def test_two_deployments_with_one_name_and_an_empty_plan_are_refused():
    plan = plan_of_only()
    twin = copy.deepcopy(plan["deployments"][0])
    twin["name"] = "twin"
    plan["deployments"].append(twin)
    with pytest.raises(gateway.GatewayPlanError, match="both serve"):
        gateway.litellm_config(plan)
    with pytest.raises(gateway.GatewayPlanError, match="no deployment"):
        gateway.litellm_config({"deployments": []})


def test_auth_ejection_and_metrics_settings():
    cfg = gateway.litellm_config(plan_of_only(), router={"cooldown_time": 5})
    assert cfg["general_settings"]["custom_auth"] == "sparkops_gateway_auth.user_api_key_auth"
    assert "master_key" not in cfg["general_settings"]  # from the environment only (LITELLM_MASTER_KEY)
    assert "database_url" not in cfg["general_settings"]  # no Prisma
    assert cfg["litellm_settings"]["callbacks"] == ["prometheus", "sparkops_gateway_auth.usage_callback"]
    assert cfg["litellm_settings"]["require_auth_for_metrics_endpoint"] is True
    router = cfg["router_settings"]
    assert router["cooldown_time"] == 5 and router["allowed_fails"] == 0 and router["num_retries"] >= 1
    assert gateway.ROUTER_DEFAULTS["cooldown_time"] == 30  # the override did not leak into the defaults


def test_wheel_platforms_name_every_manylinux_level_the_nodes_glibc_runs():
    tags = gateway.wheel_platforms("aarch64", "glibc 2.39")
    assert tags[0] == "manylinux_2_39_aarch64" and tags[-2] == "manylinux_2_17_aarch64"
    assert tags[-1] == "manylinux2014_aarch64"
    assert len(tags) == 39 - 17 + 2
    # Debian 12's glibc: no wheel that needs a newer one (LiteLLM's is manylinux_2_28).
    assert "manylinux_2_37_x86_64" not in gateway.wheel_platforms("x86_64", "2.36")
    assert "manylinux_2_28_x86_64" in gateway.wheel_platforms("x86_64", "2.36")


@pytest.mark.parametrize(
    ("arch", "glibc"), [("riscv64", "2.39"), ("x86_64", "2.12"), ("x86_64", "musl"), ("x86_64", "")]
)
def test_a_platform_without_wheels_is_refused(arch, glibc):
    with pytest.raises(gateway.WheelhouseError):
        gateway.wheel_platforms(arch, glibc)


def test_the_wheelhouse_folder_names_arch_and_python():
    assert gateway.wheelhouse_name("aarch64", "3.12.3") == "linux-aarch64-cp312"
    assert gateway.wheelhouse_name("x86_64", "3.11") == "linux-x86_64-cp311"
    with pytest.raises(gateway.WheelhouseError):
        gateway.wheelhouse_name("x86_64", "three")


def test_pip_download_is_binary_only_for_the_nodes_python_and_platforms():
    argv = gateway.pip_download_argv(
        ["pip"], "/w", ["litellm[proxy]==1.108.7", "prometheus_client"], arch="x86_64", python="3.11.2", glibc="2.36"
    )
    assert argv[:3] == ["pip", "download", "--only-binary=:all:"]
    assert argv[argv.index("--python-version") + 1] == "3.11"
    assert argv[argv.index("--implementation") + 1] == "cp"
    platforms = [argv[i + 1] for i, a in enumerate(argv) if a == "--platform"]
    assert platforms == gateway.wheel_platforms("x86_64", "2.36")
    assert argv[-3:] == ["/w", "litellm[proxy]==1.108.7", "prometheus_client"]


def test_the_filters_turn_errors_into_ansible_errors():
    from ansible.errors import AnsibleFilterError  # noqa: PLC0415
    from ansible_collections.sparkops.cluster.plugins.filter import gateway as gateway_filters  # noqa: PLC0415

    filters = gateway_filters.FilterModule().filters()
    assert filters["gateway_wheelhouse_name"]("aarch64", "3.12.3") == "linux-aarch64-cp312"
    with pytest.raises(AnsibleFilterError, match="riscv64"):
        filters["gateway_pip_download"]("pip", "/w", ["x"], arch="riscv64", python="3.12", glibc="2.39")
    download = filters["gateway_wheelhouse_download"]
    argv = download("/usr/bin/python3", "/w", ["litellm"], arch="aarch64", python="3.12.3", glibc="glibc 2.39")
    assert argv[1].endswith("plugin_utils/gateway.py") and argv[2:6] == ["/w", "aarch64", "3.12.3", "2.39"]
    assert argv[6:9] == ["/usr/bin/python3", "-m", "pip"] and argv[-2:] == ["--", "litellm"]
    with pytest.raises(AnsibleFilterError, match="riscv64"):
        filters["gateway_wheelhouse_download"]("py", "/w", ["x"], arch="riscv64", python="3.12.3", glibc="2.39")
    with pytest.raises(AnsibleFilterError, match="no deployment"):
        filters["gateway_litellm_config"]({"deployments": []})


def _wheel(folder, name, version, requires):
    import zipfile

    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
        z.writestr(
            f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}"
        )
    return path


def test_the_wheels_the_node_s_exact_python_needs_besides_are_named(tmp_path):
    """pip download judges markers with the controller's Python: a 3.11.7 controller leaves out what a
    3.11.2 node needs (redis's async-timeout below 3.11.3, as LiteLLM 1.108.7's tree has it). The walk with
    the node's markers names it, follows extras, and skips what the node does not need."""
    from ansible_collections.sparkops.cluster.plugins.plugin_utils import gateway as gw

    _wheel(tmp_path, "litellm", "1.108.7", ["httpx", 'redis; extra == "proxy"', 'boto3; extra == "bedrock"'])
    _wheel(tmp_path, "httpx", "0.28.1", [])
    _wheel(tmp_path, "redis", "8.1.0", ['async-timeout>=4.0.3; python_full_version < "3.11.3"'])
    node = gw.marker_environment("x86_64", "3.11.2")
    assert gw.missing_requirements(str(tmp_path), ["litellm[proxy]==1.108.7"], node) == ["async-timeout>=4.0.3"]
    assert (
        gw.missing_requirements(str(tmp_path), ["litellm[proxy]==1.108.7"], gw.marker_environment("aarch64", "3.12.3"))
        == []
    )
    assert gw.missing_requirements(str(tmp_path), ["litellm==1.108.7"], node) == []  # no extra: no redis
    _wheel(tmp_path, "async_timeout", "5.0.1", [])
    assert gw.missing_requirements(str(tmp_path), ["litellm[proxy]==1.108.7"], node) == []


def _two_replicas_and_a_lone_one():
    plan = plan_of_only()
    dep = plan["deployments"][0]
    dep["replicas"] = [
        {"index": 0, "head": "spark-1", "endpoint": {"url": "http://10.0.0.1:8000"}},
        {"index": 1, "head": "spark-3", "endpoint": {"url": "http://10.0.0.3:8000"}},
    ]
    other = copy.deepcopy(dep)
    other.update(name="second", served_model_name="small", replicas=None, api_host="spark-5")
    other["endpoint"] = {"url": "http://10.0.0.5:8001"}
    plan["deployments"].append(other)
    return plan, dep


def test_a_drained_replica_leaves_the_routing_and_the_others_stay():
    plan, dep = _two_replicas_and_a_lone_one()
    entries = gateway.litellm_config(plan, drained=[dep["name"] + "-0"])["model_list"]
    assert [e["model_info"]["id"] for e in entries] == [dep["name"] + "-1", "second-0"]
    assert entries[0]["litellm_params"]["api_base"] == "http://10.0.0.3:8000/v1"
    # Nothing drained: every replica, as before.
    assert len(gateway.litellm_config(plan, drained=())["model_list"]) == 3


def test_draining_the_last_replica_of_a_model_is_refused_naming_it():
    plan, dep = _two_replicas_and_a_lone_one()
    with pytest.raises(gateway.GatewayPlanError, match=r"would leave small with no replica"):
        gateway.litellm_config(plan, drained=["second-0"])
    both = [dep["name"] + "-0", dep["name"] + "-1"]
    with pytest.raises(gateway.GatewayPlanError, match=rf"leave {dep['served_model_name']} with no replica"):
        gateway.litellm_config(plan, drained=both)


def test_draining_an_unknown_replica_is_refused_listing_the_ids():
    plan, dep = _two_replicas_and_a_lone_one()
    with pytest.raises(gateway.GatewayPlanError, match=r"second-7 are not in the plan") as err:
        gateway.litellm_config(plan, drained=["second-7"])
    assert f"{dep['name']}-0, {dep['name']}-1, second-0" in str(err.value)


def test_the_filter_passes_drained_and_turns_refusals_into_ansible_errors():
    from ansible.errors import AnsibleFilterError  # noqa: PLC0415
    from ansible_collections.sparkops.cluster.plugins.filter import gateway as gateway_filters  # noqa: PLC0415

    plan, dep = _two_replicas_and_a_lone_one()
    render = gateway_filters.FilterModule().filters()["gateway_litellm_config"]
    assert [e["model_info"]["id"] for e in render(plan, [dep["name"] + "-1"])["model_list"]] == [
        dep["name"] + "-0",
        "second-0",
    ]
    with pytest.raises(AnsibleFilterError, match="no replica"):
        render(plan, ["second-0"])


def test_no_setting_litellm_ignores_and_the_environment_sets_what_it_reads():
    """LiteLLM 1.108.7 takes the admin UI's switch and the telemetry veto from the environment only
    (litellm/proxy/common_utils/admin_ui_utils.py:7-8; litellm/proxy/telemetry/settings.py:12, 34-40): keys in
    the config did nothing (general_settings.disable_admin_ui is read nowhere; litellm_settings.telemetry only
    sets an unused attribute, proxy_server.py:6737-6745)."""
    cfg = gateway.litellm_config(plan_of_only())
    assert "telemetry" not in cfg["litellm_settings"]
    assert "disable_admin_ui" not in cfg["general_settings"]
    env = yaml.safe_load((ROOT / "roles/gateway/vars/main.yml").read_text())["gateway_environment"]
    # The exact spelling each reader accepts: str_to_bool takes "true"/"false" (secret_managers/main.py:133-141),
    # ui_discovery_endpoints.py:27 compares the lowered value with "true", pydantic's bool takes "true".
    assert env["DISABLE_ADMIN_UI"] == "true"
    assert env["LITELLM_TELEMETRY_DISABLED"] == "true"
