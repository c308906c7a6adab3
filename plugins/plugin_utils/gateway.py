"""The gateway's LiteLLM proxy configuration, rendered from the serving plan (issue 25; docs/gateway.md).

Pure, controller side: plugins/plugin_utils/serving.py's plan in, LiteLLM 1.108.7's config.yaml as a dict out.
One model_list entry per replica endpoint, all replicas of a deployment under its served model name (LiteLLM's
router spreads a model name's entries and cools a failing one down); no master key and no DATABASE_URL
(LiteLLM's key database needs Prisma, which downloads its engines: not on an air-gapped head); client keys
through our custom-auth hook (roles/gateway/files/sparkops_gateway_auth.py); usage through LiteLLM's
Prometheus integration plus our callback.
"""

from __future__ import annotations

AUTH_MODULE = "sparkops_gateway_auth"
# The env var, in the gateway's service, that holds the key the gateway presents to vLLM (the deployment's
# sparkops_vllm_auth key): LiteLLM reads `os.environ/NAME` values at start (litellm/proxy/proxy_server.py).
VLLM_KEY_ENV = "SPARKOPS_VLLM_API_KEY"
ROUTER_DEFAULTS = {
    # A random replica per request, weighted equally: no Redis needed (usage-based strategies want one).
    "routing_strategy": "simple-shuffle",
    # The first failure cools the replica down for cooldown_time seconds (litellm/router_utils/
    # cooldown_handlers.py:546-551: cooled when fails this minute > allowed_fails); a retry goes to another.
    "allowed_fails": 0,
    "cooldown_time": 30,
    "num_retries": 2,
    "retry_after": 0,
    "timeout": 600,
}


class GatewayPlanError(ValueError):
    """The serving plan gives the gateway nothing to route to, or two deployments one name."""


def replicas(deployment: dict) -> list[dict]:
    """The API endpoints of a deployment: `replicas[]` when the plan has them, else its one endpoint."""
    reps = deployment.get("replicas")
    if reps:
        return [{"host": r["head"], "url": r["endpoint"]["url"]} for r in reps]
    return [{"host": deployment["api_host"], "url": deployment["endpoint"]["url"]}]


def model_list(plan: dict) -> list[dict]:
    entries, seen = [], {}
    for dep in plan.get("deployments") or []:
        name = dep["served_model_name"]
        if name in seen:
            raise GatewayPlanError(
                f"deployments {seen[name]!r} and {dep['name']!r} both serve {name!r}: "
                "give each deployment its own served_model_name"
            )
        seen[name] = dep["name"]
        for index, rep in enumerate(replicas(dep)):
            entries.append(
                {
                    "model_name": name,
                    "litellm_params": {
                        # hosted_vllm: LiteLLM's OpenAI-compatible provider for vLLM (passes vLLM's params through).
                        "model": f"hosted_vllm/{name}",
                        "api_base": rep["url"].rstrip("/") + "/v1",
                        "api_key": f"os.environ/{VLLM_KEY_ENV}",
                    },
                    "model_info": {"id": f"{dep['name']}-{index}", "sparkops_host": rep["host"]},
                }
            )
    if not entries:
        raise GatewayPlanError("the serving plan has no deployment: nothing for the gateway to route to")
    return entries


def litellm_config(plan: dict, router: dict | None = None) -> dict:
    return {
        "model_list": model_list(plan),
        "router_settings": {**ROUTER_DEFAULTS, **(router or {})},
        "litellm_settings": {
            "callbacks": ["prometheus", f"{AUTH_MODULE}.usage_callback"],
            # /metrics behind the key as well (litellm/__init__.py:194 defaults it on; said here so it stays).
            "require_auth_for_metrics_endpoint": True,
            "drop_params": False,
            "telemetry": False,
        },
        "general_settings": {
            "custom_auth": f"{AUTH_MODULE}.user_api_key_auth",
            "disable_spend_logs": True,
            "disable_admin_ui": True,
        },
    }
