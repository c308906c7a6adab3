"""The weight_cache role's download, run by ansible-playbook -vvv on this machine (issue 23: the token).

The role's own tasks (roles/weight_cache/tasks/source.yml) run against localhost; ``docker`` is
tests/system/fake_docker.py (does what ``docker run`` does with the role's arguments and records them), the
image's client is the real huggingface_hub 0.36.2 (HUB_CLIENT_VERSIONS[0]), the Hub is hub_server.py with a
gated model. While the play runs, every process's arguments and environment are sampled with ``ps``; the
token must appear in none of them, nor in -vvv's output, nor in what the container's config would hold,
and its file must be gone afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml
from conftest import HUB_CLIENT_VERSIONS, ROOT, install_hub_client
from hub_server import HubServer

MODEL = "sparkops-test/gated-role"
TOKEN = "hf_sparkopsRoleToken0123456789abcdef"
SHARD = bytes(range(256)) * (4 * 4096)  # 4 MiB


@pytest.fixture
def client():
    version = HUB_CLIENT_VERSIONS[0]
    try:
        return install_hub_client(version)
    except (subprocess.SubprocessError, OSError) as exc:
        if os.environ.get("SPARKOPS_REQUIRE_HUB_CLIENTS") == "1":
            pytest.fail(f"huggingface_hub {version} did not install: {exc}")
        pytest.skip(f"huggingface_hub {version} could not be installed (no PyPI?): {exc}")


def test_the_roles_download_never_shows_the_token(client, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "docker").symlink_to(ROOT / "tests" / "system" / "fake_docker.py")
    token_file = tmp_path / "run-sparkops" / "hf-token"
    secrets = tmp_path / "secrets.yml"  # as a vault file would hold it: never on the command line
    secrets.write_text(yaml.safe_dump({"sparkops_hf_token": TOKEN}))
    play = tmp_path / "play.yml"
    # The role's files/ as the play's (a play including the role's task file looks there, not in the role).
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "hub_download.py").symlink_to(ROOT / "roles" / "weight_cache" / "files" / "hub_download.py")
    play.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    "vars": {
                        "ansible_python_interpreter": sys.executable,
                        "weight_cache_source": "hub",
                        "weight_cache_source_host": "localhost",
                        "weight_cache_dir": str(tmp_path / "hf" / "hub"),
                        "weight_cache_xet_dir": str(tmp_path / "hf" / "xet"),
                        "weight_cache_download_timeout_s": 300,
                        "weight_cache_token_file": str(token_file),
                        "weight_cache_use_xet": False,
                        # the role passes the Hub's address to the container (the test's Hub, from this env)
                        "weight_cache_hf_endpoint": "{{ lookup('ansible.builtin.env', 'HF_ENDPOINT') }}",
                        "sparkops_state_dir": str(state),
                        "sparkops_image": "fake/serving-image:test",
                        "weight_cache_repo": {"model": MODEL, "revision": "main", "what": "model"},
                    },
                    "tasks": [
                        {"ansible.builtin.include_tasks": str(ROOT / "roles" / "weight_cache" / "tasks" / "source.yml")}
                    ],
                }
            ]
        )
    )
    log = tmp_path / "docker.log"
    with HubServer() as hub:
        hub.add_repo(MODEL, {"config.json": b'{"model_type": "tiny"}', "model.safetensors": SHARD}, gated=True,
                     tokens=(TOKEN,))  # fmt: skip
        hub.delay_s = 0.3  # a slow link: the download is sampled while it runs
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
        env.update(
            ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
            PATH=f"{tmp_path / 'bin'}:{os.path.dirname(sys.executable)}:{env.get('PATH', '')}",
            HF_ENDPOINT=hub.endpoint,
            HF_HUB_DISABLE_TELEMETRY="1",
            NO_PROXY="127.0.0.1,127.0.0.2",
            FAKE_DOCKER_LOG=str(log),
            FAKE_DOCKER_PYTHONPATH=str(client),
            FAKE_DOCKER_HF_HOME=str(tmp_path / "container-hf-home"),
        )
        argv = ["ansible-playbook", "-vvv", "-i", "localhost,", "-e", f"@{secrets}", str(play)]
        samples, seen_download = [], 0
        with subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) as proc:  # fmt: skip
            out_chunks: list = []
            import threading  # noqa: PLC0415 - only this test reads a pipe while sampling

            reader = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True)
            reader.start()
            deadline = time.monotonic() + 400
            while proc.poll() is None and time.monotonic() < deadline:
                listing = subprocess.run(
                    ["ps", "axwwe", "-o", "pid=,args="], capture_output=True, text=True, timeout=10, check=False
                ).stdout
                samples.append(listing)
                if "hub_download.py" in listing:
                    seen_download += 1
                time.sleep(0.1)
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            reader.join(timeout=30)
        output = "".join(c for c in out_chunks if c)
        heads = hub.requests("HEAD", f"/{MODEL}/resolve/")
    assert proc.returncode == 0, output[-4000:]
    assert seen_download >= 3, f"the download was sampled only {seen_download} times while it ran"
    assert any("FAKE_DOCKER_LOG=" in s for s in samples), "the samples cannot see environments: they prove nothing"
    assert not [s for s in samples if TOKEN in s], "the token appeared in a process listing"
    assert TOKEN not in output, "the token appeared in ansible-playbook -vvv's output"
    # What `docker inspect` would show: arguments (and so Env and Mounts) without the token.
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == 1 and TOKEN not in json.dumps(runs)
    assert "HF_TOKEN_PATH=/run/secrets/hf_token" in runs[0]
    assert f"{token_file}:/run/secrets/hf_token:ro" in runs[0]
    assert "HF_HUB_DISABLE_XET=1" in runs[0]
    assert not any(a.startswith("HF_TOKEN=") or a == "HF_TOKEN" for a in runs[0])
    # The client read the file (the gated Hub answered), and the file is gone.
    assert heads and all(r["authorization"] and r["status"] != 401 for r in heads)
    assert not token_file.exists()
    assert (tmp_path / "hf" / "xet").is_dir()
