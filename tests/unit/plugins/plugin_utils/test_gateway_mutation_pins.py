"""The gateway's LiteLLM config as LiteLLM reads it (plugins/plugin_utils/gateway.py): the router's exact
settings (how soon a failing replica is cooled and for how long, how often a request is retried, how long
one may take), the settings that keep /metrics behind the key and the admin UI off."""

from __future__ import annotations

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
    """The admin UI's switch and the telemetry veto are in the service's environment, where LiteLLM 1.108.7 reads
    them (test_gateway_config.py): the config carries neither key."""
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
