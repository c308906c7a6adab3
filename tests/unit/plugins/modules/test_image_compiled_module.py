"""image_compiled: the docker call (with the GPUs on a Spark, without elsewhere) and the refusal.

`docker` is a fake executable that logs its arguments and runs the module's probe with this Python on a
site-packages given by the test, as the image's python3 would.
"""

from __future__ import annotations

import sys

from ansible_collections.sparkops.cluster.plugins.modules import image_compiled
from module_runner import run_module


def fake_docker(tmp_path, c_ok=True):
    root = tmp_path / "site"
    (root / "vllm").mkdir(parents=True, exist_ok=True)
    (root / "torch").mkdir(exist_ok=True)
    (root / "torch" / "__init__.py").write_text("__version__ = '2.12.0'\n")
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "_C.py").write_text(
        "import torch\n" + ("" if c_ok else "raise ImportError('undefined symbol: x')\n")
    )
    (root / "flashinfer" / "jit").mkdir(parents=True, exist_ok=True)
    (root / "flashinfer" / "__init__.py").write_text("")
    (root / "flashinfer" / "jit" / "__init__.py").write_text("")
    (root / "flashinfer" / "jit" / "env.py").write_text(f"FLASHINFER_AOT_DIR = {str(tmp_path / 'aot')!r}\n")
    script = tmp_path / "docker"
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > {tmp_path}/argv\n'
        'while [ "$1" != "-c" ]; do shift; done\n'
        f'PYTHONPATH={root} exec {sys.executable} -c "$2"\n'
    )
    script.chmod(0o755)
    return str(script)


def argv(tmp_path):
    return (tmp_path / "argv").read_text().splitlines()


def test_the_probe_runs_with_the_gpus_on_a_spark_and_passes(tmp_path):
    res = run_module(image_compiled, {"image": "vllm-node:abc", "docker": fake_docker(tmp_path)})
    assert not res.get("failed"), res
    assert res["problems"] == [] and res["found"]["vllm"]["vllm._C"] == "loaded"
    args = argv(tmp_path)
    assert args[:4] == ["run", "--rm", "--network", "none"] and args[4:6] == ["--gpus", "all"]
    assert args[6:9] == ["--entrypoint", "python3", "vllm-node:abc"]


def test_without_gpus_no_gpu_is_asked(tmp_path):
    res = run_module(image_compiled, {"image": "vllm-node:abc", "gpus": False, "docker": fake_docker(tmp_path)})
    assert not res.get("failed"), res
    assert "--gpus" not in argv(tmp_path)


def test_a_skewed_build_is_refused_saying_why_and_what_to_do(tmp_path):
    res = run_module(image_compiled, {"image": "vllm-node:abc", "docker": fake_docker(tmp_path, c_ok=False)})
    assert res["failed"]
    assert "vllm._C does not load against the image's torch 2.12.0" in res["msg"]
    assert "undefined symbol: x" in res["msg"] and "build again" in res["msg"]
    report = run_module(
        image_compiled,
        {"image": "vllm-node:abc", "docker": fake_docker(tmp_path, c_ok=False), "fail_on_problem": False},
    )
    assert not report.get("failed") and report["problems"]
