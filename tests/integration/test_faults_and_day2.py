"""Faults and day-2 operations on the simulated cluster, in order.

The molecule scenario has converged the cluster before these run (make test).
Each test leaves the cluster serving again, so the order only matters for speed.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import (
    ENDPOINT,
    HEAD_FAST,
    NODES,
    ROOT,
    WORKER_FAST,
    api_key,
    assert_watchdog_running,
    failure,
    node_sh,
    recap,
    reset_watchdog,
    run_adhoc,
    run_playbook,
)
from test_image_lock import standin_commit

pytestmark = pytest.mark.usefixtures("sim_cluster")


def health(key: str | None = None, timeout_s: float = 20, checks=None) -> dict:
    return run_adhoc(
        "spark-sim-1",
        "sparkops.cluster.vllm_health",
        {
            "base_url": ENDPOINT,
            "api_key": key if key is not None else api_key(),
            "model": "sim-tiny",
            "timeout_s": timeout_s,
            "checks": checks or ["health", "models", "completion"],
        },
    )


def image_ids() -> dict:
    out = {}
    for node in NODES:
        res = node_sh(node, "docker inspect --format '{{.Image}}' sparkops-ray", check=False)
        out[node] = res.stdout.strip()
    return out


def state_file() -> dict:
    return json.loads(node_sh("spark-sim-1", "cat /var/lib/sparkops/deployment.json").stdout)


def test_wrong_api_key_is_reported_as_401():
    out = health(key="not-the-key")
    assert out.get("failed")
    assert out["failure_kind"] == "unauthorized"
    assert "401" in out["msg"]
    assert "not-the-key" not in json.dumps(out)


def test_interrupted_image_transfer_is_redone():
    tag = state_file()["image"]
    want = image_ids()["spark-sim-1"]
    # A transfer cut off midway: the tag is gone and a truncated stream fails to load.
    node_sh("spark-sim-2", f"docker image rm -f {tag} >/dev/null")
    cut = node_sh(
        "spark-sim-1",
        f"set -o pipefail; docker save {tag} | head -c 20000000 | "
        "ssh -i /root/.ssh/sparkops_fabric_ed25519 -o UserKnownHostsFile=/root/.ssh/sparkops_fabric_known_hosts "
        f"-o BatchMode=yes root@{WORKER_FAST} docker load -q",
        check=False,
    )
    assert cut.returncode != 0
    assert node_sh("spark-sim-2", f"docker image inspect {tag}", check=False).returncode != 0
    res = run_playbook("playbooks/image.yml")
    assert res.returncode == 0, failure(res)
    assert recap(res.stdout)["spark-sim-1"]["changed"] >= 1
    got = node_sh("spark-sim-2", f"docker image inspect --format '{{{{.Id}}}}' {tag}").stdout.strip()
    assert got == want


def test_ray_answers_on_the_fast_links_only_and_a_lost_rule_comes_back():
    """Ray has no authentication: its GCS port is dropped on the management LAN, open on the fast link."""
    import yaml

    hosts = yaml.safe_load((ROOT / "inventory" / "sim" / "hosts.yml").read_text())
    mgmt = hosts["all"]["children"]["spark_cluster"]["children"]["spark_head"]["hosts"]["spark-sim-1"]["ansible_host"]

    def reaches(address: str) -> bool:
        return node_sh("spark-sim-2", f"nc -z -w 3 {address} 6379", check=False).returncode == 0

    assert reaches(HEAD_FAST), "the GCS port does not answer on the fast link"
    assert not reaches(mgmt), "Ray's GCS port answers on the management LAN"
    # A lost rule (someone's `iptables -D`): the management LAN reaches Ray until the next run.
    drop = "-m comment --comment 'sparkops: Ray: fast links and client networks only' -j DROP"
    node_sh("spark-sim-1", f"iptables -D SPARKOPS-RAY {drop}")
    assert reaches(mgmt)
    res = run_playbook("playbooks/serve.yml")
    assert res.returncode == 0, failure(res)
    assert recap(res.stdout)["spark-sim-1"]["changed"] >= 1
    assert not reaches(mgmt), "the rerun did not put the DROP rule back"
    assert reaches(HEAD_FAST)
    again = run_playbook("playbooks/serve.yml")
    assert again.returncode == 0 and recap(again.stdout)["spark-sim-1"]["changed"] == 0, again.stdout[-3000:]


def locked_copy(tmp_path):
    """A copy of the inventory's lock file: an upgrade moves this one, so later site.yml runs in this
    session (whose inventory still says sim-v1) converge back instead of being refused by the lock."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    lock = tmp_path / "sparkops.lock.json"
    main = ROOT / ".sim" / "sparkops.lock.json"  # the simulated cluster's lock (inventory/sim connection.yml)
    if main.exists():
        lock.write_bytes(main.read_bytes())
    return lock


