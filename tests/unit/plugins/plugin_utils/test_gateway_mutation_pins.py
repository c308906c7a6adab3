"""The gateway's LiteLLM config as LiteLLM reads it (plugins/plugin_utils/gateway.py): the router's exact
settings (how soon a failing replica is cooled and for how long, how often a request is retried, how long
one may take), the settings that keep /metrics behind the key and the admin UI off; the offline wheelhouse's
markers, rounds and bound.

Equivalent mutant (tests/mutation/equivalents.py lists it; `make mutation` does not run it): marker_environment's
`[*str(python).split("."), "0", "0"][:3]` with one "0" dropped: the node's Python is major.minor at least
(wheelhouse_name refuses less), so one "0" fills the micro version alike.
"""

from __future__ import annotations

import pytest
from ansible_collections.sparkops.cluster.plugins.plugin_utils import gateway
from test_serving_plan import plan_of_only


def test_the_router_cools_a_replica_on_its_first_failure_for_30_s_and_retries_twice():
    router = gateway.litellm_config(plan_of_only())["router_settings"]
    assert router == {
        "routing_strategy": "simple-shuffle",
        "allowed_fails": 0,
        "cooldown_time": 30,
        "num_retries": 2,
        "retry_after": 0,
        "timeout": 600,
    }


def test_metrics_stay_behind_the_key_and_spend_logs_stay_off():
    # The admin UI and telemetry are switched off in the service's environment, where LiteLLM 1.108.7 reads
    # them (DISABLE_ADMIN_UI, LITELLM_TELEMETRY_DISABLED: test_gateway_config.py), not in this file.
    cfg = gateway.litellm_config(plan_of_only())
    assert cfg["litellm_settings"] == {
        "callbacks": ["prometheus", "sparkops_gateway_auth.usage_callback"],
        "require_auth_for_metrics_endpoint": True,
        "drop_params": False,
    }
    assert cfg["general_settings"] == {
        "custom_auth": "sparkops_gateway_auth.user_api_key_auth",
        "disable_spend_logs": True,
    }


def test_the_oldest_glibc_the_wheels_take_is_2_17():
    assert gateway.wheel_platforms("aarch64", "glibc 2.17") == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    assert gateway.wheel_platforms("x86_64", "2.18") == [
        "manylinux_2_18_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
    ]


def test_a_gateway_without_any_key_yet_lists_no_usage_line():
    # status.yml's keys section before the first key (the gateway_key module's `keys` is null then)
    assert gateway.usage_lines(None) == [] and gateway.usage_lines([]) == []


def test_the_wheelhouse_is_named_by_python_major_minor_only():
    assert gateway.wheelhouse_name("aarch64", "3.13.0rc1") == "linux-aarch64-cp313"
    for bad in ("3", "3.x", "x.12"):
        with pytest.raises(gateway.WheelhouseError, match=r"^Python version .*: expected major\.minor\[\.micro\]$"):
            gateway.wheelhouse_name("aarch64", bad)


def test_the_node_s_markers_are_those_of_cpython_on_linux_for_its_arch_and_exact_python():
    assert gateway.marker_environment("aarch64", "3.11") == {
        "implementation_name": "cpython",
        "implementation_version": "3.11.0",
        "os_name": "posix",
        "platform_machine": "aarch64",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": "3.11.0",
        "python_version": "3.11",
        "sys_platform": "linux",
    }


def test_a_requirement_reached_twice_does_not_stop_the_walk(tmp_path):
    # Two packages need `idna`: the second time it is met the walk goes on to what is still queued.
    from test_gateway_config import _wheel  # noqa: PLC0415

    _wheel(tmp_path, "app", "1.0", ["a", "b", 'uvloop; sys_platform == "linux" and platform_machine == "aarch64"'])
    _wheel(tmp_path, "a", "1.0", ["idna"])
    _wheel(tmp_path, "b", "1.0", ["idna", "certifi"])
    _wheel(tmp_path, "idna", "3.10", [])
    env = gateway.marker_environment("aarch64", "3.12.3")
    assert gateway.missing_requirements(str(tmp_path), ["app"], env) == ["certifi", "uvloop"]
    assert gateway.missing_requirements(str(tmp_path), ["app"], gateway.marker_environment("x86_64", "3.12.3")) == [
        "certifi"
    ]


def test_an_extra_among_several_brings_its_requirements():
    import tempfile  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from test_gateway_config import _wheel  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        _wheel(Path(tmp), "app", "1.0", ['redis; extra == "proxy"', 'boto3; extra == "bedrock"'])
        env = gateway.marker_environment("x86_64", "3.12.3")
        assert gateway.missing_requirements(tmp, ["app[proxy,ui]"], env) == ["redis"]
        assert gateway.missing_requirements(tmp, ["app[bedrock,proxy]"], env) == ["boto3", "redis"]


def test_the_wheelhouse_download_adds_rounds_for_what_the_node_s_markers_add_and_gives_up_after_six(tmp_path):
    from test_gateway_config import _wheel  # noqa: PLC0415

    def pip(argv):  # a pip download that fetches what it is asked for (by name), and nothing else
        dest = tmp_path
        for req in argv[argv.index(str(dest)) + 1 :]:
            name = req.split("[")[0].split(">")[0].split("=")[0].split(";")[0]
            deps = ['async-timeout>=4; python_full_version < "3.11.3"'] if name == "redis" else []
            _wheel(dest, name.replace("-", "_"), "1.0", deps)

    rounds = gateway.download_wheelhouse(
        ["pip"], str(tmp_path), ["redis"], arch="x86_64", python="3.11.2", glibc="2.36", run=pip
    )
    assert [r[r.index(str(tmp_path)) + 1 :] for r in rounds] == [["redis"], ["async-timeout>=4"]]
    assert rounds[0][:7] == [
        "pip",
        "download",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        "3.11",
    ]

    calls = []
    with pytest.raises(gateway.WheelhouseError, match=r"still lacks nothing-fetches-this for CPython 3.11.2 on x86_64"):
        gateway.download_wheelhouse(
            ["pip"], str(tmp_path), ["nothing-fetches-this"], arch="x86_64", python="3.11.2", glibc="2.36",
            run=calls.append,
        )  # fmt: skip
    assert len(calls) == 6
