"""Several deployments on the simulated pair (issue 25): two single-node deployments of two extra
profiles, one on each node, served side by side by site.yml; each node runs its own vLLM (no Ray),
answers for its own model, and its own watchdog brings it back when it is killed; a rerun changes
nothing; removing one deployment leaves the other serving without a restart; and site.yml goes back
to the reference deployment (TP=2 over Ray).

The molecule scenario and the earlier integration tests have converged the pair with the reference
deployment and written the lock; this test leaves it serving that way again.
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import HEAD_FAST, WORKER_FAST, api_key, node_sh, recap, reset_watchdog, run_playbook
from test_day2_faults import HEAD, WORKER, completion_ok, wait_event, wait_serving
from test_serving_plan import container, failure

pytestmark = pytest.mark.usefixtures("sim_cluster")

# Two profiles of the stand-in model for one GPU each (the reference's flags otherwise), under their own
# served model names: the way a site adds its own models (sparkops_serving_profiles_extra).
_ONE_GPU = {
    "model": "sparkops-sim/tiny-test-model",
    "revision": "5157000000000000000000000000000000000001",
    "model_family": "sim",
    "gated": False,
    "weights_gib": 0.05,
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "enable_expert_parallel": False,
    "quantization": "gptq_marlin",
    "kv_cache_dtype": "fp8",
    "attention_backend": "TRITON_ATTN",
    "moe_backend": None,
    "gpu_memory_utilization": 0.87,
    "max_model_len": 32768,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 8192,
    "max_cudagraph_capture_size": 2048,
    "enable_prefix_caching": True,
    "speculative_config": None,
    "chat_template_kwargs": {},
    "env": {},
    "extra_args": [],
}
EXTRA = {
    "sparkops_serving_profiles_extra": {
        "sim-chat": {**_ONE_GPU, "served_model_name": "sim-chat"},
        "sim-code": {**_ONE_GPU, "served_model_name": "sim-code"},
    }
}
CHAT = {"name": "chat", "profile": "sim-chat", "hosts": [HEAD]}
CODE = {"name": "code", "profile": "sim-code", "hosts": [WORKER]}
TWO = {**EXTRA, "sparkops_deployments": [CHAT, CODE]}
CHAT_ONLY = {**EXTRA, "sparkops_deployments": [CHAT]}


def completion(ip: str, model: str) -> int:
    """The HTTP status of a completion asked of the vLLM at ip:8000 for model (from the head)."""
    key = api_key()
    res = node_sh(
        HEAD,
        "python3 - <<'EOF'\nimport json,urllib.request,urllib.error\n"
        f"req=urllib.request.Request('http://{ip}:8000/v1/completions',"
        f"data=json.dumps({{'model':'{model}','prompt':'hi','max_tokens':2}}).encode(),"
        f"headers={{'Authorization':'Bearer {key}','Content-Type':'application/json'}})\n"
        "try:\n  print(urllib.request.urlopen(req,timeout=5).status)\n"
        "except urllib.error.HTTPError as e:\n  print(e.code)\nEOF",
        check=False,
        timeout=20,
    )
    return int(res.stdout.strip() or 0)


def started_at(node: str) -> str:
    return container(node, "sparkops-vllm")["State"]["StartedAt"]


def test_two_deployments_serve_side_by_side_and_the_cluster_goes_back_to_the_reference(tmp_path):
    out = tmp_path / "plan.json"
    shown = run_playbook("playbooks/plan.yml", extra_vars={**TWO, "sparkops_plan_file": str(out)})
    assert shown.returncode == 0, failure(shown)
    plan = json.loads(out.read_text())["serving"]
    argv = {d["name"]: d["members"][0]["vllm"]["argv"] for d in plan["deployments"]}
    t0 = time.monotonic()
    res = run_playbook("site.yml", extra_vars=TWO, timeout=900)
    assert res.returncode == 0, failure(res)
    print(f"\n[deployments] reference -> chat + code: {time.monotonic() - t0:.0f} s")
    try:
        for node, name in ((HEAD, "chat"), (WORKER, "code")):
            vllm = container(node, "sparkops-vllm")
            assert vllm and vllm["State"]["Running"], f"no vLLM on {node}"
            assert vllm["Config"]["Cmd"] == argv[name], node
            assert vllm["Config"]["Labels"]["io.sparkops.deployment"] == name
            assert container(node, "sparkops-ray") is None, f"Ray still on {node}: a single-node deployment needs none"
        # Each node answers for its own model only.
        assert completion(HEAD_FAST, "sim-chat") == 200 and completion(WORKER_FAST, "sim-code") == 200
        assert completion(HEAD_FAST, "sim-code") == 404 and completion(WORKER_FAST, "sim-chat") == 404
        again = run_playbook("site.yml", extra_vars=TWO, timeout=900)
        assert again.returncode == 0, failure(again)
        counts = recap(again.stdout)
        assert all(c["changed"] == 0 for c in counts.values()), counts

        # The code deployment's own watchdog (on its API host, spark-sim-2) restarts it; chat is untouched.
        chat_started = started_at(HEAD)
        reset_watchdog(WORKER)
        t1 = time.time()
        node_sh(WORKER, "docker kill sparkops-vllm")
        ended = wait_event("restart_ended", t1, timeout=240, node=WORKER, pred=lambda e: e.get("ok"))
        assert completion(WORKER_FAST, "sim-code") == 200
        assert started_at(HEAD) == chat_started
        print(f"[deployments] code killed: serving again after {ended['epoch'] - t1:.1f} s (2 cores)")

        # Removing one deployment leaves the other serving, not restarted.
        less = run_playbook("site.yml", extra_vars=CHAT_ONLY, timeout=900)
        assert less.returncode == 0, failure(less)
        assert container(WORKER, "sparkops-vllm") is None, "the removed deployment's vLLM is still there"
        assert started_at(HEAD) == chat_started and completion(HEAD_FAST, "sim-chat") == 200
    finally:
        back = run_playbook("site.yml", timeout=900)
    assert back.returncode == 0, failure(back)
    for node in (HEAD, WORKER):
        assert container(node, "sparkops-ray")["State"]["Running"], f"Ray did not come back on {node}"
    assert container(WORKER, "sparkops-vllm") is None
    wait_serving(60)
    assert completion_ok()