def test_upgrade_to_a_new_image_commit(tmp_path):
    # A watchdog with its whole restart budget: unpaused, it took the swap for a failure and
    # restarted the group under it (CI: the upgrade failed and rolled back).
    reset_watchdog()
    before = state_file()
    lock = locked_copy(tmp_path)
    res = run_playbook(
        "playbooks/upgrade.yml", extra_vars={"spark_vllm_image_ref": "sim-v2", "sparkops_lock_file": str(lock)}
    )
    assert res.returncode == 0, failure(res)
    text = " ".join(res.stdout.split())
    down = re.search(r"downtime ([0-9.]+) s", text)
    assert down, text[-3000:]
    print(f"\nupgrade sim-v1 -> sim-v2: downtime {down.group(1)} s, whole playbook {res.elapsed:.1f} s")
    after = state_file()
    assert after["image"] != before["image"]
    assert after["image_ref"] == "sim-v2"
    assert after["previous"]["image"] == before["image"]
    # The lock moved, and the run said what moved.
    locked_before = json.loads(locked_copy(tmp_path / "main").read_text())
    locked = json.loads(lock.read_text())
    assert locked["image"]["ref"] == "sim-v2" and locked["image"]["id"] != locked_before["image"]["id"]
    assert locked["versions"] == locked_before["versions"]
    moved = re.search(r"Lock file \S+: moved: (.{0,600})", text.replace('\\"', '"'))
    assert moved, text[-3000:]
    assert f'image.commit: "{standin_commit("sim-v1")}" -> "{standin_commit("sim-v2")}"' in moved.group(1)
    assert 'image.ref: "sim-v1" -> "sim-v2"' in moved.group(1)
    assert (
        node_sh("spark-sim-1", "docker inspect --format '{{.Config.Image}}' sparkops-vllm").stdout.strip()
        == (locked["image"]["tag"])
    )
    # The lock now holds sim-v2: the inventory (sim-v1) is refused until it is upgraded back.
    refused = run_playbook("playbooks/image.yml", extra_vars={"sparkops_lock_file": str(lock)})
    assert refused.returncode != 0
    assert 'the lock has "sim-v2", the inventory asks for "sim-v1"' in " ".join(refused.stdout.split()).replace(
        '\\"', '"'
    )
    # The old tag is kept on every node, for a rollback.
    for node in NODES:
        assert node_sh(node, f"docker image inspect {before['image']}", check=False).returncode == 0
    assert len(set(image_ids().values())) == 1
    assert not health().get("failed")
    assert_watchdog_running()


def failed_upgrade_rolls_back(tmp_path, label: str, extra: dict, timeout: float = 900) -> str:
    """Runs upgrade.yml with `extra` under a copy of the lock, expecting it to fail and roll back: the record on
    the head, the lock and the serving image are as before, the endpoint is healthy and the watchdog runs.
    Prints the run's figures under `label`; returns the run's output on one line."""
    reset_watchdog()
    lock, before = locked_copy(tmp_path), state_file()
    locked = lock.read_bytes() if lock.exists() else None
    up = run_playbook("playbooks/upgrade.yml", extra_vars={**extra, "sparkops_lock_file": str(lock)}, timeout=timeout)
    text = " ".join(up.stdout.split()).replace('\\"', '"')
    assert up.returncode != 0, text[-4000:]
    assert "was rolled back" in text, text[-4000:]
    figures = re.search(r"was rolled back.*?([0-9.]+) s; total downtime ([0-9.]+) s", text)
    print(
        f"\n{label}: {up.elapsed:.1f} s, rolled back in {figures.group(1) if figures else '?'} s, "
        f"total downtime {figures.group(2) if figures else '?'} s"
    )
    assert state_file() == before
    assert (lock.read_bytes() if lock.exists() else None) == locked  # a rollback leaves the lock alone
    assert not health().get("failed")
    serving = node_sh("spark-sim-1", "docker inspect --format '{{.Config.Image}}' sparkops-vllm").stdout.strip()
    assert serving == before["image"]
    assert_watchdog_running()
    return text


def test_upgrade_to_a_broken_image_rolls_back(tmp_path):
    failed_upgrade_rolls_back(tmp_path, "broken upgrade", {"spark_vllm_image_ref": "sim-broken"})


def served_release(node: str = "spark-sim-1") -> str:
    return node_sh(node, "docker exec sparkops-vllm vllm --version").stdout.strip().splitlines()[-1]


