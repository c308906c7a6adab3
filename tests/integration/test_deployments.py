"""Several deployments on the simulated pair (issue 25): two single-node deployments of two extra
profiles, one on each node, served side by side by site.yml; each node runs its own vLLM (no Ray),
answers for its own model, and its own watchdog brings it back when it is killed; a rerun changes
nothing; status, the health report (verify's last play), doctor, Prometheus and the benchmark see
each deployment's replica. That removing one deployment leaves the other serving without a restart is proven
two steps later, where the gateway's two replicas of chat replace code (test_gateway.py).

A step of the transition chain (conftest.CHAIN): it starts from the previous step's end (the pair under
vLLM's mp executor) and leaves the two deployments for the gateway's step.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from conftest import HEAD_FAST, SIM_STATE, WORKER_FAST, api_key, node_sh, recap, reset_watchdog, run_playbook
from test_day2_faults import HEAD, WORKER, wait_event
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


def day2_sees_every_replica():
    """Issue 25: status, the health report, doctor, Prometheus and the benchmark check each deployment's
    replica (chat on the head, code on the worker), not only the first deployment's."""
    from test_monitoring import prom_get, wait_for  # noqa: PLC0415 - its Prometheus helpers

    replicas = [("chat", HEAD, HEAD_FAST, "sim-chat"), ("code", WORKER, WORKER_FAST, "sim-code")]
    status = run_playbook("playbooks/status.yml", extra_vars=TWO, timeout=300)
    assert status.returncode == 0, failure(status)
    out = " ".join(status.stdout.split())
    for name, _node, ip, model in replicas:
        assert f"endpoint {name} replica 0 ({model}): http://{ip}:8000/v1 HEALTHY" in out, out[-3000:]
    assert "ray: not used (no replica runs under Ray)" in out
    report = run_playbook("playbooks/report.yml", extra_vars=TWO, timeout=300)
    assert report.returncode == 0, failure(report)
    health = json.loads((SIM_STATE / "reports" / "health.json").read_text())
    assert health["healthy"] is True and health["served_model_name"] == "sim-chat"
    got = [(r["deployment"], r["host"], r["url"], r["healthy"]) for r in health["replicas"]]
    assert got == [(n, node, f"http://{ip}:8000", True) for n, node, ip, _m in replicas], got
    assert "## Every replica" in (SIM_STATE / "reports" / "health.md").read_text()
    doctor = run_playbook("playbooks/doctor.yml", extra_vars=TWO, timeout=600)
    verdicts = json.loads((SIM_STATE / "reports" / "doctor.json").read_text())["verdicts"]
    endpoints = [(v["scope"], v["verdict"]) for v in verdicts if v["check"] == "endpoint"]
    want = [(f"{n} replica 0 (http://{ip}:8000)", "PASS") for n, _node, ip, _m in replicas]
    assert endpoints == want, (endpoints, doctor.stdout[-3000:])
    # The worker's API was asked without the key too (doctor_keyless_urls): it asks for it.
    assert f"http://{WORKER_FAST}:8000/tokenize" in doctor.stdout, doctor.stdout[-3000:]
    (exposure,) = [v for v in verdicts if v["check"] == "API exposure"]
    assert exposure["verdict"] == "PASS", exposure

    def vllm_targets():
        active = prom_get("/api/v1/targets?state=active")["activeTargets"]
        found = sorted(
            (t["labels"]["deployment"], t["labels"]["node"], t["scrapeUrl"], t["health"])
            for t in active
            if t["labels"]["job"] == "vllm" and "deployment" in t["labels"]
        )
        return found if [f[3] for f in found] == ["up", "up"] else None

    scraped = wait_for("both replicas scraped", vllm_targets, 90)
    assert scraped == [(n, node, f"http://{ip}:8000/metrics", "up") for n, node, ip, _m in replicas], scraped
    bench = run_playbook(
        "playbooks/benchmark.yml",
        extra_vars={**TWO, "sparkops_deployment": "code", "benchmark_concurrency": [1], "benchmark_max_tokens": 8},
        timeout=600,
    )
    assert bench.returncode == 0, failure(bench)
    path = Path(re.search(r"JSON: (\S+\.json)", bench.stdout).group(1))
    assert path.name.startswith("spark-sim-code-") and json.loads(path.read_text())["model"] == "sim-code"
    wrong = run_playbook("playbooks/benchmark.yml", extra_vars={**TWO, "sparkops_deployment": "nope"}, timeout=300)
    assert wrong.returncode != 0 and "it serves chat, code" in " ".join(wrong.stdout.split()), failure(wrong)


# Both deployments moved at once by a whole-cluster upgrade to new profiles (fewer sequences), code's new one
# answering 200 OK but wrongly, as a broken kernel would (the double's SPARKOPS_TEST_DOUBLE_ANSWERS=wrong):
# only the quality gate sees it. (An image whose vLLM dies at its start: test_faults_and_day2.)
V2_BOTH = {
    "sparkops_serving_profiles_extra": {
        **EXTRA["sparkops_serving_profiles_extra"],
        "sim-chat-v2": {**_ONE_GPU, "served_model_name": "sim-chat", "max_num_seqs": 8},
        "sim-code-v2": {
            **_ONE_GPU,
            "served_model_name": "sim-code",
            "max_num_seqs": 8,
            "env": {"SPARKOPS_TEST_DOUBLE_ANSWERS": "wrong"},
        },  # fmt: skip
    },
    "sparkops_deployments": [{**CHAT, "profile": "sim-chat-v2"}, {**CODE, "profile": "sim-code-v2"}],
}


def a_failed_upgrade_of_both_deployments_rolls_both_back(tmp_path) -> None:
    """A whole-cluster upgrade of two deployments whose new code replica answers wrongly behind a green health
    check is stopped by the quality gate and rolls BOTH back to their recorded profiles on the recorded image;
    the lock and the records are unchanged. From the two deployments' shape, and back to it: no converge of its
    own."""
    record = node_sh(HEAD, "cat /var/lib/sparkops/deployment.json").stdout
    assert set(json.loads(record)["deployments"]) == {"chat", "code"}, record
    before = {n: (container(n, "sparkops-vllm")["Config"]["Cmd"], container(n, "sparkops-vllm")["Config"]["Image"])
              for n in (HEAD, WORKER)}  # fmt: skip
    lock = tmp_path / "sparkops.lock.json"
    lock.write_bytes((SIM_STATE / "sparkops.lock.json").read_bytes())
    locked = lock.read_bytes()
    assert {"chat", "code"} <= set(json.loads(locked)["models"])
    for node in (HEAD, WORKER):
        reset_watchdog(node)
    extra = {**V2_BOTH, "sparkops_lock_file": str(lock)}
    t0 = time.monotonic()
    up = run_playbook("playbooks/upgrade.yml", extra_vars=extra, timeout=1800)
    text = " ".join(up.stdout.split())
    assert up.returncode != 0, text[-4000:]
    assert "vllm_quality: sim-code at http://" in text and "answers wrongly" in text, text[-4000:]
    assert "was rolled back" in text, text[-4000:]
    print(f"[deployments] failed upgrade of both deployments rolled back in {time.monotonic() - t0:.0f} s")
    for node in (HEAD, WORKER):  # profile (--max-num-seqs 16) and image back on both nodes
        vllm = container(node, "sparkops-vllm")
        assert vllm["State"]["Running"] and (vllm["Config"]["Cmd"], vllm["Config"]["Image"]) == before[node], node
    assert completion(HEAD_FAST, "sim-chat") == 200 and completion(WORKER_FAST, "sim-code") == 200
    assert node_sh(HEAD, "cat /var/lib/sparkops/deployment.json").stdout == record  # the records unchanged
    assert lock.read_bytes() == locked  # the lock unchanged


def test_two_deployments_serve_side_by_side_and_removing_one_leaves_the_other(tmp_path):
    out = tmp_path / "plan.json"
    shown = run_playbook("playbooks/plan.yml", extra_vars={**TWO, "sparkops_plan_file": str(out)})
    assert shown.returncode == 0, failure(shown)
    plan = json.loads(out.read_text())["serving"]
    argv = {d["name"]: d["members"][0]["vllm"]["argv"] for d in plan["deployments"]}
    t0 = time.monotonic()
    res = run_playbook("site.yml", extra_vars=TWO, timeout=900)
    assert res.returncode == 0, failure(res)
    print(f"\n[chain] mp TP=2 -> chat + code: {time.monotonic() - t0:.0f} s")
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
    day2_sees_every_replica()
    a_failed_upgrade_of_both_deployments_rolls_both_back(tmp_path)

    # The code deployment's own watchdog (on its API host, spark-sim-2) restarts it; chat is untouched.
    chat_started = started_at(HEAD)
    reset_watchdog(WORKER)
    t1 = time.time()
    node_sh(WORKER, "docker kill sparkops-vllm")
    ended = wait_event("restart_ended", t1, timeout=240, node=WORKER, pred=lambda e: e.get("ok"))
    assert completion(WORKER_FAST, "sim-code") == 200
    assert started_at(HEAD) == chat_started
    print(f"[deployments] code killed: serving again after {ended['epoch'] - t1:.1f} s (2 cores)")
    # The chain's next step (test_gateway.py) puts the gateway in front of these two deployments; the one after it
    # removes code and proves chat is left serving, not restarted.