def test_a_move_to_the_current_stack_whose_vllm_never_gets_healthy_rolls_back_with_the_lock_unchanged(tmp_path):
    """The planted failure of a stack move: vLLM 0.33.0's image is pulled and its vLLM started, but it exits at
    start (the profile's env carries a value the double refuses, as a real vLLM exits on a bad setting), so its
    health check never passes. upgrade.yml puts the recorded deployment back on its 0.19.0 image; the lock and the
    record are as they were."""
    planted = {"sparkops_serving_overrides": {"sim-tiny-tp2": {"env": {"SPARKOPS_TEST_DOUBLE_ANSWERS": "planted"}}}}
    text = failed_upgrade_rolls_back(
        tmp_path, "move to vllm-0.33.0 that never gets healthy", {"sparkops_stack": "vllm-0.33.0", **planted}, 1800
    )
    assert "stack vllm-0.19.0 -> vllm-0.33.0" in text, text[-4000:]
    assert served_release().startswith("0.19.1.dev0+g2a69949bd")


def test_the_reference_deployment_moves_to_the_current_vllm_stack_and_a_rerun_changes_nothing(tmp_path):
    """upgrade.yml -e sparkops_stack=vllm-0.33.0: vLLM's own image, named by tag in the stack, pulled once by tag
    (from the test bed's registry) and by its digest from then on; the profile checked against 0.33.0's contract
    before anything stops; the swap; the lock and the record name the stack. Back to the reference stack with
    site.yml under the inventory's own lock (the converge every later test starts from)."""
    registry = json.loads((ROOT / ".sim" / "cluster.json").read_text())["registry"]
    reset_watchdog()
    lock, before = locked_copy(tmp_path), state_file()
    extra = {"sparkops_stack": "vllm-0.33.0", "sparkops_lock_file": str(lock)}
    up = run_playbook("playbooks/upgrade.yml", extra_vars=extra, timeout=1800)
    assert up.returncode == 0, failure(up)
    text = " ".join(up.stdout.split()).replace('\\"', '"')
    assert "stack vllm-0.19.0 -> vllm-0.33.0" in text, text[-3000:]
    down = re.search(r"downtime ([0-9.]+) s", text)
    print(f"\nmove to vllm-0.33.0: {up.elapsed:.1f} s, downtime {down.group(1) if down else '?'} s")
    locked = json.loads(lock.read_text())
    ref = locked["image"]["registry_ref"]
    assert locked["stack"] == "vllm-0.33.0" and locked["image"]["source"] == "registry", locked
    assert locked["image"]["registry_image"] == f"{registry}/vllm/vllm-openai:v0.33.0-aarch64"
    assert re.fullmatch(re.escape(f"{registry}/vllm/vllm-openai") + r"@sha256:[0-9a-f]{64}", ref), ref
    assert locked["versions"]["vllm_commit"] == "4ba787ec9", locked["versions"]
    after = state_file()
    assert after["stack"] == "vllm-0.33.0" and after["previous"]["image"] == before["image"]
    for node in NODES:  # every node holds the digest, and vLLM runs the image's command, not `vllm serve vllm ...`
        assert node_sh(node, f"docker image inspect {ref}", check=False).returncode == 0
        entry = node_sh(node, "docker inspect --format '{{json .Config.Entrypoint}}' sparkops-ray").stdout.strip()
        assert entry in ("null", "[]"), (node, entry)
    assert served_release() == "0.33.0"
    assert not health().get("failed")
    # A rerun changes nothing and leaves the lock as it is (the tag is not followed again).
    locked_bytes = lock.read_bytes()
    again = run_playbook("site.yml", extra_vars=extra, timeout=1800)
    assert again.returncode == 0, failure(again)
    assert all(c["changed"] == 0 for c in recap(again.stdout).values()), again.stdout[-3000:]
    assert lock.read_bytes() == locked_bytes
    # Back to the inventory's stack and lock: one converge. The head's watchdog stands aside first: the other image
    # replaces the containers it watches (seeing the worker's Ray container gone, it would restart the group).
    back = run_playbook("site.yml", timeout=1800)
    assert back.returncode == 0, failure(back)
    flat = " ".join(back.stdout.split())
    assert "The watchdog on spark-sim-1 stops until watchdog.yml starts it on the new plan:" in flat, failure(back)
    assert re.search(r"image: \S*registry-[0-9a-f]{12} -> \S+", flat), flat[-3000:]
    assert served_release().startswith("0.19.1.dev0+g2a69949bd")
    assert not health().get("failed")
    assert_watchdog_running()
